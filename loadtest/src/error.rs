//! The harness's error type.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubesim: {0}")]
    Kubesim(#[from] kubesim::Error),
    #[error("activator on {node}: {source}")]
    Activator {
        node: String,
        #[source]
        source: activator::Error,
    },
    #[error("reading {path}: {message}")]
    Manifest { path: String, message: String },
    #[error("timed out after {secs}s waiting for {what}")]
    Timeout { what: String, secs: u64 },
    #[error("kubeconfig: {0}")]
    KubeConfig(String),
}
