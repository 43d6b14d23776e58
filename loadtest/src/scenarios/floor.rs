//! The floor under a burst of cold starts: the same number of pods, POSTed at once by the
//! client with `spec.nodeName` on the same nodes, no activator in the way. Each is timed from
//! its POST to Ready in a pod watch, and to the first byte of one request sent straight to its
//! IP: what the API server and the nodes alone take, against which the activator's arrival →
//! first byte is compared (the goal: within 1.5× of it).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::{Value, json};

use crate::driver::Driver;
use crate::observe::FirstSeen;
use crate::stats::Percentiles;

const LABEL: &str = "loadtest.local-activator.dev/floor";

/// What the floor's pods took, failures counted.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    pub pods: usize,
    /// POST → Ready in the watch.
    pub ready_ms: Percentiles,
    /// POST → first byte of a request to the pod's IP: the floor of arrival → first byte.
    pub first_byte_ms: Percentiles,
    /// Every failure, verbatim (a refused POST, a pod not Ready in time, a failed request).
    pub errors: Vec<String>,
}

/// A ratio of two p50s with both sides' failures beside it; no ratio (`valid` false) when
/// either side had one, as a side with failures left out is not the same burst.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub valid: bool,
    pub errors: usize,
    pub floor_errors: usize,
    pub p50: Option<f64>,
}

impl Ratio {
    pub fn over_floor(p: &Percentiles, floor: &Floor) -> Self {
        let valid = p.failed == 0 && floor.errors.is_empty() && floor.first_byte_ms.p50 > 0.0;
        Self {
            valid,
            errors: p.failed,
            floor_errors: floor.errors.len(),
            p50: valid.then(|| p.p50 / floor.first_byte_ms.p50),
        }
    }

    pub fn line(&self) -> String {
        match self.p50 {
            Some(r) => format!("{r:.2}"),
            None => format!(
                "INVALID ({} failed, {} floor failures)",
                self.errors, self.floor_errors
            ),
        }
    }
}

/// POSTs `n` pods of `spec` (round-robin over `nodes`) into `ns` at once and times each one.
/// The pods are deleted before this returns.
pub async fn burst(
    client: &Client,
    ns: &str,
    spec: &Value,
    port: u16,
    nodes: &[String],
    n: usize,
    limit: Duration,
) -> Floor {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    // When each pod was first Ready, and its IP.
    let ready = FirstSeen::start(api.clone(), LABEL, |p| {
        Some((p.name_any(), crate::observe::ready_ip(p)?))
    })
    .await;
    let driver = Driver::new();
    let outcomes = join_all((0..n).map(|i| {
        let (api, ready, driver) = (api.clone(), &ready, driver.clone());
        let name = format!("floor-{i}");
        let node = nodes[i % nodes.len().max(1)].clone();
        let mut spec = spec.clone();
        spec["nodeName"] = node.clone().into();
        async move {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {LABEL: name}},
                "spec": spec,
            }))
            .map_err(|e| format!("{name}: {e}"))?;
            let t0 = Instant::now();
            api.create(&PostParams::default(), &pod)
                .await
                .map_err(|e| format!("creating {name}: {e}"))?;
            let (at, ip) = ready
                .wait_one(&name, limit.saturating_sub(t0.elapsed()))
                .await
                .ok_or_else(|| format!("{name}: not Ready within {limit:?}"))?;
            let addr = SocketAddr::new(ip.parse().map_err(|e| format!("{ip}: {e}"))?, port);
            let s = driver.get((&node, addr), &name, "floor", "/").await;
            match s.ok() {
                true => Ok((at.saturating_duration_since(t0), t0.elapsed())),
                false => Err(format!("{name} on {node}: {}", s.error.unwrap_or_default())),
            }
        }
    }))
    .await;
    drop(ready);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    if let Err(e) = api
        .delete_collection(&dp, &ListParams::default().labels(LABEL))
        .await
    {
        tracing::warn!(error = %e, "deleting the floor's pods");
    }
    let ok: Vec<(Duration, Duration)> = outcomes.iter().filter_map(|o| o.clone().ok()).collect();
    let errors: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
    let (ready_ms, first_byte_ms): (Vec<_>, Vec<_>) = ok.into_iter().unzip();
    Floor {
        pods: n,
        ready_ms: Percentiles::with_failed(&ready_ms, errors.len()),
        first_byte_ms: Percentiles::with_failed(&first_byte_ms, errors.len()),
        errors,
    }
}
