//! The subsetter: gives each Revision a subset of N activators, recorded in its
//! ActivationEndpoints (docs/architecture.md, "The contracts"). Policies, shares, conditions and the plan of each
//! reconcile are pure code; `controller` wires them to the API with kube-runtime.

pub mod activators;
pub mod admin;
pub mod cli;
pub mod conditions;
mod config;
mod context;
pub mod contract;
mod control_plane;
pub mod eligibility;
pub mod endpoint_slice;
pub mod error;
pub mod handover;
pub mod hosts;
pub mod images;
pub mod index;
pub mod load_index;
mod locks;
pub mod loss_burst;
pub mod metrics;
pub mod namespaces;
pub mod plan;
pub mod policy;
pub mod queue;
pub mod ready_pods;
pub mod rebalance;
pub mod replacements;
pub mod route_index;
pub mod route_plan;
pub mod settings;
mod shared;
pub mod shares;
pub mod size;
pub mod store;
pub mod usable_activators;
pub mod write_limit;
pub mod written_status;

pub use error::{Error, Result};
pub use policy::{LeastLoaded, Random, SubsetPolicy};
mod app_pods;
pub mod controller;
pub mod directory;
pub mod leader;
pub mod reconciler;
mod routes;

pub use controller::{Caches, Subsetter};
pub use reconciler::Config;
