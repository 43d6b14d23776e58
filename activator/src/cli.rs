//! The activator's command line: flags, and the downward-API environment they fall back to.
//! In the library so that the deploy manifests can be checked against it (a test parses the
//! DaemonSet's args and env with it).

use std::net::IpAddr;

use clap::Parser;

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
}
