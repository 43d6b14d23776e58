//! `cold-burst`: R sleeping revisions woken at once by C concurrent clients (client i asks
//! revision i mod R, through a random activator), then the same C requests again, warm; then
//! the floor: as many pods as the burst cold-started, POSTed at once by the client with
//! `spec.nodeName` (see [`super::floor`]), and the burst's arrival → first byte over it.

use std::time::Instant;

use futures::future::join_all;

use super::common::{SampleSummary, Sender, api_delta, random_entry};
use super::floor::{self, Ratio};
use crate::Error;
use crate::plot;
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, create_revisions, revision_names};

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(20),
        revisions: Some(20),
        clients: Some(200),
        activators: Some(3),
        start_delay_ms: Some(300),
        ..Knobs::default()
    }
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    let (revisions, clients) = (
        k.revisions.unwrap_or(1).max(1),
        k.clients.unwrap_or(1).max(1),
    );
    ctx.on_cluster(Scenario::ColdBurst, &k, |_| {}, async |cluster, ns| {
        let names = revision_names(revisions);
        ctx.step(format!("creating {revisions} revisions"));
        let created = create_revisions(cluster, ns, &names, |r| {
            if let Some(cc) = k.container_concurrency {
                r.spec.container_concurrency = cc;
            }
        })
        .await?;
        let sender = Sender::new(ns, k.by_host()?);
        let entries = cluster.entries();
        let api_before = cluster.api_requests_by_verb();
        let activator_api_before = cluster.activator_api_requests();
        let wave = || {
            join_all((0..clients).map(|i| {
                let (sender, rev) = (sender.clone(), names[i % names.len()].clone());
                let entry = random_entry(&entries);
                async move { sender.send(&entry, &rev, &[]).await }
            }))
        };
        ctx.step(format!("{clients} clients wake {revisions} revisions"));
        let t = Instant::now();
        let burst = wave().await;
        let burst_ms = t.elapsed().as_secs_f64() * 1e3;
        let api = api_delta(cluster, &api_before);
        // The activators' own count, per cold start: a member's cold start is one pod create.
        let activator_api: std::collections::BTreeMap<String, u64> = cluster
            .activator_api_requests()
            .into_iter()
            .filter_map(|(k, n)| {
                let d = n - activator_api_before.get(&k).copied().unwrap_or(0);
                (d > 0).then_some((k, d))
            })
            .collect();
        let warm = if ctx.cancel.is_cancelled() {
            Vec::new()
        } else {
            ctx.step("the same requests again, warm");
            wave().await
        };
        // Pods the burst woke, and for how many revisions: one pod per woken revision is
        // the aim (the primary member serves a trickle; the others only what it refuses).
        let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
            cluster.client.clone(),
            ns,
        )
        .list(&kube::api::ListParams::default().labels(crds::contract::REVISION_LABEL))
        .await?
        .items
        .len();
        let woken = burst
            .iter()
            .filter(|s| s.cold)
            .map(|s| s.revision.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let pods_per_woken = pods as f64 / woken.max(1) as f64;
        let all: Vec<_> = burst.iter().chain(&warm).cloned().collect();
        let (cold, again, total) = (
            SampleSummary::of(&burst),
            SampleSummary::of(&warm),
            SampleSummary::of(&all),
        );
        // The floor of this burst: as many pods as it started, with the revisions' template.
        let floor = if ctx.cancel.is_cancelled() || cold.cold_starts == 0 || pods == 0 {
            None
        } else {
            ctx.step(format!(
                "the floor: {pods} pods POSTed at once with spec.nodeName"
            ));
            let rev = kube::Api::<crds::Revision>::namespaced(cluster.client.clone(), ns)
                .get(&names[0])
                .await?;
            let nodes: Vec<String> = entries.iter().map(|(n, _)| n.clone()).collect();
            let spec = rev.spec.template.value().get("spec").cloned().unwrap_or_default();
            let port = u16::try_from(rev.spec.port).unwrap_or(8080);
            let limit = std::time::Duration::from_secs(120);
            Some(floor::burst(&cluster.client, ns, &spec, port, &nodes, pods, limit).await)
        };
        // Every request that waited for a pod, failures ranked last: the burst's side.
        let waited = crate::stats::Percentiles {
            failed: cold.errors,
            ..cold.anatomy.total_ms
        };
        let over_floor = floor.as_ref().map(|f| Ratio::over_floor(&waited, f));
        // The client's whole wait (the entry's forward and the client included) over it too.
        let client_over_floor = floor.as_ref().map(|f| Ratio::over_floor(&cold.all_ms, f));
        let per_cold = |n: u64| n as f64 / cold.cold_starts.max(1) as f64;
        let activator_api_per_cold: std::collections::BTreeMap<&String, f64> =
            activator_api.iter().map(|(k, n)| (k, per_cold(*n))).collect();
        let text = format!(
            "cold-burst: {clients} clients → {revisions} revisions on {} nodes (burst took {burst_ms:.0} ms)\n\
             -- the burst --\n{}pods per woken revision {pods_per_woken:.2} ({pods} pods, {woken} revisions woken; {} requests waited for a cold start)\n\
             -- the same requests again --\n{}API requests during the burst: {api:?}\n\
             activators' API requests per cold start ({} cold starts): {activator_api_per_cold:?}\n{}",
            cluster.activators.len(),
            cold.lines(),
            cold.cold_starts,
            again.lines(),
            cold.cold_starts,
            floor_lines(floor.as_ref(), over_floor.as_ref(), client_over_floor.as_ref()),
        );
        Ok(Outcome {
            figures: serde_json::json!({
                "revisions_created_ms": created.as_secs_f64() * 1e3,
                "requests": total.requests,
                "errors": total.errors,
                "cold_starts": cold.cold_starts,
                "pods": pods,
                "revisions_woken": woken,
                "pods_per_woken_revision": pods_per_woken,
                "burst_wall_ms": burst_ms,
                "burst": cold,
                "warm_again": again,
                "api_requests_during_burst": api,
                "activator_api_requests_during_burst": activator_api,
                "activator_api_requests_per_cold_start": activator_api_per_cold,
                "floor": floor,
                "first_byte_over_floor": over_floor,
                "client_over_floor": client_over_floor,
            }),
            text,
            plots: vec![
                ("anatomy", plot::anatomy("cold-burst: where a cold start's time goes", &cold.anatomy)?),
                ("cdf", plot::cdf("cold-burst: latency CDF", &SampleSummary::cdf_series(&all))?),
            ],
        })
    })
    .await
}

fn floor_lines(
    floor: Option<&floor::Floor>,
    ratio: Option<&Ratio>,
    client: Option<&Ratio>,
) -> String {
    let (Some(f), Some(r), Some(c)) = (floor, ratio, client) else {
        return "-- the floor -- not run (no cold start, or cancelled)\n".into();
    };
    let mut o = format!(
        "-- the floor: {} pods POSTed at once with spec.nodeName, {} failed --\n",
        f.pods,
        f.errors.len()
    );
    o += &super::common::pct_line("POST→Ready", &f.ready_ms);
    o += &super::common::pct_line("POST→first byte", &f.first_byte_ms);
    o += &format!(
        "arrival→first byte ÷ floor POST→first byte (p50): {}\n",
        r.line()
    );
    o += &format!(
        "client latency ÷ floor POST→first byte (p50): {}\n",
        c.line()
    );
    for e in f.errors.iter().take(5) {
        o += &format!("floor error: {e}\n");
    }
    o
}
