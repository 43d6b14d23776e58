//! The activator binary: configuration from flags and the downward-API environment.

use std::time::Duration;

use activator::cli::Args;
use activator::ops::telemetry::{self, Identity};
use activator::{Activator, shutdown_signal};
use clap::Parser;

/// Longest wait for the trace exporter's last flush on exit.
const TELEMETRY_FLUSH: Duration = Duration::from_secs(5);

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The data port has its own threads; this runtime runs the watches, the kube client,
    // the scalers and the admin port, which need little.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(run_with_telemetry(args))
}

async fn run_with_telemetry(args: Args) -> anyhow::Result<()> {
    let telemetry = telemetry::init(&Identity {
        node_name: Some(args.node_name.clone()),
        pod_name: Some(args.pod_name.clone()),
        pod_namespace: Some(args.pod_namespace.clone()),
    })?;
    let result = run(args).await;
    telemetry.shutdown(TELEMETRY_FLUSH).await;
    result
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut cfg = args.config();
    // The Secret is mounted optionally: an activator installed before it was created runs,
    // honouring no hop, and says so.
    match &args.hop_secret_file {
        Some(path) if path.exists() => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading the hop secret {}: {e}", path.display()))?;
            cfg.hop = activator::pipeline::hop::HopAuth::new(&text)?;
        }
        Some(path) => tracing::warn!(
            path = %path.display(),
            "the hop secret file does not exist: no forwarded hop is honoured (a forwarded \
             request may be forwarded again); create the Secret and restart the DaemonSet"
        ),
        None => tracing::warn!(
            "no --hop-secret-file: no forwarded hop is honoured (a forwarded request may be \
             forwarded again)"
        ),
    }
    // Straight to the API server's address, the Service's virtual IP as fallback: resuming
    // after an outage does not wait for kube-proxy (crds::api_route).
    let client = crds::api_route::client(kube::Config::infer().await?).await?;
    let activator = Activator::start(cfg, client).await?;
    shutdown_signal().await;
    // Not ready at once, but still serving: whoever routes here learns that this pod is
    // going from the API server (its deletion, then the subset without it), which takes a
    // moment; until then their requests must find a listener, not a dead address.
    activator.set_not_ready();
    tracing::info!(delay = ?args.shutdown_delay, "SIGTERM: not ready; serving until the delay ends, then draining");
    tokio::select! {
        _ = tokio::time::sleep(args.shutdown_delay) => {}
        _ = shutdown_signal() => tracing::info!("second signal: draining now"),
    }
    tracing::info!("draining");
    activator.shutdown().await;
    Ok(())
}
