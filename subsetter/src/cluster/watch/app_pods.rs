//! The watch of app pods (those the activators create, label `local-activator.dev/revision`)
//! that keeps [`ReadyPods`]: a change of a revision someone waits on (a hand-over, a Route
//! step) triggers that revision and wakes the route pass.
//!
//! One cluster-wide watch, as any controller of pods has (the ReplicaSet controller's): the
//! subsetter is a controller, not a node agent, so this is not the per-node fan-out DESIGN
//! rules out; most revisions are at zero and have no pods to send.

use std::sync::{Arc, Mutex};

use crds::backoff::resilient;
use crds::contract::REVISION_LABEL;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::Notify;
use tracing::warn;

use crate::cluster::triggers::Triggers;
use crate::pure::key::Key;
use crate::pure::ready_pods::ReadyPods;
use keep_serving::Locked;

fn key_of(pod: &Pod) -> Option<Key> {
    let rev = pod.labels().get(REVISION_LABEL)?;
    Some(Key::new(pod.namespace().unwrap_or_default(), rev.clone()))
}

/// Keeps `ready` from the pods' events until the stream ends.
pub(crate) async fn watch_app_pods(
    api: Api<Pod>,
    ready: Arc<Mutex<ReadyPods>>,
    triggers: Triggers,
    wake: Arc<Notify>,
    synced: Arc<tokio::sync::watch::Sender<crate::cluster::synced::Synced>>,
) {
    let config = watcher::Config::default().labels(REVISION_LABEL);
    let mut events = std::pin::pin!(resilient(watcher::watcher(api, config)));
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "app pod watch");
                continue;
            }
        };
        let changed: Vec<Key> = {
            let mut r = ready.locked();
            match &event {
                Event::Init => {
                    r.relist_start();
                    Vec::new()
                }
                Event::InitDone => {
                    synced.send_modify(|s| s.app_pods = true);
                    r.relisted()
                }
                Event::Apply(p) | Event::InitApply(p) => key_of(p)
                    .filter(|k| r.apply(k, &p.name_any(), Some(crds::pod_ready::ready(p))))
                    .into_iter()
                    .collect(),
                Event::Delete(p) => key_of(p)
                    .filter(|k| r.apply(k, &p.name_any(), None))
                    .into_iter()
                    .collect(),
            }
        };
        if !changed.is_empty() {
            for k in changed {
                triggers.send(ObjectRef::new(&k.name).within(&k.namespace));
            }
            wake.notify_one();
        }
    }
}
