//! `idle`: the whole lifecycle, `cycles` times: every revision woken (cold), asked again
//! (warm), then left alone until its pods are gone (idleTimeoutSeconds), and woken again.

use std::time::{Duration, Instant};

use serde_json::json;

use super::common::{SampleSummary, Sender, random_entry};
use crate::Error;
use crate::observe::PodWatch;
use crate::plot::{self, Line};
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, create_revisions, revision_names};

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(5),
        revisions: Some(5),
        activators: Some(2),
        idle_timeout_secs: Some(2),
        cycles: Some(2),
        start_delay_ms: Some(200),
        ..Knobs::default()
    }
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    let idle = k.idle_timeout_secs.unwrap_or(2).max(1);
    ctx.on_cluster(Scenario::Idle, &k, |_| {}, async |cluster, ns| {
        let names = revision_names(k.revisions.unwrap_or(1).max(1));
        let pods = PodWatch::start(&cluster.client, ns);
        create_revisions(cluster, ns, &names, |r| r.spec.idle_timeout_seconds = idle).await?;
        let sender = Sender::new(ns, k.by_host()?);
        let entries = cluster.entries();
        let t0 = Instant::now();
        let mut cycles = Vec::new();
        let mut all = Vec::new();
        let mut marks = Vec::new();
        let limit = Duration::from_secs(idle as u64 + 60);
        for cycle in 0..k.cycles.unwrap_or(1).max(1) {
            if ctx.cancel.is_cancelled() {
                break;
            }
            ctx.step(format!("cycle {}: waking {} revisions", cycle + 1, names.len()));
            marks.push((t0.elapsed().as_secs_f64(), format!("wake {}", cycle + 1)));
            let wake = futures::future::join_all(names.iter().map(|rev| {
                let (sender, entry) = (sender.clone(), random_entry(&entries));
                async move { sender.send(&entry, rev, &[]).await }
            }))
            .await;
            let mut again = Vec::new();
            for rev in &names {
                again.push(sender.send(&random_entry(&entries), rev, &[]).await);
            }
            let last = Instant::now();
            ctx.step(format!("cycle {}: waiting for zero pods", cycle + 1));
            let zero = pods.wait_live(limit, |n| n == 0).await;
            let to_zero = zero.then(|| last.elapsed());
            let (w, a) = (SampleSummary::of(&wake), SampleSummary::of(&again));
            cycles.push(json!({
                "cycle": cycle + 1,
                "woken": w.requests,
                "cold": w.cold,
                "errors": w.errors + a.errors,
                "cold_ms": w.cold_ms,
                "warm_ms": a.warm_ms,
                "warm_again_cold": a.cold,
                "to_zero_ms": to_zero.map(|d| d.as_secs_f64() * 1e3),
            }));
            all.extend(wake);
            all.extend(again);
            if !zero {
                break;
            }
        }
        let summary = SampleSummary::of(&all);
        let mut text = format!(
            "idle: {} revisions, idleTimeoutSeconds {idle}, {} nodes\n{:<6} {:>6} {:>5} {:>7} {:>11} {:>11} {:>12}\n",
            names.len(),
            entries.len(),
            "cycle", "woken", "cold", "errors", "cold p50", "warm p50", "to zero ms"
        );
        for c in &cycles {
            text += &format!(
                "{:<6} {:>6} {:>5} {:>7} {:>11.1} {:>11.2} {:>12}\n",
                c["cycle"].as_u64().unwrap_or(0),
                c["woken"].as_u64().unwrap_or(0),
                c["cold"].as_u64().unwrap_or(0),
                c["errors"].as_u64().unwrap_or(0),
                c["cold_ms"]["p50"].as_f64().unwrap_or(0.0),
                c["warm_ms"]["p50"].as_f64().unwrap_or(0.0),
                c["to_zero_ms"].as_f64().map_or("never".into(), |v| format!("{v:.0}")),
            );
        }
        text += &summary.lines();
        // A step line: the count holds until the next pod event.
        let mut history: Vec<(f64, f64)> = Vec::new();
        for (t, n) in pods.history() {
            let t = t.saturating_duration_since(t0).as_secs_f64();
            if let Some(&(_, before)) = history.last() {
                history.push((t, before));
            }
            history.push((t, n as f64));
        }
        Ok(Outcome {
            figures: json!({
                "idle_timeout_secs": idle,
                "cycles": cycles,
                "requests": summary.requests,
                "errors": summary.errors,
                "pods_created": pods.created(),
                "samples": summary,
            }),
            text,
            plots: vec![(
                "timeline",
                plot::timeline(
                    "idle: live app pods over sleep/wake cycles",
                    "live pods",
                    &[Line { name: "live pods".into(), points: history }],
                    &marks,
                )?,
            )],
        })
    })
    .await
}
