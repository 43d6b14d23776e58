//! `write-rate`: bulk writes, as a load test's setup makes them (thousands of objects
//! created by many writers at once): ConfigMap creates in a namespace of the scenario's own,
//! at each of several concurrencies, each step's writes/s, latency and errors. Against a real
//! API server (`--kubeconfig`) these are the figures kubesim's storage model is calibrated
//! against (docs/kubesim.md, "Throughput"); against the embedded kubesim, what its model gives.
//! No nodes, no activators: only the API server is measured.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde::Serialize;
use serde_json::json;

use crate::Error;
use crate::scenario::{Ctx, Report, Scenario, Target, namespace_for};
use crate::stats::Percentiles;

const DEFAULT_CONCURRENCY: &[usize] = &[1, 4, 16, 64, 256];
const DEFAULT_WRITES: usize = 500;
/// Each step has at least this many writes per concurrent writer, so that the rate is not
/// only the ramp up and down.
const MIN_ROUNDS: usize = 8;
const DELETE_LIMIT: Duration = Duration::from_secs(120);

/// One concurrency's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub concurrency: usize,
    pub writes: usize,
    pub secs: f64,
    /// Successful writes per second over the step.
    pub writes_per_sec: f64,
    /// Latency of each write (failures rank last).
    pub latency_ms: Percentiles,
    /// Failed writes by HTTP status (0: no answer).
    pub errors: BTreeMap<u16, usize>,
}

/// The concurrencies of `--concurrency` (`1,4,16`).
pub fn parse_levels(s: Option<&str>) -> Result<Vec<usize>, Error> {
    let Some(s) = s else {
        return Ok(DEFAULT_CONCURRENCY.to_vec());
    };
    s.split(',')
        .map(|v| match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(Error::Options(format!(
                "concurrency: {v:?} is not a positive number"
            ))),
        })
        .collect()
}

/// Writes in a step of `concurrency` writers when `writes` were asked for.
pub fn step_writes(writes: usize, concurrency: usize) -> usize {
    writes.max(MIN_ROUNDS * concurrency)
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"loadtest.local-activator.dev/write-rate": "1"}},
        "data": {"key": "a value of a few bytes, as most ConfigMaps and custom resources"},
    }))
    .expect("a static ConfigMap")
}

/// `n` creates, `concurrency` in flight at once.
async fn step(api: &Api<ConfigMap>, concurrency: usize, n: usize) -> Step {
    let t0 = Instant::now();
    let results: Vec<Result<Duration, u16>> = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let cm = config_map(&format!("c{concurrency}-{i}"));
                let t = Instant::now();
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => Ok(t.elapsed()),
                    Err(e) => {
                        tracing::debug!(error = %e, "a write failed");
                        Err(match e {
                            kube::Error::Api(s) => s.code,
                            _ => 0,
                        })
                    }
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let secs = t0.elapsed().as_secs_f64();
    let mut ok = Vec::new();
    let mut errors = BTreeMap::new();
    for r in results {
        match r {
            Ok(d) => ok.push(d),
            Err(code) => *errors.entry(code).or_default() += 1,
        }
    }
    Step {
        concurrency,
        writes: n,
        secs,
        writes_per_sec: ok.len() as f64 / secs.max(1e-9),
        latency_ms: Percentiles::with_failed(&ok, n - ok.len()),
        errors,
    }
}

/// Deletes the namespace and waits until it is gone (on a real server the namespace
/// controller deletes its objects first).
async fn delete_namespace(client: &Client, ns: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    if let Err(e) = api.delete(ns, &DeleteParams::default()).await {
        tracing::warn!(namespace = ns, error = %e, "deleting the namespace");
        return;
    }
    let t = Instant::now();
    while t.elapsed() < DELETE_LIMIT {
        match api.get_opt(ns).await {
            Ok(None) => return,
            Ok(Some(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    tracing::warn!(namespace = ns, "still there after {DELETE_LIMIT:?}");
}

pub fn table(steps: &[Step]) -> String {
    let mut t = String::from("concurrency  writes  writes/s  p50 ms  p99 ms  errors\n");
    for s in steps {
        let errors: Vec<String> = s.errors.iter().map(|(c, n)| format!("{n}×{c}")).collect();
        t += &format!(
            "{:>11}  {:>6}  {:>8.0}  {:>6.1}  {:>6.1}  {}\n",
            s.concurrency,
            s.writes,
            s.writes_per_sec,
            s.latency_ms.p50,
            s.latency_ms.p99,
            if errors.is_empty() {
                "0".to_string()
            } else {
                errors.join(" ")
            }
        );
    }
    t
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone();
    let levels = parse_levels(k.concurrency.as_deref())?;
    let writes = k.writes.unwrap_or(DEFAULT_WRITES).max(1);
    let (client, server, target) = match &ctx.target {
        Target::Cluster(c) => (
            c.clone(),
            None,
            "the API server of --kubeconfig".to_string(),
        ),
        Target::Embedded => {
            let cfg = k.api_server_config()?;
            let lanes = cfg
                .storage_lanes
                .map_or("unbounded".to_string(), |n| n.to_string());
            let target = format!(
                "embedded kubesim; write latency {}, quorum read latency {}, storage lanes {lanes}, batch {}, write cost {}",
                cfg.write_latency,
                cfg.quorum_read_latency,
                cfg.storage_batch,
                cfg.storage_write_cost
            );
            let server = kubesim::api::ApiServer::start(cfg).await?;
            (server.client(), Some(server), target)
        }
    };
    let ns = namespace_for(Scenario::WriteRate);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))
        .map_err(|e| Error::Options(e.to_string()))?;
    namespaces
        .create(&PostParams::default(), &namespace)
        .await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut steps = Vec::new();
    for &c in &levels {
        if ctx.cancel.is_cancelled() {
            break;
        }
        let n = step_writes(writes, c);
        ctx.step(format!("{n} writes, {c} at once"));
        steps.push(step(&api, c, n).await);
    }
    ctx.step("deleting the namespace");
    delete_namespace(&client, &ns).await;
    if let Some(server) = server {
        server.shutdown().await;
    }
    let text = format!(
        "write-rate: ConfigMap creates at each concurrency, {target}\n{}",
        table(&steps)
    );
    Ok(Report {
        scenario: Scenario::WriteRate,
        partial: ctx.cancel.is_cancelled(),
        target,
        knobs: serde_json::to_value(&k).map_err(|e| Error::Options(e.to_string()))?,
        figures: json!({ "steps": steps }),
        text,
        plots: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_levels(None).unwrap(), DEFAULT_CONCURRENCY);
        assert_eq!(parse_levels(Some("1, 8,32")).unwrap(), [1, 8, 32]);
        for bad in ["0", "a", "1,,2", ""] {
            assert!(parse_levels(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_writer_writes_several_times() {
        assert_eq!(step_writes(500, 1), 500);
        assert_eq!(step_writes(500, 256), 2048);
    }
}
