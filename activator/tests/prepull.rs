//! Members pull ahead, end to end in one process: kubesim's API server, an activator whose
//! node agent is the real `node_agent::serve` with a fake image backend, and membership given
//! the real way (an ActivationEndpoints object listing the activator's node).
//!
//! - each image of the member revisions is pulled once, however many revisions name it;
//!   `imagePullPolicy: Never` is not pulled, an image the node holds is not pulled;
//! - a final failure is not retried and is an `ImagePullFailed` Event on the revision;
//! - a pull in flight does not delay the agent's `addr` answers;
//! - pull secrets: with `--prepull-secrets`, the template's dockerconfigjson Secret gives the
//!   pull its credentials (a missing one is skipped); without it, a revision naming pull secrets is not
//!   pre-pulled, and an anonymous pull refused is told as such.

#[path = "support/kubesim_cluster.rs"]
mod kubesim_cluster;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use activator::ops::events::REASON_IMAGE_PULL_FAILED;
use activator::ops::metrics::{PullFailLabel, PullFailReason};
use activator::{Activator, ActivatorConfig};
use anyhow::Context as _;
use base64::Engine as _;
use crds::{ActivationEndpoints, ActivationEndpointsStatus, ActivatorMember, Revision};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kubesim::api::{ApiServer, ApiServerConfig};
use node_agent::server::{Backend, BackendFuture, ImageFuture, PullFuture, ServerConfig, serve};
use node_agent::{
    AgentClient, BackendError, Credentials, ImageId, ImageInfo, ImageRef, PodUid, PullFailure,
};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Far longer than anything here takes: reaching it means the test hung.
const HANG: Duration = Duration::from_secs(60);
const NS: &str = "apps";
const NODE: &str = "node-pull";

const HELD: &str = "registry.test/held:v1";
const APP: &str = "registry.test/app:v2";
const SIDE: &str = "registry.test/side:v1";
const LOCAL: &str = "registry.test/local:v1";
const MISSING: &str = "registry.test/missing:v1";
const PRIVATE: &str = "registry.test/private/app:v1";
const SLOW: &str = "registry.test/slow:v1";

/// A node's runtime as the agent sees it: holds `HELD`, pulls the rest (after the test opens
/// the gate for `SLOW`), and tells the test of each pull as it starts.
struct FakeRuntime {
    held: Mutex<HashSet<String>>,
    pulls: Mutex<Vec<(String, Option<String>)>>,
    started: mpsc::UnboundedSender<String>,
    gate: tokio::sync::Semaphore,
    addr_calls: AtomicUsize,
}

impl Backend for FakeRuntime {
    fn pod_addr<'a>(&'a self, _uid: &'a PodUid) -> BackendFuture<'a> {
        Box::pin(async move {
            self.addr_calls.fetch_add(1, Ordering::Relaxed);
            Ok(Some(IpAddr::from([10, 1, 2, 3])))
        })
    }

    fn image_status<'a>(&'a self, image: &'a ImageRef) -> ImageFuture<'a> {
        Box::pin(async move {
            let held = self.held.lock().unwrap().contains(image.as_str());
            Ok(held.then(|| ImageInfo {
                id: ImageId::new("sha256:feed").unwrap(),
                size: 5_000_000,
            }))
        })
    }

    fn pull_image<'a>(
        &'a self,
        image: &'a ImageRef,
        auth: Option<&'a Credentials>,
    ) -> PullFuture<'a> {
        Box::pin(async move {
            let name = image.as_str().to_owned();
            self.pulls
                .lock()
                .unwrap()
                .push((name.clone(), auth.map(|a| a.username().to_owned())));
            let _ = self.started.send(name.clone());
            match name.as_str() {
                MISSING => return Err(BackendError::new(PullFailure::NOT_FOUND)),
                PRIVATE if auth.map(|a| (a.username(), a.password())) != Some(("robot", "pw")) => {
                    return Err(BackendError::new(PullFailure::UNAUTHORIZED));
                }
                SLOW => self.gate.acquire().await.expect("gate").forget(),
                _ => {}
            }
            self.held.lock().unwrap().insert(name);
            Ok(ImageId::new("sha256:feed").unwrap())
        })
    }
}

struct Node {
    api: ApiServer,
    activator: Activator,
    runtime: Arc<FakeRuntime>,
    started: mpsc::UnboundedReceiver<String>,
    socket: PathBuf,
    dir: PathBuf,
    stop_agent: CancellationToken,
}

impl Node {
    async fn finish(self) {
        self.activator.shutdown().await;
        self.stop_agent.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// kubesim with the project's CRDs and the apps namespace.
async fn cluster() -> anyhow::Result<ApiServer> {
    kubesim_cluster::cluster(ApiServerConfig::default(), NS).await
}

/// An activator on `NODE` whose node agent serves `FakeRuntime`.
async fn node(prepull_secrets: bool) -> anyhow::Result<Node> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let api = cluster().await?;
    let dir = std::env::temp_dir().join(format!(
        "activator-prepull-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("agent.sock");
    let (tx, started) = mpsc::unbounded_channel();
    let runtime = Arc::new(FakeRuntime {
        held: Mutex::new(HashSet::from([HELD.to_owned()])),
        pulls: Mutex::default(),
        started: tx,
        gate: tokio::sync::Semaphore::new(0),
        addr_calls: AtomicUsize::new(0),
    });
    let stop_agent = CancellationToken::new();
    tokio::spawn(serve(
        UnixListener::bind(&socket)?,
        runtime.clone(),
        ServerConfig::default(),
        stop_agent.clone(),
    ));
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut cfg = ActivatorConfig::new(NODE, any, any);
    cfg.drain_timeout = Duration::from_millis(300);
    cfg.node_agent = Some(socket.clone());
    cfg.prepull_secrets = prepull_secrets;
    let activator = Activator::start(cfg, api.client()).await?;
    Ok(Node {
        api,
        activator,
        runtime,
        started,
        socket,
        dir,
        stop_agent,
    })
}

/// A revision with this pod spec, and its ActivationEndpoints listing the node as a member.
async fn member_revision(n: &Node, name: &str, pod_spec: serde_json::Value) -> anyhow::Result<()> {
    let client = n.api.client();
    let spec = serde_json::from_value(serde_json::json!({ "template": { "spec": pod_spec } }))?;
    let mut rev = Revision::new(name, spec);
    rev.metadata.namespace = Some(NS.into());
    let rev = Api::<Revision>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &rev)
        .await?;
    let mut aep = ActivationEndpoints::new(name, Default::default());
    aep.metadata.namespace = Some(NS.into());
    aep.metadata.labels = Some([(crds::contract::member_label(NODE), String::new())].into());
    aep.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "local-activator.dev/v1alpha1".into(),
            kind: "Revision".into(),
            name: name.into(),
            uid: rev.metadata.uid.clone().context("a Revision without uid")?,
            controller: Some(true),
            ..Default::default()
        },
    ]);
    let aeps: Api<ActivationEndpoints> = Api::namespaced(client, NS);
    aeps.create(&PostParams::default(), &aep).await?;
    let status = ActivationEndpointsStatus {
        activators: vec![ActivatorMember {
            node: NODE.into(),
            address: n.activator.data_addr().to_string(),
            pod: n.activator.pod_name().into(),
            max_pods: 1,
            min_pods: 0,
        }],
        ..Default::default()
    };
    aeps.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await?;
    Ok(())
}

fn containers(images: &[(&str, &str)]) -> serde_json::Value {
    let list: Vec<serde_json::Value> = images
        .iter()
        .enumerate()
        .map(|(i, (image, policy))| {
            serde_json::json!({"name": format!("c{i}"), "image": image, "imagePullPolicy": policy})
        })
        .collect();
    serde_json::Value::Array(list)
}

/// Waits (bounded by `HANG`) until `done` holds; what it reads changes in other tasks.
async fn until(what: &str, done: impl Fn() -> bool) -> anyhow::Result<()> {
    tokio::time::timeout(HANG, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .with_context(|| format!("never: {what}"))
}

fn failed(a: &Activator, reason: PullFailReason) -> u64 {
    a.metrics()
        .prepull
        .failed
        .get_or_create(&PullFailLabel { reason })
        .get()
}

/// The `ImagePullFailed` events regarding `revision`, once there are `n` (polled).
async fn pull_events(
    client: &kube::Client,
    revision: &str,
    n: usize,
) -> anyhow::Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().fields(&format!("regarding.name={revision}"));
    tokio::time::timeout(HANG, async {
        loop {
            let list: Vec<Event> = events
                .list(&lp)
                .await?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(REASON_IMAGE_PULL_FAILED))
                .collect();
            if list.len() >= n {
                return anyhow::Ok(list);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .context("the events never came")?
}

#[tokio::test]
async fn each_image_is_pulled_once_and_a_final_failure_is_an_event() -> anyhow::Result<()> {
    let mut n = node(false).await?;
    member_revision(
        &n,
        "r1",
        serde_json::json!({"containers": containers(&[(APP, "Always"), (LOCAL, "Never")])}),
    )
    .await?;
    member_revision(
        &n,
        "r2",
        serde_json::json!({
            "initContainers": containers(&[(SIDE, "IfNotPresent")]),
            "containers": containers(&[(APP, "IfNotPresent")]),
        }),
    )
    .await?;
    member_revision(
        &n,
        "r3",
        serde_json::json!({"containers": containers(&[(MISSING, "IfNotPresent")])}),
    )
    .await?;
    member_revision(
        &n,
        "r4",
        serde_json::json!({"containers": containers(&[(HELD, "IfNotPresent")])}),
    )
    .await?;
    let m = n.activator.metrics().clone();
    until("two pulls succeeded, one not found, one present", || {
        m.prepull.succeeded.get() == 2
            && failed(&n.activator, PullFailReason::NotFound) == 1
            && m.prepull.present.get() == 1
    })
    .await?;
    let mut pulled: Vec<String> = std::iter::from_fn(|| n.started.try_recv().ok()).collect();
    pulled.sort();
    assert_eq!(
        pulled,
        [APP, MISSING, SIDE],
        "one pull per image, none of LOCAL or HELD"
    );
    assert_eq!(m.prepull.started.get(), 3);
    assert_eq!(m.prepull.bytes.get(), 2 * 5_000_000);

    let events = pull_events(&n.api.client(), "r3", 1).await?;
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(MISSING) && note.contains("not found"),
        "{note}"
    );
    assert!(note.contains(NODE), "{note}");
    // Not retried: the queue has nothing waiting.
    until("the queue drained", || {
        m.prepull.queue_depth.get() == 0 && m.prepull.in_flight.get() == 0
    })
    .await?;
    assert_eq!(n.runtime.pulls.lock().unwrap().len(), 3);
    n.finish().await;
    Ok(())
}

#[tokio::test]
async fn a_pull_in_flight_does_not_delay_addr_answers() -> anyhow::Result<()> {
    let mut n = node(false).await?;
    member_revision(
        &n,
        "slow",
        serde_json::json!({"containers": containers(&[(SLOW, "Always")])}),
    )
    .await?;
    let started = tokio::time::timeout(HANG, n.started.recv())
        .await
        .context("the pull never started")?;
    assert_eq!(started.as_deref(), Some(SLOW));
    // The pull is held by the gate (closed until below); a cold start's question is answered.
    let client = AgentClient::new(&n.socket);
    let uid = PodUid::new("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")?;
    for _ in 0..10 {
        assert_eq!(
            client.pod_addr(&uid).await?,
            Some(IpAddr::from([10, 1, 2, 3]))
        );
    }
    let m = n.activator.metrics().clone();
    assert_eq!(m.prepull.succeeded.get(), 0, "the pull is still held");
    assert_eq!(m.prepull.in_flight.get(), 1);
    n.runtime.gate.add_permits(1);
    until("the slow pull finished", || m.prepull.succeeded.get() == 1).await?;
    n.finish().await;
    Ok(())
}

fn dockerconfig(registry: &str, user: &str, pass: &str) -> Secret {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    let json = serde_json::json!({"auths": {registry: {"auth": auth}}});
    Secret {
        metadata: ObjectMeta {
            name: Some("regcred".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(
            [(
                ".dockerconfigjson".to_owned(),
                k8s_openapi::ByteString(serde_json::to_vec(&json).unwrap()),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

/// kubesim serves Secrets but no ServiceAccounts (see kubesim's resource list): the service
/// account is skipped as not found, as the kubelet does, and the template's secrets are used,
/// a missing one skipped. A service account's own `imagePullSecrets` are read by the same code
/// (not run here: no ServiceAccounts in kubesim).
#[tokio::test]
async fn with_prepull_secrets_the_templates_pull_secret_is_used() -> anyhow::Result<()> {
    let n = node(true).await?;
    let client = n.api.client();
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &dockerconfig("registry.test", "robot", "pw"),
        )
        .await?;
    member_revision(
        &n,
        "private",
        serde_json::json!({
            "serviceAccountName": "app-sa",
            "imagePullSecrets": [{"name": "absent"}, {"name": "regcred"}],
            "containers": containers(&[(PRIVATE, "Always")]),
        }),
    )
    .await?;
    let m = n.activator.metrics().clone();
    until("the private image is pulled", || {
        m.prepull.succeeded.get() == 1
    })
    .await?;
    assert_eq!(
        *n.runtime.pulls.lock().unwrap(),
        [(PRIVATE.to_owned(), Some("robot".to_owned()))]
    );
    n.finish().await;
    Ok(())
}

#[tokio::test]
async fn without_prepull_secrets_private_images_are_left_to_the_kubelet() -> anyhow::Result<()> {
    let n = node(false).await?;
    member_revision(
        &n,
        "named",
        serde_json::json!({
            "imagePullSecrets": [{"name": "regcred"}],
            "containers": containers(&[(PRIVATE, "Always")]),
        }),
    )
    .await?;
    member_revision(
        &n,
        "anonymous",
        serde_json::json!({"containers": containers(&[(PRIVATE, "Always")])}),
    )
    .await?;
    until("one skipped, one refused", || {
        failed(&n.activator, PullFailReason::NeedsPullSecret) == 1
            && failed(&n.activator, PullFailReason::Unauthorized) == 1
    })
    .await?;
    let events = pull_events(&n.api.client(), "anonymous", 1).await?;
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("unauthorized") && note.contains("--prepull-secrets is off"),
        "{note}"
    );
    // The anonymous pull is the only one: the revision naming a secret was not pulled.
    assert_eq!(
        *n.runtime.pulls.lock().unwrap(),
        [(PRIVATE.to_owned(), None)]
    );
    n.finish().await;
    Ok(())
}
