//! What the harness's watches record: the status changes, the Ready app pods by revision.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::contract::REVISION_LABEL;
use crds::{ActivationEndpoints, Revision, Route};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

use super::figures::signed_ms;
use crate::Error;

/// A change of a watched status field, as the harness's watch saw it.
#[derive(Debug, Clone)]
pub struct StatusEvent {
    pub at: Instant,
    /// `Revision`, `Route` or `ActivationEndpoints`.
    pub kind: &'static str,
    pub object: String,
    /// A condition type, `summary` (a Route's) or `routes` (an ActivationEndpoints' host
    /// shares, what the activators read).
    pub field: String,
    /// `status/reason` of a condition, or the field's value.
    pub value: String,
    /// A condition's message and lastTransitionTime.
    pub detail: String,
}

impl StatusEvent {
    pub(super) fn json(&self, t0: Instant) -> serde_json::Value {
        json!({
            "at_ms": signed_ms(self.at, t0),
            "kind": self.kind,
            "object": self.object,
            "field": self.field,
            "value": self.value,
            "detail": self.detail,
        })
    }
}

/// The conditions of the Revisions and the Route of a namespace, the Route's summary, and of
/// the ActivationEndpoints their `HostConflict` and host shares, as they change.
pub(super) struct StatusLog {
    log: signal::Receiver<Vec<StatusEvent>>,
    tasks: Vec<JoinHandle<()>>,
}

type Fields = Vec<(String, String, String)>;

fn condition_fields(cs: &[Condition]) -> Fields {
    cs.iter()
        .map(|c| {
            let when = serde_json::to_value(&c.last_transition_time)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            (
                c.type_.clone(),
                format!("{}/{}", c.status, c.reason),
                if c.message.is_empty() {
                    format!("(lastTransitionTime {when})")
                } else {
                    format!("{} (lastTransitionTime {when})", c.message)
                },
            )
        })
        .collect()
}

fn revision_fields(r: &Revision) -> Fields {
    condition_fields(r.status.as_ref().map_or(&[], |s| &s.conditions[..]))
}

fn route_fields(r: &Route) -> Fields {
    let Some(s) = r.status.as_ref() else {
        return Vec::new();
    };
    let mut out = condition_fields(&s.conditions);
    if let Some(summary) = &s.summary {
        out.push(("summary".into(), summary.clone(), String::new()));
    }
    out
}

fn endpoints_fields(a: &ActivationEndpoints) -> Fields {
    let Some(s) = a.status.as_ref() else {
        return Vec::new();
    };
    let mut out: Fields = condition_fields(&s.conditions)
        .into_iter()
        .filter(|(field, _, _)| field == "HostConflict")
        .collect();
    let routes = if s.routes.is_empty() {
        "none".to_string()
    } else {
        s.routes
            .iter()
            .map(|r| format!("{} {}%", r.host, r.percent))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push(("routes".into(), routes, String::new()));
    out
}

impl StatusLog {
    /// The watches, once each has listed (bounded: a Route CRD missing is an error).
    pub(super) async fn start(client: &Client, ns: &str) -> Result<Self, Error> {
        let (tx, log) = signal::channel(Vec::new());
        let tx = Arc::new(tx);
        let (r_listed, r_task) = watch_fields(
            Api::<Revision>::namespaced(client.clone(), ns),
            "Revision",
            revision_fields,
            tx.clone(),
        );
        let (o_listed, o_task) = watch_fields(
            Api::<Route>::namespaced(client.clone(), ns),
            "Route",
            route_fields,
            tx.clone(),
        );
        let (a_listed, a_task) = watch_fields(
            Api::<ActivationEndpoints>::namespaced(client.clone(), ns),
            "ActivationEndpoints",
            endpoints_fields,
            tx,
        );
        let this = Self {
            log,
            tasks: vec![r_task, o_task, a_task],
        };
        let limit = Duration::from_secs(30);
        tokio::time::timeout(limit, async {
            let _ = r_listed.await;
            let _ = o_listed.await;
            let _ = a_listed.await;
        })
        .await
        .map_err(|_| Error::Timeout {
            what: "the Revision, Route and ActivationEndpoints watches to list (is the Route CRD installed?)".into(),
            secs: limit.as_secs(),
        })?;
        Ok(this)
    }

    pub(super) fn events(&self) -> Vec<StatusEvent> {
        self.log.borrow().clone()
    }
}

impl Drop for StatusLog {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Watches `api`, appending to `tx` each change of a field `fields` reads; the receiver says
/// when the first list is done.
fn watch_fields<K>(
    api: Api<K>,
    kind: &'static str,
    fields: fn(&K) -> Fields,
    tx: Arc<signal::Sender<Vec<StatusEvent>>>,
) -> (tokio::sync::oneshot::Receiver<()>, JoinHandle<()>)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed_tx = Some(listed_tx);
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(ev) = events.next().await {
            let obj = match ev {
                Ok(watcher::Event::InitDone) => {
                    if let Some(t) = listed_tx.take() {
                        let _ = t.send(());
                    }
                    continue;
                }
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, kind, "the deploy scenario's status watch");
                    continue;
                }
            };
            let now = Instant::now();
            let name = obj.name_any();
            tx.send_if_modified(|log| {
                let mut changed = false;
                for (field, value, detail) in fields(&obj) {
                    let last = log
                        .iter()
                        .rev()
                        .find(|e| e.kind == kind && e.object == name && e.field == field);
                    if last.is_none_or(|e| e.value != value) {
                        log.push(StatusEvent {
                            at: now,
                            kind,
                            object: name.clone(),
                            field,
                            value,
                            detail,
                        });
                        changed = true;
                    }
                }
                changed
            });
        }
    });
    (listed, task)
}

/// Ready app pods by revision over time, from one pod watch of the namespace.
/// Ready pods by revision, from the moment each count was seen on.
type ReadyHistory = Vec<(Instant, BTreeMap<String, usize>)>;

pub(super) struct ReadyPods {
    history: Arc<Mutex<ReadyHistory>>,
    task: JoinHandle<()>,
}

impl ReadyPods {
    pub(super) async fn start(client: &Client, ns: &str) -> Result<Self, Error> {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let cfg = watcher::Config::default().labels(REVISION_LABEL);
        let (store, writer) = reflector::store::<Pod>();
        let history = Arc::new(Mutex::new(ReadyHistory::new()));
        let h = history.clone();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            let mut events = std::pin::pin!(watcher(api, cfg).default_backoff().reflect(writer));
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(t) = listed_tx.take() {
                            let _ = t.send(());
                        }
                    }
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "the deploy scenario's pod watch");
                        continue;
                    }
                }
                let mut ready: BTreeMap<String, usize> = BTreeMap::new();
                for p in store.state() {
                    if crate::observe::is_ready(&p)
                        && let Some(rev) = p.labels().get(REVISION_LABEL)
                    {
                        *ready.entry(rev.clone()).or_default() += 1;
                    }
                }
                let mut h = h.lock().unwrap_or_else(|e| e.into_inner());
                if h.last().is_none_or(|(_, last)| *last != ready) {
                    h.push((Instant::now(), ready));
                }
            }
        });
        let limit = Duration::from_secs(30);
        tokio::time::timeout(limit, listed)
            .await
            .map_err(|_| Error::Timeout {
                what: "the app pod watch to list".into(),
                secs: limit.as_secs(),
            })?
            .map_err(|_| Error::Options("the app pod watch ended".into()))?;
        Ok(Self { history, task })
    }

    /// Ready pods by revision at `t`, as the watch had seen them.
    pub(super) fn at(&self, t: Instant) -> BTreeMap<String, usize> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

impl Drop for ReadyPods {
    fn drop(&mut self) {
        self.task.abort();
    }
}
