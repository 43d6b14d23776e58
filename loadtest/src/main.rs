//! `loadtest demo`: the README's main command.

// The report on stdout is this binary's output (logs go to stderr).
#![allow(clippy::print_stdout)]

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use kubesim::node::Delay;
use loadtest::demo::{self, DemoOptions};
use loadtest::scenario::{self, Ctx, Knobs, Scenario, Target};
use loadtest::{ClusterOptions, SimCluster};

#[derive(Parser)]
#[command(about = "local-activator load tests on a simulated (or real) cluster")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// A named scenario (see docs/load-testing.md): prints a summary table, and writes JSON
    /// and SVG pictures when asked.
    Run {
        /// The scenario; may be left out when `--config` names one.
        #[arg(value_enum)]
        scenario: Option<Scenario>,
        /// A scenario file (YAML): `scenario:` and any of the knobs below, by their flag
        /// names. Flags override it.
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        knobs: Box<Knobs>,
        /// Run against this cluster's API server (the harness registers simulated nodes
        /// there, works in namespaces of its own and deletes what it created).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Write the JSON report here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write the scenario's main picture here.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Write the JSON report and every picture into this directory.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Cold starts end to end: kubesim + subsetter + one activator per node, in this process.
    Demo {
        #[arg(long, default_value_t = 20)]
        nodes: usize,
        #[arg(long, default_value_t = 10)]
        revisions: usize,
        /// Requests per revision.
        #[arg(long, default_value_t = 5)]
        requests: usize,
        /// How many of each revision's first requests are sent at once.
        #[arg(long, default_value_t = 3)]
        burst: usize,
        /// Simulated pod start delay.
        #[arg(long, default_value_t = 300)]
        start_delay_ms: u64,
        /// The simulated kubelets' relist period: a started app's IP, Running and Ready reach
        /// the API server at the node's next relist, as on a real kubelet (1 s). 0: at once.
        #[arg(long, default_value_t = 1000)]
        relist_ms: u64,
        /// Each node runs the activator's node agent sidecar, which tells it a starting pod's
        /// IP from its sandbox, so the activator probes the app itself instead of waiting for
        /// the kubelet's report.
        #[arg(long, value_enum, default_value_t = OnOff::On)]
        node_agent: OnOff,
        /// Activators per revision (N).
        #[arg(long, default_value_t = 3)]
        activators: usize,
        /// How requests name their revision: `host` (Host header; every activator watches
        /// every Revision) or `headers` (x-revision-namespace/-name, as an ingress sets them;
        /// activators read only the revisions requests name).
        #[arg(long, default_value = "host", value_parser = ["host", "headers"])]
        routing: String,
        /// What sits in front of the activators: `none` never retries; `retry` retries once,
        /// on another activator, a request that failed before any response byte. With
        /// `retry` the report gives both (the first attempts are what `none` would see).
        #[arg(long, value_enum, default_value_t = loadtest::driver::Ingress::Retry)]
        ingress: loadtest::driver::Ingress,
        /// Write the summary as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// The embedded API server's time per write (an etcd commit on a real server):
        /// `6ms`, `uniform:3ms..9ms`, `lognormal:6ms,0.5`; `0ms` answers from memory. The
        /// default is calibrated on a real kube-apiserver + etcd (docs/load-testing.md).
        #[arg(long, default_value = loadtest::cluster::CALIBRATED_WRITE_LATENCY)]
        api_write_latency: Delay,
        /// The embedded API server's storage time per quorum read (a GET or LIST without
        /// resourceVersion, which a real server sends to etcd), same syntax.
        #[arg(long, default_value = loadtest::cluster::CALIBRATED_QUORUM_READ_LATENCY)]
        api_quorum_read_latency: Delay,
        /// Writes and quorum reads the embedded API server's storage serves at once; more
        /// wait in line, as behind a real etcd (0: no queueing).
        #[arg(long, default_value_t = loadtest::cluster::CALIBRATED_STORAGE_LANES)]
        api_storage_lanes: usize,
        /// Writes and quorum reads one storage commit takes at most: those arriving while a
        /// lane commits share its next commit, as etcd batches them (1: one by one).
        #[arg(long, default_value_t = loadtest::cluster::CALIBRATED_STORAGE_BATCH)]
        api_storage_batch: usize,
        /// Time each write adds to a shared storage commit past the first, same syntax.
        #[arg(long, default_value = loadtest::cluster::CALIBRATED_STORAGE_WRITE_COST)]
        api_storage_write_cost: Delay,
    },
    /// Cold starts on a cluster where the product is installed and real kubelets run the
    /// app (hack/cluster, docs/real-cluster.md): through an activator, through a Deployment
    /// scaled 0 → 1, and the floor (the pod POSTed with spec.nodeName), each to the first byte.
    Installed {
        /// The cluster (default: KUBECONFIG, then ~/.kube/config).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Rounds. With --image-pull and --pull-load, 0 measures only the warm traffic
        /// during the pulls.
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Cold starts at once per path in a round.
        #[arg(long, default_value_t = 1)]
        burst: usize,
        /// The app image: answers the path on 8080, present on every node.
        #[arg(long, default_value = "localhost/local-activator/testapp:dev")]
        image: String,
        #[arg(long, default_value = "/cgi-bin/app")]
        path: String,
        /// Give the app an HTTP readinessProbe (GET of the path) with this periodSeconds: the
        /// kubelet reports Ready only at its probe's period, the activator's own check at once.
        #[arg(long)]
        readiness_period: Option<u32>,
        /// The app listens this many ms after its container starts (with a TCP readinessProbe,
        /// so the kubelet's Ready means it answers).
        #[arg(long)]
        listen_delay_ms: Option<u64>,
        /// The image-pull mode: the first request after a Revision is created whose image is
        /// on no node (pulled ahead by its member, not, image present, a Deployment 0 → 1).
        /// Needs --evict-cmd; the image (--image) must be in a registry the nodes pull from.
        #[arg(long, requires = "evict_cmd")]
        image_pull: bool,
        /// Removes the image from one node: run per node with {node} and {image} replaced,
        /// e.g. 'hack/cluster/node image-rm {node} {image}' on the local cluster.
        #[arg(long)]
        evict_cmd: Option<String>,
        /// With --image-pull, also warm traffic on one node while its activator pre-pulls
        /// these images: a reference with {i}, numbered 0..--pull-load-count (e.g.
        /// '10.88.255.1:5000/local-activator/testapp-pull-{i}:dev'). Needs --has-cmd.
        #[arg(long, requires = "has_cmd")]
        pull_load: Option<String>,
        #[arg(long, default_value_t = 10)]
        pull_load_count: usize,
        /// Exit status 0 when {node} holds {image}, e.g. 'hack/cluster/node image-has {node}
        /// {image}': how the image-pull mode sees a pre-pull end (without it: the Node's
        /// status.images, which can lag by minutes).
        #[arg(long)]
        has_cmd: Option<String>,
        /// Concurrent warm clients during the pull load.
        #[arg(long, default_value_t = 4)]
        warm_clients: usize,
        /// Warm traffic during the pull load as an open loop at this many requests a second
        /// (instead of --warm-clients in a closed loop, which keeps the CPU busy by itself).
        #[arg(long)]
        warm_rate: Option<f64>,
        /// The warm requests' path (default: --path).
        #[arg(long)]
        warm_path: Option<String>,
        /// Write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        #[command(flatten)]
        deploy: DeployFlags,
    },
    /// What a real API server pays per subset write for the activators' watches: none, the
    /// member-label watch, a per-node object watched by name, membership streams from a
    /// directory replica run here (docs/membership-watch-cost.md). Stop the product's
    /// subsetter first.
    WatchCost {
        /// The cluster (default: KUBECONFIG, then ~/.kube/config).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Activators watching (one per simulated node).
        #[arg(long, default_value_t = 1000)]
        watchers: usize,
        /// Subsets written in each phase.
        #[arg(long, default_value_t = 2000)]
        subsets: usize,
        #[arg(long, default_value_t = 3)]
        members: usize,
        /// Subset writes in flight.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// The phases, in order: none, label, name, stream.
        #[arg(long, value_delimiter = ',', default_value = "none,label,name,stream")]
        ways: Vec<String>,
        /// Write the figures as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// What one object of a kind costs a real API server and etcd: a Revision with what the
    /// subsetter writes for it, a Deployment + Service, a ConfigMap (docs/revision-cost.md).
    ObjectCost {
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "revision,app,configmap"
        )]
        kinds: Vec<loadtest::object_cost::Kind>,
        /// Units of each kind.
        #[arg(long, default_value_t = 2000)]
        count: usize,
        /// Batches per kind, the kinds alternating.
        #[arg(long, default_value_t = 4)]
        rounds: usize,
        /// Creates in flight.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Labels of the namespaces, `k=v`, repeated (e.g. `local-activator.dev/subsetter=cost`
        /// for a subsetter run with that `--namespace-selector`).
        #[arg(long)]
        namespace_label: Vec<String>,
        /// etcd's client address, plain HTTP (`/metrics`, `etcdctl`).
        #[arg(long)]
        etcd: Option<String>,
        /// Services with a cluster IP instead of headless ones.
        #[arg(long)]
        cluster_ip: bool,
        /// Objects of each resource read back for their sizes.
        #[arg(long, default_value_t = 20)]
        sample: usize,
        #[arg(long, default_value_t = 600)]
        settle_timeout_secs: u64,
        /// Quiet after each batch before its figures are read.
        #[arg(long, default_value_t = 3)]
        quiet_secs: u64,
        #[arg(long)]
        keep: bool,
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

/// `loadtest installed --deploy`: the `deploy` scenario (docs/load-testing.md) on the installed
/// product, its knobs named as in `loadtest run deploy`.
#[derive(clap::Args)]
struct DeployFlags {
    /// The deploy scenario instead of cold starts: v1 warm under closed-loop load through every
    /// activator, v2 deployed on its host, a Route splitting it 10/90, a rollback to v1 (the
    /// app: --image at --path, naming its pod in `x-pod-name`).
    #[arg(long, conflicts_with = "image_pull")]
    deploy: bool,
    /// Closed-loop clients (deploy).
    #[arg(long)]
    clients: Option<usize>,
    /// Seconds of load before the deploy (deploy).
    #[arg(long)]
    before_secs: Option<f64>,
    /// Seconds of load after the rollback (deploy).
    #[arg(long)]
    after_secs: Option<f64>,
    /// Seconds the load goes on once a move has reached every activator (deploy).
    #[arg(long)]
    settle_secs: Option<f64>,
    /// Requests measured under the 10/90 split (deploy).
    #[arg(long)]
    split_requests: Option<usize>,
    /// v2's handOverTimeoutSeconds (deploy).
    #[arg(long)]
    hand_over_timeout_secs: Option<i64>,
    /// Write the deploy scenario's main picture here (deploy).
    #[arg(long)]
    svg: Option<PathBuf>,
}

impl DeployFlags {
    fn knobs(&self) -> Knobs {
        Knobs {
            scenario: Some(Scenario::Deploy),
            clients: self.clients,
            before_secs: self.before_secs,
            after_secs: self.after_secs,
            settle_secs: self.settle_secs,
            split_requests: self.split_requests,
            hand_over_timeout_secs: self.hand_over_timeout_secs,
            ..Knobs::default()
        }
    }
}

/// A context with a progress line, ended early by Ctrl-C.
fn interactive_ctx(knobs: Knobs, target: Target) -> Ctx {
    let progress = indicatif::ProgressBar::new_spinner();
    progress.enable_steady_tick(std::time::Duration::from_millis(200));
    let ctx = Ctx {
        knobs,
        target,
        cancel: tokio_util::sync::CancellationToken::new(),
        progress,
    };
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ninterrupted: ending the run, the report covers what ran");
            cancel.cancel();
        }
    });
    ctx
}

/// Prints a scenario's report and writes its files.
fn print_report(
    report: &scenario::Report,
    json: Option<&std::path::Path>,
    svg: Option<&std::path::Path>,
    out: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if report.partial {
        println!("PARTIAL: interrupted before the end");
    }
    print!("{}", report.text);
    println!("target: {}", report.target);
    for path in report.write(json, svg, out)? {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            // `loadtest::figures`: a scenario's figures as they are measured (`Ctx::note`),
            // which is all a run stopped before its report leaves when not on a terminal.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,loadtest::figures=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Args::parse().cmd {
        Cmd::Run {
            scenario,
            config,
            knobs,
            kubeconfig,
            json,
            svg,
            out,
        } => {
            let knobs = match &config {
                Some(path) => knobs.or(Knobs::from_file(path)?),
                None => *knobs,
            };
            let scenario = scenario.or(knobs.scenario).ok_or_else(|| {
                anyhow::anyhow!("name a scenario, or a --config file with `scenario:`")
            })?;
            let target = match kubeconfig {
                None => Target::Embedded,
                Some(path) => {
                    let kc = kube::config::Kubeconfig::read_from(&path)?;
                    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
                    Target::Cluster(kube::Client::try_from(cfg)?)
                }
            };
            let ctx = interactive_ctx(knobs, target);
            let report = scenario::run(scenario, &ctx).await;
            ctx.progress.finish_and_clear();
            print_report(&report?, json.as_deref(), svg.as_deref(), out.as_deref())?;
        }
        Cmd::Demo {
            nodes,
            revisions,
            requests,
            burst,
            start_delay_ms,
            relist_ms,
            node_agent,
            activators,
            routing,
            ingress,
            json,
            api_write_latency,
            api_quorum_read_latency,
            api_storage_lanes,
            api_storage_batch,
            api_storage_write_cost,
        } => {
            let by_host = routing == "host";
            let t = std::time::Instant::now();
            let cluster = SimCluster::start(ClusterOptions {
                nodes,
                start_delay: Delay::fixed_ms(start_delay_ms),
                relist: Delay::fixed_ms(relist_ms),
                node_agent: node_agent == OnOff::On,
                default_activators: activators,
                api_write_latency,
                api_quorum_read_latency,
                api_storage_lanes: (api_storage_lanes > 0).then_some(api_storage_lanes),
                api_storage_batch,
                api_storage_write_cost,
                // On a shared API server the subsetter must leave other Revisions alone.
                revision_namespace: Some(DemoOptions::default().namespace),
                ..ClusterOptions::default()
            })
            .await?;
            eprintln!(
                "cluster up: {nodes} nodes, {} activators, in {:.1}s",
                cluster.activators.len(),
                t.elapsed().as_secs_f64()
            );
            let t = std::time::Instant::now();
            let summary = demo::run(
                &cluster,
                &DemoOptions {
                    revisions,
                    requests,
                    burst,
                    start_delay_ms,
                    by_host,
                    ingress,
                    ..DemoOptions::default()
                },
            )
            .await?;
            eprintln!("demo ran in {:.1}s", t.elapsed().as_secs_f64());
            let kubelet = cluster.kubelet_description().to_string();
            let t = std::time::Instant::now();
            cluster.shutdown().await;
            eprintln!("cluster shut down in {:.1}s", t.elapsed().as_secs_f64());
            print!("{}", demo::text_with_kubelet(&summary, &kubelet));
            if let Some(path) = json {
                let json = demo::json_with_kubelet(&summary, &kubelet);
                std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
                eprintln!("wrote {}", path.display());
            }
            if summary.errors > 0 {
                anyhow::bail!("{} of {} requests failed", summary.errors, summary.requests);
            }
        }
        Cmd::WatchCost {
            kubeconfig,
            watchers,
            subsets,
            members,
            concurrency,
            ways,
            json,
        } => {
            let client = client_of(kubeconfig).await?;
            let ways = ways
                .iter()
                .map(|w| {
                    loadtest::watch_cost::Watches::parse(w)
                        .ok_or_else(|| anyhow::anyhow!("--ways: unknown phase {w:?}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let opts = loadtest::watch_cost::Options {
                watchers,
                subsets,
                members,
                concurrency,
                ways,
            };
            let phases = loadtest::watch_cost::run(client, &opts).await?;
            for p in &phases {
                println!("{}", p.line());
            }
            if let Some(none) = phases.iter().find(|p| p.watches == "none") {
                for p in phases.iter().filter(|p| p.watches != "none") {
                    println!(
                        "kube-apiserver CPU per subset over no watches: {} {:+.2} ms ({:+.0} %)",
                        p.watches,
                        p.cpu_ms_per_subset() - none.cpu_ms_per_subset(),
                        100.0 * (p.cpu_ms_per_subset() / none.cpu_ms_per_subset().max(1e-9) - 1.0),
                    );
                }
            }
            if let Some(path) = json {
                std::fs::write(path, serde_json::to_vec_pretty(&phases)?)?;
            }
        }
        Cmd::ObjectCost {
            kubeconfig,
            kinds,
            count,
            rounds,
            concurrency,
            namespace_label,
            etcd,
            cluster_ip,
            sample,
            settle_timeout_secs,
            quiet_secs,
            keep,
            json,
        } => {
            let client = client_of(kubeconfig).await?;
            let namespace_labels = namespace_label
                .iter()
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
                    (k.to_string(), v.to_string())
                })
                .collect();
            let opts = loadtest::object_cost::Options {
                kinds,
                count,
                rounds,
                concurrency,
                namespace_labels,
                etcd,
                cluster_ip,
                sample,
                settle_timeout: std::time::Duration::from_secs(settle_timeout_secs),
                quiet: std::time::Duration::from_secs(quiet_secs),
                keep,
            };
            let figures = loadtest::object_cost::run(client, &opts).await?;
            for f in &figures {
                for line in f.lines() {
                    println!("{line}");
                }
            }
            let of = |k: &str| figures.iter().find(|f| f.kind == k);
            if let (Some(rev), Some(app)) = (of("revision"), of("app")) {
                println!("{}", loadtest::object_cost::ratios(rev, app));
            }
            if let Some(path) = json {
                std::fs::write(path, serde_json::to_vec_pretty(&figures)?)?;
            }
        }
        Cmd::Installed {
            kubeconfig,
            runs,
            burst,
            image,
            path,
            readiness_period,
            listen_delay_ms,
            image_pull,
            evict_cmd,
            pull_load,
            pull_load_count,
            has_cmd,
            warm_clients,
            warm_rate,
            warm_path,
            json,
            deploy,
        } => {
            let client = client_of(kubeconfig).await?;
            let opts = loadtest::installed::Options {
                runs,
                burst,
                image,
                path,
                readiness_period,
                listen_delay_ms,
                ..Default::default()
            };
            if deploy.deploy {
                let ctx = interactive_ctx(deploy.knobs(), Target::Cluster(client.clone()));
                let report = loadtest::scenarios::deploy::run_installed(&ctx, &client, &opts).await;
                ctx.progress.finish_and_clear();
                let report = report?;
                print_report(&report, json.as_deref(), deploy.svg.as_deref(), None)?;
                let failed = report.figures["failed"].as_u64().unwrap_or(0);
                if failed > 0 {
                    anyhow::bail!("{failed} request(s) failed");
                }
                return Ok(());
            }
            if image_pull {
                let evict = evict_cmd.as_deref().unwrap_or_default();
                let mut failed = 0;
                if runs > 0 || pull_load.is_none() {
                    let report = loadtest::installed::run_image_pull(
                        &client,
                        &opts,
                        evict,
                        has_cmd.as_deref(),
                    )
                    .await?;
                    print!("{}", report.table());
                    if let Some(p) = &json {
                        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
                        eprintln!("wrote {}", p.display());
                    }
                    failed += report
                        .paths
                        .iter()
                        .map(|p| p.first_byte_ms.failed)
                        .sum::<usize>();
                }
                if let Some(template) = &pull_load {
                    let load = loadtest::image_pull::PullLoad {
                        images: (0..pull_load_count)
                            .map(|i| template.replace("{i}", &i.to_string()))
                            .collect(),
                        evict_cmd: evict,
                        has_cmd: has_cmd.as_deref().unwrap_or_default(),
                        clients: warm_clients,
                        rate: warm_rate,
                        path: warm_path.clone().unwrap_or_else(|| opts.path.clone()),
                        before: std::time::Duration::from_secs(10),
                    };
                    let warm =
                        loadtest::installed::run_warm_during_pulls(&client, &opts, &load).await?;
                    print!("{}", warm.table());
                    failed += warm.before_ms.failed + warm.during_ms.failed;
                }
                if failed > 0 {
                    anyhow::bail!("{failed} request(s) failed");
                }
                return Ok(());
            }
            let report = loadtest::installed::run(&client, &opts).await?;
            print!("{}", report.table());
            if let Some(p) = json {
                std::fs::write(&p, serde_json::to_string_pretty(&report)?)?;
                eprintln!("wrote {}", p.display());
            }
            let failed: usize = report.paths.iter().map(|p| p.first_byte_ms.failed).sum();
            if failed > 0 {
                anyhow::bail!("{failed} cold start(s) failed");
            }
        }
    }
    Ok(())
}

/// A client for `kubeconfig`, or the default one (KUBECONFIG, then ~/.kube/config).
async fn client_of(kubeconfig: Option<PathBuf>) -> anyhow::Result<kube::Client> {
    Ok(match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(&p)?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            kube::Client::try_from(cfg)?
        }
        None => kube::Client::try_default().await?,
    })
}
