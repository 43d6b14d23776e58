//! What talks to the cluster: the watches that fill the caches, the kube-runtime
//! `Controller` and its reconcile / error_policy / Context, the writers, leader election,
//! the directory and admin servers. Decisions are `pure`'s; this layer reads, calls and
//! writes.

pub mod admin;
pub mod caches;

pub mod config;
mod context;
pub mod contract;
mod control_plane;
pub mod controller;
pub mod directory;
pub mod error;
mod lead;
pub mod leader;
pub mod member_stream;
pub mod metrics;
pub mod namespaces;
mod rebalancer;
pub mod reconciler;
mod routes;
mod shared;
mod synced;
mod triggers;
pub mod usable_activators;
mod watch;
pub mod write_limit;
