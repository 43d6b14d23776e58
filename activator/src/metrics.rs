//! The activator's Prometheus metrics (served on the admin port at `/metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The outcome label of a finished request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// `proxied`, `forwarded` or `refused`.
    pub route: &'static str,
    pub code: u16,
}

/// Counters of one activator. Cheap to update from the request path (atomics).
#[derive(Default)]
pub struct Metrics {
    pub requests: Family<Outcome, Counter>,
    /// Requests that had to wait for a pod to start on this node.
    pub cold_start_waits: Counter,
    /// Pods this activator created.
    pub pods_created: Counter,
    /// Requests waiting for a pod that were sent to a peer because this activator was draining.
    pub drained_to_peers: Counter,
}

impl Metrics {
    /// A registry exposing these metrics under the `activator_` prefix.
    pub fn registry(self: &std::sync::Arc<Self>) -> Registry {
        let mut r = Registry::with_prefix("activator");
        r.register(
            "requests",
            "Requests answered, by route and status code",
            self.requests.clone(),
        );
        r.register(
            "cold_start_waits",
            "Requests that waited for a pod to start on this node",
            self.cold_start_waits.clone(),
        );
        r.register(
            "pods_created",
            "App pods created by this activator",
            self.pods_created.clone(),
        );
        r.register(
            "drained_to_peers",
            "Requests waiting for a pod sent to a peer while draining",
            self.drained_to_peers.clone(),
        );
        r
    }
}
