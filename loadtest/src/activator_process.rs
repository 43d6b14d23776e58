//! One node's activator as its own process — the `activator` binary a DaemonSet runs — so its
//! memory is its own: the in-process sample's figure is a difference of this process's RSS
//! over several activators, with their share of the allocator and of whatever else grew
//! meanwhile. The scale scenario reads this one's RSS when it is ready with no subsets (its
//! idle) and again once it holds its share of the revisions; bench runs its activator (and
//! the baseline build it compares with) the same way, against its own embedded cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::activator_metrics::fetch;

use crate::error::Error;

/// What the child is started with: its flags, its output, its `RUST_LOG`, and the kubeconfig
/// through `KUBECONFIG`.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub binary: PathBuf,
    pub node: String,
    /// `--pod-name`, as the DaemonSet's downward API gives it; None leaves the activator's
    /// default (named after the node).
    pub pod_name: Option<String>,
    /// `--pod-namespace`; None leaves the activator's default.
    pub pod_namespace: Option<String>,
    /// The data address; its IP is also the admin port's (`--pod-ip`, both listen on it).
    pub data: SocketAddr,
    pub admin: SocketAddr,
    pub kubeconfig: PathBuf,
    /// Flags after the node's, the pod's and the addresses.
    pub flags: Vec<String>,
    /// The file its stdout and stderr go to; None discards them.
    pub log: Option<PathBuf>,
    /// Its `RUST_LOG`.
    pub rust_log: String,
}

impl ProcessSpec {
    /// The activator of `node` at `data` and `admin`, against the cluster in `kubeconfig`: no
    /// pod flags nor other flags, its output discarded, `RUST_LOG=warn`.
    pub fn new(
        binary: PathBuf,
        node: String,
        data: SocketAddr,
        admin: SocketAddr,
        kubeconfig: PathBuf,
    ) -> Self {
        Self {
            binary,
            node,
            pod_name: None,
            pod_namespace: None,
            data,
            admin,
            kubeconfig,
            flags: Vec::new(),
            log: None,
            rust_log: "warn".into(),
        }
    }

    /// The arguments, as the DaemonSet's downward API would give them.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![format!("--node-name={}", self.node)];
        if let Some(name) = &self.pod_name {
            args.push(format!("--pod-name={name}"));
        }
        if let Some(namespace) = &self.pod_namespace {
            args.push(format!("--pod-namespace={namespace}"));
        }
        args.extend([
            format!("--pod-ip={}", self.data.ip()),
            format!("--data-port={}", self.data.port()),
            format!("--admin-port={}", self.admin.port()),
        ]);
        args.extend(self.flags.iter().cloned());
        args
    }

    /// `; its log: <file>` when its output goes to one, for the errors that ask to read it.
    fn log_hint(&self) -> String {
        self.log
            .as_ref()
            .map(|l| format!("; its log: {}", l.display()))
            .unwrap_or_default()
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
    pid: u32,
    spec: ProcessSpec,
}

impl ActivatorProcess {
    /// Starts it; [`ActivatorProcess::wait_ready`] waits until it serves.
    pub fn spawn(spec: ProcessSpec) -> Result<Self, Error> {
        if spec.data.ip() != spec.admin.ip() {
            return Err(Error::Options(
                "data and admin addresses differ in IP".into(),
            ));
        }
        let (stdout, stderr) = match &spec.log {
            Some(path) => {
                let out = std::fs::File::create(path)?;
                let err = out.try_clone()?;
                (Stdio::from(out), Stdio::from(err))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        let start_error = |message: String| Error::Start {
            what: format!("{} for {}", spec.binary.display(), spec.node),
            message,
        };
        let child = Command::new(&spec.binary)
            .args(spec.args())
            .env("KUBECONFIG", &spec.kubeconfig)
            .env("RUST_LOG", &spec.rust_log)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| start_error(e.to_string()))?;
        let pid = child
            .id()
            .ok_or_else(|| start_error("exited at once".into()))?;
        tracing::info!(
            pid,
            node = %spec.node,
            data = %spec.data,
            admin = %spec.admin,
            log = ?spec.log,
            "activator process started"
        );
        Ok(Self { child, pid, spec })
    }

    /// Starts it and waits until it serves, up to `limit`.
    pub async fn start(spec: ProcessSpec, limit: Duration) -> Result<Self, Error> {
        let mut p = Self::spawn(spec)?;
        p.wait_ready(limit).await?;
        Ok(p)
    }

    /// Waits until its `/readyz` answers OK (its caches listed), up to `limit`; how long that
    /// took. Fails as soon as it exits.
    pub async fn wait_ready(&mut self, limit: Duration) -> Result<Duration, Error> {
        let started = Instant::now();
        loop {
            self.check_alive()?;
            if self.get_ok("/readyz").await.is_some() {
                return Ok(started.elapsed());
            }
            if started.elapsed() > limit {
                return Err(Error::Timeout {
                    what: format!(
                        "the activator process for {} to be ready{}",
                        self.spec.node,
                        self.spec.log_hint()
                    ),
                    secs: limit.as_secs(),
                });
            }
            // Polling its port: the child has no other way to say it is ready. Often, since
            // bench reports how long it took.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Fails when the process has exited.
    pub fn check_alive(&mut self) -> Result<(), Error> {
        match self.child.try_wait()? {
            Some(status) => Err(Error::ActivatorExited {
                node: self.spec.node.clone(),
                message: format!("{status}{}", self.spec.log_hint()),
            }),
            None => Ok(()),
        }
    }

    pub fn node(&self) -> &str {
        &self.spec.node
    }

    /// Its pid, as it was started (still given once it has exited).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its data address.
    pub fn data(&self) -> SocketAddr {
        self.spec.data
    }

    /// The body of its `/metrics`; None when it does not answer OK.
    pub async fn metrics(&self) -> Option<String> {
        self.get_ok("/metrics").await
    }

    /// The body of `GET path` on its admin port when the answer is 200 OK.
    async fn get_ok(&self, path: &str) -> Option<String> {
        let answer = fetch(self.spec.admin, path).await?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        (head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"))
            .then(|| body.to_string())
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
        let until = Instant::now() + limit;
        let mut last = self.memory()?;
        loop {
            // Sampling the process's memory: nothing to wait on but time.
            tokio::time::sleep(SETTLE_STEP).await;
            let now = self.memory()?;
            if now == last || Instant::now() >= until {
                return Some(now);
            }
            last = now;
        }
    }

    /// Kills the process and reaps it.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// Where `cargo build` leaves the `activator` binary for this program: beside it (whether or
/// not it is there). None when this program's path has no directory.
pub fn beside_this_program() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join("activator"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ProcessSpec {
        ProcessSpec::new(
            "activator".into(),
            "node-7".into(),
            "127.1.0.7:8080".parse().unwrap(),
            "127.1.0.7:9090".parse().unwrap(),
            "/tmp/kubeconfig".into(),
        )
    }

    #[test]
    fn the_flags_name_the_node_its_pod_and_its_addresses() {
        let mut spec = spec();
        spec.pod_name = Some("local-activator-node-7".into());
        spec.pod_namespace = Some("local-activator".into());
        spec.flags = vec!["--io-threads=1".into()];
        assert_eq!(
            spec.args(),
            [
                "--node-name=node-7",
                "--pod-name=local-activator-node-7",
                "--pod-namespace=local-activator",
                "--pod-ip=127.1.0.7",
                "--data-port=8080",
                "--admin-port=9090",
                "--io-threads=1",
            ]
        );
    }

    #[test]
    fn without_a_pod_the_activator_keeps_its_defaults() {
        assert_eq!(
            spec().args(),
            [
                "--node-name=node-7",
                "--pod-ip=127.1.0.7",
                "--data-port=8080",
                "--admin-port=9090",
            ]
        );
    }
}
