//! `churn`: open-loop traffic through random subset members while activators leave (drain,
//! pod deleted, as in a node removal) and join again (a new pod on the node), one node at a
//! time. Reports member changes, cold starts beyond the first per revision (extra cold starts
//! the moves cost), and failed requests — under both ingress models from one run, as
//! node-failure does, with the requests in flight on an activator while it left counted
//! apart (the bound on what a move may cost: each other request can go elsewhere).

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
        let ingress = k.ingress.unwrap_or(Ingress::Retry);
        let sender = Sender::new(ns, k.by_host()?).with_ingress(ingress);
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
            // (node, the moment it began to leave): the requests in flight on it then.
            let mut leaving = Vec::new();
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
                let left_at = t0.elapsed();
                marks.push((left_at.as_secs_f64(), format!("{node} out")));
                // In flight on it: sent before it began to leave, not over by then. One sent
                // later is refused (it stops accepting first), and another member can take it.
                leaving.push((node.clone(), (left_at, left_at)));
                cluster.remove_activator(node).await?;
                members.wait_gone(node, Duration::from_secs(60)).await;
                tokio::time::sleep(gap / 2).await;
                ctx.step(format!("{node} joins"));
                cluster.add_activator(node, None).await?;
                marks.push((t0.elapsed().as_secs_f64(), format!("{node} in")));
            }
            Ok::<_, Error>((marks, leaving))
        };
        let (run, churned) = tokio::join!(traffic, churn);
        let (marks, leaving) = churned?;
        let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
        let summary = SampleSummary::under(ingress, &samples);
        let with_retry = Failures::of(&run, &samples, t0, None, |s| !s.ok());
        let without_retry = Failures::of(&run, &samples, t0, None, |s| !s.ok_without_retry());
        let chosen = match ingress {
            Ingress::Retry => with_retry,
            Ingress::None => without_retry,
        };
        let mut in_flight: Vec<&Sample> = Vec::new();
        for (node, window) in &leaving {
            for s in in_flight_on(&samples, std::slice::from_ref(node), t0, *window) {
                if !in_flight.iter().any(|x| std::ptr::eq(*x, s)) {
                    in_flight.push(s);
                }
            }
        }
        // Every member was warm before the load: each cold start in it came from a move.
        let extra = summary.cold_starts;
        let changes = members.changes() - changes_before;
        let lines = request_lines(&samples, &run, t0);
        let requests = run.due();
        let mut text = format!(
            "churn: {} nodes, {} revisions, {} req/s for {:.1} s, {moves} activators out and back in\n\
             member changes {changes}; cold starts under load {extra} (every member was warm before)\n\
             in flight on an activator when it began to leave: {} requests\n\
             ingress none  (first attempts): failed {} of {requests} ({} overflowed)\n",
            entries.len(),
            names.len(),
            schedule.rate,
            duration.as_secs_f64(),
            in_flight.len(),
            without_retry.failed_requests,
            run.overflow(),
        );
        if ingress == Ingress::Retry {
            text += &format!(
                "ingress retry (one retry elsewhere of a refused or reset request, {} retried, {} attempts): failed {} of {requests}\n",
                summary.retried, summary.attempts, with_retry.failed_requests,
            );
        }
        text += &summary.lines();
        let mut by_ingress = serde_json::Map::new();
        by_ingress.insert(
            "none".into(),
            json!({"failed_requests": without_retry.failed_requests}),
        );
        if ingress == Ingress::Retry {
            by_ingress.insert(
                "retry".into(),
                json!({"failed_requests": with_retry.failed_requests}),
            );
        }
        Ok(Outcome {
            figures: json!({
                "moves": moves,
                "member_changes": changes,
                "warm_up_requests": warmed.len(),
                "warm_up_errors": warm_up_errors,
                "extra_cold_starts": extra,
                "ingress": ingress,
                "requests": requests,
                "overflowed": run.overflow(),
                "overflowed_at_s": overflowed_at(&run),
                "failed_requests": chosen.failed_requests,
                "in_flight_on_moved": in_flight.len(),
                "by_ingress": by_ingress,
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
