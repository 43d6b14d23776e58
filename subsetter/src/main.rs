//! The subsetter binary: flags and environment, then the library.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use clap::Parser;
use keep_serving::shutdown_signal;
use subsetter::Caches;
use subsetter::cli::{Args, Command};
use subsetter::controller::Subsetter;
use subsetter::leader::run_as_leader;
use tracing_subscriber::EnvFilter;

/// The binary's own commands beside the controller, kept out of the library (whose surface is
/// the controller): `subsetter bench` and the baseline it measures against.
mod tools {
    pub mod bench;
    pub mod knative_hash;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        // Colour only on a terminal: a pod's log is a file, where escapes are noise.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let mut args = Args::parse();
    match args.command.take() {
        Some(Command::Bench {
            revisions,
            activators,
            members,
            policy,
            seed,
            images,
            image_share,
            image_locality,
            json,
        }) => {
            let opts = tools::bench::BenchOptions {
                revisions,
                activators,
                members,
                policy,
                seed,
                images,
                image_share,
                image_locality,
            };
            bench(opts, json)
        }
        Some(Command::VerifyContract { kubeconfig }) => verify_contract(kubeconfig).await,
        None => run(args).await,
    }
}

/// The controller: its caches and ports at once, then leading (alone, or when elected).
async fn run(args: Args) -> anyhow::Result<()> {
    let policy = subsetter::policy::by_name(&args.policy)
        .ok_or_else(|| subsetter::Error::UnknownPolicy(args.policy.clone()))?;
    // Straight to the API server's address, the Service's virtual IP as fallback: resuming
    // after an outage does not wait for kube-proxy (crds::api_route).
    let config = kube::Config::infer()
        .await
        .context("reading the API server's configuration")?;
    let client = crds::api_route::client(config)
        .await
        .context("connecting to the API server")?;
    if let Some(selector) = &args.namespace_selector {
        subsetter::namespaces::check_selector(&kube::Api::all(client.clone()), selector).await?;
    }
    // The one read of POD_NAME beyond the flags: the instance this replica's Events name.
    let config = args.config(std::env::var("POD_NAME").ok());
    let subsetter = Arc::new(Subsetter::new(client.clone(), config, Arc::from(policy)));
    let shutdown = shutdown_signal();
    let caches = serve(&args, &subsetter).await?;
    if args.directory_only {
        // The directory and the streams alone, for another subsetter's ActivationEndpoints:
        // this replica never writes.
        tracing::info!(
            "--directory-only: serving the directory and membership streams, never leading"
        );
        shutdown.await;
        caches.stop();
        return Ok(());
    }
    if args.no_leader_election {
        subsetter.lead(&caches, shutdown).await?;
        caches.stop();
        return Ok(());
    }
    run_as_leader(client, args.lease(), shutdown, |stop| {
        let (subsetter, caches) = (Arc::clone(&subsetter), Arc::clone(&caches));
        async move { subsetter.lead(&caches, stop).await }
    })
    .await?;
    Ok(())
}

/// The admin port, the caches (a standby keeps them warm: a hand-over reconciles what is
/// cached; ready once they have synced, when either replica can lead) and the directory port.
async fn serve(args: &Args, subsetter: &Subsetter) -> anyhow::Result<Arc<Caches>> {
    let ready = Arc::new(AtomicBool::new(false));
    let (admin, _admin_task) =
        subsetter::admin::serve(args.admin_addr, subsetter.metrics(), Arc::clone(&ready))
            .await
            .with_context(|| format!("binding the admin port {}", args.admin_addr))?;
    tracing::info!(%admin, "admin port: /metrics, /healthz, /readyz");
    let caches = Arc::new(subsetter.start_caches());
    let access = args.stream_access()?;
    if access.secret.is_none() {
        tracing::warn!("no --hop-secret-file: membership streams are open to any caller");
    }
    let (directory, _directory_task) =
        subsetter::directory::serve_streams(args.directory_addr, Arc::clone(&caches), access)
            .await
            .with_context(|| format!("binding the directory port {}", args.directory_addr))?;
    tracing::info!(%directory, "directory port: /v1/hosts/<host>, /v1/revisions/<ns>/<name>, /v1/members/<node>, /v1/member-stream/<node>");
    {
        let caches = Arc::clone(&caches);
        tokio::spawn(async move {
            caches.wait_synced().await;
            ready.store(true, Ordering::Release);
            tracing::info!("caches synced; ready");
        });
    }
    Ok(caches)
}

#[allow(clippy::print_stdout)] // the breaches are the command's output
async fn verify_contract(kubeconfig: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let client = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            kube::Client::try_from(cfg)?
        }
        None => kube::Client::try_default().await?,
    };
    let cluster = subsetter::contract::read_cluster(&client)
        .await
        .context("reading the cluster")?;
    let breaches = subsetter::contract::check(&cluster);
    println!(
        "{} ActivationEndpoints, {} Revisions, {} usable activators: {} breach(es)",
        cluster.endpoints.len(),
        cluster.revisions.len(),
        cluster.activators.len(),
        breaches.len()
    );
    for b in &breaches {
        println!("{b}");
    }
    if breaches.is_empty() {
        Ok(())
    } else {
        std::process::exit(1)
    }
}

#[allow(clippy::print_stdout)] // the bench's report is the command's output
fn bench(opts: tools::bench::BenchOptions, json: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let report = tools::bench::run(&opts).map_err(anyhow::Error::msg)?;
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(path) = json {
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
