//! One node's activator as its own process — the `activator` binary a DaemonSet runs — so its
//! memory is its own: the in-process sample's figure is a difference of this process's RSS
//! over several activators, with their share of the allocator and of whatever else grew
//! meanwhile. The scale scenario reads this one's RSS when it is ready with no subsets (its
//! idle) and again once it holds its share of the revisions.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::activator_metrics::fetch;

use crate::error::Error;

/// What the child is started with (its flags; the kubeconfig through `KUBECONFIG`).
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub binary: PathBuf,
    pub node: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    pub kubeconfig: PathBuf,
}

impl ProcessSpec {
    /// The arguments, as the DaemonSet's downward API would give them.
    pub fn args(&self) -> Vec<String> {
        vec![
            format!("--node-name={}", self.node),
            format!("--pod-name={}", self.pod_name),
            format!("--pod-namespace={}", self.pod_namespace),
            format!("--pod-ip={}", self.data.ip()),
            format!("--data-port={}", self.data.port()),
            format!("--admin-port={}", self.admin.port()),
            // One small data-path thread: the process is measured idle, not under load.
            "--io-threads=1".into(),
            // No node agent beside it: nothing to pull through.
            "--prepull=false".into(),
        ]
    }
}

/// How far apart two reads of a settled process's memory agree.
pub const SETTLE_STEP: Duration = Duration::from_secs(1);

/// A process's resident memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`: everything resident, the binary's mapped pages included.
    pub rss: u64,
    /// `RssAnon`: its heap and stacks, what it allocated itself.
    pub anon: u64,
}

/// A running activator process, killed when dropped.
pub struct ActivatorProcess {
    child: Child,
    spec: ProcessSpec,
}

impl ActivatorProcess {
    /// Starts it and waits until its `/readyz` answers OK (its caches listed), up to `limit`.
    pub async fn start(spec: ProcessSpec, limit: Duration) -> Result<Self, Error> {
        let child = Command::new(&spec.binary)
            .args(spec.args())
            .env("KUBECONFIG", &spec.kubeconfig)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Start {
                what: format!("{} for {}", spec.binary.display(), spec.node),
                message: e.to_string(),
            })?;
        let mut p = Self { child, spec };
        let started = tokio::time::Instant::now();
        loop {
            if let Some(status) = p.child.try_wait()? {
                return Err(Error::Start {
                    what: format!("the activator process for {}", p.spec.node),
                    message: format!("exited: {status}"),
                });
            }
            if fetch(p.spec.admin, "/readyz")
                .await
                .is_some_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
            {
                return Ok(p);
            }
            if started.elapsed() > limit {
                return Err(Error::Timeout {
                    what: format!("the activator process for {} to be ready", p.spec.node),
                    secs: limit.as_secs(),
                });
            }
            // Polling its port: the child has no other way to say it is ready.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn node(&self) -> &str {
        &self.spec.node
    }

    /// Its memory now, None once it is gone.
    pub fn memory(&self) -> Option<Memory> {
        let pid = self.child.id()?;
        Some(Memory {
            rss: kubesim::node::process::rss_bytes_of(pid)?,
            anon: kubesim::node::process::rss_anon_bytes_of(pid)?,
        })
    }

    /// Its memory once it stops changing: two reads [`SETTLE_STEP`] apart agree (a process
    /// just ready still faults in code and grows its allocator for a moment), or the last
    /// read after `limit`.
    pub async fn settled(&self, limit: Duration) -> Option<Memory> {
        let until = tokio::time::Instant::now() + limit;
        let mut last = self.memory()?;
        loop {
            // Sampling the process's memory: nothing to wait on but time.
            tokio::time::sleep(SETTLE_STEP).await;
            let now = self.memory()?;
            if now == last || tokio::time::Instant::now() >= until {
                return Some(now);
            }
            last = now;
        }
    }
}

/// The `activator` binary beside this program's (as `cargo build` leaves them), if there is
/// one.
pub fn beside_this_program() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.join("activator");
    path.is_file().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_name_the_node_its_pod_and_its_addresses() {
        let spec = ProcessSpec {
            binary: "activator".into(),
            node: "node-7".into(),
            pod_name: "local-activator-node-7".into(),
            pod_namespace: "local-activator".into(),
            data: "127.1.0.7:8080".parse().unwrap(),
            admin: "127.1.0.7:9090".parse().unwrap(),
            kubeconfig: "/tmp/kubeconfig".into(),
        };
        let args = spec.args();
        for want in [
            "--node-name=node-7",
            "--pod-name=local-activator-node-7",
            "--pod-namespace=local-activator",
            "--pod-ip=127.1.0.7",
            "--data-port=8080",
            "--admin-port=9090",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
    }
}
