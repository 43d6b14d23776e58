//! The bench library's error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubesim: {0}")]
    Kubesim(#[from] kubesim::Error),
    /// The harness's errors say what they were doing (setting up the cluster, starting nginx
    /// or the activator process).
    #[error(transparent)]
    Loadtest(#[from] loadtest::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "no activator binary at {}: build it next to bench with \
         `cargo build --release -p activator -p bench` (or pass --activator-bin)",
        path.display()
    )]
    ActivatorMissing { path: PathBuf },
    #[error("starting {what}: {message}")]
    Start { what: String, message: String },
    #[error("timed out after {secs}s waiting for {what}")]
    Timeout { what: String, secs: u64 },
    #[error("HTTP to {target}: {message}")]
    Http { target: String, message: String },
    #[error("parsing {what}: {message}")]
    Parse { what: &'static str, message: String },
    #[error("invalid options: {0}")]
    Options(String),
}
