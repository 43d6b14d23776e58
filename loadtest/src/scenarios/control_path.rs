//! `control-path`: how long until a pod is bound to a node, as that node's kubelet sees it (a
//! watch with `spec.nodeName=<node>`), (a) when the activator's way is used — one POST with
//! `spec.nodeName` set — and (b) the standard way, a Deployment scaled 0 → 1 (ReplicaSet
//! controller, then kube-scheduler). One at a time (`cycles`) and in bursts (`clients` at
//! once). (b) needs a real control plane (`--kubeconfig`): the embedded kubesim has no
//! scheduler and no controller-manager, and the report says so.
//!
//! Also the reads an activator makes, alone and while the burst is written: a GET by name
//! without a resourceVersion (a quorum read, from etcd) and with `resourceVersion=0` (from the
//! API server's watch cache): the figures kubesim's storage model is calibrated against.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{GetParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::Error;
use crate::observe::FirstSeen;
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, Target};
use crate::stats::Percentiles;

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(3),
        cycles: Some(20),
        clients: Some(50),
        ..Knobs::default()
    }
}

const LABEL: &str = "loadtest.local-activator.dev/control-path";
const LIMIT: Duration = Duration::from_secs(120);

fn pod(name: &str, node: Option<&str>) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "labels": {LABEL: name}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "kubesim/echo:latest"}],
        },
    })
}

/// Watches pods of `namespace` as the kubelets would: when each label value was first seen
/// with a node.
async fn bound_watch(client: &Client, namespace: &str) -> FirstSeen<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    FirstSeen::start(api, LABEL, |p| {
        p.spec.as_ref()?.node_name.as_ref()?;
        let key = p
            .labels()
            .get(LABEL)
            .cloned()
            .unwrap_or_else(|| p.name_any());
        Some((key, ()))
    })
    .await
}

/// When each of `keys` was seen bound.
async fn bound_at(
    watch: &FirstSeen<()>,
    keys: &[String],
) -> Result<BTreeMap<String, (Instant, ())>, Error> {
    watch
        .wait_all(keys, LIMIT)
        .await
        .ok_or_else(|| Error::Timeout {
            what: format!("{} pods bound", keys.len()),
            secs: LIMIT.as_secs(),
        })
}

/// Pods POSTed with `spec.nodeName`, `n` at once; each one's time from its POST to its bound
/// pod in the node's watch.
async fn direct(
    client: &Client,
    ns: &str,
    node: &str,
    tag: &str,
    n: usize,
) -> Result<Vec<Duration>, Error> {
    let watch = bound_watch(client, ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let keys: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    let sent = join_all(keys.iter().map(|k| {
        let api = api.clone();
        async move {
            let p: Pod = serde_json::from_value(pod(k, Some(node))).expect("a static pod");
            let t = Instant::now();
            api.create(&PostParams::default(), &p).await.map(|_| t)
        }
    }))
    .await;
    let seen = bound_at(&watch, &keys).await?;
    keys.iter()
        .zip(sent)
        .map(|(k, t)| Ok(seen[k].0.saturating_duration_since(t?)))
        .collect()
}

/// Deployments with 0 replicas scaled to 1, `n` at once; each one's time from the scale
/// request to its pod bound by the scheduler.
async fn deployment(
    client: &Client,
    ns: &str,
    tag: &str,
    n: usize,
) -> Result<Vec<Duration>, Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let keys: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    for k in &keys {
        let p = pod(k, None);
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": k},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {LABEL: k}},
                "template": {"metadata": p["metadata"], "spec": p["spec"]},
            },
        }))
        .map_err(|e| Error::Options(e.to_string()))?;
        api.create(&PostParams::default(), &d).await?;
    }
    let watch = bound_watch(client, ns).await;
    let scaled = join_all(keys.iter().map(|k| {
        let api = api.clone();
        async move {
            let t = Instant::now();
            api.patch(
                k,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 1}})),
            )
            .await
            .map(|_| t)
        }
    }))
    .await;
    let seen = bound_at(&watch, &keys).await?;
    keys.iter()
        .zip(scaled)
        .map(|(k, t)| Ok(seen[k].0.saturating_duration_since(t?)))
        .collect()
}

/// Quorum reads (no resourceVersion) and cached ones (`resourceVersion=0`) of one object by
/// `readers` concurrent readers, each alternating the two one at a time: at least `min` of
/// each per reader, then on until `until` resolves. Failures counted.
async fn reads(
    api: &Api<Pod>,
    name: &str,
    until: impl std::future::Future<Output = ()> + Send,
    readers: usize,
    min: usize,
) -> Reads {
    use futures::FutureExt;
    let until = until.shared();
    let per_reader = join_all((0..readers).map(|_| {
        let until = until.clone();
        async move {
            let mut until = std::pin::pin!(until);
            let mut done = false;
            let mut got: [(Vec<Duration>, usize); 2] = Default::default();
            for i in 0.. {
                if i >= 2 * min && (done || futures::poll!(&mut until).is_ready()) {
                    break;
                }
                let gp = [GetParams::default(), GetParams::any()][i % 2].clone();
                let t = Instant::now();
                let r = tokio::select! {
                    r = api.get_with(name, &gp) => r,
                    () = &mut until, if !done => { done = true; api.get_with(name, &gp).await }
                };
                match r {
                    Ok(_) => got[i % 2].0.push(t.elapsed()),
                    Err(e) => {
                        tracing::warn!(error = %e, "a timed read failed");
                        got[i % 2].1 += 1;
                    }
                }
            }
            got
        }
    }))
    .await;
    let side = |s: usize| {
        let ok: Vec<Duration> = per_reader.iter().flat_map(|g| g[s].0.clone()).collect();
        Percentiles::with_failed(&ok, per_reader.iter().map(|g| g[s].1).sum())
    };
    Reads {
        quorum_ms: side(0),
        cache_ms: side(1),
    }
}

#[derive(Debug, Clone, serde::Serialize)]
struct Reads {
    quorum_ms: Percentiles,
    cache_ms: Percentiles,
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    let seq = k.cycles.unwrap_or(1).max(1);
    let burst = k.clients.unwrap_or(1).max(1);
    let real = matches!(ctx.target, Target::Cluster(_));
    ctx.on_cluster(Scenario::ControlPath, &k, |_| {}, async |cluster, ns| {
        let node = cluster
            .activators
            .first()
            .map(|a| a.node.clone())
            .ok_or_else(|| Error::Options("no nodes".into()))?;
        let client = cluster.client.clone();
        let mut local_seq = Vec::new();
        for i in 0..seq {
            ctx.step(format!("local: pod {} of {seq}", i + 1));
            local_seq.extend(direct(&client, ns, &node, &format!("local-{i}"), 1).await?);
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        ctx.step("reads, alone");
        let reads_alone = reads(&pods, "local-0-0", std::future::ready(()), 1, 20).await;
        ctx.step(format!("local: a burst of {burst}, read meanwhile"));
        let (written, wrote) = tokio::sync::oneshot::channel::<()>();
        let (local_burst, reads_in_burst) = tokio::join!(
            async {
                let r = direct(&client, ns, &node, "local-burst", burst).await;
                drop(written);
                r
            },
            reads(&pods, "local-0-0", async { let _ = wrote.await; }, 4, 1),
        );
        let local_burst = local_burst?;
        let (mut std_seq, mut std_burst) = (Vec::new(), Vec::new());
        if real {
            for i in 0..seq {
                ctx.step(format!("Deployment 0 → 1: {} of {seq}", i + 1));
                std_seq.extend(deployment(&client, ns, &format!("std-{i}"), 1).await?);
            }
            ctx.step(format!("Deployments 0 → 1: a burst of {burst}"));
            std_burst = deployment(&client, ns, "std-burst", burst).await?;
        }
        let p = |v: &[Duration]| Percentiles::of(v);
        let note = if real {
            "standard path measured on this cluster's kube-controller-manager and kube-scheduler"
                .to_string()
        } else {
            "the standard path was NOT measured: the embedded kubesim has no kube-scheduler and no \
             kube-controller-manager (run with --kubeconfig against a real control plane)"
                .to_string()
        };
        let mut text = format!(
            "control-path: time from the request to a bound pod in the node's watch, {}\n",
            cluster.api_description()
        );
        let rows = [
            ("local, one at a time", &local_seq),
            ("local, burst", &local_burst),
            ("Deployment, one at a time", &std_seq),
            ("Deployment, burst", &std_burst),
        ];
        for (name, v) in rows {
            text += &super::common::pct_line(name, &p(v));
        }
        let ratio = |a: &[Duration], b: &[Duration]| {
            (!a.is_empty() && !b.is_empty()).then(|| p(b).p50 / p(a).p50.max(1e-9))
        };
        let (r_seq, r_burst) = (ratio(&local_seq, &std_seq), ratio(&local_burst, &std_burst));
        if let (Some(s), Some(b)) = (r_seq, r_burst) {
            text += &format!("Deployment ÷ local, p50: one at a time {s:.1}×, burst {b:.1}×\n");
        }
        text += &format!("{note}\n");
        text += "GET of a pod by name, ms (quorum: no resourceVersion, from etcd; cache: resourceVersion=0):\n";
        for (when, r) in [("alone", &reads_alone), ("during the burst", &reads_in_burst)] {
            for (side, p) in [("quorum", &r.quorum_ms), ("cache", &r.cache_ms)] {
                text += &super::common::pct_line(&format!("  {side}, {when}"), p);
            }
        }
        let cdf = plot_series(&rows);
        Ok(Outcome {
            figures: json!({
                "local_sequential_ms": p(&local_seq),
                "local_burst_ms": p(&local_burst),
                "deployment_sequential_ms": real.then(|| p(&std_seq)),
                "deployment_burst_ms": real.then(|| p(&std_burst)),
                "ratio_p50_sequential": r_seq,
                "ratio_p50_burst": r_burst,
                "standard_path": note,
                "reads_alone": reads_alone,
                "reads_during_burst": reads_in_burst,
            }),
            text,
            plots: vec![("cdf", crate::plot::cdf("control-path: request → bound pod seen by the kubelet", &cdf)?)],
        })
    })
    .await
}

fn plot_series<'a>(rows: &[(&'a str, &Vec<Duration>)]) -> Vec<(&'a str, Vec<f64>)> {
    rows.iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(n, v)| (*n, v.iter().map(|d| d.as_secs_f64() * 1e3).collect()))
        .collect()
}
