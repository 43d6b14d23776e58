//! A whole local-activator system in one process: an API server (kubesim's, or a real one from
//! `KUBECONFIG`), simulated nodes, the subsetter, and one activator per node at the node's own
//! loopback address, represented in the API as a Ready DaemonSet-style pod on its node.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use activator::WatchOnly;
use activator::{Activator, ActivatorConfig};
use crds::contract::{
    ADMIN_PORT, APP_NAME_LABEL, APP_NAME_VALUE, COMPONENT_LABEL, COMPONENT_VALUE, DATA_PORT,
    NODE_ACTIVATOR_LABEL, SUBSETTER_LABEL,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Pod, PodSpec, ServiceAccount,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::node::reserve::{NodeBlock, reserve_nodes};
use kubesim::node::{
    Delay, Fleet, FleetOptions, NodeConfig, NodeLifecycleController, StartDelays, WatchMode,
};
use tokio_util::sync::CancellationToken;

use crate::Error;

/// The namespace of the activator (DaemonSet) pods, as in `deploy/`. Against a shared API
/// server (`KUBECONFIG`) each cluster adds a suffix, so concurrent clusters stay apart.
pub const ACTIVATOR_NAMESPACE: &str = "local-activator";
/// Marks a pod whose process the harness runs itself (kubesim's kubelet then only reports it
/// Running and Ready with the node's IP, as for a `hostNetwork` DaemonSet pod).
const EXTERNAL_ANNOTATION: &str = "kubesim.local-activator.dev/external";

/// The write-latency model load tests use by default: the median write of a real
/// kube-apiserver + etcd on this kind of machine (a pod create seen bound in about 6 ms; a cold
/// start of several writes 24–42 ms where an in-memory server answers in 3 ms), with a
/// log-normal tail. See docs/load-testing.md.
pub const CALIBRATED_WRITE_LATENCY: &str = "lognormal:6ms,0.5";

/// The time a quorum read (a GET or LIST without resourceVersion) holds the embedded API
/// server's storage, as etcd serves it in line with the writes. See docs/load-testing.md.
pub const CALIBRATED_QUORUM_READ_LATENCY: &str = "lognormal:1ms,0.5";

/// Commits the embedded API server's storage runs at once (more requests wait in line): one,
/// as a single etcd member's raft loop. With [`CALIBRATED_STORAGE_BATCH`] and
/// [`CALIBRATED_STORAGE_WRITE_COST`] calibrated so that bulk writes at 1–256 at once go as
/// fast as on a real kube-apiserver + etcd on this kind of machine, and a burst of pod
/// creates (and reads made during it) waits about as long. See docs/kubesim.md.
pub const CALIBRATED_STORAGE_LANES: usize = 1;

/// Writes and quorum reads one commit of the embedded API server's storage takes at most:
/// those arriving while a commit runs share the next one, as etcd commits concurrent writes
/// together. See docs/kubesim.md, "Throughput".
pub const CALIBRATED_STORAGE_BATCH: usize = 64;

/// Time each write adds to a shared commit past the first: the real server's own work per
/// write (about 3 ms of kube-apiserver + etcd CPU, measured), which batching does not share.
/// It sets the bulk write rate (about 300/s, as measured). See docs/kubesim.md, "Throughput".
pub const CALIBRATED_STORAGE_WRITE_COST: &str = "3ms";

/// kube-controller-manager's `--node-monitor-grace-period` default.
pub const DEFAULT_NODE_GRACE: Duration = Duration::from_secs(40);
/// The in-process subsetter's own loopback address (nodes are 127.10.0.1 and up), for its
/// directory port.
const DIRECTORY_IP: [u8; 4] = [127, 9, 0, 1];

/// A change to each activator's configuration.
pub type ConfigureActivator = Arc<dyn Fn(&mut ActivatorConfig) + Send + Sync>;

/// How to build the cluster.
#[derive(Clone)]
pub struct ClusterOptions {
    pub nodes: usize,
    /// Simulated time from a pod's admission to its app answering and being Ready.
    pub start_delay: Delay,
    /// Simulated time from the app answering to the kubelet reporting it Ready (its
    /// readiness probe passing, then a status write).
    pub ready_delay: Delay,
    /// The simulated kubelets' PLEG relist period: a started app's IP, Running and Ready
    /// reach the API server only at its node's next relist, 0..period after it listens (a
    /// real kubelet relists every second; see docs/kubesim-nodes.md). ZERO: at once.
    pub relist: Delay,
    /// Each simulated node serves a node agent (a pod's IP from its sandbox, before the
    /// kubelet reports it) and its activator asks it, as the DaemonSet's sidecar.
    pub node_agent: bool,
    /// N for revisions without `spec.activators`.
    pub default_activators: usize,
    /// Use the API server of `KUBECONFIG` instead of an embedded kubesim one.
    pub use_kubeconfig: bool,
    /// Use this client's API server instead of an embedded one (as with `KUBECONFIG`: the
    /// server is shared, and the cluster cleans up what it created there).
    pub shared_client: Option<Client>,
    /// Latency the embedded API server adds to every request.
    pub api_latency: Option<Duration>,
    /// The embedded API server's write-latency model (an etcd commit per write on a real
    /// server); see [`CALIBRATED_WRITE_LATENCY`].
    pub api_write_latency: Delay,
    /// The embedded API server's latency for GET and LIST.
    pub api_read_latency: Delay,
    /// The embedded API server's storage time per quorum read; see
    /// [`CALIBRATED_QUORUM_READ_LATENCY`].
    pub api_quorum_read_latency: Delay,
    /// Writes and quorum reads the embedded API server's storage serves at once (`None`: no
    /// queueing); see [`CALIBRATED_STORAGE_LANES`].
    pub api_storage_lanes: Option<usize>,
    /// Writes and quorum reads one storage commit takes at most (1: one by one); see
    /// [`CALIBRATED_STORAGE_BATCH`].
    pub api_storage_batch: usize,
    /// Time each write adds to a shared commit; see [`CALIBRATED_STORAGE_WRITE_COST`].
    pub api_storage_write_cost: Delay,
    /// How long shutting down waits, in all, for what the cluster created on a shared API
    /// server to be gone (namespaces terminate only when their pods have).
    pub cleanup_timeout: Duration,
    /// One pod watch for all simulated kubelets instead of one per node (for thousands of nodes).
    pub shared_kubelet_watch: bool,
    /// Pods each simulated node admits.
    pub max_pods: u32,
    /// Only Revisions of this namespace get subsets (None = all). Set it when several
    /// clusters share one API server.
    pub revision_namespace: Option<String>,
    /// The activators' `--members-from-directory` (stand-ins included).
    pub members_from_directory: bool,
    /// Adjusts each activator's configuration (tests shorten its clocks and limits).
    pub configure_activator: Option<ConfigureActivator>,
    /// How long the embedded cluster's node lifecycle controller waits for a node's lease
    /// before marking it NotReady (kube-controller-manager's default is 40 s). Below 40 s the
    /// simulated kubelets renew their leases at a quarter of it.
    pub node_grace: Duration,
    /// Run activator processes on the first this many nodes only (None = all). Every node
    /// still gets its activator pod in the API, so the subsetter sees a full DaemonSet:
    /// a sample of real activators against a full-size cluster.
    pub real_activators: Option<usize>,
    /// The subsetter's write rate limit (writes per second; 0 = none).
    pub subsetter_write_qps: f64,
    /// The subsetter's reconciles at once (its `--concurrency`).
    pub subsetter_concurrency: u16,
    /// Directory replicas in all: the subsetter's own, and this many less one beside it
    /// (`--directory-only`, each with its own watch), every one named to the activators.
    pub directory_replicas: usize,
    /// How long the subsetter keeps an activator lost on a Ready node as a member for its
    /// replacement (its `--replacement-hold-seconds`).
    pub subsetter_replacement_hold: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            nodes: 5,
            start_delay: Delay::fixed_ms(300),
            ready_delay: Delay::ZERO,
            relist: Delay::ZERO,
            node_agent: false,
            default_activators: 3,
            use_kubeconfig: std::env::var_os("KUBECONFIG").is_some(),
            shared_client: None,
            api_latency: None,
            api_write_latency: Delay::ZERO,
            api_read_latency: Delay::ZERO,
            api_quorum_read_latency: Delay::ZERO,
            api_storage_lanes: None,
            api_storage_batch: 1,
            api_storage_write_cost: Delay::ZERO,
            cleanup_timeout: Duration::from_secs(60),
            shared_kubelet_watch: false,
            max_pods: 110,
            revision_namespace: None,
            members_from_directory: true,
            configure_activator: None,
            node_grace: DEFAULT_NODE_GRACE,
            real_activators: None,
            subsetter_write_qps: subsetter::Config::default().write_qps,
            subsetter_concurrency: subsetter::Config::default().concurrency,
            directory_replicas: 1,
            subsetter_replacement_hold: subsetter::Config::default().replacement_hold,
        }
    }
}

/// One activator of the cluster.
pub struct NodeActivator {
    pub node: String,
    pub activator: Activator,
}

/// The running system.
pub struct SimCluster {
    /// The embedded API server (None against a real cluster).
    pub api: Option<ApiServer>,
    pub client: Client,
    pub fleet: Fleet,
    pub activators: Vec<NodeActivator>,
    lifecycle: Option<NodeLifecycleController>,
    block: NodeBlock,
    activator_namespace: String,
    /// Namespaces this cluster created on a shared API server, deleted when it shuts down.
    owned_namespaces: Arc<std::sync::Mutex<Vec<String>>>,
    /// Deletes what this cluster added to a real API server if it is dropped without
    /// [`SimCluster::shutdown`] (a test that failed).
    leftovers: Leftovers,
    cleanup_timeout: Duration,
    /// Which API server, under which latency model (for reports).
    api_description: String,
    /// The simulated kubelets' model: relist period, node agent (for reports).
    kubelet_description: String,
    /// The activators' client: on the embedded server it names them (see [`Components`]).
    activator_client: Client,
    stop_subsetter: CancellationToken,
    subsetter: tokio::task::JoinHandle<()>,
    /// The in-process subsetter's metrics.
    subsetter_metrics: Arc<subsetter::metrics::Metrics>,
    /// Where the in-process subsetter answers directory lookups (`crds::directory`), and
    /// the replicas beside it after it.
    directory: Vec<SocketAddr>,
    /// The replicas beside the subsetter's own, which a scenario may kill.
    replicas: std::sync::Mutex<Vec<crate::directory_replica::DirectoryReplica>>,
    /// The activators' `--members-from-directory`, for those started from now on.
    members_from_directory: std::sync::atomic::AtomicBool,
    /// Whether the subsetter watches every namespace: only then does it stream memberships
    /// (one watching a namespace answers 501), so activators beside it watch theirs.
    members_streamed: bool,
    /// The hop secret every activator of this cluster shares (as the DaemonSet mounts one).
    hop: activator::pipeline::hop::HopAuth,
}

/// Each component's own client. On the embedded API server each names itself (kubesim counts
/// requests by `Impersonate-User`), so a report can say which component asked for what; the
/// harness itself keeps the plain client (user ""). Against another server all share one.
struct Components {
    kubelet: Client,
    node_lifecycle: Client,
    subsetter: Client,
    activator: Client,
}

/// The names [`Components`] give the embedded server, as reports show them.
pub const COMPONENTS: [&str; 4] = ["kubelet", "node-lifecycle", "subsetter", "activator"];

impl Components {
    fn of(api: &ApiServer) -> Self {
        let [kubelet, node_lifecycle, subsetter, activator] = COMPONENTS.map(|c| api.client_as(c));
        Self {
            kubelet,
            node_lifecycle,
            subsetter,
            activator,
        }
    }
    fn one(client: &Client) -> Self {
        Self {
            kubelet: client.clone(),
            node_lifecycle: client.clone(),
            subsetter: client.clone(),
            activator: client.clone(),
        }
    }
}

impl SimCluster {
    pub async fn start(opts: ClusterOptions) -> Result<Self, Error> {
        // Addresses no other cluster in this or another process is using.
        let block = reserve_nodes(opts.nodes)?;
        let (api, client, api_description, clients) = if let Some(client) =
            opts.shared_client.clone()
        {
            let clients = Components::one(&client);
            (None, client, "a shared API server".to_string(), clients)
        } else if opts.use_kubeconfig {
            let client = Client::try_default().await?;
            let clients = Components::one(&client);
            (
                None,
                client,
                "the API server of KUBECONFIG".to_string(),
                clients,
            )
        } else {
            let api = ApiServer::start(ApiServerConfig {
                latency: opts.api_latency,
                write_latency: opts.api_write_latency.clone(),
                read_latency: opts.api_read_latency.clone(),
                quorum_read_latency: opts.api_quorum_read_latency.clone(),
                storage_lanes: opts.api_storage_lanes,
                storage_batch: opts.api_storage_batch,
                storage_write_cost: opts.api_storage_write_cost.clone(),
                ..ApiServerConfig::default()
            })
            .await?;
            let client = api.client();
            let lanes = opts
                .api_storage_lanes
                .map_or("unbounded".to_string(), |n| n.to_string());
            let description = format!(
                "embedded kubesim; write latency {}, quorum read latency {}, storage lanes {lanes}, batch {}, write cost {}, read latency {}",
                opts.api_write_latency,
                opts.api_quorum_read_latency,
                opts.api_storage_batch,
                opts.api_storage_write_cost,
                opts.api_read_latency
            );
            let clients = Components::of(&api);
            (Some(api), client, description, clients)
        };
        apply_crds(&client).await?;
        let activator_namespace = if api.is_some() {
            ACTIVATOR_NAMESPACE.to_string()
        } else {
            format!("{ACTIVATOR_NAMESPACE}-{}", block.first())
        };
        let mut owned = Vec::new();
        if ensure_namespace(&client, &activator_namespace).await? {
            owned.push(activator_namespace.clone());
        }
        let owned_namespaces = Arc::new(std::sync::Mutex::new(owned));

        let shared = api.is_none();
        let configs: Vec<NodeConfig> = block
            .indices()
            .map(|i| {
                let cfg = NodeConfig::numbered(i)
                    .with_max_pods(opts.max_pods)
                    .with_delays(StartDelays {
                        container_start: opts.start_delay.clone(),
                        readiness: opts.ready_delay.clone(),
                        relist: opts.relist.clone(),
                        ..StartDelays::default()
                    });
                // On a shared API server: no DaemonSet installed there (the product's, or a
                // CNI's that honours the label) takes these nodes for its own.
                let cfg = if shared {
                    cfg.with_label(NODE_ACTIVATOR_LABEL, "false")
                } else {
                    cfg
                };
                if opts.node_grace < DEFAULT_NODE_GRACE {
                    cfg.with_lease(opts.node_grace, opts.node_grace / 4)
                } else {
                    cfg
                }
            })
            .collect();
        let fleet = Fleet::start_with(
            clients.kubelet.clone(),
            configs,
            FleetOptions {
                watch_mode: if opts.shared_kubelet_watch {
                    WatchMode::Shared
                } else {
                    WatchMode::PerNode
                },
                node_agents: opts.node_agent,
                ..FleetOptions::default()
            },
        )
        .await?;
        // A real cluster runs its own node lifecycle controller.
        let lifecycle = api.is_some().then(|| {
            NodeLifecycleController::start(clients.node_lifecycle.clone(), opts.node_grace)
        });

        let node_names = fleet.nodes().map(|n| n.name().to_string()).collect();
        let mut cluster = Self {
            api,
            client: client.clone(),
            fleet,
            activators: Vec::new(),
            lifecycle,
            block,
            activator_namespace,
            leftovers: Leftovers {
                armed: opts.use_kubeconfig && opts.shared_client.is_none(),
                nodes: node_names,
                namespaces: Arc::clone(&owned_namespaces),
            },
            owned_namespaces,
            cleanup_timeout: opts.cleanup_timeout,
            api_description,
            kubelet_description: kubelet_description(&opts.relist, opts.node_agent),
            activator_client: clients.activator.clone(),
            stop_subsetter: CancellationToken::new(),
            subsetter: tokio::spawn(async {}),
            subsetter_metrics: Arc::default(),
            directory: Vec::new(),
            replicas: Default::default(),
            members_from_directory: opts.members_from_directory.into(),
            members_streamed: opts.revision_namespace.is_none(),
            hop: activator::pipeline::hop::HopAuth::new(&format!(
                "{:032x}",
                rand::random::<u128>()
            ))
            .expect("hex is a valid hop secret"),
        };
        let sub = subsetter::Subsetter::new(
            clients.subsetter,
            subsetter::Config {
                default_activators: opts.default_activators,
                namespace: opts.revision_namespace.clone(),
                // On a shared API server: only the namespaces this cluster labelled its own.
                namespace_selector: cluster
                    .api
                    .is_none()
                    .then(|| format!("{SUBSETTER_LABEL}={}", cluster.activator_namespace)),
                activator_namespace: Some(cluster.activator_namespace.clone()),
                write_qps: opts.subsetter_write_qps,
                concurrency: opts.subsetter_concurrency,
                replacement_hold: opts.subsetter_replacement_hold,
                ..subsetter::Config::default()
            },
            Arc::new(subsetter::Random::new()),
        );
        cluster.subsetter_metrics = sub.metrics();
        // The subsetter's caches and its directory first: the activators are told where the
        // directory is when they start (the binary finds the replicas by their labels).
        let caches = Arc::new(sub.start_caches());
        let (directory, directory_task) = subsetter::directory::serve(
            SocketAddr::new(DIRECTORY_IP.into(), 0),
            Arc::clone(&caches),
        )
        .await
        .map_err(|e| Error::Options(format!("binding the subsetter's directory: {e}")))?;
        cluster.directory = vec![directory];
        for _ in 1..opts.directory_replicas {
            match crate::directory_replica::DirectoryReplica::start(&sub, DIRECTORY_IP.into()).await
            {
                Ok(r) => {
                    cluster.directory.push(r.addr);
                    cluster
                        .replicas
                        .get_mut()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(r);
                }
                Err(e) => {
                    directory_task.abort();
                    cluster.shutdown().await;
                    return Err(e);
                }
            }
        }
        let started = match cluster.start_activators(&opts).await {
            // The subsetter plans a revision with the activators its own watch has shown: a
            // harness that creates revisions as soon as its watch sees them Ready would have
            // the first ones planned over the few seen so far (under load, 49 subsets of 200
            // on one node of 30, none on the sampled ones).
            Ok(activators) => {
                let limit = Duration::from_secs(60 + opts.nodes as u64 / 50);
                match tokio::time::timeout(limit, caches.wait_for_activators(opts.nodes)).await {
                    Ok(()) => Ok(activators),
                    Err(_) => Err(Error::Timeout {
                        what: format!("the subsetter to see {} activators", opts.nodes),
                        secs: limit.as_secs(),
                    }),
                }
            }
            Err(e) => Err(e),
        };
        match started {
            Ok(activators) => cluster.activators = activators,
            Err(e) => {
                directory_task.abort();
                // On a shared API server a half-started cluster must not leave its nodes and
                // namespaces behind.
                cluster.shutdown().await;
                return Err(e);
            }
        }
        let stop = cluster.stop_subsetter.clone();
        cluster.subsetter = tokio::spawn(async move {
            if let Err(e) = sub
                .lead(&caches, async move { stop.cancelled().await })
                .await
            {
                tracing::error!(error = %e, "subsetter stopped");
            }
            directory_task.abort();
            caches.stop();
        });
        Ok(cluster)
    }

    /// One activator per node (or per sampled node), each represented by a Ready
    /// DaemonSet-style pod.
    async fn start_activators(&self, opts: &ClusterOptions) -> Result<Vec<NodeActivator>, Error> {
        use futures::StreamExt;
        let names: Vec<String> = self.fleet.nodes().map(|n| n.name().to_string()).collect();
        let real = opts.real_activators.unwrap_or(names.len()).min(names.len());
        let mut activators = Vec::with_capacity(real);
        for node in &names[..real] {
            activators.push(
                self.start_activator(node, opts.configure_activator.as_ref())
                    .await?,
            );
        }
        // The other nodes' activators exist only as pods (many, so several creates at once).
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.activator_namespace);
        let created: Vec<Result<(), Error>> = futures::stream::iter(&names[real..])
            .map(|node| async move {
                self.create_activator_pod(node, &activator_pod_name(node))
                    .await
            })
            .buffer_unordered(32)
            .collect()
            .await;
        created.into_iter().collect::<Result<Vec<()>, _>>()?;
        let limit = Duration::from_secs(60 + names.len() as u64 / 50);
        wait_ready_pods(&pods, opts.nodes, limit).await?;
        Ok(activators)
    }

    async fn create_activator_pod(&self, node: &str, pod_name: &str) -> Result<(), Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.activator_namespace);
        let pod = activator_pod(pod_name, &self.activator_namespace, node);
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces `node`'s activator pod `old` by a new one named `new`, as a DaemonSet rolling
    /// update does (the data port is a hostPort, so no surge): `old` turns unready at once
    /// (its SIGTERM fails `/readyz`) and exits `drain` later (the activator's shutdown delay
    /// and drain), and only once it is gone is `new` created. Returns once `new` is Ready.
    pub async fn replace_activator_pod(
        &self,
        node: &str,
        old: &str,
        new: &str,
        drain: Duration,
        limit: Duration,
    ) -> Result<(), Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.activator_namespace);
        let uid = match pods.get_opt(old).await? {
            Some(p) => p.metadata.uid,
            None => None,
        };
        if uid.is_some() && !drain.is_zero() {
            // What its kubelet reports when the readiness probe fails: the container and
            // the pod not ready.
            let unready = serde_json::json!({"status": {
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                    {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
                ],
                "containerStatuses": [{
                    "name": "activator", "image": "local-activator/activator:dev", "imageID": "",
                    "ready": false, "restartCount": 0, "started": true,
                    "state": {"running": {}},
                }],
            }});
            pods.patch_status(old, &PatchParams::default(), &Patch::Merge(&unready))
                .await?;
            // The modelled drain: time passing, not a wait for an event.
            tokio::time::sleep(drain).await;
        }
        match pods.delete(old, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        let timeout = |what: String| Error::Timeout {
            what,
            secs: limit.as_secs(),
        };
        if let Some(uid) = uid {
            let gone = await_condition(pods.clone(), old, conditions::is_deleted(&uid));
            tokio::time::timeout(limit, gone)
                .await
                .map_err(|_| timeout(format!("activator pod {old} to be gone")))?
                .map_err(|e| Error::KubeConfig(e.to_string()))?;
        }
        self.create_activator_pod(node, new).await?;
        let ready = await_condition(pods, new, |p: Option<&Pod>| {
            p.is_some_and(crate::observe::is_ready)
        });
        tokio::time::timeout(limit, ready)
            .await
            .map_err(|_| timeout(format!("activator pod {new} to be Ready")))?
            .map_err(|e| Error::KubeConfig(e.to_string()))?;
        Ok(())
    }

    /// Starts the activator of `node` and creates its pod (not waiting for it to be Ready).
    async fn start_activator(
        &self,
        node: &str,
        configure: Option<&ConfigureActivator>,
    ) -> Result<NodeActivator, Error> {
        let mut cfg = self.activator_config(node)?;
        let pod_name = cfg.pod_name.clone();
        if let Some(f) = configure {
            f(&mut cfg);
        }
        let activator = Activator::start(cfg, self.activator_client.clone())
            .await
            .map_err(|source| Error::Activator {
                node: node.to_string(),
                source,
            })?;
        self.create_activator_pod(node, &pod_name).await?;
        Ok(NodeActivator {
            node: node.to_string(),
            activator,
        })
    }

    /// An activator's watches and reads ahead for `node`, without the activator
    /// (`activator::WatchOnly`): configured as [`SimCluster::start_activator`]
    /// configures a real one, through the same client.
    pub fn watch_only(&self, node: &str) -> Result<WatchOnly, Error> {
        let cfg = self.activator_config(node)?;
        Ok(WatchOnly::start(&cfg, self.activator_client.clone()))
    }

    /// How to run `node`'s activator as its own process (`activator_process`) against the
    /// embedded API server, whose kubeconfig is written into `dir`; None against a real
    /// cluster (the process would need the cluster's credentials for an activator).
    pub fn process_spec(
        &self,
        node: &str,
        binary: &std::path::Path,
        dir: &std::path::Path,
    ) -> Result<Option<crate::activator_process::ProcessSpec>, Error> {
        let Some(api) = &self.api else {
            return Ok(None);
        };
        let cfg = self.activator_config(node)?;
        std::fs::create_dir_all(dir)?;
        let kubeconfig = dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig)?;
        let mut spec = crate::activator_process::ProcessSpec::new(
            binary.to_path_buf(),
            node.to_string(),
            cfg.data_addr,
            cfg.admin_addr,
            kubeconfig,
        );
        spec.pod_name = Some(cfg.pod_name.clone());
        spec.pod_namespace = Some(cfg.pod_namespace.clone());
        spec.flags = vec![
            // One small data-path thread: the process is measured idle, not under load.
            "--io-threads=1".into(),
            // No node agent beside it: nothing to pull through.
            "--prepull=false".into(),
        ];
        Ok(Some(spec))
    }

    /// The configuration of `node`'s activator: its node's addresses and node agent, this
    /// cluster's activator namespace, hop secret and directory.
    fn activator_config(&self, node: &str) -> Result<ActivatorConfig, Error> {
        let sim = self
            .fleet
            .node(node)
            .ok_or_else(|| Error::Options(format!("no node {node}")))?;
        let ip = sim.ip().into();
        let mut cfg = ActivatorConfig::new(
            node,
            SocketAddr::new(ip, DATA_PORT),
            SocketAddr::new(ip, ADMIN_PORT),
        );
        cfg.pod_namespace = self.activator_namespace.clone();
        cfg.hop = self.hop.clone();
        // The sidecar shares the activator's pod, so its node's socket.
        cfg.node_agent = sim.agent_socket().map(std::path::Path::to_path_buf);
        if !self.directory.is_empty() {
            cfg.directory =
                activator::cache::directory::DirectorySource::Static(self.directory.clone());
        }
        cfg.members_from_directory = self
            .members_from_directory
            .load(std::sync::atomic::Ordering::Relaxed);
        cfg.members_streamed = self.members_streamed;
        Ok(cfg)
    }

    /// Kills `node` as a crash would: its kubelet stops renewing, its apps refuse
    /// connections, and its activator stops at once without draining. The node lifecycle
    /// controller marks it NotReady after the node grace period.
    pub async fn kill_node(&mut self, node: &str) -> Result<(), Error> {
        self.fleet.kill(node).await?;
        if let Some(i) = self.activators.iter().position(|a| a.node == node) {
            drop(self.activators.remove(i));
        }
        Ok(())
    }

    /// Takes `node`'s activator out as a DaemonSet scale-down or node removal would: it
    /// drains and exits, and its pod is deleted.
    pub async fn remove_activator(&mut self, node: &str) -> Result<(), Error> {
        let Some(i) = self.activators.iter().position(|a| a.node == node) else {
            return Err(Error::Options(format!("no activator on {node}")));
        };
        let a = self.activators.remove(i);
        let pod_name = a.activator.pod_name().to_string();
        a.activator.shutdown().await;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.activator_namespace);
        match pods.delete(&pod_name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Starts an activator on `node` again (after [`SimCluster::remove_activator`]), as a
    /// node joining the DaemonSet; returns once its pod is Ready.
    pub async fn add_activator(
        &mut self,
        node: &str,
        configure: Option<&ConfigureActivator>,
    ) -> Result<(), Error> {
        if self.activators.iter().any(|a| a.node == node) {
            return Err(Error::Options(format!("{node} already has an activator")));
        }
        let a = self.start_activator(node, configure).await?;
        let pod_name = a.activator.pod_name().to_string();
        self.activators.push(a);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.activator_namespace);
        let ready = await_condition(pods, &pod_name, |p: Option<&Pod>| {
            p.is_some_and(crate::observe::is_ready)
        });
        // As long as the cluster's start allows its pods (its first read queues behind the
        // storage's writes, which grow with the cluster).
        let limit = 60 + self.fleet.nodes().count() as u64 / 50;
        tokio::time::timeout(Duration::from_secs(limit), ready)
            .await
            .map_err(|_| Error::Timeout {
                what: format!("activator pod {pod_name} to be Ready"),
                secs: limit,
            })?
            .map_err(|e| Error::KubeConfig(e.to_string()))?;
        Ok(())
    }

    /// The in-process subsetter's metrics (its `/metrics`).
    pub fn subsetter_metrics(&self) -> &subsetter::metrics::Metrics {
        &self.subsetter_metrics
    }

    /// The cluster's hop secret: a test can send what a peer activator forwards.
    pub fn hop(&self) -> &activator::pipeline::hop::HopAuth {
        &self.hop
    }

    /// A number no other live cluster on this machine has (its first node index), for
    /// naming namespaces when clusters share an API server.
    pub fn id(&self) -> usize {
        self.block.first()
    }

    /// Which API server the cluster runs against, and under which latency model.
    pub fn api_description(&self) -> &str {
        &self.api_description
    }

    /// The simulated kubelets' model: `relist 1000 ms, node agent on`.
    pub fn kubelet_description(&self) -> &str {
        &self.kubelet_description
    }

    /// Creates `name` unless it exists; one this call created is deleted again when the
    /// cluster shuts down on a shared API server (what the cluster did not create, it never
    /// deletes).
    ///
    /// On a shared API server the namespace is labelled as this cluster's subsetter's
    /// ([`SUBSETTER_LABEL`]): a subsetter installed there leaves it alone, and this one
    /// reconciles nothing else.
    pub async fn ensure_own_namespace(&self, name: &str) -> Result<(), Error> {
        if ensure_namespace(&self.client, name).await? {
            self.owned_namespaces
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(name.to_string());
        }
        if self.api.is_none() {
            let api: Api<Namespace> = Api::all(self.client.clone());
            let label = serde_json::json!({
                "metadata": { "labels": { SUBSETTER_LABEL: self.activator_namespace } }
            });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&label))
                .await?;
        }
        Ok(())
    }

    /// The namespace of this cluster's activator pods.
    pub fn activator_namespace(&self) -> &str {
        &self.activator_namespace
    }

    /// Shuts the activator on `node` down as SIGTERM would (drain, then exit) and removes it
    /// from the cluster. False if there is none.
    pub async fn stop_activator(&mut self, node: &str) -> bool {
        let Some(i) = self.activators.iter().position(|a| a.node == node) else {
            return false;
        };
        self.activators.remove(i).activator.shutdown().await;
        true
    }

    /// Requests the activators of this process sent to the API server, by `verb resource
    /// (from)`, `from` being `etcd` or the API server's `cache` (their
    /// `activator_api_requests_total`; an API server that is not kubesim counts too).
    pub fn activator_api_requests(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for a in &self.activators {
            let m = a.activator.metrics();
            for (l, n) in crate::activator_metrics::samples(m, "activator_api_requests_total") {
                *out.entry(format!("{} {} ({})", l["verb"], l["resource"], l["from"]))
                    .or_default() += n;
            }
        }
        out
    }

    /// Data addresses of the activators, by node.
    pub fn entries(&self) -> Vec<(String, SocketAddr)> {
        self.activators
            .iter()
            .map(|a| (a.node.clone(), a.activator.data_addr()))
            .collect()
    }

    /// API requests by verb so far (embedded API server only).
    pub fn api_requests_by_verb(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        if let Some(api) = &self.api {
            for (k, n) in api.stats().requests {
                *out.entry(k.verb.clone()).or_default() += n;
            }
        }
        out
    }

    /// API requests on the embedded server by component (the harness's own as `harness`) and
    /// verb; empty against another server.
    pub fn api_requests_by_component(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        if let Some(api) = &self.api {
            for (k, n) in api.stats().requests_by_user {
                let who = if k.user.is_empty() {
                    "harness"
                } else {
                    k.user.as_str()
                };
                *out.entry(who.to_string())
                    .or_default()
                    .entry(k.verb.clone())
                    .or_default() += n;
            }
        }
        out
    }

    /// Kills the last directory replica beside the subsetter's own, as a pod killed; returns
    /// the member labels of the nodes that were streaming from it (None: no such replica).
    pub fn kill_directory_replica(&self) -> Option<Vec<String>> {
        let replica = self
            .replicas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()?;
        let streaming = replica.streaming();
        replica.kill();
        Some(streaming)
    }

    /// Whether activators started from now on take their memberships from the directory
    /// (`--members-from-directory`).
    pub fn set_members_from_directory(&self, on: bool) {
        self.members_from_directory
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The activators' LISTs of ActivationEndpoints so far (a real API server scans every
    /// subset for each); None against another API server.
    pub fn activator_subset_lists(&self) -> Option<u64> {
        let api = self.api.as_ref()?;
        Some(
            api.stats()
                .requests_by_user
                .iter()
                .filter(|(k, _)| {
                    k.user == "activator" && k.verb == "list" && k.resource == "activationendpoints"
                })
                .map(|(_, n)| *n)
                .sum(),
        )
    }

    pub async fn shutdown(mut self) {
        self.replicas
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.stop_subsetter.cancel();
        let _ = (&mut self.subsetter).await;
        for a in std::mem::take(&mut self.activators) {
            a.activator.shutdown().await;
        }
        if self.api.is_none() {
            // A shared API server outlives this cluster: take away what it added.
            self.clean_up_shared().await;
        }
        self.leftovers.armed = false;
        self.fleet.shutdown();
        drop(self.lifecycle);
        if let Some(api) = self.api {
            api.shutdown().await;
        }
        drop(self.block);
    }
}

impl SimCluster {
    /// Deletes the namespaces and nodes this cluster created on a shared API server, and
    /// waits — at most `cleanup_timeout` in all — for the namespaces to be gone: their bound
    /// pods go only when the simulated kubelets (still running) have stopped them.
    async fn clean_up_shared(&self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let owned = std::mem::take(
            &mut *self
                .owned_namespaces
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let mut terminating = Vec::new();
        for ns in owned {
            match namespaces.delete(&ns, &Default::default()).await {
                Ok(either) => {
                    if let Some(uid) = either.left().and_then(|n| n.metadata.uid) {
                        terminating.push((ns, uid));
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => tracing::warn!(namespace = %ns, error = %e, "cleaning up"),
            }
        }
        let all_gone =
            futures::future::join_all(terminating.iter().map(|(ns, uid)| {
                await_condition(namespaces.clone(), ns, conditions::is_deleted(uid))
            }));
        if tokio::time::timeout(self.cleanup_timeout, all_gone)
            .await
            .is_err()
        {
            let names: Vec<&str> = terminating.iter().map(|(n, _)| n.as_str()).collect();
            tracing::warn!(
                namespaces = ?names,
                timeout = ?self.cleanup_timeout,
                "namespaces still terminating; leaving them to the namespace controller"
            );
        }
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        for node in self.fleet.nodes() {
            match nodes.delete(node.name(), &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => tracing::warn!(node = node.name(), error = %e, "cleaning up"),
            }
        }
    }
}

/// What a cluster on the API server of `KUBECONFIG` added there, deleted when it is dropped
/// without [`SimCluster::shutdown`] — a test that panicked — so that a failed test leaves no
/// NotReady node behind for a DaemonSet or the next test to wait on. On a thread of its own
/// with a fresh client and runtime (the test's runtime is going away), bounded.
struct Leftovers {
    armed: bool,
    nodes: Vec<String>,
    /// The cluster's own namespaces (the same list as `SimCluster::owned_namespaces`).
    namespaces: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let nodes = std::mem::take(&mut self.nodes);
        let namespaces =
            std::mem::take(&mut *self.namespaces.lock().unwrap_or_else(|e| e.into_inner()));
        let cleaner = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(client) = Client::try_default().await else {
                    return;
                };
                let work = async {
                    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
                    for n in &nodes {
                        let _ = api.delete(n, &Default::default()).await;
                    }
                    let api: Api<Namespace> = Api::all(client);
                    for ns in &namespaces {
                        let _ = api.delete(ns, &Default::default()).await;
                    }
                };
                if tokio::time::timeout(Duration::from_secs(20), work)
                    .await
                    .is_err()
                {
                    tracing::warn!("cleaning up a failed cluster: the API server did not answer");
                }
            });
        });
        let _ = cleaner.join();
    }
}

/// `relist 1000 ms, node agent on`; `relist none (status at once)` for the zero period.
pub fn kubelet_description(relist: &Delay, node_agent: bool) -> String {
    let relist = match relist {
        _ if relist.is_zero() => "none (status at once)".to_string(),
        Delay::Fixed(d) => format!("{} ms", d.as_millis()),
        other => other.to_string(),
    };
    let agent = if node_agent { "on" } else { "off" };
    format!("relist {relist}, node agent {agent}")
}

/// The directory of the generated CRD YAML.
pub fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds")
}

/// Applies `deploy/crds/*.yaml` (server-side apply, as `kubectl apply --server-side` would)
/// and waits until each is Established.
pub async fn apply_crds(client: &Client) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = crd_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| Error::Manifest {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        // kustomize's own file lists the CRDs; it is not one.
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Manifest {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).map_err(|e| Error::Manifest {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply("local-activator-loadtest").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .map_err(|_| Error::Timeout {
            what: format!("CRD {name} to be established"),
            secs: 30,
        })?
        .map_err(|e| Error::KubeConfig(e.to_string()))?;
    }
    Ok(())
}

/// Creates a namespace unless it exists; true if this call created it.
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<bool, Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = match api.create(&PostParams::default(), &ns).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 409 => false,
        Err(e) => return Err(e.into()),
    };
    wait_default_service_account(client, name).await?;
    Ok(created)
}

/// On a real cluster kube-controller-manager creates a new namespace's `default`
/// ServiceAccount a moment after the namespace, and until then ServiceAccount admission
/// refuses every pod there (403 "error looking up service account"). Waits for it where
/// ServiceAccounts are served (kubesim serves none, and admits pods without one).
async fn wait_default_service_account(client: &Client, namespace: &str) -> Result<(), Error> {
    const LIMIT: Duration = Duration::from_secs(30);
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    match sas
        .list(&kube::api::ListParams::default().fields("metadata.name=default"))
        .await
    {
        Ok(l) if !l.items.is_empty() => return Ok(()),
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let exists = await_condition(sas, "default", |o: Option<&ServiceAccount>| o.is_some());
    tokio::time::timeout(LIMIT, exists)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("ServiceAccount {namespace}/default"),
            secs: LIMIT.as_secs(),
        })?
        .map_err(|e| Error::KubeConfig(e.to_string()))?;
    Ok(())
}

/// The name of `node`'s activator pod (as the activator's own config names it).
pub fn activator_pod_name(node: &str) -> String {
    ActivatorConfig::new(
        node,
        SocketAddr::from(([127, 0, 0, 1], 0)),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .pod_name
}

/// The DaemonSet-style pod that represents an activator on `node`.
fn activator_pod(name: &str, namespace: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (APP_NAME_LABEL.to_string(), APP_NAME_VALUE.to_string()),
                (COMPONENT_LABEL.to_string(), COMPONENT_VALUE.to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                EXTERNAL_ANNOTATION.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            host_network: Some(true),
            containers: vec![Container {
                name: "activator".into(),
                image: Some("local-activator/activator:dev".into()),
                ports: Some(vec![
                    ContainerPort {
                        name: Some("http".into()),
                        container_port: DATA_PORT.into(),
                        ..Default::default()
                    },
                    ContainerPort {
                        name: Some("admin".into()),
                        container_port: ADMIN_PORT.into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// Waits until `n` pods of `api` are Ready, using one watch.
async fn wait_ready_pods(api: &Api<Pod>, n: usize, limit: Duration) -> Result<(), Error> {
    let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
    let wait = async {
        let mut stream = std::pin::pin!(stream);
        let mut ready = std::collections::HashSet::new();
        while let Some(ev) = stream.next().await {
            let Ok(pod) = ev else { continue };
            let is_ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if is_ready {
                ready.insert(pod.name_any());
            } else {
                ready.remove(&pod.name_any());
            }
            if ready.len() >= n {
                return;
            }
        }
    };
    tokio::time::timeout(limit, wait)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("{n} activator pods to be Ready"),
            secs: limit.as_secs(),
        })
}
