//! One module per scenario; each starts its own cluster, runs, and returns a [`Report`].
//!
//! [`Report`]: crate::scenario::Report

pub mod churn;
pub mod cold_burst;
pub mod common;
pub mod control_path;
pub mod deploy;
pub mod floor;
pub mod idle;
pub mod maxscale;
pub mod node_failure;
pub mod replica_kill;
pub mod scale;
pub mod scale_control_plane;
pub mod steady;
pub mod steady_creation;
pub mod write_rate;
