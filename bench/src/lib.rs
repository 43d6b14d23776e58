//! Benchmarks anyone can run on one machine: the activator binary as a separate process
//! against an embedded kubesim API server and one simulated node.
//!
//! - [`warm`]: the warm path's throughput and latency against the pod directly, nginx and the
//!   activator;
//! - [`control`]: the cold-start control path, phase by phase;
//! - [`buffer`]: the activator's memory per waiting request;
//! - [`revisions`]: the activator's memory with many revisions in the cluster.
//!
//! Each returns a report that prints itself; nothing here asserts a timing.

pub mod buffer;
pub mod cluster;
pub mod control;
pub mod cpu;
mod error;
pub mod http;
pub mod loadgen;
pub mod process;
pub mod prom;
pub mod revisions;
pub mod stats;
pub mod warm;
pub mod wrk;

pub use error::Error;
