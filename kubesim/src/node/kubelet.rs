//! The kubelet's pod side: watch the pods bound to the node, admit them, start their apps
//! after the configured delays, report status, and stop and remove them when deleted.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use rand::RngExt as _;
use tokio::time::{Instant, MissedTickBehavior};

use super::addresses::is_pod_ip_of;
use super::app::{App, AppSpec};
use super::objects::{self, ContainersPhase, PodTimes, now, status_patch};
use super::retry::{delete_pod_now, patch_pod_status};
use super::sim_node::{NodeInner, PodRuntime, PodStage};

/// Attempts to bind a pod's address; a just-stopped app may hold it for a moment.
const BIND_ATTEMPTS: u32 = 20;
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// The node's own pod watch (per-node mode). Runs until aborted (node killed or stopped).
pub(crate) async fn watch_pods(node: Arc<NodeInner>) {
    let api: Api<Pod> = Api::all(node.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", node.config.name));
    let mut events = pin!(watcher::watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => node.on_event(event),
            Err(e) => {
                tracing::warn!(node = %node.config.name, error = %e, "pod watch failed; retrying")
            }
        }
    }
}

/// The kubelet's PLEG relist (`relist` delay non-zero): a tick on a fixed period, at a random
/// phase per node start, as real kubelets started at different times relist out of step. Runs
/// until aborted (node killed or stopped). A relist that finds a started container is what
/// lets the kubelet report it: [`NodeInner::next_relist`].
pub(crate) async fn relist(node: Arc<NodeInner>) {
    let period = node.config.delays.relist.sample_now();
    if period.is_zero() {
        return;
    }
    let offset = period.mul_f64(rand::rng().random::<f64>());
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
    // The kubelet waits a period after each relist ends (wait.Until): a late relist shifts
    // the next ones rather than firing a burst to catch up.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        node.relists.send_modify(|n| *n += 1);
    }
}

impl NodeInner {
    /// Resolves at the node's next PLEG relist; at once when relists are not modelled.
    pub(crate) async fn next_relist(&self) {
        if self.config.delays.relist.is_zero() {
            return;
        }
        // Subscribing marks the current tick seen: only a relist after this call counts.
        let mut ticks = self.relists.subscribe();
        // An error means the node is going away, and this pod's task with it.
        let _ = ticks.changed().await;
    }

    pub(crate) fn on_event(self: &Arc<Self>, event: Event<Pod>) {
        match event {
            Event::Init => self.begin_resync(),
            Event::InitApply(pod) | Event::Apply(pod) => self.on_apply(pod),
            Event::InitDone => self.end_resync(),
            Event::Delete(pod) => self.on_delete(&pod),
        }
    }

    pub(crate) fn begin_resync(&self) {
        let mut st = self.lock();
        if st.alive {
            st.resync = Some(HashSet::new());
        }
    }

    /// Pods the relist did not return were deleted while the watch was down.
    pub(crate) fn end_resync(&self) {
        let mut st = self.lock();
        if !st.alive {
            return;
        }
        let Some(seen) = st.resync.take() else { return };
        let gone: Vec<String> = st
            .pods
            .keys()
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(rt) = st.pods.remove(&uid) {
                release(&mut st.ips, rt);
            }
        }
        drop(st);
        self.synced.send_replace(true);
        self.changed();
    }

    pub(crate) fn on_delete(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        let mut st = self.lock();
        if !st.alive {
            return;
        }
        if let Some(rt) = st.pods.remove(uid) {
            tracing::debug!(node = %self.config.name, pod = %rt.name, "pod gone");
            release(&mut st.ips, rt);
            drop(st);
            self.changed();
        }
    }

    pub(crate) fn on_apply(self: &Arc<Self>, pod: Pod) {
        self.apply(pod);
        self.changed();
    }

    fn apply(self: &Arc<Self>, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(self.config.name.as_str())
        {
            return;
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        if !st.alive {
            return;
        }
        if let Some(seen) = st.resync.as_mut() {
            seen.insert(uid.clone());
        }
        let deleting = pod.metadata.deletion_timestamp.is_some();

        if let Some(rt) = st.pods.get_mut(&uid) {
            let resume = std::mem::take(&mut rt.suspended);
            match rt.stage {
                PodStage::Terminating => {
                    if resume {
                        rt.task = Some(self.spawn_terminate(pod, uid));
                    }
                }
                PodStage::Rejected | PodStage::Finished => {
                    if deleting {
                        rt.stage = PodStage::Terminating;
                        rt.task = Some(self.spawn_terminate(pod, uid));
                    }
                }
                PodStage::Starting | PodStage::Running => {
                    if deleting {
                        if let Some(task) = rt.task.take() {
                            task.abort();
                        }
                        rt.stage = PodStage::Terminating;
                        rt.task = Some(self.spawn_terminate(pod, uid));
                    } else if resume {
                        rt.stage = PodStage::Starting;
                        let ip = rt.ip.unwrap_or(self.config.ip());
                        let external = rt.external;
                        rt.task = Some(self.spawn_start(pod, uid, ip, external, true));
                    } else if rt.stage == PodStage::Running
                        && kube_readings::pod_ready::marked_by_the_node_controller(&pod)
                    {
                        // The node lifecycle controller marked a running pod unready (its
                        // lease was late: an API server too busy to take the renewals). A
                        // real kubelet's status manager, seeing the API's status differ from
                        // its own, writes its own back; without this the mark stayed for
                        // good here, and a harness waiting for the pod to be Ready gave up
                        // (docs/kubesim-nodes.md, "The node controller's unready mark").
                        self.spawn_ready_again(pod);
                    }
                }
            }
            return;
        }

        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let external = objects::is_external(&pod);
        let mut runtime = PodRuntime {
            namespace,
            name,
            ip: None,
            external,
            stage: PodStage::Finished,
            app: None,
            task: None,
            suspended: false,
        };
        if objects::is_terminal(&pod) || deleting {
            // Never started here (or finished already): nothing to stop, only the object to remove.
            if deleting {
                runtime.stage = PodStage::Terminating;
                runtime.task = Some(self.spawn_terminate(pod, uid.clone()));
            }
            st.pods.insert(uid, runtime);
            return;
        }

        let used = st
            .pods
            .values()
            .filter(|rt| rt.stage.counts_against_capacity())
            .count();
        let ip = if used >= self.config.max_pods as usize {
            None
        } else if external {
            Some(self.config.ip())
        } else {
            let existing = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
                .filter(|ip| is_pod_ip_of(self.config.index, *ip));
            match existing {
                Some(ip) if st.ips.claim(ip) => Some(ip),
                _ => st.ips.allocate(),
            }
        };
        match ip {
            None => {
                tracing::info!(node = %self.config.name, pod = %runtime.name, used, "pod rejected: OutOfpods");
                runtime.stage = PodStage::Rejected;
                runtime.task = Some(self.spawn_reject(pod, used));
            }
            Some(ip) => {
                let already_running =
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                runtime.stage = PodStage::Starting;
                runtime.ip = Some(ip);
                runtime.task =
                    Some(self.spawn_start(pod, uid.clone(), ip, external, already_running));
            }
        }
        st.pods.insert(uid, runtime);
    }

    /// Writes the Ready condition back to True on a running pod the node lifecycle
    /// controller marked (the other conditions as the API has them).
    fn spawn_ready_again(self: &Arc<Self>, pod: Pod) {
        let Some(mut conditions) = pod.status.as_ref().and_then(|s| s.conditions.clone()) else {
            return;
        };
        for c in conditions.iter_mut().filter(|c| c.type_ == "Ready") {
            c.status = "True".into();
            c.reason = None;
            c.message = None;
            c.last_transition_time = Some(now());
        }
        let api = pod_api(self, &pod);
        let name = pod_name(&pod);
        let node = self.config.name.clone();
        tokio::spawn(async move {
            let patch = status_patch(&serde_json::json!({ "conditions": conditions }));
            match patch_pod_status(&api, &name, &patch).await {
                Ok(_) => {
                    tracing::debug!(%node, pod = %name, "the node controller's unready mark corrected")
                }
                Err(e) => {
                    tracing::warn!(%node, pod = %name, error = %e, "could not correct the node controller's unready mark")
                }
            }
        });
    }

    fn spawn_reject(self: &Arc<Self>, pod: Pod, used: usize) -> tokio::task::AbortHandle {
        let node = self.clone();
        tokio::spawn(async move {
            let api = pod_api(&node, &pod);
            let patch = status_patch(&objects::out_of_pods_status(used, node.config.max_pods));
            if let Err(e) = patch_pod_status(&api, &pod_name(&pod), &patch).await {
                tracing::warn!(node = %node.config.name, pod = %pod_name(&pod), error = %e, "could not report rejection");
            }
        })
        .abort_handle()
    }

    fn spawn_start(
        self: &Arc<Self>,
        pod: Pod,
        uid: String,
        ip: Ipv4Addr,
        external: bool,
        resume: bool,
    ) -> tokio::task::AbortHandle {
        let node = self.clone();
        tokio::spawn(async move {
            if let Err(e) = node.start_pod(&pod, &uid, ip, external, resume).await {
                tracing::warn!(node = %node.config.name, pod = %pod_name(&pod), error = %e, "pod start failed");
            }
        })
        .abort_handle()
    }

    fn spawn_terminate(self: &Arc<Self>, pod: Pod, uid: String) -> tokio::task::AbortHandle {
        let node = self.clone();
        tokio::spawn(async move {
            if let Err(e) = node.terminate_pod(&pod, &uid).await {
                tracing::warn!(node = %node.config.name, pod = %pod_name(&pod), error = %e, "pod termination failed");
            }
        })
        .abort_handle()
    }

    /// `resume`: the pod ran before (node revived, or found Running on start): no image pull,
    /// no Pending report, containers start again.
    async fn start_pod(
        self: &Arc<Self>,
        pod: &Pod,
        uid: &str,
        ip: Ipv4Addr,
        external: bool,
        resume: bool,
    ) -> Result<(), kube::Error> {
        let api = pod_api(self, pod);
        let name = pod_name(pod);
        let host_ip = self.config.ip();
        let admitted = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.clone())
            .unwrap_or_else(now);
        let report = |containers: ContainersPhase, ready_changed: Time| {
            let times = PodTimes {
                admitted: admitted.clone(),
                ready_changed,
            };
            let status = objects::pod_status(pod, host_ip, Some(ip), &times, &containers);
            status_patch(&status)
        };

        if external {
            let t = now();
            let patch = report(
                ContainersPhase::Running {
                    started_at: t.clone(),
                    ready: true,
                },
                t,
            );
            if patch_pod_status(&api, &name, &patch).await? {
                self.set_stage(uid, PodStage::Running);
            }
            return Ok(());
        }

        let delays = &self.config.delays;
        if !resume {
            let times = PodTimes {
                admitted: admitted.clone(),
                ready_changed: admitted.clone(),
            };
            let pending =
                objects::pod_status(pod, host_ip, None, &times, &ContainersPhase::Creating);
            if !patch_pod_status(&api, &name, &status_patch(&pending)).await? {
                return Ok(());
            }
            sleep(delays.image_pull.sample_now()).await;
        }
        sleep(delays.container_start.sample_now()).await;

        let app = bind_app(AppSpec::from_pod(pod, &self.config.name, ip)).await;
        let app = match app {
            Ok(app) => app,
            Err(e) => {
                tracing::error!(node = %self.config.name, pod = %name, %ip, error = %e, "cannot bind the pod's app");
                return Ok(());
            }
        };
        let started_at = now();
        let bound = Instant::now();
        {
            let mut st = self.lock();
            match st.pods.get_mut(uid) {
                Some(rt) if rt.stage == PodStage::Starting && !rt.suspended => {
                    rt.app = Some(app);
                }
                // Deleted or killed meanwhile: dropping the app closes it.
                _ => return Ok(()),
            }
        }
        self.changed();

        // The readiness probe's clock starts with the container; the kubelet reports nothing
        // about the container (not even the pod's IP) until a relist has noticed it, so the
        // first report after that is Ready at once if the probe has passed meanwhile.
        let ready_at = bound + delays.readiness.sample_now();
        self.next_relist().await;
        if Instant::now() < ready_at {
            let patch = report(
                ContainersPhase::Running {
                    started_at: started_at.clone(),
                    ready: false,
                },
                admitted.clone(),
            );
            if !patch_pod_status(&api, &name, &patch).await? {
                return Ok(());
            }
            tokio::time::sleep_until(ready_at).await;
        }
        let patch = report(
            ContainersPhase::Running {
                started_at,
                ready: true,
            },
            now(),
        );
        if patch_pod_status(&api, &name, &patch).await? {
            self.set_stage(uid, PodStage::Running);
            tracing::debug!(node = %self.config.name, pod = %name, %ip, "pod ready");
        }
        Ok(())
    }

    fn set_stage(&self, uid: &str, stage: PodStage) {
        if let Some(rt) = self.lock().pods.get_mut(uid)
            && rt.stage == PodStage::Starting
        {
            rt.stage = stage;
        }
        self.changed();
    }

    /// Stops the pod's app within its grace period, reports its containers terminated, and
    /// removes the object (grace period 0), as a kubelet finishing a graceful deletion does.
    async fn terminate_pod(self: &Arc<Self>, pod: &Pod, uid: &str) -> Result<(), kube::Error> {
        let api = pod_api(self, pod);
        let name = pod_name(pod);
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                pod.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(DEFAULT_GRACE_SECONDS)
            .max(0);
        let (app, ip, external) = {
            let mut st = self.lock();
            match st.pods.get_mut(uid) {
                Some(rt) => (rt.app.take(), rt.ip, rt.external),
                None => return Ok(()),
            }
        };
        self.changed();
        let ran = app.is_some()
            || (external
                && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        if let Some(app) = app {
            app.drain(Duration::from_secs(grace as u64)).await;
        }
        if ran && let Some(ip) = ip {
            let status = pod.status.as_ref();
            let admitted = status
                .and_then(|s| s.start_time.clone())
                .unwrap_or_else(now);
            let started_at = status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first())
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.running.as_ref())
                .and_then(|r| r.started_at.clone())
                .unwrap_or_else(|| admitted.clone());
            let finished = now();
            let times = PodTimes {
                admitted,
                ready_changed: finished.clone(),
            };
            let phase = ContainersPhase::Terminated {
                started_at,
                finished_at: finished,
            };
            let terminated = objects::pod_status(pod, self.config.ip(), Some(ip), &times, &phase);
            if !patch_pod_status(&api, &name, &status_patch(&terminated)).await? {
                return Ok(());
            }
        }
        delete_pod_now(&api, &name, uid).await
    }
}

/// Drops a pod's runtime: its app closes at once and its address goes back to the pool.
fn release(ips: &mut super::addresses::PodIpPool, mut rt: PodRuntime) {
    if let Some(task) = rt.task.take() {
        task.abort();
    }
    if let Some(ip) = rt.ip
        && !rt.external
    {
        ips.free(ip);
    }
}

async fn bind_app(spec: AppSpec) -> std::io::Result<App> {
    let mut attempt = 0;
    loop {
        match App::start(spec.clone()).await {
            Ok(app) => return Ok(app),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && attempt + 1 < BIND_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(25 * attempt as u64)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

fn pod_api(node: &NodeInner, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        node.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}
