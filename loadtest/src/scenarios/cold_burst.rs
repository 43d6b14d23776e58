//! `cold-burst`: R sleeping revisions woken at once by C concurrent clients (client i asks
//! revision i mod R, through a random activator), then the same C requests again, warm.

use std::time::Instant;

use futures::future::join_all;

use super::common::{SampleSummary, Sender, api_delta, random_entry};
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
        let warm = if ctx.cancel.is_cancelled() {
            Vec::new()
        } else {
            ctx.step("the same requests again, warm");
            wave().await
        };
        let all: Vec<_> = burst.iter().chain(&warm).cloned().collect();
        let (cold, again, total) = (
            SampleSummary::of(&burst),
            SampleSummary::of(&warm),
            SampleSummary::of(&all),
        );
        let text = format!(
            "cold-burst: {clients} clients → {revisions} revisions on {} nodes (burst took {burst_ms:.0} ms)\n\
             -- the burst --\n{}-- the same requests again --\n{}API requests during the burst: {api:?}\n",
            cluster.activators.len(),
            cold.lines(),
            again.lines(),
        );
        Ok(Outcome {
            figures: serde_json::json!({
                "revisions_created_ms": created.as_secs_f64() * 1e3,
                "requests": total.requests,
                "errors": total.errors,
                "cold_starts": cold.cold_starts,
                "burst_wall_ms": burst_ms,
                "burst": cold,
                "warm_again": again,
                "api_requests_during_burst": api,
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
