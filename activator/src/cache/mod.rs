//! What the activator keeps in memory: only what its own node needs (docs/architecture.md, "The scale it must hold").
//!
//! - [`revisions`]: the Revisions requests name, read on demand and kept briefly.
//! - [`hosts`]: Host → the revisions serving it, looked up by host label on
//!   ActivationEndpoints and cached; [`host_route`]: the answer itself, by the rule of
//!   `status.routes` (a split by weight) or the legacy one (the newest claimant), pure.
//! - [`endpoints`]: the ActivationEndpoints that list this node (a label-selected watch), plus
//!   short-lived lookups of other revisions' subsets, for forwarding.
//! - [`member_stream`]: those subsets streamed by a directory replica instead of watched.
//! - [`seeded`]: that watch's first state from the directory, not from a list that scans every
//!   subset on the API server.
//! - [`pods`]: app pods on this node (a `spec.nodeName` field-selected watch).
//! - [`read`]: reads by name from the API server's cache first, not from etcd.
//! - [`trim`]: what the caches drop from each object they keep (its field-manager trees).

pub mod api_health;
pub mod directory;
pub(crate) mod endpoints;
pub(crate) mod host_route;
pub(crate) mod hosts;
pub mod member_stream;
pub(crate) mod pods;
pub(crate) mod read;
pub(crate) mod revisions;
pub(crate) mod seeded;
mod trim;

/// How many objects the caches hold now: what an activator costs grows with these, not with
/// the cluster (load tests report them; an operator sizing memory can compare).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CachedObjects {
    /// ActivationEndpoints listing this node (the label-selected watch).
    pub subsets: usize,
    /// Other revisions' subsets looked up for forwarding.
    pub other_subsets: usize,
    /// Revisions read on demand.
    pub revisions: usize,
    /// Hosts resolved (Host routing).
    pub hosts: usize,
    /// App pods on this node, and the revisions they belong to.
    pub pods: usize,
    pub pod_revisions: usize,
}

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

/// Drives a watch stream until `stop`, handing each event to `on_event`. Errors are logged
/// and left to the stream, which retries them ([`crds::backoff::resilient`]).
pub(crate) fn spawn_watch<K, S>(
    what: &'static str,
    events: S,
    stop: CancellationToken,
    mut on_event: impl FnMut(watcher::Event<K>) + Send + 'static,
) where
    K: Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        // Errors since the last event: during an API server outage the stream retries every
        // second or so, and one warning says so, not one per attempt.
        let mut failed = 0u64;
        loop {
            let ev = tokio::select! {
                _ = stop.cancelled() => return,
                ev = events.next() => ev,
            };
            match ev {
                None => return,
                Some(Err(e)) => {
                    if failed == 0 {
                        tracing::warn!(error = %e, "{what} watch error; retrying");
                    } else {
                        tracing::debug!(error = %e, failed, "{what} watch error; retrying");
                    }
                    failed += 1;
                }
                Some(Ok(ev)) => {
                    if failed > 0 {
                        tracing::info!(errors = failed, "{what} watch receiving events again");
                        failed = 0;
                    }
                    on_event(ev)
                }
            }
        }
    });
}
