use thiserror::Error;

#[derive(Debug, Error)]
pub enum NodeError {
    #[error("invalid node configuration: {0}")]
    InvalidConfig(String),
    #[error("unknown simulated node {0:?}")]
    UnknownNode(String),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("node {node}: {source}")]
    Io {
        node: String,
        #[source]
        source: std::io::Error,
    },
}
