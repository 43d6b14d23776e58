//! Prometheus metrics of the subsetter.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Counters the reconciler updates; `encode` renders them in the text exposition format.
pub struct Metrics {
    registry: Registry,
    pub reconciles: Counter,
    pub errors: Counter,
    pub writes: Counter,
    /// Seconds writes waited for their turn under the write rate limit.
    pub write_wait_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    pub members_joined: Counter,
    pub members_left: Counter,
    /// Members that left because their activator was lost or its node became ineligible.
    pub members_replaced: Family<ReplacedBy, Counter>,
    /// Activators lost while most nodes were NotReady at once, kept as members until it ended.
    pub disruption_holds: Counter,
    /// Activators lost on a Ready node, kept as members while their replacement comes
    /// (`replacements.rs`); those not replaced in time; those held now.
    pub replacement_holds: Counter,
    pub replacement_holds_expired: Counter,
    pub held_for_replacement: Gauge,
    /// `/readyz` probes not answered OK: signs of a control-plane outage (`control_plane.rs`).
    pub readyz_failures: Counter,
    /// How long reconciles take (plan and writes), in seconds.
    pub reconcile_seconds: Histogram,
    /// Reconciles running now, most of them waiting for their turn under the write limit
    /// when there are many: the backlog of a flood of repairs.
    pub reconciles_in_flight: Gauge,
    /// Revisions waiting for a reconcile: triggered, not started yet (`queue.rs`).
    pub reconciles_queued: Gauge,
    /// Events written on Revisions whose subset turned Degraded.
    pub degraded_events: Counter,
    /// Hosts handed over to a newer revision with its pods Ready, and after the bound without.
    pub handovers_warm: Counter,
    pub handovers_bound: Counter,
    /// How long hand-overs waited for the newer revision's pods, in seconds.
    pub handover_wait_seconds: Histogram,
    /// Moves of a Route's served traffic (each step of a rollout counts).
    pub route_moves: Counter,
    /// Settings ConfigMap versions put in force, and refused.
    pub settings_applied: Counter,
    pub settings_refused: Counter,
    /// Times the flags were put back in force (the ConfigMap deleted or absent).
    pub settings_reverted: Counter,
    pub activators: Gauge,
    pub subsets: Gauge,
    /// ActivationEndpoints Degraded for want of members (reason InsufficientActivators), as
    /// the watch shows them: the revisions running on fewer activators than they want.
    pub subsets_short: Gauge,
    /// Membership streams open now (`member_stream`), frames sent on them, streams closed
    /// because their reader fell behind, and requests refused (auth, limit, behind).
    pub member_streams: Gauge,
    pub member_stream_frames: Counter,
    pub member_streams_dropped_slow: Counter,
    pub member_streams_refused: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("subsetter");
        let m = Self {
            reconciles: Counter::default(),
            errors: Counter::default(),
            writes: Counter::default(),
            write_wait_seconds: Counter::default(),
            members_joined: Counter::default(),
            members_left: Counter::default(),
            members_replaced: Family::default(),
            disruption_holds: Counter::default(),
            replacement_holds: Counter::default(),
            replacement_holds_expired: Counter::default(),
            held_for_replacement: Gauge::default(),
            readyz_failures: Counter::default(),
            // 100 µs to ~3 s: a plan alone is microseconds, a write an etcd commit or a wait
            // under the write rate limit.
            reconcile_seconds: Histogram::new(exponential_buckets(1e-4, 4.0, 9)),
            reconciles_in_flight: Gauge::default(),
            reconciles_queued: Gauge::default(),
            degraded_events: Counter::default(),
            handovers_warm: Counter::default(),
            handovers_bound: Counter::default(),
            // 10 ms to ~3 min: a quick app's start to a JVM's.
            handover_wait_seconds: Histogram::new(exponential_buckets(0.01, 3.0, 12)),
            route_moves: Counter::default(),
            settings_applied: Counter::default(),
            settings_refused: Counter::default(),
            settings_reverted: Counter::default(),
            activators: Gauge::default(),
            subsets: Gauge::default(),
            subsets_short: Gauge::default(),
            member_streams: Gauge::default(),
            member_stream_frames: Counter::default(),
            member_streams_dropped_slow: Counter::default(),
            member_streams_refused: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "reconciles",
            "Revision reconciles run",
            m.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed (retried with backoff)",
            m.errors.clone(),
        );
        registry.register(
            "writes",
            "API writes made (creates and patches)",
            m.writes.clone(),
        );
        registry.register(
            "write_wait_seconds",
            "Time API writes waited under the write rate limit (--write-qps)",
            m.write_wait_seconds.clone(),
        );
        registry.register(
            "members_joined",
            "Activators added to subsets (each costs a cold start)",
            m.members_joined.clone(),
        );
        registry.register(
            "members_left",
            "Activators removed from subsets",
            m.members_left.clone(),
        );
        registry.register(
            "members_replaced",
            "Members that left a subset, by why: lost (activator gone) or ineligible (node)",
            m.members_replaced.clone(),
        );
        registry.register(
            "disruption_holds",
            "Activators lost while most nodes were NotReady at once (a control-plane or network \
             disruption), or to a Node NotReady right after an API server outage, kept as \
             members until it ended",
            m.disruption_holds.clone(),
        );
        registry.register(
            "replacement_holds",
            "Activators lost on a Ready node (a DaemonSet rolling update, a restart), kept as \
             members while their replacement comes (--replacement-hold-seconds)",
            m.replacement_holds.clone(),
        );
        registry.register(
            "replacement_holds_expired",
            "Activators held for their replacement that none replaced within the hold: their \
             subsets repaired then",
            m.replacement_holds_expired.clone(),
        );
        registry.register(
            "held_for_replacement",
            "Activators held as members now while their replacement comes",
            m.held_for_replacement.clone(),
        );
        registry.register(
            "readyz_failures",
            "Probes of the API server's /readyz (one a second) not answered OK: an API server or \
             etcd outage, whose aftermath holds members on Nodes turning NotReady",
            m.readyz_failures.clone(),
        );
        registry.register(
            "reconcile_seconds",
            "Duration of Revision reconciles",
            m.reconcile_seconds.clone(),
        );
        registry.register(
            "reconciles_in_flight",
            "Reconciles running now (a backlog under the write limit shows here)",
            m.reconciles_in_flight.clone(),
        );
        registry.register(
            "reconciles_queued",
            "Revisions waiting for a reconcile (triggered, not started yet)",
            m.reconciles_queued.clone(),
        );
        registry.register(
            "handovers_warm",
            "Hosts handed over to a newer revision once its pods were Ready",
            m.handovers_warm.clone(),
        );
        registry.register(
            "handovers_bound",
            "Hosts handed over to a newer revision at its bound, without the pods",
            m.handovers_bound.clone(),
        );
        registry.register(
            "handover_wait_seconds",
            "How long hand-overs waited for the newer revision's pods",
            m.handover_wait_seconds.clone(),
        );
        registry.register(
            "route_moves",
            "Moves of a Route's served traffic (each step of a rollout)",
            m.route_moves.clone(),
        );
        registry.register(
            "degraded_events",
            "Warning Events written on Revisions whose subset turned Degraded",
            m.degraded_events.clone(),
        );
        registry.register(
            "settings_applied",
            "Versions of the settings ConfigMap put in force",
            m.settings_applied.clone(),
        );
        registry.register(
            "settings_refused",
            "Versions of the settings ConfigMap refused (bad keys or values; see the log)",
            m.settings_refused.clone(),
        );
        registry.register(
            "settings_reverted",
            "Times the flags were put back in force (settings ConfigMap deleted or absent)",
            m.settings_reverted.clone(),
        );
        registry.register(
            "activators_available",
            "Ready activators on Ready nodes",
            m.activators.clone(),
        );
        registry.register("subsets", "ActivationEndpoints known", m.subsets.clone());
        registry.register(
            "subsets_short",
            "ActivationEndpoints Degraded with fewer members than wanted (InsufficientActivators)",
            m.subsets_short.clone(),
        );
        registry.register(
            "member_streams",
            "Membership streams open now (one per activator holding this replica)",
            m.member_streams.clone(),
        );
        registry.register(
            "member_stream_frames",
            "Frames sent on membership streams",
            m.member_stream_frames.clone(),
        );
        registry.register(
            "member_streams_dropped_slow",
            "Membership streams closed because their reader fell behind (it resumes from its version)",
            m.member_streams_dropped_slow.clone(),
        );
        registry.register(
            "member_streams_refused",
            "Membership stream requests refused (no proof, over the limit, replica behind)",
            m.member_streams_refused.clone(),
        );
        Self { registry, ..m }
    }
}

/// Why members left a subset.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplacedBy {
    pub reason: &'static str,
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_show_in_the_exposition() {
        let m = Metrics::default();
        m.reconciles.inc();
        m.members_joined.inc_by(3);
        let text = m.encode();
        assert!(text.contains("subsetter_reconciles_total 1"), "{text}");
        assert!(text.contains("subsetter_members_joined_total 3"), "{text}");
    }
}
