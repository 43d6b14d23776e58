//! `kubesim`: a local simulated cluster (API server, node lifecycle controller and N simulated
//! nodes) that tools can be pointed at through the kubeconfig it writes. Runs until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::node::config::parse_duration;
use kubesim::node::{
    Delay, Fleet, FleetOptions, NodeConfig, NodeLifecycleController, StartDelays, WatchMode,
    process,
};

#[derive(Parser, Debug)]
#[command(about = "A simulated Kubernetes cluster: in-memory API server and simulated nodes")]
struct Args {
    /// Number of simulated nodes (node-0000, node-0001, ...).
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Where to write the kubeconfig for clients (kubectl, the activator, tests).
    #[arg(long, default_value = "kubesim.kubeconfig")]
    kubeconfig: PathBuf,
    /// API server port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Container start delay in milliseconds (fixed); see --container-start for distributions.
    #[arg(long, default_value_t = 0)]
    start_delay_ms: u64,
    /// Container start delay: `300ms`, `uniform:100ms..1s`, `lognormal:300ms,0.5`.
    /// Overrides --start-delay-ms.
    #[arg(long)]
    container_start: Option<Delay>,
    /// Image pull delay (same syntax).
    #[arg(long, default_value = "0ms")]
    image_pull: Delay,
    /// Readiness delay after the container starts (same syntax).
    #[arg(long, default_value = "0ms")]
    readiness: Delay,
    /// The kubelet's PLEG relist period (a real kubelet's is 1s): a started container's IP,
    /// Running and Ready are reported at the node's next relist. `0ms`: at once.
    #[arg(long, default_value = "0ms")]
    relist: Delay,
    /// Each node serves a simulated node agent (a pod's IP by UID from its sandbox, before
    /// the kubelet reports it) on `<temp>/kubesim-agents-<pid>-<n>/<node>.sock`.
    #[arg(long)]
    node_agents: bool,
    /// Pod capacity of each node.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// How long a node may miss lease renewals before it is marked Unknown.
    #[arg(long, default_value = "40s", value_parser = duration)]
    node_grace: Duration,
    /// Per-node pod watches (as real kubelets), or one shared watch for very many nodes.
    #[arg(long, value_enum, default_value_t = Watch::PerNode)]
    watch: Watch,
    /// Latency added to every API request, in milliseconds.
    #[arg(long)]
    api_latency_ms: Option<u64>,
    /// Time each write (create/update/patch/delete) takes, as an etcd commit does on a real
    /// server: `6ms`, `uniform:3ms..9ms`, `lognormal:6ms,0.5`. Default none (answered from memory).
    #[arg(long, default_value = "0ms")]
    api_write_latency: Delay,
    /// Time each GET and LIST takes in the server itself (same syntax).
    #[arg(long, default_value = "0ms")]
    api_read_latency: Delay,
    /// Time a quorum read (a GET or LIST without resourceVersion) holds the storage, as etcd
    /// serves it in line with the writes (same syntax); a read naming a resourceVersion is
    /// answered from the watch cache.
    #[arg(long, default_value = "0ms")]
    api_quorum_read_latency: Delay,
    /// Writes and quorum reads the storage serves at once; more wait in line (0: no queueing).
    #[arg(long, default_value_t = 0)]
    api_storage_lanes: usize,
    /// Writes and quorum reads one commit takes at most: those that arrive while a lane
    /// commits share its next commit, as etcd batches them (1: one by one).
    #[arg(long, default_value_t = 1)]
    api_storage_batch: usize,
    /// Time each write adds to its commit past the first (same syntax as the latencies).
    #[arg(long, default_value = "0ms")]
    api_storage_write_cost: Delay,
    /// How often watches that ask for bookmarks get one (kube-apiserver: 1m).
    #[arg(long, default_value = "60s", value_parser = duration)]
    bookmark_interval: Duration,
    /// The watch cache's event window, per resource: it starts at --watch-window-min events
    /// and doubles while its oldest event is younger than 75 s, up to this many
    /// (kube-apiserver: 102400). A watch resuming from before the window gets 410 Gone.
    #[arg(long, default_value_t = kubesim::api::WINDOW_MAX)]
    watch_history: usize,
    /// The event window's lower bound (kube-apiserver: 100).
    #[arg(long, default_value_t = kubesim::api::WINDOW_MIN)]
    watch_window_min: usize,
    /// Every watcher's input and result buffer, in events (0: sized as kube-apiserver sizes
    /// them from the window: 10 to 100 for custom resources, 10 for a pod watch by node, up to
    /// 1000 for other pod watches).
    #[arg(long, default_value_t = 0)]
    watch_buffer: usize,
    /// The watch dispatch time budget's refill per second (kube-apiserver: 50ms).
    #[arg(long, default_value = "50ms", value_parser = duration)]
    watch_budget_refresh: Duration,
    /// The watch dispatch time budget's maximum (kube-apiserver: 100ms): how long one event
    /// may wait for watchers whose buffers are full before they are closed.
    #[arg(long, default_value = "100ms", value_parser = duration)]
    watch_budget_max: Duration,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Watch {
    PerNode,
    Shared,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).ok_or_else(|| format!("invalid duration {s:?}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let args = Args::parse();
    let began = Instant::now();

    let server = ApiServer::start(ApiServerConfig {
        bind: SocketAddr::from(([127, 0, 0, 1], args.port)),
        latency: args.api_latency_ms.map(Duration::from_millis),
        write_latency: args.api_write_latency.clone(),
        read_latency: args.api_read_latency.clone(),
        quorum_read_latency: args.api_quorum_read_latency.clone(),
        storage_lanes: (args.api_storage_lanes > 0).then_some(args.api_storage_lanes),
        storage_batch: args.api_storage_batch,
        storage_write_cost: args.api_storage_write_cost.clone(),
        bookmark_interval: args.bookmark_interval,
        watch_history: args.watch_history,
        watch_cache: kubesim::api::WatchCacheConfig {
            window_min: args.watch_window_min,
            chan_size: (args.watch_buffer > 0).then_some(args.watch_buffer),
            budget_refresh_per_second: args.watch_budget_refresh,
            budget_max: args.watch_budget_max,
            ..kubesim::api::WatchCacheConfig::default()
        },
    })
    .await
    .context("starting the API server")?;
    server
        .write_kubeconfig(&args.kubeconfig)
        .context("writing the kubeconfig")?;
    let client = server.client();
    let controller = NodeLifecycleController::start(client.clone(), args.node_grace);

    let delays = StartDelays {
        image_pull: args.image_pull.clone(),
        container_start: args
            .container_start
            .clone()
            .unwrap_or(Delay::fixed_ms(args.start_delay_ms)),
        readiness: args.readiness.clone(),
        relist: args.relist.clone(),
    };
    let configs = (0..args.nodes)
        .map(|i| {
            NodeConfig::numbered(i)
                .with_max_pods(args.max_pods)
                .with_delays(delays.clone())
        })
        .collect();
    let watch_mode = match args.watch {
        Watch::PerNode => WatchMode::PerNode,
        Watch::Shared => WatchMode::Shared,
    };
    let fleet = Fleet::start_with(
        client,
        configs,
        FleetOptions {
            watch_mode,
            node_agents: args.node_agents,
            ..Default::default()
        },
    )
    .await
    .context("starting the simulated nodes")?;

    tracing::info!(
        url = %server.url(),
        kubeconfig = %args.kubeconfig.display(),
        nodes = fleet.len(),
        agent_sockets = fleet.agent_dir().map(|d| d.display().to_string()),
        startup_ms = began.elapsed().as_millis() as u64,
        rss_mib = process::rss_bytes().map(|b| b / (1024 * 1024)),
        "kubesim ready; Ctrl-C to stop"
    );

    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    tracing::info!("shutting down");
    fleet.shutdown();
    controller.shutdown();
    server.shutdown().await;
    Ok(())
}
