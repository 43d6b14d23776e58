//! What every reconcile shares: the client and configuration, the caches, the settings in
//! force, the write rate limit, and the Events and EndpointSlices written beside the subset.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crds::{ActivationEndpoints, ActivatorMember, Revision};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource};
use tracing::debug;

use crate::cluster::config::Config;
use crate::cluster::error::Result;
use crate::cluster::metrics::Metrics;
use crate::cluster::shared::SharedCaches;
use crate::cluster::write_limit::{Lane, WriteLimiter};
use crate::pure::key::Key;
use crate::pure::policy::SubsetPolicy;
use keep_serving::{Locked, ReadWriteLocked};

/// Upper bound on writing one Event (the client has no timeout of its own).
const EVENT_WRITE_LIMIT: Duration = Duration::from_secs(5);

/// Shared state of the reconciler.
pub struct Context {
    pub client: Client,
    pub config: Config,
    /// The policy and maxNodeSelection in force (flags, or the settings ConfigMap).
    tuned: RwLock<Tuned>,
    pub metrics: Arc<Metrics>,
    /// What the watches keep and the reconciler plans from (`shared.rs`).
    pub(crate) caches: SharedCaches,
    /// Consecutive failures by revision, for the backoff (`reconciler::error_policy`).
    pub(crate) failures: Mutex<HashMap<Key, u32>>,
    writes: WriteLimiter,
    /// Members the rebalancer wants moved off, by revision (taken by its next reconcile).
    pub(crate) evictions: Mutex<HashMap<Key, String>>,
    /// The EndpointSlice last applied per revision (`Config::endpoint_slices`), to apply
    /// only what changed.
    slices: Mutex<HashMap<Key, Vec<ActivatorMember>>>,
    /// Each revision's images by uid and generation (image locality), parsed once a
    /// generation rather than on every plan.
    pub(crate) wanted_images: crate::pure::images::WantedCache,
}

/// What the settings ConfigMap can change while running.
#[derive(Clone)]
pub struct Tuned {
    pub policy: Arc<dyn SubsetPolicy>,
    pub max_node_selection: usize,
    /// Least-loaded prefers nodes holding the revision's images (`Config::image_locality`).
    pub image_locality: bool,
}

impl Context {
    /// The context of one leadership: `policy` is in force until the settings ConfigMap
    /// says otherwise; `caches` are the replica's, kept from before it led.
    pub(crate) fn new(
        client: Client,
        config: Config,
        policy: Arc<dyn SubsetPolicy>,
        metrics: Arc<Metrics>,
        caches: SharedCaches,
    ) -> Self {
        let writes = WriteLimiter::new(config.write_qps, config.write_burst);
        let tuned = RwLock::new(Tuned {
            policy,
            max_node_selection: config.default_activators,
            image_locality: config.image_locality,
        });
        Self {
            client,
            config,
            tuned,
            metrics,
            caches,
            writes,
            failures: Mutex::default(),
            evictions: Mutex::default(),
            slices: Mutex::default(),
            wanted_images: Default::default(),
        }
    }

    /// The policy and maxNodeSelection to plan with now.
    pub fn tuned(&self) -> Tuned {
        self.tuned.read_locked().clone()
    }

    /// Puts `s` in force: the next reconciles plan with it, the next writes take its rate.
    /// The policy object is kept when its name is unchanged (a seeded random stays seeded).
    pub fn apply(&self, s: &crate::pure::settings::Settings) {
        let mut t = self.tuned.write_locked();
        if t.policy.name() != s.policy
            && let Some(p) = crate::pure::policy::by_name(&s.policy)
        {
            t.policy = Arc::from(p);
        }
        t.max_node_selection = s.max_node_selection;
        t.image_locality = s.image_locality;
        self.writes.reconfigure(s.write_qps, s.write_burst);
    }

    /// Waits for this write's turn under the write rate limit (`Config::write_qps`).
    pub(crate) async fn write_turn(&self, lane: Lane) {
        let waited = self.writes.acquire(lane).await;
        if !waited.is_zero() {
            self.metrics.write_wait_seconds.inc_by(waited.as_secs_f64());
        }
    }

    /// `key`'s ActivationEndpoints as last seen or written (`store.rs`).
    pub(crate) fn current(&self, key: &Key) -> Option<ActivationEndpoints> {
        self.caches.ae_store.read_locked().current(key)
    }

    /// Writes an Event about `regarding` under the write limit. Best effort, bounded: a
    /// reconcile never fails or hangs on an Event. True when the API server took it.
    pub(crate) async fn publish_event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
    ) -> bool {
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter {
                controller: self.config.field_manager.clone(),
                instance: self.config.event_instance.clone(),
            },
        );
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note.to_owned()),
            action: action.to_owned(),
            secondary: None,
        };
        self.write_turn(Lane::Bulk).await;
        match tokio::time::timeout(EVENT_WRITE_LIMIT, recorder.publish(&event, regarding)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                debug!(error = %e, reason, "writing an Event");
                false
            }
            Err(_) => {
                debug!(reason, "writing an Event timed out");
                false
            }
        }
    }

    /// A Warning Event on `rev` saying why its subset is Degraded.
    pub(crate) async fn degraded_event(&self, rev: &Revision, reason: &str, message: &str) {
        let regarding = rev.object_ref(&());
        let written = self
            .publish_event(
                &regarding,
                EventType::Warning,
                reason,
                message,
                "AssignActivators",
            )
            .await;
        if written {
            self.metrics.degraded_events.inc();
        }
    }

    /// An Event on `rev` about its hosts (a hand-over), Normal or Warning.
    pub(crate) async fn revision_event(
        &self,
        rev: &Revision,
        normal: bool,
        reason: &str,
        message: &str,
    ) {
        let type_ = if normal {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let regarding = rev.object_ref(&());
        self.publish_event(&regarding, type_, reason, message, "RouteHosts")
            .await;
    }

    /// Applies `rev`'s EndpointSlice (server-side apply) unless the members are those last
    /// applied. The first reconcile of each revision after a start applies it once.
    pub(crate) async fn apply_endpoint_slice(
        &self,
        key: &Key,
        rev: &Revision,
        members: &[ActivatorMember],
    ) -> Result<()> {
        if self.slices.locked().get(key).is_some_and(|m| m == members) {
            return Ok(());
        }
        let slice = crate::pure::endpoint_slice::build(rev, members);
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &key.namespace);
        let pp = PatchParams::apply(&self.config.field_manager).force();
        self.write_turn(Lane::Bulk).await;
        api.patch(
            &crate::pure::endpoint_slice::name(&key.name),
            &pp,
            &Patch::Apply(&slice),
        )
        .await?;
        self.metrics.writes.inc();
        self.slices.locked().insert(key.clone(), members.to_vec());
        Ok(())
    }

    /// A merge patch's parameters: this controller's field manager.
    pub(crate) fn patch_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.config.field_manager.clone()),
            ..Default::default()
        }
    }
}
