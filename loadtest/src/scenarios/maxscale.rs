//! `maxscale`: bursts of concurrent requests on revisions with a small maxScale and
//! containerConcurrency 1 (each request holds its pod for `app-delay-ms`), so every member
//! wants to scale out; a pod watch records the most pods of each revision ever live at once,
//! which must never exceed maxScale.

use futures::future::join_all;
use serde_json::json;

use super::common::{SampleSummary, Sender, random_entry};
use crate::Error;
use crate::driver::Sample;
use crate::observe::PodWatch;
use crate::scenario::{
    Ctx, Knobs, Outcome, Report, Scenario, app_env, create_revisions, revision_names,
};

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(6),
        revisions: Some(3),
        activators: Some(3),
        clients: Some(60),
        max_scale: Some(3),
        container_concurrency: Some(1),
        app_delay_ms: Some(100),
        cycles: Some(3),
        start_delay_ms: Some(100),
        ..Knobs::default()
    }
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    let max_scale = k.max_scale.unwrap_or(3).max(1);
    let clients = k.clients.unwrap_or(60).max(1);
    ctx.on_cluster(Scenario::Maxscale, &k, |_| {}, async |cluster, ns| {
        let names = revision_names(k.revisions.unwrap_or(1).max(1));
        let pods = PodWatch::start(&cluster.client, ns);
        let cc = k.container_concurrency.unwrap_or(1);
        let delay = k.app_delay_ms.unwrap_or(100);
        create_revisions(cluster, ns, &names, |r| {
            r.spec.max_scale = max_scale;
            r.spec.container_concurrency = cc;
            app_env(r, &[("SIM_DELAY_MS", delay.to_string()), ("SIM_CONCURRENCY", cc.max(0).to_string())]);
        })
        .await?;
        let sender = Sender::new(ns, k.by_host()?);
        let entries = cluster.entries();
        let mut samples: Vec<Sample> = Vec::new();
        for burst in 0..k.cycles.unwrap_or(1).max(1) {
            if ctx.cancel.is_cancelled() {
                break;
            }
            ctx.step(format!("burst {} of {clients} requests", burst + 1));
            samples.extend(
                join_all((0..clients).map(|i| {
                    let (sender, rev) = (sender.clone(), names[i % names.len()].clone());
                    let entry = random_entry(&entries);
                    async move { sender.send(&entry, &rev, &[]).await }
                }))
                .await,
            );
        }
        let max_live = pods.max_live();
        let most = max_live.values().copied().max().unwrap_or(0);
        let summary = SampleSummary::of(&samples);
        let text = format!(
            "maxscale: {} revisions, maxScale {max_scale}, containerConcurrency {cc}, N={}, {} bursts of {clients} (app holds each request {delay} ms)\n\
             most pods of one revision live at once: {most} (maxScale {max_scale}: {})\n\
             per revision: {max_live:?}; pods created {}\n{}",
            names.len(),
            k.activators.unwrap_or(3),
            k.cycles.unwrap_or(1),
            if most as i32 <= max_scale { "kept" } else { "EXCEEDED" },
            pods.created(),
            summary.lines()
        );
        Ok(Outcome {
            figures: json!({
                "max_scale": max_scale,
                "max_pods_observed": most,
                "max_pods_by_revision": max_live,
                "pods_created": pods.created(),
                "requests": summary.requests,
                "errors": summary.errors,
                "samples": summary,
            }),
            text,
            plots: vec![(
                "cdf",
                crate::plot::cdf("maxscale: latency CDF", &SampleSummary::cdf_series(&samples))?,
            )],
        })
    })
    .await
}
