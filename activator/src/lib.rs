//! The node-local activator: receives requests for scale-to-zero revisions, creates their pods
//! on its own node when they are asleep, and proxies to the pod IPs.
//!
//! A library with a thin `main`, so tests and the load test run many activators in one
//! process. Start one with [`Activator::start`] (the composition root, `compose/`); the request
//! path is in [`pipeline`].

// The activator's rooms, from the bottom up (hack/structure.layers): errors; the wire
// (answers, naming, connections); the HTTP/1 rules (http1); operations (metrics, Events,
// tracing, the admin port); the upstream pools and the serving threads; the caches of the API;
// the node's pods; the request path (its transport-neutral core, and hyper's adapter); the fast
// lane and accepting connections; the settings; and the composition root (compose).
pub(crate) mod accept;
pub mod cache;
pub mod cli;
mod compose;
pub mod config;
pub mod error;
pub mod fast;
pub mod http1;
pub mod node;
pub mod ops;
pub mod pipeline;
pub(crate) mod threads;
pub mod upstream;
pub mod wire;

pub use compose::Activator;
pub use compose::watch_only::WatchOnly;
pub use config::ActivatorConfig;
pub use error::Error;
pub use keep_serving::shutdown_signal;
pub use ops::metrics::Metrics;
