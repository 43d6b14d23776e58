//! The subsetter's error type.

/// Errors of the subsetter library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("watch failed: {0}")]
    Watch(#[from] kube::runtime::watcher::Error),
    #[error("revision {0} has no namespace")]
    NoNamespace(String),
    #[error("serializing a patch: {0}")]
    Json(#[from] serde_json::Error),
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    #[error("unknown subset policy {0:?} (random, least-loaded)")]
    UnknownPolicy(String),
    #[error("--namespace-selector {selector:?}: {reason}")]
    NamespaceSelector { selector: String, reason: String },
    #[error("--hop-secret-file {path}: {reason}")]
    HopSecret { path: String, reason: String },
    #[error("ActivationEndpoints {0} is controlled by another object")]
    ForeignOwner(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
