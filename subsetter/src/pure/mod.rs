//! The subsetter's decisions: what a reconcile writes, who is a member, what a change
//! concerns. Nothing here holds a client, a runtime or a socket, and nothing imports
//! `cluster` (the layer that feeds these from the watches and writes what they decide).

pub mod activators;
pub mod conditions;
pub mod eligibility;
pub mod endpoint_slice;
pub mod handover;
pub mod hosts;
pub mod images;
pub mod index;
pub mod key;
pub mod load_index;
pub mod loss_burst;
pub mod plan;
pub mod policy;
pub mod queue;
pub mod ready_pods;
pub mod rebalance;
pub mod replacements;
pub mod ring;
pub mod route_index;
pub mod route_plan;
pub mod settings;
pub mod settle;
pub mod shares;
pub mod size;
pub mod store;
pub mod written_status;
