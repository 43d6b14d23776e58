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
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("starting {what}: {message}")]
    Start { what: String, message: String },
    #[error("the activator process for {node} exited: {message}")]
    ActivatorExited { node: String, message: String },
    #[error("drawing a plot: {0}")]
    Plot(String),
    #[error("invalid options: {0}")]
    Options(String),
    #[error("kubeconfig: {0}")]
    KubeConfig(String),
    #[error("running `{line}`: {message}")]
    Command { line: String, message: String },
}
