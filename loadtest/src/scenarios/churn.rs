//! `churn`: open-loop traffic through random subset members while activators leave (drain,
//! pod deleted, as in a node removal) and join again (a new pod on the node), one node at a
//! time. Reports member changes, cold starts beyond the first per revision (extra cold starts
//! the moves cost), and failed requests.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::common::{SampleSummary, Sender, request_lines, via_a_member};
use crate::Error;
use crate::driver::Sample;
use crate::observe::MemberWatch;
use crate::open_loop::OpenLoop;
use crate::plot;
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, create_revisions, revision_names};

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(10),
        revisions: Some(20),
        activators: Some(3),
        rate: Some(100.0),
        duration_secs: Some(12.0),
        kill_nodes: Some(2),
        start_delay_ms: Some(200),
        ..Knobs::default()
    }
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    let moves = k.kill_nodes.unwrap_or(2).max(1);
    let duration = Duration::from_secs_f64(k.duration_secs.unwrap_or(12.0).max(1.0));
    ctx.on_cluster(Scenario::Churn, &k, |_| {}, async |cluster, ns| {
        let names = revision_names(k.revisions.unwrap_or(1).max(1));
        let members = MemberWatch::start(&cluster.client, ns);
        create_revisions(cluster, ns, &names, |_| {}).await?;
        let sender = Sender::new(ns, k.by_host()?);
        let entries = cluster.entries();
        let addr_of = |node: &str| entries.iter().find(|(n, _)| n == node).cloned();
        ctx.step("warming every member of every revision");
        let warm_up: Vec<(String, (String, std::net::SocketAddr))> = members
            .members()
            .into_iter()
            .flat_map(|(rev, nodes)| {
                nodes
                    .into_iter()
                    .filter_map(|n| addr_of(&n))
                    .map(move |e| (rev.clone(), e))
            })
            .collect();
        let warmed = futures::future::join_all(
            warm_up.iter().map(|(rev, e)| sender.send(e, rev, &[])),
        )
        .await;
        let warm_up_errors = warmed.iter().filter(|s| !s.ok()).count();
        let changes_before = members.changes();
        let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
        let schedule = OpenLoop {
            rate: k.rate.unwrap_or(100.0).max(1.0),
            duration,
            max_in_flight: 10_000,
        };
        let t0 = Instant::now();
        let traffic = schedule.run(&ctx.cancel, |i| {
            let rev = names[i as usize % names.len()].clone();
            via_a_member(&members, &entries, &sender, &samples, rev)
        });
        let churn = async {
            let mut marks = Vec::new();
            let gap = duration / (moves as u32 + 1);
            for _ in 0..moves {
                // The script: a move every `gap`, the node back once its subsets are repaired.
                tokio::time::sleep(gap / 2).await;
                if ctx.cancel.is_cancelled() {
                    break;
                }
                // The node in the most subsets now: the move that costs the most.
                let Some((_, node)) = members
                    .busiest(entries.iter().map(|(n, _)| n))
                    .into_iter()
                    .next()
                else {
                    break;
                };
                let node = &node;
                ctx.step(format!("{node} leaves"));
                marks.push((t0.elapsed().as_secs_f64(), format!("{node} out")));
                cluster.remove_activator(node).await?;
                members
                    .wait(Duration::from_secs(60), |all| {
                        all.values().all(|s: &BTreeSet<String>| !s.contains(node))
                    })
                    .await;
                tokio::time::sleep(gap / 2).await;
                ctx.step(format!("{node} joins"));
                cluster.add_activator(node, None).await?;
                marks.push((t0.elapsed().as_secs_f64(), format!("{node} in")));
            }
            Ok::<_, Error>(marks)
        };
        let (run, marks) = tokio::join!(traffic, churn);
        let marks = marks?;
        let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
        let summary = SampleSummary::of(&samples);
        // Every member was warm before the load: each cold start in it came from a move.
        let extra = summary.cold_starts;
        let changes = members.changes() - changes_before;
        let lines = request_lines(&samples, t0);
        let text = format!(
            "churn: {} nodes, {} revisions, {} req/s for {:.1} s, {moves} activators out and back in\n\
             member changes {changes}; cold starts under load {extra} (every member was warm before); failed requests {} of {}\n{}",
            entries.len(),
            names.len(),
            schedule.rate,
            duration.as_secs_f64(),
            run.errors(),
            run.sent() as u64 + run.overflow,
            summary.lines()
        );
        Ok(Outcome {
            figures: json!({
                "moves": moves,
                "member_changes": changes,
                "warm_up_requests": warmed.len(),
                "warm_up_errors": warm_up_errors,
                "extra_cold_starts": extra,
                "requests": run.sent() as u64 + run.overflow,
                "failed_requests": run.errors(),
                "latency_ms": run.latency(),
                "samples": summary,
            }),
            text,
            plots: vec![(
                "timeline",
                plot::timeline("churn: requests per 100 ms", "requests", &lines, &marks)?,
            )],
        })
    })
    .await
}
