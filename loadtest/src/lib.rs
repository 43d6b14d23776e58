//! The load-test harness: composes kubesim, the subsetter and one activator per node in one
//! process (or targets a real cluster through `KUBECONFIG`), runs scenarios and reports.

pub mod activator_metrics;
pub mod activator_process;
pub mod anatomy;
pub mod apiserver_metrics;
pub mod cluster;
pub mod demo;
pub mod directory_replica;
pub mod driver;
pub mod error;
pub mod image_pull;
pub mod installed;
pub mod nginx;
pub mod object_cost;
pub mod observe;
pub mod open_loop;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod scenarios;
pub mod stats;
pub mod watch_cost;

pub use cluster::{ClusterOptions, SimCluster};
pub use error::Error;
