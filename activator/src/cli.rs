//! The activator's command line: flags, and the downward-API environment they fall back to.
//! In the library so that the deploy manifests can be checked against it (a test parses the
//! DaemonSet's args and env with it). [`Args::config`] maps a parsed command line to the
//! [`ActivatorConfig`] in one place; each flag's default is the default of the field it sets
//! (a test compares them).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::Parser;
use clap::builder::BoolishValueParser;

use crate::cache::directory::DirectorySource;
use crate::config::{ActivatorConfig, PoolConfig};

/// Environment variables the binary reads outside these flags.
pub const OTHER_ENV: &[&str] = &["RUST_LOG", "KUBECONFIG"];

#[derive(Parser, Debug)]
#[command(about = "local-activator: the node-local scale-to-zero data plane")]
pub struct Args {
    /// This node (downward API: spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    #[arg(long, env = "POD_NAME", default_value = "local-activator")]
    pub pod_name: String,
    #[arg(long, env = "POD_NAMESPACE", default_value = "local-activator")]
    pub pod_namespace: String,
    /// The address to listen on (downward API: status.podIP).
    #[arg(long, env = "POD_IP", default_value = "0.0.0.0")]
    pub pod_ip: IpAddr,
    #[arg(long, env = "DATA_PORT", default_value_t = crds::contract::DATA_PORT)]
    pub data_port: u16,
    #[arg(long, env = "ADMIN_PORT", default_value_t = crds::contract::ADMIN_PORT)]
    pub admin_port: u16,
    /// Threads serving the data port (0: one per core). Each runs its own event loop, as
    /// nginx runs a worker per core.
    #[arg(long, env = "IO_THREADS", default_value_t = 0)]
    pub io_threads: usize,

    /// Connections a serving thread takes before the next one is used (0: the kernel
    /// spreads them).
    #[arg(long, env = "CONNS_PER_THREAD", default_value_t = crate::config::DEFAULT_CONNS_PER_THREAD)]
    pub conns_per_thread: usize,
    /// A serving thread busy at least this share of the time takes no new connections while
    /// another is not, and moves some of its own to a thread busy less than --thread-cool.
    #[arg(long, env = "THREAD_HOT", default_value = "0.9", value_parser = fraction)]
    pub thread_hot: f64,
    #[arg(long, env = "THREAD_COOL", default_value = "0.6", value_parser = fraction)]
    pub thread_cool: f64,

    /// Resolve requests that name no revision by headers through their Host header (a
    /// label-selected LIST of ActivationEndpoints per unknown Host). Off: such requests get a
    /// 404 and no Host lookup reaches the API server (an ingress in front names revisions).
    #[arg(long, env = "HOST_ROUTING", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub host_routing: bool,

    /// Carry plain HTTP/1.1 requests for revisions this node serves as bytes (the fast
    /// lane), leaving the rest to the full HTTP stack. Off: the full stack serves every request.
    #[arg(long, env = "FAST_LANE", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub fast_lane: bool,

    /// Requests one revision may have waiting on this node (then 503 + Retry-After).
    #[arg(long, env = "QUEUE_LIMIT", default_value = "10000", value_parser = at_least_one)]
    pub queue_limit: usize,
    /// Requests all revisions together may have waiting on this node (then 503 + Retry-After).
    #[arg(long, env = "QUEUE_LIMIT_TOTAL", default_value = "50000", value_parser = at_least_one)]
    pub queue_limit_total: usize,
    /// Fraction of containerConcurrency a pod runs at before another is added, in (0, 1].
    #[arg(long, alias = "target-utilization", env = "TARGET_UTILISATION",
          default_value = "0.7", value_parser = fraction)]
    pub target_utilisation: f64,
    /// How long demand must fit in fewer pods before one is removed.
    #[arg(long, env = "SCALE_IN_WINDOW", default_value = "30s", value_parser = duration)]
    pub scale_in_window: Duration,
    /// Pods of one revision this node runs at most, whatever maxScale says.
    #[arg(long, env = "MAX_PODS_PER_REVISION", default_value = "20", value_parser = at_least_one_u32)]
    pub max_pods_per_revision: u32,
    /// A pod not usable this long after it appeared is deleted and the node counts as full
    /// for its revision.
    #[arg(long, env = "POD_START_TIMEOUT", default_value = "120s", value_parser = positive_duration)]
    pub pod_start_timeout: Duration,
    /// How long a node that could not start a revision's pod sends its requests elsewhere.
    #[arg(long, env = "FULL_BACKOFF", default_value = "30s", value_parser = duration)]
    pub full_backoff: Duration,
    /// Upper bound on the interval between readiness probes of a starting pod.
    #[arg(long, env = "PROBE_INTERVAL_MAX", default_value = "250ms", value_parser = positive_duration)]
    pub probe_interval_max: Duration,

    /// Upper bound on connecting to a pod or a peer activator.
    #[arg(long, env = "CONNECT_TIMEOUT", default_value = "2s", value_parser = positive_duration)]
    pub connect_timeout: Duration,
    /// How long an idle pooled connection to a pod or peer is kept.
    #[arg(long, env = "POOL_IDLE_TIMEOUT", default_value = "90s", value_parser = positive_duration)]
    pub pool_idle_timeout: Duration,
    /// Times a request without a body is tried again when a pod or peer refuses the connection.
    #[arg(long, env = "CONNECT_RETRIES", default_value_t = 3)]
    pub connect_retries: u32,
    /// How long a non-member caches a revision's ActivationEndpoints (0s: read every time).
    #[arg(long, env = "ENDPOINTS_TTL", default_value = "5s", value_parser = duration)]
    pub endpoints_ttl: Duration,
    /// How long a Host's revision is used before it is looked up again in the background.
    #[arg(long, env = "HOST_TTL", default_value = "10s", value_parser = duration)]
    pub host_ttl: Duration,
    /// How long a Host no revision claims is answered 404 without asking again.
    #[arg(long, env = "HOST_MISS_TTL", default_value = "1s", value_parser = duration)]
    pub host_miss_ttl: Duration,
    /// How long the activator keeps serving after SIGTERM, with /readyz failing, before it
    /// stops accepting: those that route to it (ingresses, peers reading ActivationEndpoints)
    /// learn that it is going only after the pod is marked terminating; until they do, they
    /// still send here, and a pod that had already exited would leave them a dead address.
    #[arg(long, env = "SHUTDOWN_DELAY", default_value = "5s", value_parser = duration)]
    pub shutdown_delay: Duration,
    /// How long SIGTERM waits for in-flight requests (keep it below the pod's
    /// terminationGracePeriodSeconds).
    #[arg(long, env = "DRAIN_TIMEOUT", default_value = "90s", value_parser = duration)]
    pub drain_timeout: Duration,
    /// How long a request body may send nothing before the request is answered 408 (and a
    /// response body, or a client that stops reading, before the connection closes).
    #[arg(long, env = "BODY_IDLE_TIMEOUT", default_value = "30s", value_parser = positive_duration)]
    pub body_idle_timeout: Duration,
    /// A file holding the cluster's hop secret (a mounted Secret), which proves to a peer
    /// that a forwarded request came from an activator. Unset: no hop is honoured.
    #[arg(long, env = "HOP_SECRET_FILE")]
    pub hop_secret_file: Option<std::path::PathBuf>,
    /// The node agent's unix socket (a sidecar with the node's container runtime): a
    /// starting pod's address from its sandbox, before the kubelet reports it. Unset: the
    /// pod watch alone says where a pod is (docs/node-agent.md).
    #[arg(long, env = "NODE_AGENT_SOCKET")]
    pub node_agent_socket: Option<std::path::PathBuf>,
    /// Pull member revisions' images through the node agent before their first request
    /// (needs --node-agent-socket; docs/node-agent.md).
    #[arg(long, env = "PREPULL", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub prepull: bool,
    /// Image pulls in flight at once on this node.
    #[arg(long, env = "PREPULL_CONCURRENCY", default_value = "1", value_parser = at_least_one)]
    pub prepull_concurrency: usize,
    /// Read revisions' image pull secrets (and their service accounts') to pre-pull private
    /// images. Needs `get` on Secrets and ServiceAccounts (an opt-in RBAC block, see
    /// docs/security.md). Off: revisions naming pull secrets are not pre-pulled.
    #[arg(long, env = "PREPULL_SECRETS", default_value = "false", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub prepull_secrets: bool,
    /// Member revisions a start (or a re-list of the subsets) finds are read ahead at most
    /// this many a second, so that activators restarting together do not read every one at once
    /// (a request for one not read yet reads it itself). 0: they are not read ahead.
    #[arg(long, env = "READ_AHEAD_PER_SECOND", default_value = "0.2", value_parser = rate)]
    pub read_ahead_per_second: f64,
    /// Those reads in flight at once.
    #[arg(long, env = "READ_AHEAD_IN_FLIGHT", default_value = "2", value_parser = at_least_one)]
    pub read_ahead_in_flight: usize,
    /// The directory's replicas (the subsetter's pods, in this activator's namespace), by
    /// label: a Host or revision the API server does not answer is looked up there, so warm
    /// traffic survives an API server outage. Empty: no directory.
    #[arg(
        long,
        env = "DIRECTORY_SELECTOR",
        default_value = "app.kubernetes.io/name=local-activator,app.kubernetes.io/component=subsetter"
    )]
    pub directory_selector: String,
    /// The replicas' directory port.
    #[arg(long, env = "DIRECTORY_PORT", default_value_t = crds::directory::DIRECTORY_PORT)]
    pub directory_port: u16,
    /// Ask the directory for this node's memberships at start, and watch them from the
    /// version it answers, instead of listing them (a list that scans every subset on the API
    /// server). Falls back to the list when the directory does not answer.
    #[arg(long, env = "MEMBERS_FROM_DIRECTORY", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub members_from_directory: bool,
    /// Have a directory replica stream this node's memberships (docs/member-stream.md)
    /// instead of watching them on the API server; the watch is then only a bounded
    /// fallback while no replica answers.
    #[arg(long, env = "MEMBERS_STREAMED", default_value = "true", num_args = 0..=1,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub members_streamed: bool,
}

impl Args {
    /// The configuration this command line asks for. `--io-threads 0` becomes one thread per
    /// core of this machine.
    pub fn config(&self) -> ActivatorConfig {
        let mut cfg = ActivatorConfig::new(
            self.node_name.clone(),
            SocketAddr::new(self.pod_ip, self.data_port),
            SocketAddr::new(self.pod_ip, self.admin_port),
        );
        cfg.pod_name = self.pod_name.clone();
        cfg.pod_namespace = self.pod_namespace.clone();
        cfg.io_threads = match self.io_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        cfg.conns_per_thread = self.conns_per_thread;
        cfg.thread_hot = self.thread_hot;
        cfg.thread_cool = self.thread_cool;
        cfg.host_routing = self.host_routing;
        cfg.fast_lane = self.fast_lane;
        cfg.connect_timeout = self.connect_timeout;
        cfg.pool_idle_timeout = self.pool_idle_timeout;
        cfg.connect_retries = self.connect_retries;
        cfg.endpoints_ttl = self.endpoints_ttl;
        cfg.host_ttl = self.host_ttl;
        cfg.host_miss_ttl = self.host_miss_ttl;
        cfg.drain_timeout = self.drain_timeout;
        cfg.body_idle_timeout = self.body_idle_timeout;
        cfg.node_agent = self.node_agent_socket.clone();
        cfg.prepull = self.prepull;
        cfg.prepull_concurrency = self.prepull_concurrency;
        cfg.prepull_secrets = self.prepull_secrets;
        cfg.read_ahead = crate::config::ReadAheadConfig {
            per_second: self.read_ahead_per_second,
            in_flight: self.read_ahead_in_flight,
        };
        cfg.members_from_directory = self.members_from_directory;
        cfg.members_streamed = self.members_streamed;
        cfg.directory = if self.directory_selector.is_empty() {
            DirectorySource::Off
        } else {
            DirectorySource::Pods {
                namespace: self.pod_namespace.clone(),
                selector: self.directory_selector.clone(),
                port: self.directory_port,
            }
        };
        cfg.pool = PoolConfig {
            queue_limit: self.queue_limit,
            queue_limit_total: self.queue_limit_total,
            target_utilisation: self.target_utilisation,
            scale_in_window: self.scale_in_window,
            max_pods_per_revision: self.max_pods_per_revision,
            pod_start_timeout: self.pod_start_timeout,
            full_backoff: self.full_backoff,
            probe_interval_max: self.probe_interval_max,
        };
        cfg
    }
}

/// A duration in a human form: `30s`, `250ms`, `2m`, `1h 30m`, `1.5s` (jiff's friendly
/// format; ISO 8601 `PT30S` too). Not negative.
fn duration(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration = s.trim().parse().map_err(|e| {
        format!("{s:?} is not a duration (write it like 30s, 250ms, 2m or 1h30m): {e}")
    })?;
    Duration::try_from(d).map_err(|_| format!("{s:?}: a duration cannot be negative"))
}

/// A [`duration`] above zero.
fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        Duration::ZERO => Err(format!("{s:?}: must be longer than zero")),
        d => Ok(d),
    }
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?} is not a whole number: {e}")),
    }
}

fn at_least_one_u32(s: &str) -> Result<u32, String> {
    let n = at_least_one(s)?;
    u32::try_from(n).map_err(|_| format!("{s:?} is more than {}", u32::MAX))
}

/// A rate: a finite number, 0 or more.
fn rate(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if f.is_finite() && f >= 0.0 {
        Ok(f)
    } else {
        Err(format!("{s:?}: must be a finite number, 0 or more"))
    }
}

/// A fraction in (0, 1].
fn fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if f > 0.0 && f <= 1.0 {
        Ok(f)
    } else {
        Err(format!("{s:?}: must be above 0 and at most 1 (0.7 = 70 %)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("activator").chain(args.iter().copied()))
    }

    /// The defaults of the flags are the defaults of the configuration (compared whole,
    /// through Debug: a field added to the configuration without a flag of the same default
    /// shows here).
    #[test]
    fn defaults_are_the_configuration_defaults() {
        let args = parse(&["--node-name=n1", "--io-threads=4"]).unwrap();
        let mut want = ActivatorConfig::new(
            "n1",
            "0.0.0.0:8080".parse().unwrap(),
            "0.0.0.0:9090".parse().unwrap(),
        );
        want.pod_name = "local-activator".into();
        want.io_threads = 4;
        // The binary finds the subsetter's replicas; the library asks no directory.
        want.directory = DirectorySource::Pods {
            namespace: "local-activator".into(),
            selector:
                "app.kubernetes.io/name=local-activator,app.kubernetes.io/component=subsetter"
                    .into(),
            port: crds::directory::DIRECTORY_PORT,
        };
        assert_eq!(format!("{:?}", args.config()), format!("{want:?}"));
        let off = parse(&["--node-name=n1", "--directory-selector="]).unwrap();
        assert_eq!(off.config().directory, DirectorySource::Off);
    }

    #[test]
    fn a_full_command_line_gives_the_configuration_it_names() {
        let args = parse(&[
            "--node-name=n1",
            "--pod-name=la-x",
            "--pod-namespace=ops",
            "--pod-ip=10.0.0.7",
            "--data-port=8081",
            "--admin-port=9091",
            "--io-threads=3",
            "--conns-per-thread=0",
            "--thread-hot=0.8",
            "--thread-cool=0.5",
            "--host-routing=false",
            "--queue-limit=100",
            "--queue-limit-total=1000",
            "--target-utilisation=0.5",
            "--scale-in-window=1m",
            "--max-pods-per-revision=4",
            "--pod-start-timeout=45s",
            "--full-backoff=0s",
            "--probe-interval-max=100ms",
            "--connect-timeout=1500ms",
            "--pool-idle-timeout=2m 30s",
            "--connect-retries=0",
            "--endpoints-ttl=0s",
            "--host-ttl=1m",
            "--host-miss-ttl=500ms",
            "--drain-timeout=1.5s",
            "--body-idle-timeout=PT10S",
            "--fast-lane=false",
            "--node-agent-socket=/run/local-activator/agent.sock",
            "--prepull=false",
            "--prepull-concurrency=5",
            "--prepull-secrets",
            "--directory-selector=app=dir",
            "--directory-port=7000",
            "--read-ahead-per-second=1.5",
            "--read-ahead-in-flight=4",
        ])
        .unwrap();
        let c = args.config();
        let mut want = ActivatorConfig::new(
            "n1",
            "10.0.0.7:8081".parse().unwrap(),
            "10.0.0.7:9091".parse().unwrap(),
        );
        want.pod_name = "la-x".into();
        want.pod_namespace = "ops".into();
        want.io_threads = 3;
        want.conns_per_thread = 0;
        want.thread_hot = 0.8;
        want.thread_cool = 0.5;
        want.host_routing = false;
        want.connect_timeout = Duration::from_millis(1500);
        want.pool_idle_timeout = Duration::from_secs(150);
        want.connect_retries = 0;
        want.endpoints_ttl = Duration::ZERO;
        want.host_ttl = Duration::from_secs(60);
        want.host_miss_ttl = Duration::from_millis(500);
        want.drain_timeout = Duration::from_millis(1500);
        want.body_idle_timeout = Duration::from_secs(10);
        want.fast_lane = false;
        want.node_agent = Some("/run/local-activator/agent.sock".into());
        want.prepull = false;
        want.prepull_concurrency = 5;
        want.prepull_secrets = true;
        want.read_ahead = crate::config::ReadAheadConfig {
            per_second: 1.5,
            in_flight: 4,
        };
        want.directory = DirectorySource::Pods {
            namespace: "ops".into(),
            selector: "app=dir".into(),
            port: 7000,
        };
        want.pool = PoolConfig {
            queue_limit: 100,
            queue_limit_total: 1000,
            target_utilisation: 0.5,
            scale_in_window: Duration::from_secs(60),
            max_pods_per_revision: 4,
            pod_start_timeout: Duration::from_secs(45),
            full_backoff: Duration::ZERO,
            probe_interval_max: Duration::from_millis(100),
        };
        assert_eq!(format!("{c:?}"), format!("{want:?}"));
    }

    #[test]
    fn host_routing_is_a_switch() {
        let on = |a: &[&str]| parse(a).unwrap().host_routing;
        assert!(on(&["--node-name=n"]));
        assert!(on(&["--node-name=n", "--host-routing"]));
        assert!(on(&["--node-name=n", "--host-routing=true"]));
        assert!(!on(&["--node-name=n", "--host-routing=false"]));
        assert!(!on(&["--node-name=n", "--host-routing", "off"]));
        assert!(parse(&["--node-name=n", "--host-routing=maybe"]).is_err());
    }

    /// Each bad value is refused, and the message names the flag and says what is wrong.
    #[test]
    fn bad_values_are_refused_with_a_reason() {
        let cases = [
            ("--queue-limit=0", "must be at least 1"),
            ("--prepull-concurrency=0", "must be at least 1"),
            ("--queue-limit=-3", "not a whole number"),
            ("--queue-limit-total=lots", "not a whole number"),
            ("--max-pods-per-revision=0", "must be at least 1"),
            ("--max-pods-per-revision=5000000000", "more than"),
            ("--target-utilisation=0", "above 0 and at most 1"),
            ("--target-utilisation=1.5", "above 0 and at most 1"),
            ("--target-utilisation=70%", "not a number"),
            ("--scale-in-window=30", "not a duration"),
            ("--scale-in-window=soon", "not a duration"),
            ("--drain-timeout=-5s", "cannot be negative"),
            ("--connect-timeout=0s", "longer than zero"),
            ("--pod-start-timeout=0ms", "longer than zero"),
            ("--probe-interval-max=0s", "longer than zero"),
            ("--body-idle-timeout=0s", "longer than zero"),
            ("--connect-retries=-1", "invalid"),
            ("--read-ahead-per-second=-1", "0 or more"),
            ("--read-ahead-per-second=inf", "finite"),
            ("--read-ahead-per-second=fast", "not a number"),
            ("--read-ahead-in-flight=0", "must be at least 1"),
        ];
        for (arg, why) in cases {
            let e = parse(&["--node-name=n", arg]).expect_err(arg).to_string();
            let flag = arg.split('=').next().unwrap();
            assert!(e.contains(flag), "{arg}: {e}");
            assert!(e.contains(why), "{arg}: {e}");
        }
    }

    #[test]
    fn durations_read_in_human_forms() {
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        assert!(duration("").is_err());
    }
}
