//! The crate's error type, for errors that cross kubesim's public API (the API server's and
//! the simulated nodes').

/// Errors returned by kubesim's public functions.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid kube config: {0}")]
    KubeConfig(String),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("invalid node configuration: {0}")]
    InvalidConfig(String),
    #[error("unknown simulated node {0:?}")]
    UnknownNode(String),
    #[error("node {node}: {source}")]
    NodeIo {
        node: String,
        #[source]
        source: std::io::Error,
    },
}
