//! The in-memory API server.

mod builtin;
mod configmap;
mod crd;
mod delete;
mod discovery;
mod events;
mod gc;
mod handlers;
mod http;
mod list;
mod meta;
pub mod patch;
mod resource;
pub mod schema;
pub mod selector;
mod server;
mod stats;
mod status;
pub mod storage;
mod store;
mod watch;

pub use server::{ApiServer, ApiServerConfig};
pub use stats::{RequestKey, Stats, UserRequestKey, WatchInfo};
pub use watch::WatchStat;
