//! The activator as a separate process (the `activator` binary built next to `bench`), and
//! process figures read from `/proc`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::Error;
use crate::http;

/// The activator binary: `explicit`, else `activator` next to the running executable.
pub fn activator_binary(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("activator"))
            .ok_or_else(|| Error::Options("the bench executable has no directory".into()))?,
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::ActivatorMissing { path })
    }
}

/// `VmRSS` of process `pid` in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes as MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// A running activator process.
pub struct ActivatorProcess {
    child: Child,
    pid: u32,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    pub log: PathBuf,
}

impl ActivatorProcess {
    /// Starts `bin --node-name <node> --pod-ip <ip> --data-port --admin-port` with
    /// `KUBECONFIG` set; its output goes to `log` (`RUST_LOG` from `BENCH_ACTIVATOR_LOG`,
    /// default `warn`).
    pub fn spawn(
        bin: &Path,
        kubeconfig: &Path,
        node: &str,
        data: SocketAddr,
        admin: SocketAddr,
        log: PathBuf,
    ) -> Result<Self, Error> {
        if data.ip() != admin.ip() {
            return Err(Error::Options(
                "data and admin addresses differ in IP".into(),
            ));
        }
        let out = std::fs::File::create(&log)?;
        let err = out.try_clone()?;
        let level = std::env::var("BENCH_ACTIVATOR_LOG").unwrap_or_else(|_| "warn".into());
        let child = Command::new(bin)
            .arg("--node-name")
            .arg(node)
            .arg("--pod-ip")
            .arg(data.ip().to_string())
            .arg("--data-port")
            .arg(data.port().to_string())
            .arg("--admin-port")
            .arg(admin.port().to_string())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", level)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Start {
                what: bin.display().to_string(),
                message: e.to_string(),
            })?;
        let pid = child.id().ok_or_else(|| Error::Start {
            what: bin.display().to_string(),
            message: "exited at once".into(),
        })?;
        tracing::info!(pid, %data, %admin, log = %log.display(), "activator process started");
        Ok(Self {
            child,
            pid,
            data,
            admin,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits until `/readyz` answers 200; how long that took.
    pub async fn wait_ready(&mut self, limit: Duration) -> Result<Duration, Error> {
        let began = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(Error::ActivatorExited {
                    status: status.to_string(),
                    log: self.log.clone(),
                });
            }
            if let Ok(r) = http::get(self.admin, "/readyz", &[], Duration::from_secs(2)).await
                && r.status.is_success()
            {
                return Ok(began.elapsed());
            }
            if began.elapsed() > limit {
                return Err(Error::Timeout {
                    what: format!("the activator's /readyz (log: {})", self.log.display()),
                    secs: limit.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The process's resident set size.
    pub fn rss_bytes(&self) -> Option<u64> {
        rss_bytes(self.pid)
    }

    /// The text of `/metrics` on the admin port.
    pub async fn metrics(&self) -> Result<String, Error> {
        let r = http::get(self.admin, "/metrics", &[], Duration::from_secs(10)).await?;
        Ok(String::from_utf8_lossy(&r.body).into_owned())
    }

    /// Fails when the process has exited.
    pub fn check_alive(&mut self) -> Result<(), Error> {
        match self.child.try_wait()? {
            Some(status) => Err(Error::ActivatorExited {
                status: status.to_string(),
                log: self.log.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Kills the process and reaps it.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// Raises this process's open-file limit as far as it goes (children inherit it): first the
/// hard limit to `want` where permitted (root), else the soft limit to the hard one. Returns
/// the soft limit now in force.
pub fn raise_nofile(want: u64) -> Result<u64, Error> {
    let (soft, hard) = rlimit::Resource::NOFILE.get()?;
    if soft >= want {
        return Ok(soft);
    }
    if hard < want && rlimit::Resource::NOFILE.set(want, want).is_ok() {
        return Ok(rlimit::Resource::NOFILE.get()?.0);
    }
    let target = want.min(hard);
    if soft < target {
        rlimit::Resource::NOFILE.set(target, hard)?;
    }
    Ok(rlimit::Resource::NOFILE.get()?.0)
}
