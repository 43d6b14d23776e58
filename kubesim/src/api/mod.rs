//! The in-memory API server.

mod builtin;
mod cache_counters;
mod cache_watcher;
mod configmap;
mod crd;
mod delete;
mod discovery;
mod dispatch;
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
mod time_budget;
mod watch;
mod watch_cache_sizing;

pub use cache_counters::WatchCacheStats;
pub use server::{ApiServer, ApiServerConfig};
pub use stats::{RequestKey, Stats, UserRequestKey, WatchInfo};
pub use time_budget::{MAX_BUDGET, REFRESH_PER_SECOND};
pub use watch::WatchStat;
pub use watch_cache_sizing::{EVENT_FRESH, WINDOW_MAX, WINDOW_MIN, WatchCacheConfig};
