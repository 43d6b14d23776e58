//! The bench's cluster: an embedded kubesim API server (CRDs applied, a kubeconfig written
//! for the activator process), one simulated node, and helpers that write Revisions with
//! their ActivationEndpoints directly (no subsetter: the subset is whatever the bench says).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crds::contract::{host_label, member_label};
use crds::{ActivationEndpoints, ActivatorMember, Revision};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::node::reserve::{NodeBlock, reserve_nodes};
use kubesim::node::{Delay, Fleet, NodeConfig, SimNode, StartDelays};

use crate::Error;

/// The namespace of the bench's revisions.
pub const NAMESPACE: &str = "bench";

/// A directory under the system temp dir, removed when dropped.
#[derive(Debug)]
pub struct WorkDir(PathBuf);

impl WorkDir {
    pub fn new(what: &str) -> Result<Self, Error> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "local-activator-bench-{}-{what}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How to build the cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The API server's write-latency model (`0ms`: answered from memory).
    pub write_latency: Delay,
    /// The simulated node's pod start delays.
    pub delays: StartDelays,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            write_latency: Delay::ZERO,
            delays: StartDelays::default(),
        }
    }
}

/// API server + one simulated node.
pub struct BenchCluster {
    pub api: ApiServer,
    pub client: Client,
    pub node: SimNode,
    fleet: Fleet,
    /// Two node indices: the simulated node's, and one no node uses (see [`Self::spare_ip`]).
    block: NodeBlock,
    pub dir: WorkDir,
    pub kubeconfig: PathBuf,
    pub write_latency: Delay,
}

impl BenchCluster {
    pub async fn start(opts: ClusterOptions) -> Result<Self, Error> {
        // The second index runs no node: its address is `spare_ip`.
        let block = reserve_nodes(2)?;
        let api = ApiServer::start(ApiServerConfig {
            write_latency: opts.write_latency.clone(),
            ..ApiServerConfig::default()
        })
        .await?;
        let dir = WorkDir::new("cluster")?;
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)?;
        let client = api.client();
        loadtest::cluster::apply_crds(&client).await?;
        loadtest::cluster::ensure_namespace(&client, NAMESPACE).await?;
        let config = NodeConfig::numbered(block.first())
            .with_max_pods(kubesim::node::addresses::MAX_PODS_PER_NODE as u32)
            .with_delays(opts.delays);
        let fleet = Fleet::start(client.clone(), vec![config]).await?;
        let node = fleet
            .nodes()
            .next()
            .cloned()
            .ok_or_else(|| Error::Options("the fleet started no node".into()))?;
        tracing::info!(node = node.name(), ip = %node.ip(), api = %api.url(), "cluster started");
        Ok(Self {
            api,
            client,
            node,
            fleet,
            block,
            dir,
            kubeconfig,
            write_latency: opts.write_latency,
        })
    }

    pub fn node_name(&self) -> &str {
        self.node.name()
    }

    pub fn node_ip(&self) -> Ipv4Addr {
        self.node.ip()
    }

    /// A loopback address of this cluster's reservation that no simulated node or pod uses:
    /// for a second activator process serving as this node's (`bench warm --baseline-bin`),
    /// so that it has its own address and never shares the node's.
    pub fn spare_ip(&self) -> Ipv4Addr {
        kubesim::node::node_ip(self.block.first() + 1)
    }

    /// The ActivationEndpoints entry of this node's activator serving at `data`.
    pub fn member(&self, data: SocketAddr) -> ActivatorMember {
        ActivatorMember {
            node: self.node_name().to_string(),
            address: data.to_string(),
            pod: format!("local-activator-{}", self.node_name()),
            max_pods: 0,
            min_pods: 0,
        }
    }

    /// Which API server, under which write-latency model.
    pub fn api_description(&self) -> String {
        format!(
            "embedded kubesim, write latency {} (the load test's calibrated model is {})",
            self.write_latency,
            loadtest::cluster::CALIBRATED_WRITE_LATENCY
        )
    }

    /// API requests by verb so far.
    pub fn api_requests_by_verb(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for (k, n) in self.api.stats().requests {
            *out.entry(k.verb.clone()).or_default() += n;
        }
        out
    }

    pub async fn shutdown(self) {
        self.fleet.shutdown();
        self.api.shutdown().await;
    }
}

/// The host a bench revision claims.
pub fn host_of(name: &str) -> String {
    format!("{name}.{NAMESPACE}.bench.test")
}

/// Creates the Revision `name` (kubesim's echo app) and its ActivationEndpoints listing
/// `members`, labelled as the contracts, docs/architecture.md says (one member label per member, one host label per
/// host), owned by the Revision. Three writes: the Revision, the object, its status.
pub async fn create_revision(
    client: &Client,
    name: &str,
    members: &[ActivatorMember],
    tweak: impl FnOnce(&mut Revision),
) -> Result<(), Error> {
    let host = host_of(name);
    let mut rev = loadtest::demo::echo_revision(name, NAMESPACE, vec![host.clone()]);
    tweak(&mut rev);
    let revs: Api<Revision> = Api::namespaced(client.clone(), NAMESPACE);
    let rev = revs.create(&PostParams::default(), &rev).await?;

    let mut labels: std::collections::BTreeMap<String, String> = members
        .iter()
        .map(|m| (member_label(&m.node), String::new()))
        .collect();
    labels.insert(host_label(&host), String::new());
    let mut ae = ActivationEndpoints::new(name, Default::default());
    ae.metadata.namespace = Some(NAMESPACE.into());
    ae.metadata.labels = Some(labels);
    ae.metadata.owner_references = rev.controller_owner_ref(&()).map(|o| vec![o]);
    let aes: Api<ActivationEndpoints> = Api::namespaced(client.clone(), NAMESPACE);
    aes.create(&PostParams::default(), &ae).await?;
    let status = serde_json::json!({
        "status": {
            "activators": members,
            "policy": "bench",
            "observedGeneration": rev.metadata.generation.unwrap_or(1),
        }
    });
    aes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// A free TCP port on `ip` (bound and released: the caller binds it a moment later).
pub fn free_port(ip: Ipv4Addr) -> Result<u16, Error> {
    let l = std::net::TcpListener::bind((ip, 0))?;
    Ok(l.local_addr()?.port())
}
