//! The subsetter: gives each Revision a subset of N activators, recorded in its
//! ActivationEndpoints (docs/architecture.md, "The contracts").
//!
//! Two layers, imported downward only:
//! - [`pure`]: the decisions (policies, shares, conditions, the plan of each reconcile, the
//!   indexes the caches keep): no client, no runtime, no network, so they are tested alone.
//! - [`cluster`]: what talks to the API server around them (watches, writers, the
//!   kube-runtime `Controller` with its reconcile / error_policy / Context, leader election,
//!   the directory and admin servers).
//!
//! The modules are re-exported at the crate's root under their names before the split, so
//! `subsetter::policy::LeastLoaded` and the like keep working for the other crates.

pub mod cli;
pub mod cluster;
pub mod pure;

pub use cluster::{
    admin, contract, controller, directory, error, leader, member_stream, metrics, namespaces,
    reconciler, usable_activators, write_limit,
};
pub use pure::{
    activators, conditions, eligibility, endpoint_slice, handover, hosts, images, index,
    load_index, loss_burst, plan, policy, queue, ready_pods, rebalance, replacements, route_index,
    route_plan, settings, shares, size, store, written_status,
};

pub use cluster::caches::Caches;
pub use cluster::controller::Subsetter;
pub use cluster::error::{Error, Result};
pub use cluster::reconciler::Config;
pub use pure::policy::{LeastLoaded, Random, SubsetPolicy};
