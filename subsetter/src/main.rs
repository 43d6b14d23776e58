//! The subsetter binary: flags and environment, then the library.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use subsetter::cli::{Args, Command};
use subsetter::controller::Subsetter;
use subsetter::leader::{LeaseConfig, run_as_leader};
use subsetter::reconciler::Config;
use tracing_subscriber::EnvFilter;

/// The binary's own commands beside the controller, kept out of the library (whose surface is
/// the controller): `subsetter bench` and the baseline it measures against.
mod tools {
    pub mod bench;
    pub mod knative_hash;
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        // Colour only on a terminal: a pod's log is a file, where escapes are noise.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let args = Args::parse();
    if let Some(Command::Bench {
        revisions,
        activators,
        members,
        policy,
        seed,
        images,
        image_share,
        image_locality,
        json,
    }) = args.command
    {
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
        return bench(opts, json);
    }
    if let Some(Command::VerifyContract { kubeconfig }) = args.command {
        return verify_contract(kubeconfig).await;
    }
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
    let config = Config {
        namespace: args.namespace,
        namespace_selector: args.namespace_selector,
        activator_namespace: args.activator_namespace,
        default_activators: usize::from(args.default_activators),
        write_qps: args.write_qps,
        write_burst: args.write_burst,
        concurrency: args.concurrency,
        endpoint_slices: args.endpoint_slices,
        image_locality: args.image_locality,
        outage_hold: std::time::Duration::from_secs(args.outage_hold_seconds),
        replacement_hold: std::time::Duration::from_secs(args.replacement_hold_seconds),
        rebalance_interval: std::time::Duration::from_secs(args.rebalance_interval_seconds),
        rebalance: subsetter::rebalance::Limits {
            threshold: args.rebalance_threshold,
            max_moves: args.rebalance_max_moves,
        },
        settings_config_map: args
            .settings_config_map
            .clone()
            .map(|name| (name, args.lease_namespace.clone())),
        ..Config::default()
    };
    let subsetter = Arc::new(Subsetter::new(client.clone(), config, Arc::from(policy)));
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (admin, _admin_task) =
        subsetter::admin::serve(args.admin_addr, subsetter.metrics(), Arc::clone(&ready))
            .await
            .with_context(|| format!("binding the admin port {}", args.admin_addr))?;
    tracing::info!(%admin, "admin port: /metrics, /healthz, /readyz");
    let shutdown = shutdown_signal();
    // The standby keeps its caches warm: a hand-over reconciles what is cached. Ready once
    // they have synced (either replica can then lead).
    let caches = Arc::new(subsetter.start_caches());
    let (directory, _directory_task) =
        subsetter::directory::serve(args.directory_addr, Arc::clone(&caches))
            .await
            .with_context(|| format!("binding the directory port {}", args.directory_addr))?;
    tracing::info!(%directory, "directory port: /v1/hosts/<host>, /v1/revisions/<ns>/<name>");
    {
        let caches = Arc::clone(&caches);
        tokio::spawn(async move {
            caches.wait_synced().await;
            ready.store(true, std::sync::atomic::Ordering::Release);
            tracing::info!("caches synced; ready");
        });
    }
    if args.no_leader_election {
        subsetter.lead(&caches, shutdown).await?;
        caches.stop();
        return Ok(());
    }
    let identity = args
        .identity
        .unwrap_or_else(|| format!("subsetter-{}", std::process::id()));
    let lease = LeaseConfig {
        name: args.lease_name,
        namespace: args.lease_namespace,
        identity,
        duration_seconds: args.lease_duration_seconds,
        grace_seconds: args.lease_grace_seconds,
        release_timeout: subsetter::leader::DEFAULT_RELEASE_TIMEOUT,
    };
    run_as_leader(client, lease, shutdown, |stop| {
        let (subsetter, caches) = (Arc::clone(&subsetter), Arc::clone(&caches));
        async move { subsetter.lead(&caches, stop).await }
    })
    .await?;
    Ok(())
}

/// Ctrl-C, or SIGTERM (what Kubernetes sends).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(error = %e, "no SIGTERM handler; Ctrl-C only");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
