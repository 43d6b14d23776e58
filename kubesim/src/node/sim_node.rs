//! One simulated node: its state (pods, addresses, apps) and the handle tests use to look at
//! it, kill it and bring it back.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::DropGuard;

use super::addresses::PodIpPool;
use super::app::{App, AppStats};
use super::config::NodeConfig;
use super::error::NodeError;
use super::{agent, kubelet, lease};

/// How the kubelets learn about their pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchMode {
    /// Each node watches `pods?fieldSelector=spec.nodeName=<node>`, as a real kubelet does.
    #[default]
    PerNode,
    /// One watch on all pods, dispatched by `spec.nodeName`: one connection instead of one
    /// per node, for thousands of nodes in one process.
    Shared,
}

/// What a killed node's apps do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KillMode {
    /// Listeners close: connections are refused, open ones are cut.
    #[default]
    Refuse,
    /// Connections are accepted and never answered.
    BlackHole,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodStage {
    /// Admitted, containers being pulled and started.
    Starting,
    Running,
    /// Being stopped after its deletion, or waiting for its object to go.
    Terminating,
    /// Refused at admission (OutOfpods).
    Rejected,
    /// Was terminal already when the kubelet saw it.
    Finished,
}

impl PodStage {
    /// Pods that take a slot of the node's pod capacity.
    pub fn counts_against_capacity(self) -> bool {
        matches!(
            self,
            PodStage::Starting | PodStage::Running | PodStage::Terminating
        )
    }
}

pub(crate) struct PodRuntime {
    pub namespace: String,
    pub name: String,
    /// This node's address for external pods; `None` for pods that never got one.
    pub ip: Option<Ipv4Addr>,
    pub external: bool,
    pub stage: PodStage,
    pub app: Option<App>,
    pub task: Option<AbortHandle>,
    /// Its node was killed: the app and tasks are gone and resume on revive.
    pub suspended: bool,
}

pub(crate) struct NodeState {
    pub alive: bool,
    pub tasks: Vec<JoinHandle<()>>,
    pub pods: HashMap<String, PodRuntime>,
    pub ips: PodIpPool,
    /// Uids seen since the watch's (re)list began.
    pub resync: Option<HashSet<String>>,
    pub node_uid: Option<String>,
    /// The node agent's server ([`agent`]) while the node is alive; dropping it stops it.
    pub agent: Option<DropGuard>,
}

pub(crate) struct NodeInner {
    pub config: NodeConfig,
    pub client: Client,
    pub watch_mode: WatchMode,
    pub boot_id: String,
    pub state: Mutex<NodeState>,
    /// True once the pod watch has listed what is bound to the node.
    pub synced: watch::Sender<bool>,
    /// Bumped whenever a pod's local state changes, for [`SimNode::wait_pod`].
    pub changes: watch::Sender<()>,
    /// Bumped by each PLEG relist of the kubelet ([`kubelet::relist`]); a started pod waits
    /// for the next one before anything about its containers is reported.
    pub relists: watch::Sender<u64>,
}

impl NodeInner {
    pub fn changed(&self) {
        self.changes.send_replace(());
    }

    pub fn lock(&self) -> MutexGuard<'_, NodeState> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A pod as the node's kubelet sees it.
#[derive(Clone, Debug)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub ip: Option<Ipv4Addr>,
    pub external: bool,
    pub stage: PodStage,
    /// Where its app listens, while it runs.
    pub app_addr: Option<SocketAddr>,
    pub app_stats: Option<Arc<AppStats>>,
}

/// A handle on one simulated node; cheap to clone.
#[derive(Clone)]
pub struct SimNode {
    pub(crate) inner: Arc<NodeInner>,
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNode")
            .field("name", &self.name())
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl SimNode {
    pub(crate) fn new(client: Client, config: NodeConfig, watch_mode: WatchMode) -> Self {
        let boot_id = format!("{:032x}", rand::random::<u128>());
        let ips = PodIpPool::new(config.index);
        SimNode {
            inner: Arc::new(NodeInner {
                config,
                client,
                watch_mode,
                boot_id,
                state: Mutex::new(NodeState {
                    alive: false,
                    tasks: Vec::new(),
                    pods: HashMap::new(),
                    ips,
                    resync: None,
                    node_uid: None,
                    agent: None,
                }),
                synced: watch::channel(false).0,
                changes: watch::channel(()).0,
                relists: watch::channel(0).0,
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.inner.config.ip()
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    /// Where the node's agent listens (see [`NodeConfig::agent_socket`]), if it runs one.
    pub fn agent_socket(&self) -> Option<&std::path::Path> {
        self.inner.config.agent_socket.as_deref()
    }

    pub fn is_alive(&self) -> bool {
        self.inner.lock().alive
    }

    pub fn pods(&self) -> Vec<PodInfo> {
        self.inner
            .lock()
            .pods
            .iter()
            .map(|(uid, rt)| PodInfo {
                namespace: rt.namespace.clone(),
                name: rt.name.clone(),
                uid: uid.clone(),
                ip: rt.ip,
                external: rt.external,
                stage: rt.stage,
                app_addr: rt.app.as_ref().map(App::addr),
                app_stats: rt.app.as_ref().map(|a| a.stats().clone()),
            })
            .collect()
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        self.pods()
            .into_iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }

    /// The counters of a pod's running app.
    pub fn app_stats(&self, namespace: &str, name: &str) -> Option<Arc<AppStats>> {
        self.inner
            .lock()
            .pods
            .values()
            .find(|rt| rt.namespace == namespace && rt.name == name)
            .and_then(|rt| rt.app.as_ref().map(|a| a.stats().clone()))
    }

    /// Stops a running pod's app and returns the address it listened on, leaving the pod
    /// Running and Ready: a test binds its own server there to play an app that misbehaves
    /// (raw bytes no HTTP library would write). None if the pod has no running app.
    pub async fn take_over_app(&self, namespace: &str, name: &str) -> Option<SocketAddr> {
        let app = self
            .inner
            .lock()
            .pods
            .values_mut()
            .find(|rt| rt.namespace == namespace && rt.name == name)
            .and_then(|rt| rt.app.take())?;
        let addr = app.addr();
        // Returns once the listener is closed: the address is free to bind.
        app.stop().await;
        Some(addr)
    }

    /// Requests served by all apps currently running on this node.
    pub fn requests(&self) -> u64 {
        self.inner
            .lock()
            .pods
            .values()
            .filter_map(|rt| rt.app.as_ref())
            .map(|a| a.stats().requests())
            .sum()
    }

    /// Resolves once `cond` holds for the kubelet's view of a pod (`None`: it has none), e.g.
    /// `|p| p.is_some_and(|p| p.stage == PodStage::Running)`: the app is bound and Ready has
    /// been reported.
    pub async fn wait_pod(
        &self,
        namespace: &str,
        name: &str,
        cond: impl Fn(Option<&PodInfo>) -> bool,
    ) {
        let mut rx = self.inner.changes.subscribe();
        loop {
            if cond(self.pod(namespace, name).as_ref()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Resolves at the kubelet's next PLEG relist (at once when relists are not modelled):
    /// a test that starts a pod right after one knows the pod's status cannot have its IP
    /// for almost a whole period.
    pub async fn next_relist(&self) {
        self.inner.next_relist().await;
    }

    /// Resolves once the kubelet has listed the pods bound to it (after start or revive).
    pub async fn wait_synced(&self) {
        let mut rx = self.inner.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Registers the node, then starts its heartbeats and (per-node mode) its pod watch.
    /// `list_pods`: re-sync by one list, for shared mode where no watch of its own relists.
    pub(crate) async fn start(&self, list_pods: bool) -> Result<(), NodeError> {
        let inner = &self.inner;
        let registered = lease::register(inner).await?;
        {
            let mut st = inner.lock();
            if let Some(path) = &inner.config.agent_socket {
                let guard = agent::start(inner, path).map_err(|source| NodeError::NodeIo {
                    node: inner.config.name.clone(),
                    source,
                })?;
                st.agent = Some(guard);
            }
            st.alive = true;
            st.node_uid = Some(registered.node_uid.clone());
            st.tasks
                .push(tokio::spawn(lease::heartbeat(inner.clone(), registered)));
            if !inner.config.delays.relist.is_zero() {
                st.tasks.push(tokio::spawn(kubelet::relist(inner.clone())));
            }
            if inner.watch_mode == WatchMode::PerNode {
                st.tasks
                    .push(tokio::spawn(kubelet::watch_pods(inner.clone())));
            }
        }
        if list_pods {
            let api: Api<Pod> = Api::all(inner.client.clone());
            let lp = ListParams::default().fields(&format!("spec.nodeName={}", inner.config.name));
            let pods = api.list(&lp).await?;
            inner.begin_resync();
            for pod in pods.items {
                inner.on_apply(pod);
            }
            inner.end_resync();
        }
        Ok(())
    }

    /// Stops the node as a crash or a network partition would: no more lease renewals or
    /// status, the kubelet ignores its pods, and its apps stop answering (per `mode`).
    /// Returns once refused listeners are closed.
    pub async fn kill(&self, mode: KillMode) {
        let apps = {
            let mut st = self.inner.lock();
            if !st.alive {
                return;
            }
            st.alive = false;
            st.resync = None;
            // A dead machine's agent does not answer either; revive starts it again.
            st.agent = None;
            for task in st.tasks.drain(..) {
                task.abort();
            }
            let mut apps = Vec::new();
            for rt in st.pods.values_mut() {
                if let Some(task) = rt.task.take() {
                    task.abort();
                }
                rt.suspended = true;
                match mode {
                    KillMode::Refuse => apps.extend(rt.app.take()),
                    KillMode::BlackHole => {
                        if let Some(app) = &rt.app {
                            app.black_hole();
                        }
                    }
                }
            }
            apps
        };
        self.inner.synced.send_replace(false);
        self.inner.changed();
        for app in apps {
            app.stop().await;
        }
        tracing::info!(node = %self.name(), ?mode, "node killed");
    }

    /// Brings a killed node back: registers again (Ready=True), resumes heartbeats, and
    /// re-syncs its pods, restarting the apps of those still bound to it.
    pub async fn revive(&self) -> Result<(), NodeError> {
        let apps: Vec<App> = {
            let mut st = self.inner.lock();
            if st.alive {
                return Ok(());
            }
            st.pods
                .values_mut()
                .filter_map(|rt| rt.app.take())
                .collect()
        };
        for app in apps {
            app.stop().await;
        }
        self.start(self.inner.watch_mode == WatchMode::Shared)
            .await?;
        tracing::info!(node = %self.name(), "node revived");
        Ok(())
    }

    /// Stops everything without touching the API (the Fleet is going away). Apps close as
    /// their tasks are cancelled, right after this returns.
    pub(crate) fn stop(&self) {
        let mut st = self.inner.lock();
        st.alive = false;
        st.agent = None;
        if let Some(path) = &self.inner.config.agent_socket
            && let Err(e) = agent::remove_socket(path)
        {
            tracing::warn!(node = %self.name(), error = %e, "removing the agent socket");
        }
        for task in st.tasks.drain(..) {
            task.abort();
        }
        for (_, mut rt) in st.pods.drain() {
            if let Some(task) = rt.task.take() {
                task.abort();
            }
        }
        drop(st);
        self.inner.changed();
    }
}
