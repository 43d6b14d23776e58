//! Many simulated nodes in one process, sharing one `kube::Client`.

use std::collections::{BTreeMap, HashSet};
use std::pin::pin;
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::task::JoinHandle;

use super::agent::AgentDir;
use super::app::AppStats;
use super::config::NodeConfig;
use super::error::NodeError;
use super::sim_node::{KillMode, PodInfo, SimNode, WatchMode};

#[derive(Clone, Debug)]
pub struct FleetOptions {
    pub watch_mode: WatchMode,
    /// Nodes registering at the same time during start.
    pub start_concurrency: usize,
    /// Every node without an `agent_socket` of its own serves a simulated node agent on a
    /// socket in a directory of the fleet's ([`AgentDir`]), removed when the fleet stops.
    pub node_agents: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            watch_mode: WatchMode::PerNode,
            start_concurrency: 64,
            node_agents: false,
        }
    }
}

/// A set of running simulated nodes. Dropping it stops them (their Node objects stay, as a
/// real machine's would when it is switched off).
pub struct Fleet {
    nodes: Arc<BTreeMap<String, SimNode>>,
    shared_watch: Option<JoinHandle<()>>,
    /// The nodes' agent sockets, when the fleet made them ([`FleetOptions::node_agents`]).
    agent_dir: Option<AgentDir>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

impl Fleet {
    pub async fn start(client: Client, configs: Vec<NodeConfig>) -> Result<Fleet, NodeError> {
        Self::start_with(client, configs, FleetOptions::default()).await
    }

    /// Registers every node, starts heartbeats and pod watches, and returns once every
    /// kubelet has listed the pods bound to it.
    pub async fn start_with(
        client: Client,
        configs: Vec<NodeConfig>,
        options: FleetOptions,
    ) -> Result<Fleet, NodeError> {
        let agent_dir = options.node_agents.then(AgentDir::new).transpose()?;
        let configs: Vec<NodeConfig> = match &agent_dir {
            None => configs,
            Some(dir) => configs
                .into_iter()
                .map(|mut c| {
                    if c.agent_socket.is_none() {
                        c.agent_socket = Some(dir.socket(&c.name));
                    }
                    c
                })
                .collect(),
        };
        let mut names = HashSet::new();
        let mut indices = HashSet::new();
        for config in &configs {
            config.validate()?;
            if !names.insert(config.name.clone()) {
                return Err(NodeError::InvalidConfig(format!(
                    "duplicate node name {}",
                    config.name
                )));
            }
            if !indices.insert(config.index) {
                return Err(NodeError::InvalidConfig(format!(
                    "duplicate node index {}",
                    config.index
                )));
            }
        }
        let began = Instant::now();
        let nodes: BTreeMap<String, SimNode> = configs
            .into_iter()
            .map(|c| {
                (
                    c.name.clone(),
                    SimNode::new(client.clone(), c, options.watch_mode),
                )
            })
            .collect();
        let mut fleet = Fleet {
            nodes: Arc::new(nodes),
            shared_watch: None,
            agent_dir,
        };

        let started: Result<Vec<()>, NodeError> = stream::iter(fleet.nodes.values().cloned())
            .map(|node| async move { node.start(false).await })
            .buffer_unordered(options.start_concurrency.max(1))
            .try_collect()
            .await;
        // On error `fleet` drops here and stops the nodes that did start.
        started?;
        let registered = began.elapsed();
        if options.watch_mode == WatchMode::Shared {
            fleet.shared_watch = Some(tokio::spawn(shared_watch(client, fleet.nodes.clone())));
        }
        futures::future::join_all(fleet.nodes.values().map(SimNode::wait_synced)).await;
        tracing::info!(
            nodes = fleet.nodes.len(),
            registered_ms = registered.as_millis() as u64,
            ready_ms = began.elapsed().as_millis() as u64,
            watch_mode = ?options.watch_mode,
            "simulated nodes started"
        );
        Ok(fleet)
    }

    /// The directory of the nodes' agent sockets (`<node>.sock`), when the fleet made it.
    pub fn agent_dir(&self) -> Option<&std::path::Path> {
        self.agent_dir.as_ref().map(AgentDir::path)
    }

    pub fn node(&self, name: &str) -> Option<SimNode> {
        self.nodes.get(name).cloned()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &SimNode> {
        self.nodes.values()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn get(&self, name: &str) -> Result<&SimNode, NodeError> {
        self.nodes
            .get(name)
            .ok_or_else(|| NodeError::UnknownNode(name.to_owned()))
    }

    /// Kills a node; its apps refuse connections. See [`SimNode::kill`].
    pub async fn kill(&self, name: &str) -> Result<(), NodeError> {
        self.kill_with(name, KillMode::Refuse).await
    }

    pub async fn kill_with(&self, name: &str, mode: KillMode) -> Result<(), NodeError> {
        self.get(name)?.kill(mode).await;
        Ok(())
    }

    pub async fn revive(&self, name: &str) -> Result<(), NodeError> {
        self.get(name)?.revive().await
    }

    /// Finds a pod on whichever node runs it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<(SimNode, PodInfo)> {
        self.nodes
            .values()
            .find_map(|n| n.pod(namespace, name).map(|p| (n.clone(), p)))
    }

    pub fn app_stats(&self, namespace: &str, name: &str) -> Option<Arc<AppStats>> {
        self.nodes
            .values()
            .find_map(|n| n.app_stats(namespace, name))
    }

    /// Requests served by every app currently running in the fleet.
    pub fn requests(&self) -> u64 {
        self.nodes.values().map(SimNode::requests).sum()
    }

    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(task) = self.shared_watch.take() {
            task.abort();
        }
        for node in self.nodes.values() {
            node.stop();
        }
        // After the nodes: their servers are told to stop and their sockets are unlinked.
        self.agent_dir = None;
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One watch on all pods for the whole fleet, dispatched by `spec.nodeName`.
async fn shared_watch(client: Client, nodes: Arc<BTreeMap<String, SimNode>>) {
    let api: Api<Pod> = Api::all(client);
    let mut events = pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
    let node_of = |pod: &Pod| {
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| nodes.get(n))
    };
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => nodes.values().for_each(|n| n.inner.begin_resync()),
            Ok(Event::InitDone) => nodes.values().for_each(|n| n.inner.end_resync()),
            Ok(Event::Apply(pod) | Event::InitApply(pod)) => {
                if let Some(node) = node_of(&pod) {
                    node.inner.on_apply(pod);
                }
            }
            Ok(Event::Delete(pod)) => {
                if let Some(node) = node_of(&pod) {
                    node.inner.on_delete(&pod);
                }
            }
            Err(e) => tracing::warn!(error = %e, "shared pod watch failed; retrying"),
        }
    }
}
