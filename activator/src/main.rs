//! The activator binary: configuration from flags and the downward-API environment.

use std::time::Duration;

use activator::Activator;
use activator::cli::Args;
use activator::telemetry::{self, Identity};
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
    let cfg = args.config();
    let client = kube::Client::try_default().await?;
    let activator = Activator::start(cfg, client).await?;
    shutdown_signal().await;
    tracing::info!("SIGTERM: draining");
    activator.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
