//! The simulated node agent: the activator pod's sidecar (crate `node-agent`), which on a real
//! node asks the container runtime for a pod's sandbox IP. Here the kubelet's own state is the
//! runtime: a pod has its IP from its admission (the sandbox), well before the kubelet
//! reports it to the API server when relists are modelled ([`super::StartDelays::relist`]).
//!
//! The protocol side is `node_agent::server::serve` itself, so the activator talks to the
//! same server code as in production; only the [`Backend`] is simulated.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use node_agent::protocol::PodUid;
use node_agent::server::{Backend, BackendFuture, ServerConfig, serve};
use tokio::net::UnixListener;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::sim_node::{NodeInner, PodStage};

/// Answers from the node's kubelet state.
struct SimBackend {
    // Weak: the server task must not keep a stopped node's state alive.
    node: Weak<NodeInner>,
}

impl Backend for SimBackend {
    fn pod_addr<'a>(&'a self, uid: &'a PodUid) -> BackendFuture<'a> {
        let ip = self.node.upgrade().and_then(|node| node.sandbox_ip(uid));
        Box::pin(std::future::ready(Ok(ip)))
    }
}

impl NodeInner {
    /// The IP of a pod whose sandbox exists: admitted and not stopping. A host-network pod
    /// (external) has no sandbox address of its own, as the CRI reports it.
    fn sandbox_ip(&self, uid: &PodUid) -> Option<IpAddr> {
        let st = self.lock();
        let rt = st.pods.get(uid.as_str())?;
        let running = matches!(rt.stage, PodStage::Starting | PodStage::Running);
        (running && !rt.external && !rt.suspended)
            .then_some(rt.ip)
            .flatten()
            .map(IpAddr::V4)
    }
}

/// Binds the node's agent socket and serves it until the returned guard is dropped (the node
/// killed or stopped). A file left at the path (an earlier run of this node) is replaced.
pub(crate) fn start(node: &Arc<NodeInner>, path: &Path) -> std::io::Result<DropGuard> {
    remove_socket(path)?;
    let listener = UnixListener::bind(path)?;
    let stop = CancellationToken::new();
    let backend = Arc::new(SimBackend {
        node: Arc::downgrade(node),
    });
    tokio::spawn(serve(
        listener,
        backend,
        ServerConfig::default(),
        stop.clone(),
    ));
    Ok(stop.drop_guard())
}

pub(crate) fn remove_socket(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A directory for the agent sockets of one fleet, `<temp>/kubesim-agents-<pid>-<n>`: unique
/// per process and per fleet, so fleets (and processes) never share a socket. Removed with
/// what is in it when dropped.
#[derive(Debug)]
pub struct AgentDir {
    path: PathBuf,
}

impl AgentDir {
    pub fn new() -> std::io::Result<AgentDir> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("kubesim-agents-{}-{n}", std::process::id()));
        // A directory left by a crashed process whose pid came back holds nothing of ours.
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
        std::fs::create_dir_all(&path)?;
        Ok(AgentDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where `node`'s agent listens.
    pub fn socket(&self, node: &str) -> PathBuf {
        self.path.join(format!("{node}.sock"))
    }
}

impl Drop for AgentDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "removing the agent socket directory");
        }
    }
}
