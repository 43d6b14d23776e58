//! Local scheduling: a ready pod of a revision on this node, creating one (with
//! `spec.nodeName` = this node) when there is none. No scheduler, ReplicaSet or Deployment is in
//! this path: one API write, then the node's kubelet.

use std::net::SocketAddr;
use std::sync::Arc;

use crds::contract::pod_name;
use crds::{ActivatorMember, Revision};
use dashmap::DashMap;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};

use crate::answer::Refusal;
use crate::cache::pods::{PodCache, RevisionPods};
use crate::metrics::Metrics;
use crate::pod_spec::build_pod;
use crate::routing::RevisionKey;

/// A pod to send a request to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub addr: SocketAddr,
    /// The request waited for this pod to start.
    pub cold: bool,
}

/// Creates and finds app pods on this node.
#[derive(Clone)]
pub struct LocalScheduler {
    client: Client,
    node: String,
    pods: PodCache,
    /// One creator at a time per revision: concurrent first requests create exactly one pod.
    creating: Arc<DashMap<RevisionKey, Arc<tokio::sync::Mutex<()>>>>,
    metrics: Arc<Metrics>,
}

impl LocalScheduler {
    pub fn new(client: Client, node: &str, pods: PodCache, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
            node: node.to_string(),
            pods,
            creating: Arc::new(DashMap::new()),
            metrics,
        }
    }

    /// A serving pod of `rev` on this node, cold-starting one if needed. The caller bounds the
    /// wait with the request's deadline.
    pub async fn ready_pod(
        &self,
        key: &RevisionKey,
        rev: &Revision,
        quota: &ActivatorMember,
    ) -> Result<Target, Refusal> {
        let mut rx = self.pods.subscribe(key);
        let port = u16::try_from(rev.spec.port).map_err(|_| {
            Refusal::bad_gateway(format!("revision {key} has port {}", rev.spec.port))
        })?;
        if let Some(addr) = serving_addr(&rx.borrow(), port) {
            return Ok(Target { addr, cold: false });
        }
        let mut mine = self.ensure_pod(key, rev, quota).await?;
        self.metrics.cold_start_waits.inc();
        loop {
            // Decide with the channel's value borrowed, act (await) after the borrow ends.
            let start_another = {
                let pods = rx.borrow_and_update();
                if let Some(addr) = serving_addr(&pods, port) {
                    return Ok(Target { addr, cold: true });
                }
                // The pod this request started, or any pod when it found one starting, failed
                // (e.g. OutOfpods): it will never serve, and a new one would fail the same way.
                let failed = match &mine {
                    Some(name) => pods.get(name).and_then(|p| p.failed.clone()),
                    None => pods.values().find_map(|p| p.failed.clone()),
                };
                if let Some(reason) = failed {
                    return Err(Refusal::unavailable(format!(
                        "the pod of revision {key} on node {} failed: {reason}",
                        self.node
                    )));
                }
                // Deleted (or terminating) before it became ready.
                !pods.values().any(|p| p.live())
            };
            if start_another {
                mine = self.ensure_pod(key, rev, quota).await?.or(mine);
                continue;
            }
            rx.changed()
                .await
                .map_err(|_| Refusal::unavailable("activator is shutting down"))?;
        }
    }

    /// Creates a pod unless the revision already has a live one on this node; returns the name
    /// of the pod it created (or found already created under the name it chose).
    async fn ensure_pod(
        &self,
        key: &RevisionKey,
        rev: &Revision,
        quota: &ActivatorMember,
    ) -> Result<Option<String>, Refusal> {
        let lock = self.creating.entry(key.clone()).or_default().clone();
        let _guard = lock.lock().await;
        let pods = self.pods.snapshot(key);
        if pods.values().any(|p| p.live()) {
            return Ok(None);
        }
        if rev.spec.max_scale > 0 && quota.max_pods == 0 {
            return Err(Refusal::unavailable(format!(
                "node {} has no share of revision {key}'s maxScale",
                self.node
            )));
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        for failed in pods.values().filter(|p| p.failed.is_some()) {
            // Free the name and the node's pod slot; best effort, the next create retries.
            if let Err(e) = api.delete(&failed.name, &DeleteParams::default()).await {
                tracing::debug!(pod = %failed.name, error = %e, "deleting failed pod");
            }
        }
        let ordinal = (0u32..)
            .find(|i| !pods.contains_key(&pod_name(&key.name, &self.node, *i)))
            .unwrap_or(0);
        let pod = build_pod(rev, &self.node, ordinal).map_err(Refusal::bad_gateway)?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), &pod).await {
            Ok(created) => {
                self.pods.observe_created(key, &created);
                self.metrics.pods_created.inc();
                tracing::info!(revision = %key, pod = %name, "created pod");
                Ok(Some(name))
            }
            // A retried create, or one racing this node's watch: the pod exists. Read it, so
            // the wait below sees it even before the watch reports it.
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&name).await {
                Ok(Some(existing)) => {
                    self.pods.observe_created(key, &existing);
                    Ok(Some(name))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(Refusal::unavailable(format!(
                    "reading pod {name} of revision {key}: {e}"
                ))),
            },
            // The create may have happened with its answer lost (a timeout, a cut
            // connection): if the pod exists, it is ours, and a later create must not pick
            // this name's ordinal again while another pod of the revision runs.
            Err(e) => match api.get_opt(&name).await {
                Ok(Some(existing)) => {
                    self.pods.observe_created(key, &existing);
                    Ok(Some(name))
                }
                _ => Err(Refusal::unavailable(format!(
                    "creating a pod for revision {key}: {e}"
                ))),
            },
        }
    }
}

fn serving_addr(pods: &RevisionPods, port: u16) -> Option<SocketAddr> {
    pods.values()
        .filter(|p| p.serving())
        .find_map(|p| p.ip.map(|ip| SocketAddr::new(ip, port)))
}
