//! The activator's Prometheus metrics (served on the admin port at `/metrics`). No label per
//! revision: a node may see thousands of them, and 100,000 revisions × label sets would be
//! the biggest thing in the process.

use std::fmt::Write as _;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label values in snake case (the derive would write the variant names as they are).
macro_rules! label_value {
    ($t:ident { $($v:ident => $s:literal),* $(,)? }) => {
        impl EncodeLabelValue for $t {
            fn encode(&self, e: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                e.write_str(match self { $(Self::$v => $s),* })
            }
        }
    };
}

/// How a request ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Route {
    /// Proxied to a pod that had a free slot.
    Warm,
    /// Proxied after waiting for a slot (a pod starting, or all pods busy).
    Cold,
    /// Sent to another member.
    Forwarded,
    /// Answered by the activator itself (404, 503, 504...).
    Refused,
}

label_value!(Route {
    Warm => "warm",
    Cold => "cold",
    Forwarded => "forwarded",
    Refused => "refused",
});

/// What made a new pod usable first.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum FirstBy {
    Probe,
    Watch,
}

label_value!(FirstBy {
    Probe => "probe",
    Watch => "watch",
});

/// Where the activator learnt a new pod's address first.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AddressSource {
    /// The node agent (the pod's sandbox, from the container runtime).
    Agent,
    /// The pod watch (the kubelet's status update).
    Watch,
}

label_value!(AddressSource {
    Agent => "agent",
    Watch => "watch",
});

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AddressFrom {
    pub source: AddressSource,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UsableFirst {
    pub by: FirstBy,
}

/// The outcome label of a finished request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub route: Route,
    pub code: u16,
}

/// Cold-start phases, each measured from the arrival of the first request that found no pod.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Phase {
    /// The pod create was sent to the API server.
    PodPostSent,
    /// The API server answered the create (the pod exists, bound to this node).
    PodBoundSeen,
    /// The pod became usable (watch Ready or our own probe).
    PodReadySeen,
    /// The app's response headers arrived (for each request that waited).
    FirstByte,
}

label_value!(Phase {
    PodPostSent => "pod_post_sent",
    PodBoundSeen => "pod_bound_seen",
    PodReadySeen => "pod_ready_seen",
    FirstByte => "first_byte",
});

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: Phase,
}

/// Why a pod was created or deleted.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum PodReason {
    /// The first pod for waiting requests.
    Cold,
    /// Demand above the target utilisation.
    ScaleOut,
    /// Demand fit in fewer pods for the stable window.
    ScaleIn,
    /// No request for idleTimeoutSeconds.
    Idle,
    /// The pod failed (e.g. the kubelet rejected it: OutOfpods).
    Failed,
    /// The pod was not ready within the start timeout.
    NotReady,
}

label_value!(PodReason {
    Cold => "cold",
    ScaleOut => "scale_out",
    ScaleIn => "scale_in",
    Idle => "idle",
    Failed => "failed",
    NotReady => "not_ready",
});

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: PodReason,
}

/// Why a pre-pull failed (or was not made).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum PullFailReason {
    BadName,
    NotFound,
    Unauthorized,
    RuntimeTimeout,
    RuntimeUnreachable,
    Busy,
    RuntimeError,
    /// The node agent did not answer (or broke the protocol).
    AgentUnreachable,
    /// The revision names pull secrets and `--prepull-secrets` is off: not pre-pulled.
    NeedsPullSecret,
    /// Its pull secrets could not be read or parsed.
    BadPullSecret,
    Other,
}

label_value!(PullFailReason {
    BadName => "bad_name",
    NotFound => "not_found",
    Unauthorized => "unauthorized",
    RuntimeTimeout => "runtime_timeout",
    RuntimeUnreachable => "runtime_unreachable",
    Busy => "busy",
    RuntimeError => "runtime_error",
    AgentUnreachable => "agent_unreachable",
    NeedsPullSecret => "needs_pull_secret",
    BadPullSecret => "bad_pull_secret",
    Other => "other",
});

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PullFailLabel {
    pub reason: PullFailReason,
}

fn pull_histogram() -> Histogram {
    // 50 ms .. ~27 min.
    Histogram::new(exponential_buckets(0.05, 2.0, 16))
}

/// The pre-pull's metrics (`node::prepull`).
pub struct PrepullMetrics {
    /// Pulls asked of the node agent.
    pub started: Counter,
    pub succeeded: Counter,
    /// Images the runtime already held: no pull made.
    pub present: Counter,
    pub failed: Family<PullFailLabel, Counter>,
    /// How long each pull asked of the agent took, whatever its outcome.
    pub duration: Histogram,
    /// Sizes of the images pulled, as the runtime reports them (ImageStatus).
    pub bytes: Counter,
    /// Images waiting for a pull slot or a retry.
    pub queue_depth: Gauge,
    pub in_flight: Gauge,
}

impl Default for PrepullMetrics {
    fn default() -> Self {
        Self {
            started: Counter::default(),
            succeeded: Counter::default(),
            present: Counter::default(),
            failed: Family::default(),
            duration: pull_histogram(),
            bytes: Counter::default(),
            queue_depth: Gauge::default(),
            in_flight: Gauge::default(),
        }
    }
}

impl PrepullMetrics {
    pub fn failed(&self, reason: PullFailReason) {
        self.failed.get_or_create(&PullFailLabel { reason }).inc();
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "prepull_started",
            "Image pulls the pre-pull asked of the node agent",
            self.started.clone(),
        );
        r.register(
            "prepull_succeeded",
            "Image pulls the pre-pull finished",
            self.succeeded.clone(),
        );
        r.register(
            "prepull_present",
            "Images of member revisions the node already held (no pull made)",
            self.present.clone(),
        );
        r.register(
            "prepull_failed",
            "Image pre-pulls that failed or were not made, by reason",
            self.failed.clone(),
        );
        r.register(
            "prepull_duration_seconds",
            "How long each image pull asked of the node agent took",
            self.duration.clone(),
        );
        r.register(
            "prepull_bytes",
            "Sizes of the images pre-pulled, as the container runtime reports them",
            self.bytes.clone(),
        );
        r.register(
            "prepull_queue_depth",
            "Images waiting for a pull slot or for their retry",
            self.queue_depth.clone(),
        );
        r.register(
            "prepull_in_flight",
            "Image pulls in flight",
            self.in_flight.clone(),
        );
    }
}

/// What this node reads from the directory: its membership stream (`cache::member_stream`),
/// and Revisions and Host claims asked of a replica before the API server.
#[derive(Clone, Default)]
pub struct DirectoryCounters {
    /// Streams opened (a first one, resumes, reconnects).
    pub opened: Counter,
    /// Attempts that failed: no connection, a refusal, a frame that could not be read.
    pub failed: Counter,
    /// First states asked for again because a sync did not agree with the copies held.
    pub doubted: Counter,
    /// Times the API server's watch took over, all replicas unreachable.
    pub fallbacks: Counter,
    /// Revisions (`cache::revisions`) and Host claims (`cache::hosts`) a replica answered.
    pub revisions_read: Counter,
    pub host_claims_read: Counter,
}

/// Why a host was read again before its TTL was past.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum HostRefresh {
    /// A member this entry forwarded to answered `x-activator-host-stale`: its subset is newer
    /// than the host answer the entry picked from.
    StaleHint,
    /// This entry is itself a member of the revision it picked, and its watched copy of the
    /// subset is newer than the host answer.
    LocalNewer,
    /// The membership stream said subsets carrying the host's label changed.
    Streamed,
}

label_value!(HostRefresh {
    StaleHint => "stale_hint",
    LocalNewer => "local_newer",
    Streamed => "streamed",
});

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostRefreshLabel {
    pub reason: HostRefresh,
}

/// Host routing's metrics (`cache::hosts`, and the hints between entries and members).
pub struct HostMetrics {
    /// Hosts read again at once, by why (at most one per host per 200 ms).
    pub refreshes: Family<HostRefreshLabel, Counter>,
    /// Lookups that replaced a host's answer with one sending its requests elsewhere (other
    /// revisions, or other weights), whatever started them (a hint, the TTL).
    pub moves: Counter,
    /// Answers this node, as a member, marked `x-activator-host-stale` for the entry that
    /// forwarded them.
    pub stale_answers: Counter,
    /// How long a refresh started by a hint or a newer local copy took to store its answer.
    pub refresh_seconds: Histogram,
}

impl Default for HostMetrics {
    fn default() -> Self {
        let m = Self {
            refreshes: Family::default(),
            moves: Counter::default(),
            stale_answers: Counter::default(),
            // 1 ms .. ~16 s.
            refresh_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
        };
        // Both series exist from the start at 0, so that the first refresh is a rise a
        // `rate()` sees rather than a series appearing.
        for reason in [HostRefresh::StaleHint, HostRefresh::LocalNewer] {
            let _ = m.refreshes.get_or_create(&HostRefreshLabel { reason });
        }
        m
    }
}

impl HostMetrics {
    pub fn refreshed(&self, reason: HostRefresh) {
        self.refreshes
            .get_or_create(&HostRefreshLabel { reason })
            .inc();
    }

    /// Refreshes counted so far for `reason`.
    pub fn refreshes(&self, reason: HostRefresh) -> u64 {
        self.refreshes
            .get_or_create(&HostRefreshLabel { reason })
            .get()
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "host_refreshes",
            "Hosts read again before their TTL, by reason: stale_hint (a member said the host \
             answer is older than its subset), local_newer (this node's own copy of the picked \
             revision's subset is newer)",
            self.refreshes.clone(),
        );
        r.register(
            "host_moves",
            "Host lookups whose answer sends the host's requests to other revisions or by other \
             weights than the answer they replaced",
            self.moves.clone(),
        );
        r.register(
            "host_stale_answers",
            "Answers to forwarded requests this node marked x-activator-host-stale: the \
             forwarding entry's host answer was older than this member's subset",
            self.stale_answers.clone(),
        );
        r.register(
            "host_refresh_seconds",
            "How long a host refresh started by a stale hint or a newer local subset took, \
             until its answer was stored",
            self.refresh_seconds.clone(),
        );
    }
}

fn phase_histogram() -> Histogram {
    // 0.25 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.000_25, 2.0, 19))
}

/// The activator's metrics. Cheap to update from the request path (atomics).
pub struct Metrics {
    pub requests: Family<Outcome, Counter>,
    pub cold_start_phase: Family<PhaseLabel, Histogram, fn() -> Histogram>,
    /// Requests waiting for a slot now.
    pub queued: Gauge,
    /// Requests holding a slot on a pod now.
    pub in_flight: Gauge,
    pub pods_created: Family<ReasonLabel, Counter>,
    pub pods_deleted: Family<ReasonLabel, Counter>,
    /// Requests sent again to another pod or member after a connect failure.
    pub retries: Counter,
    /// Requests sent to another member (not a member, no share, node full, draining, not
    /// the primary).
    pub forwards: Counter,
    /// Requests a member that is not the revision's primary served itself because every
    /// member ranked ahead of it refused them.
    pub primary_refused: Counter,
    /// Lookups the API server did not answer that the directory (the subsetter's replicas)
    /// did, and those it could not answer either.
    pub directory_answered: Counter,
    /// Forwarded requests a node no longer (or not yet) in the revision's subset served from
    /// a pod it still had.
    pub served_as_former_member: Counter,
    pub directory_failed: Counter,
    /// What this node reads from the directory: its membership stream (opened, failed, first
    /// states asked again, fallbacks to the API server's watch), Revisions and Host claims.
    pub from_directory: DirectoryCounters,
    /// New pods, by where their address came from first (the node agent or the pod watch).
    pub pod_address: Family<AddressFrom, Counter>,
    /// Questions to the node agent that failed (unreachable, an error answer, a protocol
    /// fault); the pod watch still gives the address.
    pub agent_errors: Counter,
    /// Requests waiting for a pod that were sent to a peer because this activator was draining.
    pub drained_to_peers: Counter,
    /// Times this node found itself unable to start a revision's pod.
    pub node_full: Counter,
    /// Scaler decisions taken while a revision was idle past its idleTimeoutSeconds with a
    /// minScale share to keep (scaler ticks, not pods): shows minScale holding pods an idle
    /// revision would otherwise give up, and lets a test await that decision.
    pub idle_kept_min_scale: Counter,
    /// Revisions whose pods on this node, left by a previous activator process, this one
    /// adopted at start (see `adopt`).
    pub adopted_revisions: Counter,
    /// How long before the kubelet's Ready the activator's own probe found a new pod
    /// answering (0 when the kubelet's Ready came first).
    pub probe_lead: Histogram,
    /// New pods, by what made them usable first: the activator's probe or the kubelet's Ready.
    pub usable_first: Family<UsableFirst, Counter>,
    /// Requests this activator sent to the API server, by verb and resource (`api_count`).
    pub api_requests: Family<crate::ops::api_count::ApiRequest, Counter>,
    /// Requests refused 503 + Retry-After because the buffer was full (the revision's
    /// `--queue-limit` or the node's `--queue-limit-total`).
    pub buffer_full: Counter,
    /// Connections the fast lane handed to the full HTTP stack (hyper), each with the request
    /// that needed it (see `fast`).
    pub fast_lane_handovers: Counter,
    /// Member revisions a start (or re-list) found, waiting for their paced read ahead
    /// (`node::read_ahead`).
    pub read_ahead_queued: Gauge,
    /// Connections accepted on one serving thread and served on another (see `placement`).
    pub moved_on_accept: Counter,
    /// Connections moved off a hot serving thread between two requests.
    pub moved_off_hot_thread: Counter,
    /// Images pulled ahead of their revisions' first requests.
    pub prepull: PrepullMetrics,
    /// Host routing: refreshes, moves and the hints between entries and members.
    pub hosts: HostMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            cold_start_phase: Family::new_with_constructor(phase_histogram),
            queued: Gauge::default(),
            in_flight: Gauge::default(),
            pods_created: Family::default(),
            pods_deleted: Family::default(),
            retries: Counter::default(),
            forwards: Counter::default(),
            primary_refused: Counter::default(),
            directory_answered: Counter::default(),
            served_as_former_member: Counter::default(),
            directory_failed: Counter::default(),
            from_directory: Default::default(),
            pod_address: Family::default(),
            agent_errors: Counter::default(),
            drained_to_peers: Counter::default(),
            node_full: Counter::default(),
            idle_kept_min_scale: Counter::default(),
            adopted_revisions: Counter::default(),
            api_requests: Family::default(),
            probe_lead: phase_histogram(),
            usable_first: Family::default(),
            buffer_full: Counter::default(),
            fast_lane_handovers: Counter::default(),
            moved_on_accept: Counter::default(),
            read_ahead_queued: Gauge::default(),
            moved_off_hot_thread: Counter::default(),
            prepull: PrepullMetrics::default(),
            hosts: HostMetrics::default(),
        }
    }
}

impl Metrics {
    /// A new pod turned Ready in the watch; `lead`: how long before, the activator's own probe
    /// had found it answering (None: it had not).
    pub fn observe_ready_lead(&self, lead: Option<Duration>) {
        let by = if lead.is_some() {
            FirstBy::Probe
        } else {
            FirstBy::Watch
        };
        self.usable_first.get_or_create(&UsableFirst { by }).inc();
        self.probe_lead
            .observe(lead.unwrap_or_default().as_secs_f64());
    }

    pub fn observe_phase(&self, phase: Phase, d: Duration) {
        self.cold_start_phase
            .get_or_create(&PhaseLabel { phase })
            .observe(d.as_secs_f64());
    }

    pub fn pod_created(&self, reason: PodReason) {
        self.pods_created
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn pod_deleted(&self, reason: PodReason) {
        self.pods_deleted
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Pods created so far, all reasons.
    pub fn pods_created_total(&self) -> u64 {
        [
            PodReason::Cold,
            PodReason::ScaleOut,
            PodReason::ScaleIn,
            PodReason::Idle,
            PodReason::Failed,
            PodReason::NotReady,
        ]
        .iter()
        .map(|reason| {
            self.pods_created
                .get_or_create(&ReasonLabel { reason: *reason })
                .get()
        })
        .sum()
    }

    /// A registry exposing these metrics under the `activator_` prefix.
    pub fn registry(self: &std::sync::Arc<Self>) -> Registry {
        let mut r = Registry::with_prefix("activator");
        r.register(
            "requests",
            "Requests answered, by route (warm, cold, forwarded, refused) and status code",
            self.requests.clone(),
        );
        r.register(
            "cold_start_phase_seconds",
            "Cold-start phases, from the arrival of the first request that found no pod",
            self.cold_start_phase.clone(),
        );
        r.register(
            "queued_requests",
            "Requests waiting for a slot on a pod",
            self.queued.clone(),
        );
        r.register(
            "in_flight_requests",
            "Requests holding a slot on a pod",
            self.in_flight.clone(),
        );
        r.register(
            "pods_created",
            "App pods created by this activator, by reason",
            self.pods_created.clone(),
        );
        r.register(
            "pods_deleted",
            "App pods deleted by this activator, by reason",
            self.pods_deleted.clone(),
        );
        r.register(
            "retries",
            "Requests sent again to another pod or member after a connection failure",
            self.retries.clone(),
        );
        r.register(
            "forwards",
            "Requests sent to another member of the revision's subset",
            self.forwards.clone(),
        );
        r.register(
            "primary_refused",
            "Requests a member that is not the revision's primary served itself because every \
             member ranked ahead of it refused them",
            self.primary_refused.clone(),
        );
        r.register(
            "directory_answered",
            "Host or revision lookups the API server did not answer that the directory (the \
             subsetter's replicas) answered",
            self.directory_answered.clone(),
        );
        r.register(
            "served_as_former_member",
            "Forwarded requests a node not (or no longer) in the revision's subset served from a \
             pod it still had, while the subset moved",
            self.served_as_former_member.clone(),
        );
        r.register(
            "directory_failed",
            "Host or revision lookups neither the API server nor the directory answered",
            self.directory_failed.clone(),
        );
        let s = &self.from_directory;
        r.register(
            "member_streams_opened",
            "Membership streams opened from a directory replica (a first one, resumes)",
            s.opened.clone(),
        );
        r.register(
            "member_stream_failures",
            "Membership stream attempts that failed (no connection, a refusal, a bad frame)",
            s.failed.clone(),
        );
        r.register(
            "member_stream_doubts",
            "Membership syncs that disagreed with the copies held (a first state asked again)",
            s.doubted.clone(),
        );
        r.register(
            "member_stream_fallbacks",
            "Times no directory replica answered long enough that the API server's watch of \
             this node's memberships took over",
            s.fallbacks.clone(),
        );
        r.register(
            "directory_revisions_read",
            "Revisions read from a directory replica (a read ahead, a request's read) instead of \
             the API server",
            s.revisions_read.clone(),
        );
        r.register(
            "directory_host_claims_read",
            "Host lookups a directory replica answered instead of a label-selected list on the \
             API server",
            s.host_claims_read.clone(),
        );
        r.register(
            "pod_address",
            "New pods, by where their address came from first: the node agent (the sandbox, \
             from the container runtime) or the pod watch (the kubelet's status)",
            self.pod_address.clone(),
        );
        r.register(
            "node_agent_errors",
            "Questions to the node agent that failed (unreachable, an error answer, a \
             protocol fault); the pod watch still gives the address",
            self.agent_errors.clone(),
        );
        r.register(
            "drained_to_peers",
            "Requests waiting for a pod sent to a peer while draining",
            self.drained_to_peers.clone(),
        );
        r.register(
            "node_full",
            "Times this node could not start a revision's pod and sent its requests elsewhere",
            self.node_full.clone(),
        );
        r.register(
            "idle_kept_min_scale",
            "Scaler decisions taken while a revision was idle past its idleTimeoutSeconds with \
             a minScale share of pods to keep",
            self.idle_kept_min_scale.clone(),
        );
        r.register(
            "adopted_revisions",
            "Revisions whose pods on this node, left by a previous activator process, were \
             adopted at start (so they idle out without a request)",
            self.adopted_revisions.clone(),
        );
        r.register(
            "probe_lead_seconds",
            "How long before the kubelet reported a new pod Ready the activator's own probe \
             found it answering (0 when the kubelet's Ready came first)",
            self.probe_lead.clone(),
        );
        r.register(
            "pod_usable_first",
            "New pods, by what found them usable first: the activator's probe or the \
             kubelet's Ready (watch)",
            self.usable_first.clone(),
        );
        r.register(
            "api_requests",
            "Requests this activator sent to the API server, by verb and resource",
            self.api_requests.clone(),
        );
        r.register(
            "buffer_full",
            "Requests refused 503 with Retry-After because the buffer was full (a revision's \
             --queue-limit or the node's --queue-limit-total)",
            self.buffer_full.clone(),
        );
        r.register(
            "fast_lane_handovers",
            "Connections the fast lane handed to the full HTTP stack, with the request that \
             needed it (not plain HTTP/1.1, revision not by headers or not cached, not a member \
             with a share, forwarded, draining, spans on)",
            self.fast_lane_handovers.clone(),
        );
        r.register(
            "connections_moved_on_accept",
            "Connections accepted on one serving thread and served on another (the first \
             threads take --conns-per-thread each before the next is used)",
            self.moved_on_accept.clone(),
        );
        r.register(
            "connections_moved_off_hot_thread",
            "Connections moved between two requests from a serving thread busy --thread-hot of \
             the time to one busy less than --thread-cool",
            self.moved_off_hot_thread.clone(),
        );
        r.register(
            "read_ahead_queued",
            "Member revisions found by a start (or a re-list of the subsets) still waiting \
             for their read ahead, paced by --read-ahead-per-second",
            self.read_ahead_queued.clone(),
        );
        self.prepull.register(&mut r);
        self.hosts.register(&mut r);
        r
    }
}
