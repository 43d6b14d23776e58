//! The node's side of the activator: the pools of its revisions' pods, and the pre-pull of
//! member revisions' images.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cache::api_health::ApiHealth;
use crate::cache::pods::PodCache;
use crate::cache::revisions::RevisionCache;
use crate::config::ActivatorConfig;
use crate::node::node_addr::NodeAddresses;
use crate::node::pool::Shared;
use crate::node::pools::Pools;
use crate::node::prepull::{self, Prepull, PrepullDeps};
use crate::ops::events::EventSink;
use crate::ops::metrics::Metrics;

/// The pre-pull of member revisions' images, with a node agent to pull through (on this,
/// the control runtime: never a serving thread).
pub(super) fn start_prepull(
    cfg: &ActivatorConfig,
    client: &kube::Client,
    revisions: &RevisionCache,
    events: &EventSink,
    metrics: &Arc<Metrics>,
    stop_caches: &CancellationToken,
) -> Option<Prepull> {
    let socket = cfg.node_agent.as_ref()?;
    if !prepull::enabled(cfg.prepull, Some(socket)) {
        return None;
    }
    Some(Prepull::start(
        PrepullDeps {
            agent_socket: socket.clone(),
            node: cfg.node_name.clone(),
            cfg: cfg.prepull(),
            client: client.clone(),
            revisions: revisions.clone(),
            events: events.clone(),
            metrics: metrics.clone(),
        },
        stop_caches.child_token(),
    ))
}

/// The pools of this node's revisions (their scalers stop with `stop_caches`).
pub(super) fn pools(
    cfg: &ActivatorConfig,
    client: kube::Client,
    api: &ApiHealth,
    pods: &PodCache,
    metrics: &Arc<Metrics>,
    events: EventSink,
    stop_caches: &CancellationToken,
) -> Pools {
    Pools::new(Shared {
        client,
        api: api.clone(),
        events,
        node: cfg.node_name.clone(),
        pods: pods.clone(),
        metrics: metrics.clone(),
        cfg: cfg.pool.clone(),
        queued_total: Default::default(),
        stop: stop_caches.child_token(),
        epoch: tokio::time::Instant::now(),
        full: Default::default(),
        node_addresses: cfg
            .node_agent
            .as_ref()
            .map(|path| NodeAddresses::new(path, metrics.clone())),
    })
}
