//! Local scheduling: creating and deleting a revision's pods on this node. A pod is created
//! with `spec.nodeName` = this node, so no scheduler, ReplicaSet or Deployment is in the
//! cold-start path: one API write, then the node's kubelet.

use crds::Revision;
use crds::contract::pod_name;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use std::time::Duration;

use crate::cache::api_health::{ApiHealth, GaveUp};
use crate::cache::pods::{PodCache, RevisionPods};
use crate::node::pod_spec::build_pod;
use crds::ObjectKey as RevisionKey;

/// Why a pod could not be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateError {
    /// The Revision cannot make a pod (bad template): retrying will not help.
    Invalid(String),
    /// The API server refused the pod as invalid (422/400: its validation or an admission
    /// policy): retrying will not help. The API server's message names policies and fields
    /// of the cluster, so it goes to the Revision's events and the log, never to a client.
    Refused(String),
    /// The API server answered with an error (a 5xx, a 429, a 403...): this node backs off.
    Api(String),
    /// The API server did not answer at all (connection refused or cut, no answer within
    /// [`CREATE_LIMIT`]): the control plane is out of reach, for every member alike.
    Unreachable(String),
}

impl std::fmt::Display for CreateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(s) | Self::Refused(s) | Self::Api(s) | Self::Unreachable(s) => {
                f.write_str(s)
            }
        }
    }
}

/// How long a create (with the read that may follow it) may take before it counts as
/// unanswered. A healthy API server answers in milliseconds and a busy one in well under a
/// second; past this the requests waiting for the pod are better told to come back (503)
/// than held until their timeout (minutes) by a connection to an API server that is gone
/// without a word (packets dropped, not refused), or by the client's own retries.
pub const CREATE_LIMIT: Duration = Duration::from_secs(10);

/// Creates and deletes app pods on this node.
#[derive(Clone)]
pub struct LocalScheduler {
    client: Client,
    api: ApiHealth,
    node: String,
    pods: PodCache,
}

impl LocalScheduler {
    pub fn new(client: Client, api: ApiHealth, node: &str, pods: PodCache) -> Self {
        Self {
            client,
            api,
            node: node.to_string(),
            pods,
        }
    }

    /// The lowest ordinal whose deterministic name no pod of the revision here holds
    /// (terminating pods still hold theirs).
    pub fn free_ordinal(&self, key: &RevisionKey, pods: &RevisionPods, skip: &[u32]) -> u32 {
        (0u32..)
            .find(|i| !skip.contains(i) && !pods.contains_key(&pod_name(&key.name, &self.node, *i)))
            .unwrap_or(0)
    }

    /// Creates the `ordinal`-th pod of `rev` here and returns its name. 409 AlreadyExists
    /// means a retried create already happened: the existing pod is recorded and counts as
    /// created. Bounded by [`CREATE_LIMIT`]; a create given up on may still have happened,
    /// and the next one finds it (409, deterministic names).
    pub async fn create(
        &self,
        key: &RevisionKey,
        rev: &Revision,
        ordinal: u32,
    ) -> Result<String, CreateError> {
        let pod = build_pod(rev, &self.node, ordinal).map_err(CreateError::Invalid)?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        match self
            .api
            .within(CREATE_LIMIT, self.post(key, &pod, &name))
            .await
        {
            Ok(r) => r,
            Err(GaveUp::Down) => Err(CreateError::Unreachable(format!(
                "creating pod {name}: no answer, and the API server is not ready (/readyz)"
            ))),
            Err(GaveUp::Limit) => Err(CreateError::Unreachable(format!(
                "creating pod {name}: the API server did not answer within {}s",
                CREATE_LIMIT.as_secs()
            ))),
        }
    }

    async fn post(&self, key: &RevisionKey, pod: &Pod, name: &str) -> Result<String, CreateError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        match api.create(&PostParams::default(), pod).await {
            Ok(created) => {
                // Recorded before the watch reports it, so the scaler does not create it again.
                self.pods.observe_created(key, &created);
                tracing::info!(revision = %key, pod = %name, "created pod");
                Ok(name.to_string())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => self.adopt(&api, key, name).await,
            // Invalid (422, 400), the namespace being deleted (403 with the cause
            // NamespaceTerminating) or gone (404): the template or the namespace is at fault,
            // not this node, and retrying does not change the answer. Requests waiting are
            // answered at once instead of waiting out the revision's timeout behind retries.
            // Another 403 (a quota, RBAC) may pass: retried with back-off.
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 404 | 422) || terminating(&s) => {
                Err(CreateError::Refused(format!(
                    "creating pod {name}: {}",
                    s.message
                )))
            }
            // The create may have happened with its answer lost (a timeout, a cut
            // connection): if the pod exists, it is ours. When the read gets no answer
            // either, the API server is out of reach.
            Err(e) => match self.adopt(&api, key, name).await {
                Ok(n) => Ok(n),
                Err(CreateError::Unreachable(_)) if crds::backoff::unanswered(&e) => {
                    Err(CreateError::Unreachable(format!(
                        "creating pod {name}: the API server is unreachable: {e}"
                    )))
                }
                Err(_) => Err(CreateError::Api(format!("creating pod {name}: {e}"))),
            },
        }
    }

    async fn adopt(
        &self,
        api: &Api<Pod>,
        key: &RevisionKey,
        name: &str,
    ) -> Result<String, CreateError> {
        match api.get_opt(name).await {
            Ok(Some(existing)) => {
                self.pods.observe_created(key, &existing);
                Ok(name.to_string())
            }
            Ok(None) => Err(CreateError::Api(format!(
                "pod {name} was reported to exist but is gone"
            ))),
            Err(e) if crds::backoff::unanswered(&e) => {
                Err(CreateError::Unreachable(format!("reading pod {name}: {e}")))
            }
            Err(e) => Err(CreateError::Api(format!("reading pod {name}: {e}"))),
        }
    }

    /// Deletes a pod (best effort: a pod already gone is fine; failures are logged and the
    /// scaler tries again on its next pass).
    pub async fn delete(&self, key: &RevisionKey, name: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(revision = %key, pod = %name, "deleted pod"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(revision = %key, pod = %name, error = %e, "deleting pod"),
        }
    }
}

/// A 403 because the namespace is being deleted (`Forbidden` with the cause
/// `NamespaceTerminating`, as the API server's NamespaceLifecycle admission says it).
fn terminating(s: &kube::core::Status) -> bool {
    s.code == 403
        && s.details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}
