//! The crate's error type for its public API (starting and running an activator). Errors of a
//! single request are answers, not errors: see [`crate::wire::answer`].

/// Why an activator could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Config(String),
}
