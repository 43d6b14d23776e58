//! The activator binary: configuration from flags and the downward-API environment.

use std::net::{IpAddr, SocketAddr};

use activator::{Activator, ActivatorConfig};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "local-activator: the node-local scale-to-zero data plane")]
struct Args {
    /// This node (downward API: spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    #[arg(long, env = "POD_NAME", default_value = "local-activator")]
    pod_name: String,
    #[arg(long, env = "POD_NAMESPACE", default_value = "local-activator")]
    pod_namespace: String,
    /// The address to listen on (downward API: status.podIP).
    #[arg(long, env = "POD_IP", default_value = "0.0.0.0")]
    pod_ip: IpAddr,
    #[arg(long, env = "DATA_PORT", default_value_t = crds::contract::DATA_PORT)]
    data_port: u16,
    #[arg(long, env = "ADMIN_PORT", default_value_t = crds::contract::ADMIN_PORT)]
    admin_port: u16,
    /// Route by Host header (watches every Revision). `false`: requests name their revision
    /// with x-revision-namespace/x-revision-name, and only those revisions are read.
    #[arg(long, env = "HOST_ROUTING", default_value_t = true, action = clap::ArgAction::Set)]
    host_routing: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let mut cfg = ActivatorConfig::new(
        args.node_name,
        SocketAddr::new(args.pod_ip, args.data_port),
        SocketAddr::new(args.pod_ip, args.admin_port),
    );
    cfg.pod_name = args.pod_name;
    cfg.pod_namespace = args.pod_namespace;
    cfg.host_routing = args.host_routing;
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
