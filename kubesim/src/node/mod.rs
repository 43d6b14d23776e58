//! Simulated nodes (kubelets) that work against any API server.
//!
//! A [`Fleet`] registers Node objects, renews their Leases, watches the pods bound to each
//! node and runs every pod as a real HTTP server on its own loopback address (see
//! [`addresses`]). [`NodeLifecycleController`] plays the control plane's part: a node whose
//! lease stops being renewed turns Unknown and gets the unreachable taint.

pub mod addresses;
pub mod agent;
pub mod app;
pub mod config;
mod error;
pub mod fleet;
mod kubelet;
mod lease;
pub mod lifecycle;
pub mod objects;
pub mod process;
pub mod reserve;
mod retry;
mod sim_node;

pub use addresses::{PodIpPool, node_ip};
pub use agent::AgentDir;
pub use app::{App, AppSpec, AppStats};
pub use config::{Delay, NodeConfig, StartDelays, node_name};
pub use error::NodeError;
pub use fleet::{Fleet, FleetOptions};
pub use lifecycle::NodeLifecycleController;
pub use sim_node::{KillMode, PodInfo, PodStage, SimNode, WatchMode};
