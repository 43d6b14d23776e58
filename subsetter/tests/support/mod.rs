//! Shared helpers of the subsetter's integration tests: a kubesim API server with the CRDs,
//! activator pods marked Ready the way a kubelet would, and a running subsetter.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use crds::{ActivationEndpoints, Revision, RevisionSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Node, Pod, PodSpec, PodTemplateSpec,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::json;
use subsetter::{Config, SubsetPolicy, Subsetter};
use tokio::sync::oneshot;

pub const NS: &str = "apps";
pub const ACT_NS: &str = "local-activator-system";
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Cluster {
    pub server: ApiServer,
    pub client: Client,
}

impl Cluster {
    /// A fresh API server with both CRDs established and the test namespaces.
    pub async fn start() -> Result<Self> {
        let server = ApiServer::start(ApiServerConfig::default()).await?;
        let client = server.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
        for file in ["revisions.yaml", "activationendpoints.yaml", "routes.yaml"] {
            let text = std::fs::read_to_string(format!("{dir}/{file}"))?;
            let crd: CustomResourceDefinition =
                serde_saphyr::from_str(&text).with_context(|| format!("parsing {file}"))?;
            let name = crd.name_any();
            crds.create(&PostParams::default(), &crd).await?;
            tokio::time::timeout(
                WAIT,
                await_condition(crds.clone(), &name, conditions::is_crd_established()),
            )
            .await??;
        }
        let namespaces: Api<Namespace> = Api::all(client.clone());
        for ns in [NS, ACT_NS] {
            let n: Namespace = serde_json::from_value(json!({ "metadata": { "name": ns } }))?;
            namespaces.create(&PostParams::default(), &n).await?;
        }
        Ok(Self { server, client })
    }

    pub fn revisions(&self) -> Api<Revision> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn endpoints(&self) -> Api<ActivationEndpoints> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ACT_NS)
    }

    /// An activator DaemonSet-style pod on `node`, Ready with pod IP `ip`.
    pub async fn add_activator(&self, node: &str, ip: &str) -> Result<()> {
        self.add_activator_pod(node, &activator_pod(node), ip).await
    }

    /// An activator pod named `name` on `node`, Ready with pod IP `ip` (a DaemonSet's
    /// replacement has a new name).
    pub async fn add_activator_pod(&self, node: &str, name: &str, ip: &str) -> Result<()> {
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(
                    [
                        ("app.kubernetes.io/name", "local-activator"),
                        ("app.kubernetes.io/component", "activator"),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                containers: vec![Container {
                    name: "activator".into(),
                    image: Some("local-activator:test".into()),
                    ports: Some(vec![ContainerPort {
                        name: Some("http".into()),
                        container_port: 8080,
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        self.pods().create(&PostParams::default(), &pod).await?;
        self.set_pod_ready(name, ip, true).await
    }

    /// What a kubelet reports: the pod IP and the Ready condition.
    pub async fn set_activator_ready(&self, node: &str, ip: &str, ready: bool) -> Result<()> {
        self.set_pod_ready(&activator_pod(node), ip, ready).await
    }

    /// What a kubelet reports for the activator pod `name`.
    pub async fn set_pod_ready(&self, name: &str, ip: &str, ready: bool) -> Result<()> {
        let status = if ready { "True" } else { "False" };
        let patch = json!({ "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{ "ip": ip }],
            "conditions": [{ "type": "Ready", "status": status,
                             "lastTransitionTime": "2026-01-01T00:00:00Z" }],
        }});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(())
    }

    /// Node objects for `names`, Ready and untainted, as a kubelet and the node lifecycle
    /// controller leave them.
    pub async fn add_ready_nodes(&self, names: &[&str]) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        for name in names {
            let n: Node = serde_json::from_value(json!({"metadata": {"name": name}}))?;
            nodes.create(&PostParams::default(), &n).await?;
            self.set_node_ready(name, true).await?;
            // The API server taints a new Node not-ready; the lifecycle controller lifts it.
            nodes
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"taints": []}})),
                )
                .await?;
        }
        Ok(())
    }

    /// A Node's Ready condition, as its kubelet or the node lifecycle controller sets it.
    pub async fn set_node_ready(&self, name: &str, ready: bool) -> Result<()> {
        let status = if ready { "True" } else { "False" };
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"conditions": [{"type": "Ready", "status": status}]}}),
                ),
            )
            .await?;
        Ok(())
    }

    pub async fn delete_activator(&self, node: &str) -> Result<()> {
        self.pods()
            .delete(
                &activator_pod(node),
                &DeleteParams::default().grace_period(0),
            )
            .await?;
        Ok(())
    }

    pub async fn create_revision(&self, name: &str, spec: RevisionSpec) -> Result<Revision> {
        let mut r = Revision::new(name, spec);
        r.metadata.namespace = Some(NS.into());
        Ok(self.revisions().create(&PostParams::default(), &r).await?)
    }

    /// Waits until `name`'s ActivationEndpoints satisfies `check` (watching it, no polling).
    pub async fn wait_endpoints(
        &self,
        name: &str,
        check: impl Fn(&ActivationEndpoints) -> bool,
    ) -> Result<ActivationEndpoints> {
        let found = tokio::time::timeout(
            WAIT,
            await_condition(
                self.endpoints(),
                name,
                move |o: Option<&ActivationEndpoints>| o.is_some_and(&check),
            ),
        )
        .await
        .with_context(|| format!("timed out waiting for ActivationEndpoints {name}"))??;
        found.context("object vanished")
    }

    pub async fn wait_revision(
        &self,
        name: &str,
        check: impl Fn(&Revision) -> bool,
    ) -> Result<Revision> {
        let found = tokio::time::timeout(
            WAIT,
            await_condition(self.revisions(), name, move |o: Option<&Revision>| {
                o.is_some_and(&check)
            }),
        )
        .await
        .with_context(|| format!("timed out waiting for Revision {name}"))??;
        found.context("object vanished")
    }

    /// Waits until the subsetter's metrics satisfy `check`. Metrics have no event to watch,
    /// so this polls with a timeout (tests only).
    pub async fn wait_metrics(
        &self,
        running: &Running,
        check: impl Fn(&str) -> bool,
    ) -> Result<()> {
        tokio::time::timeout(WAIT, async {
            loop {
                if check(&running.subsetter.metrics().encode()) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .context("timed out waiting for metrics")
    }

    /// Lists the ActivationEndpoints an activator on `node` would watch (server-side label
    /// selection), as activators rely on.
    pub async fn listed_for(&self, node: &str) -> Result<Vec<String>> {
        let lp = kube::api::ListParams::default().labels(&crds::contract::member_selector(node));
        let list = Api::<ActivationEndpoints>::all(self.client.clone())
            .list(&lp)
            .await?;
        Ok(list.items.iter().map(|a| a.name_any()).collect())
    }

    pub fn run_subsetter(&self, policy: Arc<dyn SubsetPolicy>) -> Running {
        self.run_subsetter_with(policy, Config::default())
    }

    pub fn run_subsetter_with(&self, policy: Arc<dyn SubsetPolicy>, config: Config) -> Running {
        let subsetter = Arc::new(Subsetter::new(self.client.clone(), config, policy));
        let (stop, stopped) = oneshot::channel::<()>();
        let s = Arc::clone(&subsetter);
        let task = tokio::spawn(async move {
            s.run(async move {
                let _ = stopped.await;
            })
            .await
        });
        Running {
            subsetter,
            stop: Some(stop),
            task,
        }
    }
}

pub struct Running {
    pub subsetter: Arc<Subsetter>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<subsetter::Result<()>>,
}

impl Running {
    pub async fn stop(mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        (&mut self.task).await??;
        Ok(())
    }
}

pub fn activator_pod(node: &str) -> String {
    format!("activator-{node}")
}

pub fn spec(max_scale: i32, min_scale: i32, activators: Option<i32>) -> RevisionSpec {
    RevisionSpec {
        template: PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("sim-app".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }
        .into(),
        port: 8080,
        hosts: vec![],
        container_concurrency: 0,
        min_scale,
        max_scale,
        target_burst_capacity: 200,
        activators,
        idle_timeout_seconds: 300,
        timeout_seconds: 300,
        hand_over_timeout_seconds: None,
    }
}

/// `n` members and Ready.
pub fn ready_with(n: usize) -> impl Fn(&ActivationEndpoints) -> bool {
    move |ae| members(ae).len() == n && ae_condition(ae, "Ready").is_some_and(|(s, _)| s == "True")
}

pub fn members(ae: &ActivationEndpoints) -> Vec<String> {
    ae.status
        .as_ref()
        .map(|s| s.activators.iter().map(|m| m.node.clone()).collect())
        .unwrap_or_default()
}

pub fn condition<'a>(
    conds: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

pub fn ae_condition(ae: &ActivationEndpoints, type_: &str) -> Option<(String, String)> {
    let c = condition(&ae.status.as_ref()?.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

/// The number a counter shows in the metrics text.
pub fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}
