//! `node-failure`: open-loop traffic to every revision through a random member of its subset
//! (as an ingress following the ActivationEndpoints would), K nodes killed a quarter of the way
//! in (kubelet, apps and activator stop at once). Reports every failed request, and the time
//! from the kill until no subset lists a killed node and each is back to N members.
//!
//! Under both ingress models from one run (`--ingress retry`, the default): a request's first
//! attempt is what an ingress with no retry would have seen, so the failures of `none` are
//! those of the first attempts, and those of `retry` what is left after the one retry. The
//! requests in flight on a killed node when it died are counted apart: no retry of a refused
//! connection saves them all.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::common::{
    Failures, SampleSummary, Sender, in_flight_on, overflowed_at, request_lines, via_a_member,
};
use crate::Error;
use crate::driver::{Ingress, Sample};
use crate::observe::MemberWatch;
use crate::open_loop::OpenLoop;
use crate::plot;
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, create_revisions, revision_names};

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(10),
        revisions: Some(20),
        activators: Some(3),
        rate: Some(200.0),
        duration_secs: Some(12.0),
        kill_nodes: Some(1),
        node_grace_secs: Some(3.0),
        start_delay_ms: Some(200),
        ..Knobs::default()
    }
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    let grace = Duration::from_secs_f64(k.node_grace_secs.unwrap_or(3.0).max(0.5));
    let n = k.activators.unwrap_or(3);
    let kills = k.kill_nodes.unwrap_or(1);
    let duration = Duration::from_secs_f64(k.duration_secs.unwrap_or(12.0).max(1.0));
    ctx.on_cluster(
        Scenario::NodeFailure,
        &k,
        |o| o.node_grace = grace,
        async |cluster, ns| {
            let names = revision_names(k.revisions.unwrap_or(1).max(1));
            let members = MemberWatch::start(&cluster.client, ns);
            create_revisions(cluster, ns, &names, |_| {}).await?;
            let ingress = k.ingress.unwrap_or(Ingress::Retry);
            let sender = Sender::new(ns, k.by_host()?).with_ingress(ingress);
            let entries = cluster.entries();
            let addr_of = |node: &str| entries.iter().find(|(n, _)| n == node).cloned();
            ctx.step("waking every revision");
            for name in &names {
                let m = members.members();
                let node = m.get(name).and_then(|s| s.iter().next().cloned());
                if let Some(e) = node.as_deref().and_then(addr_of) {
                    sender.send(&e, name, &[]).await;
                }
            }
            // The nodes in the most subsets: their loss hurts most.
            let victims: Vec<String> = members
                .busiest(entries.iter().map(|(n, _)| n))
                .into_iter()
                .take(kills)
                .map(|(_, n)| n)
                .collect();
            let affected = members
                .members()
                .values()
                .filter(|s| victims.iter().any(|v| s.contains(v)))
                .count();
            let alive = entries.len() - victims.len();

            let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
            let schedule = OpenLoop {
                rate: k.rate.unwrap_or(200.0).max(1.0),
                duration,
                max_in_flight: 10_000,
            };
            let t0 = Instant::now();
            let traffic = schedule.run(&ctx.cancel, |i| {
                let rev = names[i as usize % names.len()].clone();
                via_a_member(&members, &entries, &sender, &samples, rev)
            });
            let failure = async {
                // The kill is part of the scenario's script, a quarter of the way in.
                tokio::time::sleep(duration / 4).await;
                ctx.step(format!("killing {}", victims.join(",")));
                let killed_at = t0.elapsed();
                for v in &victims {
                    cluster.kill_node(v).await?;
                }
                let kill_done = t0.elapsed();
                let limit = grace + Duration::from_secs(60);
                let repaired = members
                    .wait(limit, |m| {
                        m.values().all(|s: &BTreeSet<String>| {
                            !victims.iter().any(|v| s.contains(v)) && s.len() >= n.min(alive)
                        })
                    })
                    .await;
                Ok::<_, Error>((killed_at, kill_done, repaired.then(|| t0.elapsed())))
            };
            let (run, killed) = tokio::join!(traffic, failure);
            let (killed_at, kill_done, repaired_at) = killed?;
            let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
            let summary = SampleSummary::under(ingress, &samples);
            let with_retry = Failures::of(&run, &samples, t0, repaired_at, |s| !s.ok());
            let without_retry =
                Failures::of(&run, &samples, t0, repaired_at, |s| !s.ok_without_retry());
            let chosen = match ingress {
                Ingress::Retry => with_retry,
                Ingress::None => without_retry,
            };
            let in_flight = in_flight_on(&samples, &victims, t0, (killed_at, kill_done));
            let in_flight_failed = in_flight.iter().filter(|s| !s.ok()).count();
            let in_flight_failed_first = in_flight.iter().filter(|s| !s.ok_without_retry()).count();
            let repair_ms = repaired_at.map(|r| (r - killed_at).as_secs_f64() * 1e3);
            let lines = request_lines(&samples, &run, t0);
            let mut marks = vec![(killed_at.as_secs_f64(), format!("{} killed", victims.len()))];
            if let Some(r) = repaired_at {
                marks.push((r.as_secs_f64(), "subsets repaired".into()));
            }
            let after = |f: &Failures| {
                if repaired_at.is_some() {
                    f.after.to_string()
                } else {
                    "- (no repair)".into()
                }
            };
            let requests = run.due();
            let mut text = format!(
                "node-failure: {} nodes, {} revisions × N={n}, {} req/s for {:.1} s; killed {} at {:.2} s ({} subsets affected); node grace {:.1} s\n\
                 subsets repaired {} after the kill\n\
                 in flight on the killed node at the kill: {} requests\n",
                entries.len(),
                names.len(),
                schedule.rate,
                duration.as_secs_f64(),
                victims.join(","),
                killed_at.as_secs_f64(),
                affected,
                grace.as_secs_f64(),
                repair_ms.map_or("NOT within the limit".into(), |ms| format!("{ms:.0} ms")),
                in_flight.len(),
            );
            text += &format!(
                "ingress none  (first attempts): failed {} of {requests} ({} overflowed); before the repair {}, after it {}; of those in flight on the killed node {}\n",
                without_retry.failed_requests,
                run.overflow(),
                without_retry.before,
                after(&without_retry),
                in_flight_failed_first,
            );
            if ingress == Ingress::Retry {
                text += &format!(
                    "ingress retry (one retry elsewhere of a refused or reset request, {} retried, {} attempts): failed {} of {requests}; before the repair {}, after it {}; of those in flight on the killed node {}\n",
                    summary.retried,
                    summary.attempts,
                    with_retry.failed_requests,
                    with_retry.before,
                    after(&with_retry),
                    in_flight_failed,
                );
            }
            text += &summary.lines();
            let by = |f: &Failures, in_flight_failed: usize| {
                json!({
                    "failed_requests": f.failed_requests,
                    "failed_before_repair": f.before,
                    "failed_after_repair": repaired_at.map(|_| f.after),
                    "failed_in_flight_on_killed": in_flight_failed,
                })
            };
            let mut by_ingress = serde_json::Map::new();
            by_ingress.insert("none".into(), by(&without_retry, in_flight_failed_first));
            if ingress == Ingress::Retry {
                by_ingress.insert("retry".into(), by(&with_retry, in_flight_failed));
            }
            Ok(Outcome {
                figures: json!({
                    "killed": victims,
                    "affected_revisions": affected,
                    "killed_at_s": killed_at.as_secs_f64(),
                    "node_grace_s": grace.as_secs_f64(),
                    "ingress": ingress,
                    "requests": requests,
                    "overflowed": run.overflow(),
                    "overflowed_at_s": overflowed_at(&run),
                    "failed_requests": chosen.failed_requests,
                    "failed_after_repair": repaired_at.map(|_| chosen.after),
                    "in_flight_on_killed": in_flight.len(),
                    "by_ingress": by_ingress,
                    "repaired_after_ms": repair_ms,
                    "latency_ms": run.latency(),
                    "samples": summary,
                }),
                text,
                plots: vec![(
                    "timeline",
                    plot::timeline("node-failure: requests per 100 ms", "requests", &lines, &marks)?,
                )],
            })
        },
    )
    .await
}
