//! The crate's error type, for errors that cross kubesim's public API.

/// Errors returned by kubesim's public functions.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid kube config: {0}")]
    KubeConfig(String),
    #[error("kube client error: {0}")]
    Kube(#[from] kube::Error),
}
