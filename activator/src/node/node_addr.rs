//! A starting pod's address from the node, before the kubelet reports it.
//!
//! Why: on a real node the sandbox (and so the pod's IP) exists about 140 ms after the
//! kubelet takes the pod, and the app listens soon after; but the kubelet writes the IP to
//! the API server only when its next PLEG relist (once a second) notices the container, in
//! the same status update as Ready. Learning the IP from the pod watch, the activator's own
//! readiness probe could never start before the kubelet's Ready. The node agent (a sidecar
//! holding the container runtime's socket, crate `node-agent`) answers "which IP has pod
//! <uid>" as soon as the sandbox has one; the scaler then probes the app itself
//! ([`crate::node::readiness`]) and routes the waiting requests on the first success.
//!
//! The agent is asked by the pod's UID, not its name: names are deterministic per (revision,
//! node, ordinal) and come back for a new pod, whose old sandbox may still exist.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use node_agent::client::AgentClient;
use node_agent::protocol::PodUid;
use tokio::sync::mpsc;

use crate::ops::metrics::Metrics;

/// How often a starting pod's address is asked for: the sandbox gets it about 140 ms after
/// the kubelet starts, and every millisecond it is learnt late is a millisecond of the cold
/// start. One question is a round trip on a unix socket and two CRI calls.
const ASK_EVERY: Duration = Duration::from_millis(5);
/// After an error (agent down, runtime unreachable), the next question waits this long at
/// first, doubling up to [`ERROR_BACKOFF_MAX`]: the pod watch still gives the address.
const ERROR_BACKOFF: Duration = Duration::from_millis(100);
const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Asks the node agent for pods' addresses. Cheap to clone.
#[derive(Clone)]
pub struct NodeAddresses {
    client: AgentClient,
    metrics: Arc<Metrics>,
}

impl NodeAddresses {
    /// `socket`: the agent's unix socket (`--node-agent-socket`).
    pub fn new(socket: impl Into<PathBuf>, metrics: Arc<Metrics>) -> Self {
        Self {
            client: AgentClient::new(socket.into()),
            metrics,
        }
    }

    /// Asks for the address of pod `uid` until its sandbox has one, then sends `(name, ip)`
    /// on `found`. Runs until then, or until `limit` has passed, or until the task is
    /// aborted (the scaler aborts it when the watch gives the address first or the pod goes).
    pub async fn find(
        self,
        uid: String,
        name: String,
        limit: Duration,
        found: mpsc::UnboundedSender<(String, IpAddr)>,
    ) {
        let Ok(uid) = PodUid::new(&uid) else {
            // The API server gives UUIDs; anything else is not worth asking about.
            tracing::debug!(pod = %name, %uid, "pod UID is not a UUID: not asking the node agent");
            return;
        };
        let until = tokio::time::Instant::now() + limit;
        let mut backoff = ERROR_BACKOFF;
        let mut warned = false;
        while tokio::time::Instant::now() < until {
            let wait = match self.client.pod_addr(&uid).await {
                Ok(Some(ip)) => {
                    let _ = found.send((name, ip));
                    return;
                }
                Ok(None) => ASK_EVERY,
                Err(e) => {
                    self.metrics.agent_errors.inc();
                    if !warned {
                        tracing::warn!(pod = %name, error = %e, "asking the node agent for a pod's address; the pod watch will give it");
                        warned = true;
                    }
                    let w = backoff;
                    backoff = (backoff * 2).min(ERROR_BACKOFF_MAX);
                    w
                }
            };
            tokio::time::sleep(wait).await;
        }
    }
}
