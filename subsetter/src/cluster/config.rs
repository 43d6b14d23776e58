//! What the controller is configured with (flags, or a caller's own values).

use std::time::Duration;

/// What the controller is configured with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Only Revisions of this namespace (None = all namespaces).
    pub namespace: Option<String>,
    /// Only Revisions of the namespaces whose labels match this selector (None = all): the
    /// others are another subsetter's (`namespaces.rs`).
    pub namespace_selector: Option<String>,
    /// Only activator pods of this namespace (None = all namespaces).
    pub activator_namespace: Option<String>,
    /// N for revisions without `spec.activators`.
    pub default_activators: usize,
    /// Field manager of every write.
    pub field_manager: String,
    /// How long a stop waits for reconciles in flight before dropping them. Stopping never
    /// waits on the API server beyond this (a real server's quiet watch sends nothing).
    pub shutdown_grace: Duration,
    /// API writes a second, across all reconciles (≤ 0: no limit), and how many may go at
    /// once after a quiet spell.
    pub write_qps: f64,
    pub write_burst: u32,
    /// Reconciles running at once (0: no bound). Unbounded, a burst of new revisions on a
    /// busy API server opens a connection per reconcile in flight: thousands of sockets.
    pub concurrency: u16,
    /// Also keep an EndpointSlice `{revision}-activationendpoints` per revision, for an
    /// ingress that wants one (`endpoint_slice.rs`).
    pub endpoint_slices: bool,
    /// How often to look for imbalance (`rebalance.rs`); zero: never.
    pub rebalance_interval: Duration,
    pub rebalance: crate::pure::rebalance::Limits,
    /// A ConfigMap (name, namespace) whose keys override the policy, maxNodeSelection and the
    /// write rate while it exists (`settings.rs`); re-read when it changes.
    pub settings_config_map: Option<(String, String)>,
    /// Least-loaded prefers activators whose node already holds the revision's images, within
    /// its balance bound (docs/subsetter.md, "Image locality"). On by default.
    pub image_locality: bool,
    /// After the API server (or etcd behind it) was out of reach, activators lost to a Node
    /// NotReady within this long are held as members, and repaired then if still NotReady
    /// (docs/subsetter.md, "A disruption is not node failures"): the controller-manager
    /// marks a node whose kubelet has not renewed its lease since the outage NotReady for
    /// the seconds until it does.
    pub outage_hold: Duration,
    /// An activator lost while its Node is Ready (a DaemonSet rolling update, a restart, a
    /// deleted pod) stays a member this long after its old pod is gone (held while that pod
    /// terminates, up to its grace period) for its replacement on the node, rather than every
    /// subset it is in moving (`replacements.rs`); no more than the 3 s settle: moved after
    /// the settle.
    pub replacement_hold: Duration,
    /// The instance named in this replica's Events (the binary passes its `POD_NAME`); None:
    /// none named.
    pub event_instance: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: None,
            namespace_selector: None,
            activator_namespace: None,
            default_activators: 3,
            field_manager: "local-activator-subsetter".into(),
            shutdown_grace: Duration::from_secs(10),
            write_qps: 100.0,
            write_burst: 200,
            concurrency: DEFAULT_CONCURRENCY,
            settings_config_map: None,
            image_locality: true,
            outage_hold: crate::pure::settle::OUTAGE_HOLD,
            replacement_hold: crate::pure::replacements::REPLACEMENT_HOLD,
            event_instance: None,
            endpoint_slices: false,
            rebalance_interval: Duration::from_secs(60),
            rebalance: crate::pure::rebalance::Limits {
                threshold: 1.2,
                max_moves: 10,
            },
        }
    }
}

/// Reconciles at once by default: with a write's round trip of a few ms, 32 keep well ahead of
/// the default write rate (100/s) and of a large cluster's (a few hundred a second).
pub const DEFAULT_CONCURRENCY: u16 = 32;
