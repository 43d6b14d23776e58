//! Everything the activator is configured with, in one place (the binary fills it from flags
//! and the downward-API environment; tests and the load test build it directly).

use std::net::SocketAddr;
use std::time::Duration;

/// [`ActivatorConfig::conns_per_thread`] by default: enough that a thread under light load finds
/// several connections ready per wake-up (measured in docs/benchmarks.md: 8 connections on
/// one thread cost less CPU per request than 4 on each of two, 32 on one thread were slower
/// than 16 on each of two).
pub const DEFAULT_CONNS_PER_THREAD: usize = 16;

pub use crate::node::pool::PoolConfig;
pub use crate::node::read_ahead::ReadAheadConfig;

/// Configuration of one activator.
#[derive(Debug, Clone)]
pub struct ActivatorConfig {
    /// The node this activator runs on (`NODE_NAME`): app pods are created with this `spec.nodeName`.
    pub node_name: String,
    /// This activator's own pod (`POD_NAME`, `POD_NAMESPACE`), for logs and events.
    pub pod_name: String,
    pub pod_namespace: String,
    /// Where requests are accepted (port 8080 on the pod IP by default).
    pub data_addr: SocketAddr,
    /// `/healthz`, `/readyz`, `/metrics` (port 9090 by default).
    pub admin_addr: SocketAddr,
    /// Upper bound on connecting to a pod or a peer activator.
    pub connect_timeout: Duration,
    /// How long an idle pooled connection to a pod or peer is kept.
    pub pool_idle_timeout: Duration,
    /// How many times a request without a body is retried on another connection attempt
    /// when the app or peer refuses the connection.
    pub connect_retries: u32,
    /// How long a non-member caches a revision's ActivationEndpoints before reading it again.
    pub endpoints_ttl: Duration,
    /// How long a Host's revision, found by a label-selected LIST of ActivationEndpoints, is
    /// used before it is looked up again (in the background; requests keep routing).
    pub host_ttl: Duration,
    /// How long a Host no revision claims is answered 404 without asking again.
    pub host_miss_ttl: Duration,
    /// Whether a request that names no revision by headers is routed by its Host header.
    /// Off: it is answered 404 and no Host lookup reaches the API server (for clusters where
    /// an ingress in front names every request's revision).
    pub host_routing: bool,
    /// Buffering, throttling and local scaling.
    pub pool: PoolConfig,
    /// How the Revisions of the memberships a start (or re-list) finds are read ahead.
    pub read_ahead: ReadAheadConfig,
    /// Threads serving the data port, each with its own single-threaded runtime and listener
    /// (SO_REUSEPORT). 0 or 1: served on the caller's runtime (tests and the load test run
    /// many activators in one process). The binary uses one per core.
    pub io_threads: usize,
    /// Connections a serving thread takes before the next thread is used (fewer wake-ups
    /// per request under light load); 0: the kernel spreads them ([`crate::threads::placement`]).
    pub conns_per_thread: usize,
    /// A serving thread busy at least this share of the time takes no new connections while
    /// another is not, and moves some of its own, between two requests, to a thread busy less
    /// than `thread_cool`.
    pub thread_hot: f64,
    pub thread_cool: f64,
    /// How long shutdown waits for in-flight requests before closing their connections
    /// (keep it below the pod's terminationGracePeriodSeconds).
    pub drain_timeout: Duration,
    /// How long a request body may send nothing while it is being proxied before the request
    /// is answered `408 Request Timeout` and both its connections are closed (a client that
    /// declares a length and stalls would otherwise hold them, and the app's, indefinitely).
    pub body_idle_timeout: Duration,
    /// Whether plain HTTP/1.1 requests for revisions this node serves are carried by the fast
    /// lane (`fast`), with hyper serving everything else; off, hyper serves every request.
    pub fast_lane: bool,
    /// The cluster's hop secret ([`crate::pipeline::hop`]): forwarded requests from peers that prove it
    /// are not forwarded again. None: no hop is honoured.
    pub hop: crate::pipeline::hop::HopAuth,
    /// The node agent's socket ([`crate::node::node_addr`]): a starting pod's address from the
    /// container runtime as soon as its sandbox has one. None: from the pod watch only.
    pub node_agent: Option<std::path::PathBuf>,
    /// Whether member revisions' images are pulled ahead of their first request, through the
    /// node agent ([`crate::node::prepull`]); nothing without `node_agent`.
    pub prepull: bool,
    /// Pulls in flight at once on this node.
    pub prepull_concurrency: usize,
    /// Whether revisions' image pull secrets (and their service accounts') are read to
    /// pre-pull private images (needs `get` on Secrets and ServiceAccounts: docs/security.md).
    pub prepull_secrets: bool,
    /// Where a Host or revision the API server does not answer is looked up
    /// ([`crate::cache::directory`]): the subsetter's replicas.
    pub directory: crate::cache::directory::DirectorySource,
    /// Whether this node's memberships are first asked of the directory at start, not
    /// listed (`cache::seeded`): a label-selected list scans every subset on the API server.
    pub members_from_directory: bool,
    /// Whether this node's memberships are streamed by a directory replica
    /// (`cache::member_stream`) rather than watched on the API server, when there is a
    /// directory. Off: the watch (its first state from the directory, as above).
    pub members_streamed: bool,
    /// How a membership stream lives (its age, its silence, the fallback's bound).
    pub member_stream: crate::cache::member_stream::Tuning,
}

impl ActivatorConfig {
    /// What the upstream connections take of this.
    pub fn upstream(&self) -> crate::upstream::proxy::UpstreamConfig {
        crate::upstream::proxy::UpstreamConfig {
            connect_timeout: self.connect_timeout,
            pool_idle_timeout: self.pool_idle_timeout,
            connect_retries: self.connect_retries,
            body_idle_timeout: self.body_idle_timeout,
        }
    }

    /// What the pre-pull takes of this.
    pub fn prepull(&self) -> crate::node::prepull::PrepullConfig {
        crate::node::prepull::PrepullConfig {
            concurrency: self.prepull_concurrency,
            secrets: self.prepull_secrets,
            ..Default::default()
        }
    }

    /// A configuration with the defaults for everything but the identity and addresses.
    pub fn new(
        node_name: impl Into<String>,
        data_addr: SocketAddr,
        admin_addr: SocketAddr,
    ) -> Self {
        let node_name = node_name.into();
        Self {
            pod_name: format!("local-activator-{node_name}"),
            pod_namespace: "local-activator".into(),
            node_name,
            data_addr,
            admin_addr,
            connect_timeout: Duration::from_secs(2),
            pool_idle_timeout: Duration::from_secs(90),
            connect_retries: 3,
            endpoints_ttl: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(90),
            host_ttl: Duration::from_secs(10),
            host_miss_ttl: Duration::from_secs(1),
            host_routing: true,
            pool: PoolConfig::default(),
            read_ahead: ReadAheadConfig::default(),
            io_threads: 0,
            conns_per_thread: DEFAULT_CONNS_PER_THREAD,
            thread_hot: crate::threads::placement::HOT as f64 / 1000.0,
            thread_cool: crate::threads::placement::COOL as f64 / 1000.0,
            body_idle_timeout: Duration::from_secs(30),
            fast_lane: true,
            hop: crate::pipeline::hop::HopAuth::none(),
            node_agent: None,
            prepull: true,
            prepull_concurrency: 1,
            prepull_secrets: false,
            directory: crate::cache::directory::DirectorySource::Off,
            members_from_directory: true,
            members_streamed: true,
            member_stream: Default::default(),
        }
    }
}
