//! Node registration and heartbeats: the Node object with its status, and the Lease in
//! `kube-node-lease` renewed every `lease_renew_interval`, as the kubelet's node lease
//! controller does. The Ready condition's heartbeat is re-posted far less often.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rand::RngExt;
use serde_json::json;
use tokio::time::{Instant, MissedTickBehavior};

use super::error::NodeError;
use super::objects::{self, LEASE_NAMESPACE, now, status_patch};
use super::retry::{FIELD_MANAGER, is_code};
use super::sim_node::NodeInner;

pub(crate) struct Registered {
    pub node_uid: String,
    pub lease: Lease,
    /// The Ready condition's lastTransitionTime, kept across heartbeats.
    pub ready_since: Time,
}

/// Creates (or adopts) the Node, posts a healthy status and makes sure the Lease exists.
pub(crate) async fn register(node: &NodeInner) -> Result<Registered, NodeError> {
    let config = &node.config;
    let nodes: Api<Node> = Api::all(node.client.clone());
    let node_uid = match nodes
        .create(&PostParams::default(), &objects::node(config))
        .await
    {
        Ok(created) => created.metadata.uid,
        Err(e) if is_code(&e, 409) => {
            // Registered before (revive, or a restarted simulator): refresh its labels as the
            // kubelet reconciles its default labels, keep everything else.
            let labels = json!({ "metadata": { "labels": objects::node_labels(config) } });
            let patched = nodes
                .patch(
                    &config.name,
                    &PatchParams::default(),
                    &Patch::Merge(&labels),
                )
                .await?;
            patched.metadata.uid
        }
        Err(e) => return Err(e.into()),
    }
    .unwrap_or_default();

    let ready_since = now();
    post_status(node, &ready_since).await?;
    let lease = ensure_lease(node, &node_uid).await?;
    Ok(Registered {
        node_uid,
        lease,
        ready_since,
    })
}

async fn post_status(node: &NodeInner, ready_since: &Time) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(node.client.clone());
    let status = objects::node_status(&node.config, &node.boot_id, ready_since, &now());
    nodes
        .patch_status(
            &node.config.name,
            &PatchParams::default(),
            &Patch::Merge(&status_patch(&status)),
        )
        .await?;
    Ok(())
}

async fn ensure_lease(node: &NodeInner, node_uid: &str) -> Result<Lease, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(node.client.clone(), LEASE_NAMESPACE);
    let fresh = objects::lease(&node.config, Some(node_uid), Timestamp::now());
    match leases.get_opt(&node.config.name).await? {
        Some(mut existing) => {
            existing.spec = fresh.spec;
            existing.metadata.owner_references = fresh.metadata.owner_references;
            leases
                .replace(&node.config.name, &PostParams::default(), &existing)
                .await
        }
        None => match leases.create(&PostParams::default(), &fresh).await {
            Ok(lease) => Ok(lease),
            Err(e) if is_code(&e, 404) => {
                // The namespace itself is missing (a bare API server).
                let namespaces: Api<Namespace> = Api::all(node.client.clone());
                let ns = Namespace {
                    metadata: ObjectMeta {
                        name: Some(LEASE_NAMESPACE.into()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                match namespaces.create(&PostParams::default(), &ns).await {
                    Ok(_) => {}
                    Err(e) if is_code(&e, 409) => {}
                    Err(e) => return Err(e),
                }
                leases.create(&PostParams::default(), &fresh).await
            }
            Err(e) if is_code(&e, 409) => leases.get(&node.config.name).await,
            Err(e) => Err(e),
        },
    }
}

/// Renews the lease until aborted. Renewals are spread over the interval (random first
/// delay) so thousands of nodes do not renew in the same instant.
pub(crate) async fn heartbeat(node: Arc<NodeInner>, registered: Registered) {
    let config = &node.config;
    let leases: Api<Lease> = Api::namespaced(node.client.clone(), LEASE_NAMESPACE);
    let Registered {
        node_uid,
        mut lease,
        ready_since,
    } = registered;
    let interval = config.lease_renew_interval;
    let offset = Duration::from_secs_f64(interval.as_secs_f64() * rand::rng().random::<f64>());
    let mut ticker = tokio::time::interval_at(Instant::now() + offset, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_status = Instant::now();
    let mut failing = false;
    loop {
        ticker.tick().await;
        match renew(&leases, &mut lease, &node, &node_uid).await {
            Ok(()) => {
                if failing {
                    tracing::info!(node = %config.name, "lease renewals recovered");
                }
            }
            Err(e) => {
                tracing::warn!(node = %config.name, error = %e, "lease renewal failed");
                failing = true;
                continue;
            }
        }
        // After failed renewals the node lifecycle controller may have marked the node
        // Unknown; the kubelet's next status post sets it straight.
        if failing || last_status.elapsed() >= config.status_report_interval {
            match post_status(&node, &ready_since).await {
                Ok(()) => {
                    failing = false;
                    last_status = Instant::now();
                }
                Err(e) => {
                    tracing::warn!(node = %config.name, error = %e, "node status update failed")
                }
            }
        }
    }
}

async fn renew(
    leases: &Api<Lease>,
    lease: &mut Lease,
    node: &NodeInner,
    node_uid: &str,
) -> Result<(), kube::Error> {
    let name = &node.config.name;
    if let Some(spec) = lease.spec.as_mut() {
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.holder_identity = Some(name.clone());
    }
    match leases
        .replace(
            name,
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            },
            lease,
        )
        .await
    {
        Ok(renewed) => {
            *lease = renewed;
            Ok(())
        }
        // Someone else wrote it, or it was deleted: start again from the server's copy.
        Err(e) if is_code(&e, 409) || is_code(&e, 404) => {
            *lease = ensure_lease(node, node_uid).await?;
            Ok(())
        }
        Err(e) => Err(e),
    }
}
