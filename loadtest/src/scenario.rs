//! Named scenarios (`loadtest run SCENARIO`): their knobs (flags, or a YAML scenario file with
//! the same keys), what every scenario shares (the cluster, revisions, the report), and the
//! dispatch to each scenario's own module under `scenarios/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crds::Revision;
use kube::Api;
use kube::api::PostParams;
use kubesim::node::Delay;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::cluster::{
    CALIBRATED_QUORUM_READ_LATENCY, CALIBRATED_STORAGE_BATCH, CALIBRATED_STORAGE_LANES,
    CALIBRATED_STORAGE_WRITE_COST, CALIBRATED_WRITE_LATENCY, ClusterOptions, SimCluster,
};
use crate::demo::{echo_revision, host_of, wait_subsets};
use crate::scenarios;

/// The scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// R revisions all woken at once by C concurrent clients.
    ColdBurst,
    /// Warm traffic at a fixed arrival rate (open loop), against direct and nginx.
    Steady,
    /// K nodes killed under load: failed requests, time until subsets are repaired.
    NodeFailure,
    /// Bursts on revisions with a small maxScale: the most pods ever seen at once.
    Maxscale,
    /// Activators leaving and joining under load: member changes, extra cold starts.
    Churn,
    /// Revisions go quiet, scale to zero, and wake again.
    Idle,
    /// Thousands of nodes × many revisions: memory, watch events, API load, assignment time.
    Scale,
    /// Time to a bound pod: the activator's own POST against a Deployment scaled 0 → 1.
    ControlPath,
    /// Bulk writes (ConfigMap creates) at several concurrencies: writes/s and latency.
    WriteRate,
    /// A deploy under live traffic: v1 warm, v2 takes its host, a Route splits it 10/90, a
    /// rollback to v1; failures, cold waits and per-activator move times per phase.
    Deploy,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::ColdBurst => "cold-burst",
            Scenario::Steady => "steady",
            Scenario::NodeFailure => "node-failure",
            Scenario::Maxscale => "maxscale",
            Scenario::Churn => "churn",
            Scenario::Idle => "idle",
            Scenario::Scale => "scale",
            Scenario::ControlPath => "control-path",
            Scenario::WriteRate => "write-rate",
            Scenario::Deploy => "deploy",
        }
    }
}

/// Every knob of every scenario; each scenario reads the ones it needs and has its own
/// defaults for those left unset. Flags override a scenario file's values.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Knobs {
    /// The scenario (in a scenario file; on the command line it is the positional argument).
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<Scenario>,
    /// Simulated nodes, each with an activator (on a real cluster: nodes registered there).
    #[arg(long, alias = "sim-nodes")]
    pub nodes: Option<usize>,
    /// Revisions.
    #[arg(long)]
    pub revisions: Option<usize>,
    /// Concurrent clients (cold-burst, maxscale; deploy: closed-loop clients).
    #[arg(long)]
    pub clients: Option<usize>,
    /// Activators per revision (N).
    #[arg(long)]
    pub activators: Option<usize>,
    /// Simulated pod start delay, ms.
    #[arg(long)]
    pub start_delay_ms: Option<u64>,
    /// The sim app's time per request, ms.
    #[arg(long)]
    pub app_delay_ms: Option<u64>,
    /// The embedded API server's write-latency model (`6ms`, `lognormal:6ms,0.5`, `0ms`).
    #[arg(long)]
    pub api_write_latency: Option<String>,
    /// The embedded API server's storage time per quorum read (a GET or LIST without
    /// resourceVersion), same syntax.
    #[arg(long)]
    pub api_quorum_read_latency: Option<String>,
    /// Writes and quorum reads the embedded API server's storage serves at once; more wait in
    /// line (0: no queueing).
    #[arg(long)]
    pub api_storage_lanes: Option<usize>,
    /// Writes and quorum reads one storage commit takes at most: those arriving while a lane
    /// commits share its next commit, as etcd batches them (1: one by one).
    #[arg(long)]
    pub api_storage_batch: Option<usize>,
    /// Time each write adds to a shared storage commit past the first (same syntax as the
    /// latencies).
    #[arg(long)]
    pub api_storage_write_cost: Option<String>,
    /// Concurrencies to write at, comma-separated (write-rate), e.g. `1,4,16,64,256`.
    #[arg(long)]
    pub concurrency: Option<String>,
    /// Writes per concurrency (write-rate; at least 8 per concurrent writer).
    #[arg(long)]
    pub writes: Option<usize>,
    /// Length of the measured load, seconds.
    #[arg(long)]
    pub duration_secs: Option<f64>,
    /// Arrival rate, requests per second (open loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Nodes killed (node-failure) or taken out and back (churn).
    #[arg(long)]
    pub kill_nodes: Option<usize>,
    /// The node lifecycle controller's grace period, seconds (node-failure).
    #[arg(long)]
    pub node_grace_secs: Option<f64>,
    /// maxScale of each revision (maxscale).
    #[arg(long)]
    pub max_scale: Option<i32>,
    /// containerConcurrency of each revision.
    #[arg(long)]
    pub container_concurrency: Option<i64>,
    /// idleTimeoutSeconds of each revision (idle).
    #[arg(long)]
    pub idle_timeout_secs: Option<i64>,
    /// Repetitions (bursts in maxscale, sleep/wake cycles in idle, moves in churn,
    /// sequential pods in control-path).
    #[arg(long)]
    pub cycles: Option<usize>,
    /// Share of revisions that get traffic (scale), 0..1.
    #[arg(long)]
    pub active_share: Option<f64>,
    /// Real activators run in this process (scale); the other nodes' activators are only
    /// pods in the API.
    #[arg(long)]
    pub sample_activators: Option<usize>,
    /// Reconciles the in-process subsetter runs at once (its `--concurrency`). Each holds one
    /// API write in flight, so with writes queued behind a busy storage this bounds how fast
    /// it assigns (scale).
    #[arg(long)]
    pub subsetter_concurrency: Option<u16>,
    /// Every node without a real activator runs an activator's watches and reads ahead
    /// (`activator::WatchOnly`), so the API server carries a whole DaemonSet's
    /// (scale; on by default against a real API server, off on kubesim).
    #[arg(long)]
    pub stand_in_activators: Option<bool>,
    /// Replace every stand-in activator as a DaemonSet rollout would, this share of the nodes
    /// at a time (scale, with stand-ins; 0 for no rollout; default 0.1, the chart's
    /// maxUnavailable).
    #[arg(long)]
    pub rollout_max_unavailable: Option<f64>,
    /// The rollout deletes each stand-in's pod and creates a new one on its node once it is
    /// gone, as a DaemonSet rolling update does (default); false: the pods stay and only the
    /// processes restart.
    #[arg(long)]
    pub rollout_replace_pods: Option<bool>,
    /// How long the subsetter keeps an activator lost on a Ready node as a member for its
    /// replacement, seconds (its `--replacement-hold-seconds`; default 60; 3 or less: none).
    #[arg(long)]
    pub replacement_hold_secs: Option<f64>,
    /// Whether a starting activator (stand-ins included) takes its memberships from the
    /// subsetter's directory and watches them from its version, not from a list (its
    /// `--members-from-directory`; default true).
    #[arg(long)]
    pub members_from_directory: Option<bool>,
    /// Roll the stand-ins twice, first listing their memberships, then from the directory,
    /// each its own phase of the control plane's figures (scale, with stand-ins): the two
    /// starts compared in one run.
    #[arg(long)]
    pub rollout_compare: Option<bool>,
    /// Revisions created at `--steady-create-rate` once the bulk is created and assigned,
    /// each its create's latency and its time to members measured, a control-plane phase of
    /// its own (scale; default 0: none): ongoing deployments at full size, where the bulk
    /// creation takes the API server to its limit.
    #[arg(long)]
    pub steady_creates: Option<usize>,
    /// Revisions created per second in the steady creation (scale; default 20).
    #[arg(long)]
    pub steady_create_rate: Option<f64>,
    /// Directory replicas (scale; default 1: the subsetter's own). With 2 or more and
    /// stand-ins, one beside the subsetter's is killed halfway through the bulk creation,
    /// and the activators that streamed from it are timed to their next stream.
    #[arg(long)]
    pub directory_replicas: Option<usize>,
    /// The `activator` binary to run one node's activator as its own process, for its memory
    /// idle and with its subsets (scale, on the embedded cluster; default: the one beside
    /// this program, if any).
    #[arg(long)]
    pub activator_binary: Option<std::path::PathBuf>,
    /// How requests name their revision: `headers` (as an ingress) or `host`.
    #[arg(long)]
    pub routing: Option<String>,
    /// What sits in front of the activators (node-failure, churn): `none` never retries;
    /// `retry` retries once on another member a request that failed before any response
    /// byte. With `retry` the report gives both: the first attempts are what `none` would
    /// have seen.
    #[arg(long, value_enum)]
    pub ingress: Option<crate::driver::Ingress>,
    /// Seconds of load before the deploy (deploy).
    #[arg(long)]
    pub before_secs: Option<f64>,
    /// Seconds of load after the rollback (deploy).
    #[arg(long)]
    pub after_secs: Option<f64>,
    /// Seconds the load goes on once a move has reached every activator, before the next
    /// step (deploy).
    #[arg(long)]
    pub settle_secs: Option<f64>,
    /// Requests measured under the Route's 10/90 split once every activator follows it
    /// (deploy; 2,000 give each share within about ±1.3 points at 95 %).
    #[arg(long)]
    pub split_requests: Option<usize>,
    /// The new revision's `handOverTimeoutSeconds` (deploy): how long its hand-over may wait
    /// for its pods before the host moves anyway.
    #[arg(long)]
    pub hand_over_timeout_secs: Option<i64>,
}

macro_rules! or_fields {
    ($a:ident, $b:ident, $($f:ident),*) => { Knobs { $($f: $a.$f.or($b.$f)),* } };
}

impl Knobs {
    /// These knobs, with `file`'s for those unset.
    pub fn or(self, file: Knobs) -> Knobs {
        or_fields!(
            self,
            file,
            scenario,
            nodes,
            revisions,
            clients,
            activators,
            start_delay_ms,
            app_delay_ms,
            api_write_latency,
            api_quorum_read_latency,
            api_storage_lanes,
            api_storage_batch,
            api_storage_write_cost,
            concurrency,
            writes,
            duration_secs,
            rate,
            kill_nodes,
            node_grace_secs,
            max_scale,
            container_concurrency,
            idle_timeout_secs,
            cycles,
            active_share,
            sample_activators,
            subsetter_concurrency,
            stand_in_activators,
            rollout_max_unavailable,
            rollout_replace_pods,
            replacement_hold_secs,
            members_from_directory,
            rollout_compare,
            steady_creates,
            steady_create_rate,
            directory_replicas,
            activator_binary,
            routing,
            ingress,
            before_secs,
            after_secs,
            settle_secs,
            split_requests,
            hand_over_timeout_secs
        )
    }

    /// Reads a scenario file (YAML; the keys are the flags' names).
    pub fn from_file(path: &Path) -> Result<Knobs, Error> {
        let text = std::fs::read_to_string(path)?;
        serde_saphyr::from_str(&text).map_err(|e| Error::Manifest {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    pub fn write_latency(&self) -> Result<Delay, Error> {
        self.api_write_latency
            .as_deref()
            .unwrap_or(CALIBRATED_WRITE_LATENCY)
            .parse()
            .map_err(|e| Error::Options(format!("api-write-latency: {e}")))
    }

    pub fn quorum_read_latency(&self) -> Result<Delay, Error> {
        self.api_quorum_read_latency
            .as_deref()
            .unwrap_or(CALIBRATED_QUORUM_READ_LATENCY)
            .parse()
            .map_err(|e| Error::Options(format!("api-quorum-read-latency: {e}")))
    }

    /// The storage's lanes; 0 means no queueing.
    pub fn storage_lanes(&self) -> Option<usize> {
        match self.api_storage_lanes.unwrap_or(CALIBRATED_STORAGE_LANES) {
            0 => None,
            n => Some(n),
        }
    }

    /// Requests one storage commit takes at most.
    pub fn storage_batch(&self) -> usize {
        self.api_storage_batch
            .unwrap_or(CALIBRATED_STORAGE_BATCH)
            .max(1)
    }

    pub fn storage_write_cost(&self) -> Result<Delay, Error> {
        self.api_storage_write_cost
            .as_deref()
            .unwrap_or(CALIBRATED_STORAGE_WRITE_COST)
            .parse()
            .map_err(|e| Error::Options(format!("api-storage-write-cost: {e}")))
    }

    /// The embedded API server's storage model these knobs describe.
    pub fn api_server_config(&self) -> Result<kubesim::api::ApiServerConfig, Error> {
        Ok(kubesim::api::ApiServerConfig {
            write_latency: self.write_latency()?,
            quorum_read_latency: self.quorum_read_latency()?,
            storage_lanes: self.storage_lanes(),
            storage_batch: self.storage_batch(),
            storage_write_cost: self.storage_write_cost()?,
            ..kubesim::api::ApiServerConfig::default()
        })
    }

    pub fn by_host(&self) -> Result<bool, Error> {
        match self.routing.as_deref().unwrap_or("headers") {
            "host" => Ok(true),
            "headers" => Ok(false),
            other => Err(Error::Options(format!(
                "routing: {other:?} is neither `host` nor `headers`"
            ))),
        }
    }
}

/// Where a scenario runs.
#[derive(Clone, Default)]
pub enum Target {
    /// An embedded kubesim API server (with the write-latency model).
    #[default]
    Embedded,
    /// A real API server, through this client (from `--kubeconfig`).
    Cluster(kube::Client),
}

/// What a scenario gets to run with.
pub struct Ctx {
    pub knobs: Knobs,
    pub target: Target,
    /// Ctrl-C: scenarios stop their load and report what they have.
    pub cancel: CancellationToken,
    pub progress: indicatif::ProgressBar,
}

impl Ctx {
    /// A context for tests and library use: embedded target, no progress output.
    pub fn new(knobs: Knobs) -> Self {
        Self {
            knobs,
            target: Target::Embedded,
            cancel: CancellationToken::new(),
            progress: indicatif::ProgressBar::hidden(),
        }
    }

    /// Shows a step of the run on the progress line.
    pub fn step(&self, msg: impl Into<std::borrow::Cow<'static, str>>) {
        self.progress.set_message(msg);
    }

    /// A figure measured so far, printed as soon as it is known: a long run stopped or killed
    /// before its report still leaves what it measured. Above the progress line on a terminal;
    /// otherwise (the progress line hidden, output to a file) logged as `loadtest::figures`.
    pub fn note(&self, line: &str) {
        if self.progress.is_hidden() {
            tracing::info!(target: "loadtest::figures", "{line}");
        } else {
            self.progress.println(line);
        }
    }

    /// Starts the cluster `k` describes (`nodes`, N, start delay, write latency; `f` adjusts
    /// the rest) with a namespace of its own, runs `body` on it, shuts it down (on a shared
    /// API server: deletes what it created) and reports.
    pub async fn on_cluster(
        &self,
        scenario: Scenario,
        k: &Knobs,
        f: impl FnOnce(&mut ClusterOptions),
        body: impl AsyncFnOnce(&mut SimCluster, &str) -> Result<Outcome, Error>,
    ) -> Result<Report, Error> {
        let mut opts = ClusterOptions {
            nodes: k.nodes.unwrap_or(5),
            start_delay: Delay::fixed_ms(k.start_delay_ms.unwrap_or(300)),
            default_activators: k.activators.unwrap_or(3),
            api_write_latency: k.write_latency()?,
            api_quorum_read_latency: k.quorum_read_latency()?,
            api_storage_lanes: k.storage_lanes(),
            api_storage_batch: k.storage_batch(),
            api_storage_write_cost: k.storage_write_cost()?,
            use_kubeconfig: false,
            ..ClusterOptions::default()
        };
        if let Target::Cluster(client) = &self.target {
            opts.shared_client = Some(client.clone());
        }
        if let Some(c) = k.subsetter_concurrency {
            opts.subsetter_concurrency = c;
        }
        let namespace = namespace_for(scenario);
        opts.revision_namespace = Some(namespace.clone());
        f(&mut opts);
        self.step(format!("starting a cluster of {} nodes", opts.nodes));
        let mut cluster = SimCluster::start(opts).await?;
        let outcome = match cluster.ensure_own_namespace(&namespace).await {
            Ok(()) => body(&mut cluster, &namespace).await,
            Err(e) => Err(e),
        };
        let target = cluster.api_description().to_string();
        self.step("shutting the cluster down");
        cluster.shutdown().await;
        let o = outcome?;
        Ok(Report {
            scenario,
            partial: self.cancel.is_cancelled(),
            target,
            knobs: serde_json::to_value(k).map_err(|e| Error::Options(e.to_string()))?,
            figures: o.figures,
            text: o.text,
            plots: o.plots,
        })
    }
}

/// What a scenario's body produces.
pub struct Outcome {
    pub figures: serde_json::Value,
    pub text: String,
    pub plots: Vec<(&'static str, String)>,
}

/// A namespace of the scenario's own (never one it did not create).
pub fn namespace_for(scenario: Scenario) -> String {
    format!(
        "lt-{}-{:06x}",
        scenario.name(),
        rand::random::<u32>() & 0xff_ffff
    )
}

/// Creates the revisions (the sim echo app, shaped by `f`), at most 32 creates in flight, and
/// waits until each has an ActivationEndpoints with members.
pub async fn create_revisions(
    cluster: &SimCluster,
    namespace: &str,
    names: &[String],
    f: impl Fn(&mut Revision),
) -> Result<Duration, Error> {
    Ok(create_revisions_timed(cluster, namespace, names, f)
        .await?
        .assigned)
}

/// How long [`create_revisions_timed`] took: both from its start.
#[derive(Debug, Clone, Copy)]
pub struct Creation {
    /// Until the last create was answered.
    pub created: Duration,
    /// Until every Revision's ActivationEndpoints had members.
    pub assigned: Duration,
}

/// [`create_revisions`], also saying when the creates ended (the subsetter assigns while they
/// run; what is left after them is its backlog).
pub async fn create_revisions_timed(
    cluster: &SimCluster,
    namespace: &str,
    names: &[String],
    f: impl Fn(&mut Revision),
) -> Result<Creation, Error> {
    use futures::StreamExt;
    let api: Api<Revision> = Api::namespaced(cluster.client.clone(), namespace);
    let t = std::time::Instant::now();
    // Each Revision is built as its create starts, not all up front: at 100,000 revisions the
    // harness's own copies (a template each) were half a GiB of the process.
    let results: Vec<Result<(), kube::Error>> = futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            let mut rev = echo_revision(name, namespace, vec![host_of(name, namespace)]);
            f(&mut rev);
            async move {
                match api.create(&PostParams::default(), &rev).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    let created = t.elapsed();
    let limit = Duration::from_secs(60 + names.len() as u64 / 100);
    wait_subsets(&cluster.client, namespace, names, limit).await?;
    Ok(Creation {
        created,
        assigned: t.elapsed(),
    })
}

/// Sets the sim app's env (`SIM_DELAY_MS`, `SIM_CONCURRENCY`) in a revision's template.
pub fn app_env(rev: &mut Revision, env: &[(&str, String)]) {
    let env: Vec<serde_json::Value> = env
        .iter()
        .map(|(k, v)| serde_json::json!({"name": k, "value": v}))
        .collect();
    let mut t = rev.spec.template.value();
    t["spec"]["containers"][0]["env"] = serde_json::Value::Array(env);
    rev.spec.template = t.into();
}

/// Revision names `rev-0000`….
pub fn revision_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("rev-{i:04}")).collect()
}

/// A scenario's result.
pub struct Report {
    pub scenario: Scenario,
    /// Ctrl-C ended the run early: the figures cover what ran.
    pub partial: bool,
    /// Which API server, under which model.
    pub target: String,
    /// The knobs as the scenario used them (its defaults filled in).
    pub knobs: serde_json::Value,
    /// The scenario's figures (documented per scenario in docs/load-testing.md).
    pub figures: serde_json::Value,
    /// The human-readable summary table.
    pub text: String,
    /// Pictures: (name, SVG). The first is the scenario's main picture.
    pub plots: Vec<(&'static str, String)>,
}

impl Report {
    /// The JSON report; `plots` names the files the pictures were written to.
    pub fn to_json(&self, plots: &[PathBuf]) -> serde_json::Value {
        serde_json::json!({
            "scenario": self.scenario.name(),
            "partial": self.partial,
            "target": self.target,
            "knobs": self.knobs,
            "figures": self.figures,
            "plots": plots.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        })
    }

    /// Writes the pictures (`--svg PATH`: the main one; `--out DIR`: all of them, and the
    /// JSON) and the JSON (`--json PATH`); returns the files written.
    pub fn write(
        &self,
        json: Option<&Path>,
        svg: Option<&Path>,
        out: Option<&Path>,
    ) -> Result<Vec<PathBuf>, Error> {
        let mut plots = Vec::new();
        if let (Some(path), Some((_, main))) = (svg, self.plots.first()) {
            std::fs::write(path, main)?;
            plots.push(path.to_path_buf());
        }
        if let Some(dir) = out {
            std::fs::create_dir_all(dir)?;
            for (name, s) in &self.plots {
                let path = dir.join(format!("{}-{name}.svg", self.scenario.name()));
                std::fs::write(&path, s)?;
                plots.push(path);
            }
        }
        let mut written = plots.clone();
        let body = serde_json::to_string_pretty(&self.to_json(&plots))
            .map_err(|e| Error::Options(e.to_string()))?;
        for path in json
            .map(Path::to_path_buf)
            .into_iter()
            .chain(out.map(|d| d.join(format!("{}.json", self.scenario.name()))))
        {
            std::fs::write(&path, &body)?;
            written.push(path);
        }
        Ok(written)
    }
}

/// Runs a scenario.
pub async fn run(scenario: Scenario, ctx: &Ctx) -> Result<Report, Error> {
    match scenario {
        Scenario::ColdBurst => scenarios::cold_burst::run(ctx).await,
        Scenario::Steady => scenarios::steady::run(ctx).await,
        Scenario::NodeFailure => scenarios::node_failure::run(ctx).await,
        Scenario::Maxscale => scenarios::maxscale::run(ctx).await,
        Scenario::Churn => scenarios::churn::run(ctx).await,
        Scenario::Idle => scenarios::idle::run(ctx).await,
        Scenario::Scale => scenarios::scale::run(ctx).await,
        Scenario::ControlPath => scenarios::control_path::run(ctx).await,
        Scenario::WriteRate => scenarios::write_rate::run(ctx).await,
        Scenario::Deploy => scenarios::deploy::run(ctx).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_and_the_file_fills_the_rest() {
        let file: Knobs = serde_saphyr::from_str(
            "scenario: cold-burst\nnodes: 50\nrevisions: 7\napi-write-latency: 0ms\n",
        )
        .unwrap();
        let flags = Knobs {
            nodes: Some(9),
            ..Knobs::default()
        };
        let k = flags.or(file);
        assert_eq!(k.scenario, Some(Scenario::ColdBurst));
        assert_eq!((k.nodes, k.revisions), (Some(9), Some(7)));
        assert_eq!(k.write_latency().unwrap().to_string(), "0ms");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_the_reason() {
        let bad: Result<Knobs, _> = serde_saphyr::from_str("nodez: 5\n");
        assert!(bad.unwrap_err().to_string().contains("nodez"));
        let k = Knobs {
            routing: Some("dns".into()),
            api_write_latency: Some("soon".into()),
            ..Knobs::default()
        };
        assert!(k.by_host().unwrap_err().to_string().contains("dns"));
        assert!(k.write_latency().is_err());
    }
}
