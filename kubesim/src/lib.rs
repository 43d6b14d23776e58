//! kubesim: a simulated Kubernetes cluster for tests and load tests.
//!
//! - [`api`]: an in-memory API server that speaks the real Kubernetes REST + watch protocol,
//!   so unmodified kube-rs code (clients, watchers, reflectors, controllers) runs against it.
//! - [`node`]: simulated kubelets that work against any API server (kubesim's or a real one)
//!   and start real HTTP apps on their own loopback addresses.

pub mod api;
pub mod delay;
pub mod error;
pub mod node;

pub use error::Error;
