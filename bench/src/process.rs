//! The activator as a separate process (the `activator` binary built next to `bench`),
//! started through the load test's launcher as bench runs it, and this process's limits.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use loadtest::activator_process::{ActivatorProcess, ProcessSpec, beside_this_program};

use crate::Error;

/// The activator binary: `explicit`, else `activator` next to the running executable.
pub fn activator_binary(explicit: Option<&Path>) -> Result<PathBuf, Error> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => beside_this_program()
            .ok_or_else(|| Error::Options("the bench executable has no directory".into()))?,
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::ActivatorMissing { path })
    }
}

/// Bytes as MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Starts the activator `bin` as bench runs it: as `node`'s, at `data` and `admin`, against
/// the cluster in `kubeconfig`, with no other flags; its output goes to `log` (`RUST_LOG`
/// from `BENCH_ACTIVATOR_LOG`, default `warn`).
pub fn spawn_activator(
    bin: &Path,
    kubeconfig: &Path,
    node: &str,
    data: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
) -> Result<ActivatorProcess, Error> {
    let mut spec = ProcessSpec::new(
        bin.to_path_buf(),
        node.to_string(),
        data,
        admin,
        kubeconfig.to_path_buf(),
    );
    spec.log = Some(log);
    spec.rust_log = std::env::var("BENCH_ACTIVATOR_LOG").unwrap_or_else(|_| "warn".into());
    Ok(ActivatorProcess::spawn(spec)?)
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
