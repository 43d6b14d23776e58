//! `scale`: a full-size simulated cluster — thousands of nodes, each with its activator pod,
//! and many revisions, most idle — with a sample of real activators in this process (one
//! process cannot hold thousands of activators; the report says how many ran). Measures the
//! subsetter's assignment time for every revision, each sampled activator's memory and watch
//! traffic, the watch events one cluster-wide change (an activator leaving) costs each of them,
//! and API requests per second at steady state with a share of revisions active.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rand::RngExt;
use serde_json::json;

use super::common::{SampleSummary, Sender};
use crate::Error;
use crate::driver::Sample;
use crate::observe::MemberWatch;
use crate::open_loop::OpenLoop;
use crate::scenario::{Ctx, Knobs, Outcome, Report, Scenario, create_revisions, revision_names};

pub fn defaults() -> Knobs {
    Knobs {
        nodes: Some(5_000),
        revisions: Some(100_000),
        activators: Some(3),
        sample_activators: Some(20),
        active_share: Some(0.01),
        rate: Some(200.0),
        duration_secs: Some(5.0),
        start_delay_ms: Some(100),
        ..Knobs::default()
    }
}

fn rss_mib() -> f64 {
    kubesim::node::process::rss_bytes().unwrap_or(0) as f64 / (1024.0 * 1024.0)
}

/// Events delivered so far to the watches whose selectors name `node` (an activator's).
fn watch_events(cluster: &crate::SimCluster, nodes: &[String]) -> Vec<u64> {
    let Some(api) = &cluster.api else {
        return Vec::new();
    };
    let stats = api.stats();
    nodes
        .iter()
        .map(|n| {
            let field = format!("spec.nodeName={n}");
            stats
                .watches
                .iter()
                .filter(|w| w.field_selector == field || w.label_selector.contains(n.as_str()))
                .filter(|w| w.resource != "nodes" && w.resource != "leases")
                .map(|w| w.events)
                .sum()
        })
        .collect()
}

fn total_requests(cluster: &crate::SimCluster) -> u64 {
    cluster.api_requests_by_verb().values().sum()
}

pub async fn run(ctx: &Ctx) -> Result<Report, Error> {
    let k = ctx.knobs.clone().or(defaults());
    let sample = k
        .sample_activators
        .unwrap_or(20)
        .max(1)
        .min(k.nodes.unwrap_or(1));
    ctx.on_cluster(
        Scenario::Scale,
        &k,
        |o| {
            o.shared_kubelet_watch = true;
            o.real_activators = Some(0);
            // Assignment time is the subsetter's, not its write limit's.
            o.subsetter_write_qps = 0.0;
            o.max_pods = 250;
        },
        async |cluster, ns| {
            let nodes: Vec<String> = cluster.fleet.nodes().map(|n| n.name().to_string()).collect();
            let names = revision_names(k.revisions.unwrap_or(1).max(1));
            let rss_cluster = rss_mib();
            let members = MemberWatch::start(&cluster.client, ns);
            ctx.step(format!("creating {} revisions; the subsetter assigns them", names.len()));
            let assign = create_revisions(cluster, ns, &names, |_| {}).await?;
            let rss_revisions = rss_mib();
            let sampled: Vec<String> = nodes.iter().take(sample).cloned().collect();
            ctx.step(format!("starting {sample} real activators"));
            let t = Instant::now();
            for node in &sampled {
                cluster.add_activator(node, None).await?;
            }
            let activators_ready = t.elapsed();
            let rss_activators = rss_mib();
            let per_activator = (rss_activators - rss_revisions) / sample as f64;
            let events_start = watch_events(cluster, &sampled);

            // Steady state: the active share's traffic, through sampled members.
            let m = members.members();
            let active: Vec<(String, String)> = names
                .iter()
                .filter_map(|r| {
                    let s = m.get(r)?;
                    let member = s.iter().find(|n| sampled.contains(n))?;
                    Some((r.clone(), member.clone()))
                })
                .take(((names.len() as f64) * k.active_share.unwrap_or(0.01)).ceil() as usize)
                .collect();
            let assigned: usize = m.values().filter(|s| !s.is_empty()).count();
            let entries = cluster.entries();
            let sender = Sender::new(ns, false);
            let mut samples: Vec<Sample> = Vec::new();
            ctx.step(format!("waking {} active revisions", active.len()));
            for (rev, node) in &active {
                if let Some(e) = entries.iter().find(|(n, _)| n == node) {
                    samples.push(sender.send(e, rev, &[]).await);
                }
            }
            let duration = Duration::from_secs_f64(k.duration_secs.unwrap_or(5.0).max(1.0));
            let before = total_requests(cluster);
            let t = Instant::now();
            let run = if active.is_empty() {
                None
            } else {
                ctx.step("steady traffic to the active revisions");
                let load = OpenLoop {
                    rate: k.rate.unwrap_or(200.0).max(1.0),
                    duration,
                    max_in_flight: 10_000,
                };
                Some(
                    load.run(&ctx.cancel, |_| {
                        let (rev, node) = active[rand::rng().random_range(0..active.len())].clone();
                        let e = entries.iter().find(|(n, _)| *n == node).cloned();
                        let sender = sender.clone();
                        async move {
                            match e {
                                Some(e) => sender.send(&e, &rev, &[]).await.ok(),
                                None => false,
                            }
                        }
                    })
                    .await,
                )
            };
            let api_rps = (total_requests(cluster) - before) as f64 / t.elapsed().as_secs_f64();
            let events_steady = watch_events(cluster, &sampled);

            // One cluster-wide change: an activator (not sampled) leaves; the subsetter
            // repairs every subset it was in.
            // The node (not sampled) in the most subsets: the largest repair one node causes.
            let (in_subsets, leaving) = members
                .busiest(nodes.iter().filter(|n| !sampled.contains(n)))
                .into_iter()
                .next()
                .unwrap_or_default();
            ctx.step(format!("{leaving} leaves ({in_subsets} subsets)"));
            let t = Instant::now();
            let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::namespaced(cluster.client.clone(), cluster.activator_namespace());
            match pods
                .delete(&crate::cluster::activator_pod_name(&leaving), &Default::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            let repaired = members
                .wait(Duration::from_secs(120), |m| {
                    m.values().all(|s: &BTreeSet<String>| !s.contains(&leaving))
                })
                .await;
            let repair_ms = repaired.then(|| t.elapsed().as_secs_f64() * 1e3);
            let events_after = watch_events(cluster, &sampled);
            let per_change: Vec<u64> = events_after
                .iter()
                .zip(&events_steady)
                .map(|(a, b)| a - b)
                .collect();
            let steady_events: Vec<u64> = events_steady
                .iter()
                .zip(&events_start)
                .map(|(a, b)| a - b)
                .collect();
            let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
            // What each sampled activator holds: its own subsets and pods, not the cluster.
            let cached: Vec<activator::cache::CachedObjects> = cluster
                .activators
                .iter()
                .map(|a| a.activator.cached_objects())
                .collect();
            let col = |f: fn(&activator::cache::CachedObjects) -> usize| {
                let v: Vec<u64> = cached.iter().map(|c| f(c) as u64).collect();
                (mean(&v), v.iter().copied().max().unwrap_or(0))
            };
            let (subsets_mean, subsets_max) = col(|c| c.subsets);
            let (revisions_mean, revisions_max) = col(|c| c.revisions);
            let (pods_mean, pods_max) = col(|c| c.pods);
            let summary = SampleSummary::of(&samples);
            let latency = run.as_ref().map(|r| r.latency());
            let text = format!(
                "scale: {} simulated nodes (every one with its activator pod), {} revisions × N={}; \
                 {sample} real activators in this process (a sample: one process cannot hold {} activators)\n\
                 API server: {}\n\
                 subsetter: all {} revisions created and assigned in {:.1} s ({assigned} with members)\n\
                 memory: process {rss_cluster:.0} MiB with the cluster, {rss_revisions:.0} MiB with the revisions, \
                 {rss_activators:.0} MiB with the sampled activators: {per_activator:.1} MiB per activator\n\
                 sampled activators ready in {:.1} s\n\
                 cached per sampled activator: subsets {subsets_mean:.1} (max {subsets_max}), revisions {revisions_mean:.1} (max {revisions_max}), pods {pods_mean:.1} (max {pods_max}) — of {} revisions in the cluster\n\
                 steady state ({} active revisions, {:.0} req/s for {:.1} s): {api_rps:.0} API requests/s in all \
                 (kubelet leases and status included); watch events per sampled activator {:.1} (max {})\n\
                 one activator leaving ({in_subsets} subsets repaired in {}): watch events per sampled activator {:.2} (max {})\n\
                 warm latency {}\n{}",
                nodes.len(),
                names.len(),
                k.activators.unwrap_or(3),
                nodes.len(),
                cluster.api_description(),
                names.len(),
                assign.as_secs_f64(),
                activators_ready.as_secs_f64(),
                names.len(),
                active.len(),
                k.rate.unwrap_or(200.0),
                duration.as_secs_f64(),
                mean(&steady_events),
                steady_events.iter().max().unwrap_or(&0),
                repair_ms.map_or("NOT within 120 s".into(), |ms| format!("{ms:.0} ms")),
                mean(&per_change),
                per_change.iter().max().unwrap_or(&0),
                latency.map_or("-".into(), |l| {
                    // A percentile among the failed requests (ranked last) has no time.
                    let ms = |v: f64| if v.is_finite() { format!("{v:.2} ms") } else { "failed".into() };
                    format!("p50 {}, p99 {} ({} of {} failed)", ms(l.p50), ms(l.p99), l.failed + l.incomplete, l.count)
                }),
                summary.lines(),
            );
            Ok(Outcome {
                figures: json!({
                    "nodes": nodes.len(),
                    "revisions": names.len(),
                    "sampled_activators": sample,
                    "assigned_revisions": assigned,
                    "assignment_s": assign.as_secs_f64(),
                    "rss_mib": {"cluster": rss_cluster, "with_revisions": rss_revisions, "with_activators": rss_activators},
                    "per_activator_mib": per_activator,
                    "cached_per_activator": {
                        "subsets_mean": subsets_mean, "subsets_max": subsets_max,
                        "revisions_mean": revisions_mean, "revisions_max": revisions_max,
                        "pods_mean": pods_mean, "pods_max": pods_max,
                        "each": cached,
                    },
                    "active_revisions": active.len(),
                    "api_requests_per_s": api_rps,
                    "watch_events_per_activator_steady": mean(&steady_events),
                    "one_change": {"subsets": in_subsets, "repaired_ms": repair_ms,
                                   "watch_events_per_activator": mean(&per_change),
                                   "watch_events_max": per_change.iter().max()},
                    "latency_ms": latency,
                    "errors": summary.errors + run.as_ref().map_or(0, |r| r.errors() as usize),
                }),
                text,
                plots: Vec::new(),
            })
        },
    )
    .await
}
