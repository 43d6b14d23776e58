//! The demo scenario: revisions created on a fresh cluster, then requests to random
//! activators — the first burst of each revision concurrent (they race to cold-start it), the
//! rest one after another (warm).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crds::{ActivationEndpoints, Revision, RevisionSpec};
use futures::StreamExt;
use futures::future::join_all;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use rand::RngExt;

use crate::Error;
use crate::cluster::SimCluster;
use crate::driver::{Driver, Ingress, Sample, with_ingress};
use crate::report::Summary;

/// The demo's knobs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub namespace: String,
    pub revisions: usize,
    /// Requests per revision.
    pub requests: usize,
    /// How many of each revision's first requests are sent at once.
    pub burst: usize,
    /// The simulated pod start delay (for the report).
    pub start_delay_ms: u64,
    /// Name revisions by Host header (true) or by the `x-revision-*` headers.
    pub by_host: bool,
    /// What sits in front of the activators (a retry goes to another random activator).
    pub ingress: Ingress,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            namespace: "demo".into(),
            revisions: 10,
            requests: 5,
            burst: 3,
            start_delay_ms: 300,
            by_host: true,
            ingress: Ingress::Retry,
        }
    }
}

/// The host a demo revision is served on.
pub fn host_of(revision: &str, namespace: &str) -> String {
    format!("{revision}.{namespace}.example.test")
}

/// A revision of the simulated echo app (kubesim's nodes serve any image as the sim app).
pub fn echo_revision(name: &str, namespace: &str, hosts: Vec<String>) -> Revision {
    let spec: RevisionSpec = serde_json::from_value(serde_json::json!({
        "hosts": hosts,
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{
                "name": "app",
                "image": "kubesim/echo:latest",
                "ports": [{"containerPort": 8080, "name": "http"}],
            }]},
        },
    }))
    .expect("a static revision spec deserializes");
    let mut rev = Revision::new(name, spec);
    rev.metadata.namespace = Some(namespace.into());
    rev
}

/// Runs the demo on a started cluster and summarises it.
pub async fn run(cluster: &SimCluster, opts: &DemoOptions) -> Result<Summary, Error> {
    let client = cluster.client.clone();
    cluster.ensure_own_namespace(&opts.namespace).await?;
    let revs: Api<Revision> = Api::namespaced(client.clone(), &opts.namespace);
    let names: Vec<String> = (0..opts.revisions).map(|i| format!("rev-{i:04}")).collect();
    let t = Instant::now();
    for name in &names {
        let rev = echo_revision(name, &opts.namespace, vec![host_of(name, &opts.namespace)]);
        match revs.create(&PostParams::default(), &rev).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let created = t.elapsed();
    wait_subsets(&client, &opts.namespace, &names, Duration::from_secs(60)).await?;
    tracing::info!(
        revisions = names.len(),
        created_ms = created.as_millis() as u64,
        subsets_ms = t.elapsed().as_millis() as u64,
        "revisions created and subsets published"
    );

    let api_before = cluster.api_requests_by_verb();
    let entries = cluster.entries();
    let driver = Driver::new();
    let start = Instant::now();
    let per_revision = names.iter().map(|name| {
        let driver = driver.clone();
        let entries = entries.clone();
        let host = host_of(name, &opts.namespace);
        let namespace = opts.namespace.clone();
        let by_host = opts.by_host;
        let (requests, burst) = (opts.requests, opts.burst.min(opts.requests));
        let ingress = opts.ingress;
        async move {
            // A random activator (but `not`, the one a retry follows).
            let pick = |not: Option<&str>| {
                let others: Vec<&(String, std::net::SocketAddr)> = entries
                    .iter()
                    .filter(|(n, _)| Some(n.as_str()) != not)
                    .collect();
                (!others.is_empty())
                    .then(|| others[rand::rng().random_range(0..others.len())].clone())
            };
            let send = |i: usize| {
                let first = pick(None).expect("the cluster has activators");
                let (driver, host, namespace) = (driver.clone(), host.clone(), namespace.clone());
                let pick = &pick;
                async move {
                    let path = format!("/demo/{i}");
                    let attempt = |(n, a): (String, std::net::SocketAddr)| {
                        let (driver, host, namespace, path) = (
                            driver.clone(),
                            host.clone(),
                            namespace.clone(),
                            path.clone(),
                        );
                        async move {
                            if by_host {
                                driver.get((&n, a), name, &host, &path).await
                            } else {
                                driver.get_named((&n, a), &namespace, name, &path).await
                            }
                        }
                    };
                    with_ingress(ingress, first, |failed| pick(Some(failed)), attempt).await
                }
            };
            let mut samples: Vec<Sample> = join_all((0..burst).map(send)).await;
            for i in burst..requests {
                samples.push(send(i).await);
            }
            samples
        }
    });
    let samples: Vec<Sample> = join_all(per_revision).await.into_iter().flatten().collect();
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;

    let api_after = cluster.api_requests_by_verb();
    let api_requests: BTreeMap<String, u64> = api_after
        .into_iter()
        .map(|(verb, n)| {
            let before = api_before.get(&verb).copied().unwrap_or(0);
            (verb, n - before)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    let members = members(&client, &opts.namespace).await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(client.clone(), &opts.namespace);
    let pods_created = pods
        .list(&kube::api::ListParams::default().labels(crds::contract::REVISION_LABEL))
        .await?
        .items
        .len() as u64;
    let mut summary = Summary::build(
        &samples,
        &members,
        cluster.activators.len(),
        pods_created,
        opts.start_delay_ms,
        api_requests,
        wall_ms,
    );
    summary.api_server = cluster.api_description().to_string();
    summary.ingress = opts.ingress;
    Ok(summary)
}

/// The summary's text with a `kubelet model` line after its API server line: how long the
/// kubelet takes to report a started pod (its relist) and whether the node agent let the
/// activator skip that wait change a cold start by most of a second, so a figure is quoted
/// with the model it ran under, as with the API server's.
pub fn text_with_kubelet(summary: &Summary, kubelet: &str) -> String {
    let line = format!("kubelet model  {kubelet}\n");
    let text = summary.to_text();
    let mut out = String::with_capacity(text.len() + line.len());
    let mut placed = false;
    for l in text.split_inclusive('\n') {
        out += l;
        if !placed && l.starts_with("API server ") {
            out += &line;
            placed = true;
        }
    }
    if !placed {
        out += &line;
    }
    out
}

/// The summary's JSON with `kubelet_model` (see [`text_with_kubelet`]).
pub fn json_with_kubelet(summary: &Summary, kubelet: &str) -> serde_json::Value {
    let mut json = summary.to_json();
    if let Some(o) = json.as_object_mut() {
        o.insert("kubelet_model".into(), kubelet.into());
    }
    json
}

/// The nodes of a revision's members, from its ActivationEndpoints' status (none before the
/// subsetter wrote it), in the order entries try them: the revision's primary first
/// (`activator::pipeline::primary`), so `[0]` is the member that serves a trickle.
pub async fn member_nodes(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>, Error> {
    let api: Api<ActivationEndpoints> = Api::namespaced(client.clone(), namespace);
    let aep = api.get(name).await?;
    let members = aep.status.map(|s| s.activators).unwrap_or_default();
    let key = activator::pipeline::routing::RevisionKey::new(namespace, name);
    Ok(activator::pipeline::primary::ranked(&key, members)
        .into_iter()
        .map(|m| m.node)
        .collect())
}

/// Waits until every named revision has an ActivationEndpoints with members.
pub async fn wait_subsets(
    client: &Client,
    namespace: &str,
    names: &[String],
    limit: Duration,
) -> Result<(), Error> {
    let api: Api<ActivationEndpoints> = Api::namespaced(client.clone(), namespace);
    let wanted: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    let wait = async {
        let mut done = std::collections::HashSet::new();
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
        while let Some(ev) = stream.next().await {
            let Ok(aep) = ev else { continue };
            let has_members = aep
                .status
                .as_ref()
                .is_some_and(|s| !s.activators.is_empty());
            if has_members && wanted.contains(aep.name_any().as_str()) {
                done.insert(aep.name_any());
            }
            if done.len() == wanted.len() {
                return;
            }
        }
    };
    tokio::time::timeout(limit, wait)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("{} ActivationEndpoints with members", names.len()),
            secs: limit.as_secs(),
        })
}

async fn members(client: &Client, namespace: &str) -> Result<BTreeMap<String, Vec<String>>, Error> {
    let api: Api<ActivationEndpoints> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .list(&Default::default())
        .await?
        .into_iter()
        .map(|a| {
            let nodes = a
                .status
                .map(|s| s.activators.into_iter().map(|m| m.node).collect())
                .unwrap_or_default();
            (a.metadata.name.unwrap_or_default(), nodes)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::kubelet_description;

    #[test]
    fn the_summary_names_the_kubelet_model_next_to_the_api_server() {
        let mut summary = Summary::build(&[], &BTreeMap::new(), 3, 0, 300, BTreeMap::new(), 1.0);
        let kubelet = kubelet_description(&kubesim::node::Delay::fixed_ms(1000), true);
        assert_eq!(kubelet, "relist 1000 ms, node agent on");
        // Without an API server line it still says it, at the end.
        let text = text_with_kubelet(&summary, &kubelet);
        assert!(
            text.ends_with("kubelet model  relist 1000 ms, node agent on\n"),
            "{text}"
        );

        summary.api_server = "embedded kubesim".into();
        let text = text_with_kubelet(&summary, &kubelet);
        let lines: Vec<&str> = text.lines().collect();
        let api = lines
            .iter()
            .position(|l| l.starts_with("API server"))
            .unwrap();
        assert_eq!(
            lines[api + 1],
            "kubelet model  relist 1000 ms, node agent on"
        );
        assert_eq!(text.matches("kubelet model").count(), 1);
        assert_eq!(
            text.len(),
            summary.to_text().len() + lines[api + 1].len() + 1
        );

        let off = kubelet_description(&kubesim::node::Delay::ZERO, false);
        assert_eq!(off, "relist none (status at once), node agent off");
        assert_eq!(
            json_with_kubelet(&summary, &off)["kubelet_model"],
            off.as_str()
        );
    }
}
