//! `scale`: a full-size simulated cluster — thousands of nodes, each with its activator pod,
//! and many revisions, most idle — with a sample of real activators in this process (one
//! process cannot hold thousands of activators; the report says how many ran). Measures the
//! subsetter's assignment time for every revision, each sampled activator's memory and watch
//! traffic, the watch events one cluster-wide change (an activator leaving) costs each of them,
//! the repair of a lost node counted from its NotReady, API requests by component and verb, and
//! this process's memory and CPU phase by phase.

use crate::activator_process::Memory;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::RngExt;
use serde_json::json;

use super::common::{SampleSummary, Sender};
use super::scale_control_plane::{self as control_plane, ControlPlane};
use super::steady_creation;
use crate::Error;
use crate::driver::Sample;
use crate::observe::MemberWatch;
use crate::open_loop::OpenLoop;
use crate::scenario::{
    Ctx, Knobs, Outcome, Report, Scenario, create_revisions_timed, revision_names,
};

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
        // kube-controller-manager's default: the kubelets renew their leases every 10 s.
        node_grace_secs: Some(40.0),
        // Each reconcile waits for its writes one after another (the subsetter's default 32
        // at once assigned ~40 revisions/s at 5,000 × 100,000 while the harness created 150/s,
        // its writes queued behind the kubelets' leases): enough at once to keep up.
        subsetter_concurrency: Some(128),
        ..Knobs::default()
    }
}

fn rss_mib() -> f64 {
    kubesim::node::process::rss_bytes().unwrap_or(0) as f64 / (1024.0 * 1024.0)
}

/// The most this process has held resident (`VmHWM`), MiB: the 8 GiB goal is about the peak,
/// which a reading between phases can miss.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// CPU time this process has used (user + system, all threads), seconds. USER_HZ is 100 on
/// Linux whatever the kernel's tick. With the machine shared, a phase's CPU beside its wall
/// time says whether it waited for the model, for its own work, or for the other processes.
fn cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces), from field 3 on.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0)
}

/// How long a lost node has to wait for its Node to turn NotReady, at most, past the node
/// grace period (the node lifecycle controller checks leases every few seconds).
const NOT_READY_SLACK: Duration = Duration::from_secs(30);

fn node_ready(n: &k8s_openapi::api::core::v1::Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Requests by component and verb, `after` less `before`.
fn by_component_since(
    after: &BTreeMap<String, BTreeMap<String, u64>>,
    before: &BTreeMap<String, BTreeMap<String, u64>>,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    after
        .iter()
        .map(|(who, verbs)| {
            let verbs = verbs
                .iter()
                .map(|(verb, n)| {
                    let was = before
                        .get(who)
                        .and_then(|v| v.get(verb))
                        .copied()
                        .unwrap_or(0);
                    (verb.clone(), n - was)
                })
                .filter(|(_, n)| *n > 0)
                .collect::<BTreeMap<_, _>>();
            (who.clone(), verbs)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// `1.5 (max 3)`: watch events per sampled activator, which only kubesim counts.
fn events_line(events: &[u64], counted: bool) -> String {
    if !counted {
        return "not counted (a real API server)".into();
    }
    let mean = events.iter().sum::<u64>() as f64 / events.len().max(1) as f64;
    format!("{mean:.2} (max {})", events.iter().max().unwrap_or(&0))
}

/// `harness: create 3, get 1; kubelet: …` for the text report.
fn requests_line(by: &BTreeMap<String, BTreeMap<String, u64>>) -> String {
    if by.is_empty() {
        return "not counted here (a real API server: its own figures are in the control \
                plane lines)"
            .into();
    }
    by.iter()
        .map(|(who, verbs)| {
            let total: u64 = verbs.values().sum();
            let verbs: Vec<String> = verbs.iter().map(|(v, n)| format!("{v} {n}")).collect();
            format!("{who} {total} ({})", verbs.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
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
    let grace = Duration::from_secs_f64(k.node_grace_secs.unwrap_or(40.0).max(0.5));
    // A real API server: its own figures phase by phase, and stand-ins for the activators
    // this process does not run, so that it carries a whole DaemonSet's watches.
    let mut cp = match &ctx.target {
        crate::scenario::Target::Cluster(client) => ControlPlane::start(client, ctx).await,
        crate::scenario::Target::Embedded => None,
    };
    let stand_ins_on = k
        .stand_in_activators
        .unwrap_or(matches!(ctx.target, crate::scenario::Target::Cluster(_)));
    let rollout_share = k.rollout_max_unavailable.unwrap_or(0.1).clamp(0.0, 1.0);
    let replace_pods = k.rollout_replace_pods.unwrap_or(true);
    let from_directory = k.members_from_directory.unwrap_or(true);
    let compare = k.rollout_compare.unwrap_or(false);
    let replacement_hold = k
        .replacement_hold_secs
        .map_or(subsetter::replacements::REPLACEMENT_HOLD, |s| {
            Duration::from_secs_f64(s.max(0.0))
        });
    ctx.on_cluster(
        Scenario::Scale,
        &k,
        |o| {
            o.shared_kubelet_watch = true;
            o.real_activators = Some(0);
            // Assignment time is the subsetter's, not its write limit's.
            o.subsetter_write_qps = 0.0;
            o.max_pods = 250;
            o.node_grace = grace;
            o.subsetter_replacement_hold = replacement_hold;
            // The subsetter as the chart runs it, over every namespace (a shared API server
            // still limits it to this run's, by label): its directory then answers a starting
            // activator's memberships whole, as the rollout's do.
            o.revision_namespace = None;
            o.members_from_directory = from_directory;
            o.directory_replicas = k.directory_replicas.unwrap_or(1).max(1);
        },
        async |cluster, ns| {
            let nodes: Vec<String> = cluster.fleet.nodes().map(|n| n.name().to_string()).collect();
            let names = revision_names(k.revisions.unwrap_or(1).max(1));
            if let Some(cp) = &mut cp {
                cp.phase("cluster started (nodes and their activator pods)", ctx).await;
            }
            // Stand-ins: every node's activator watches before the revisions, as a DaemonSet
            // installed first; a sampled node's is replaced by its real activator later.
            let mut stand_ins = Vec::new();
            let mut stand_ins_synced = None;
            if stand_ins_on {
                ctx.step(format!("starting {} stand-in activators", nodes.len()));
                let t = Instant::now();
                stand_ins = control_plane::stand_in(
                    cluster,
                    &nodes,
                    Duration::from_secs(60 + nodes.len() as u64 / 10),
                )
                .await?;
                stand_ins_synced = Some(t.elapsed());
                ctx.note(&format!(
                    "{} stand-in activators listed in {:.1} s",
                    nodes.len(),
                    t.elapsed().as_secs_f64()
                ));
                if let Some(cp) = &mut cp {
                    cp.phase("stand-in activators' watches started", ctx).await;
                }
            }
            // One node's activator as its own process: its memory idle (no revision exists
            // yet) and later with its subsets, where the in-process sample's is a difference
            // of one process's RSS over several.
            let process = start_process(cluster, &k, &nodes, ctx).await;
            let process_idle = match &process {
                Some(p) => p.settled(PROCESS_SETTLE).await,
                None => None,
            };
            let process_node = process.as_ref().map(|p| p.node().to_string());
            let rss_cluster = rss_mib();
            let members = MemberWatch::start(&cluster.client, ns);
            ctx.step(format!("creating {} revisions; the subsetter assigns them", names.len()));
            let requests_start = cluster.api_requests_by_component();
            let cpu_cluster = cpu_secs();
            // With a second directory replica, one is killed halfway through the creates.
            let kill_at = (k.directory_replicas.unwrap_or(1) > 1 && !stand_ins.is_empty())
                .then_some(names.len() / 2);
            let started = std::sync::atomic::AtomicUsize::new(0);
            let half = tokio::sync::Notify::new();
            let (creation, replica_kill) = tokio::join!(
                async {
                    let c = create_revisions_timed(cluster, ns, &names, |_| {
                        let i = started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if Some(i) == kill_at {
                            half.notify_one();
                        }
                    })
                    .await;
                    // A creation that failed early must not leave the kill waiting.
                    half.notify_one();
                    c
                },
                async {
                    kill_at?;
                    half.notified().await;
                    ctx.step("killing a directory replica");
                    super::replica_kill::run(cluster, &stand_ins, Duration::from_secs(120)).await
                }
            );
            let creation = creation?;
            if let Some(r) = &replica_kill {
                ctx.note(&r.text());
            }
            let assign = creation.assigned;
            // The goal is about what is left once the creates end: the subsetter assigns
            // while they run.
            let backlog = creation.assigned.saturating_sub(creation.created);
            let rss_revisions = rss_mib();
            if let Some(cp) = &mut cp {
                cp.phase("revisions created and assigned", ctx).await;
            }
            let cpu_assign = cpu_secs() - cpu_cluster;
            let requests_assign =
                by_component_since(&cluster.api_requests_by_component(), &requests_start);
            ctx.note(&format!(
                "{} revisions created in {:.1} s, all assigned {:.1} s after the last create \
                 ({cpu_assign:.0} s of CPU); process {rss_cluster:.0} MiB with the cluster, \
                 {rss_revisions:.0} MiB with the revisions; API requests: {}",
                names.len(),
                creation.created.as_secs_f64(),
                backlog.as_secs_f64(),
                requests_line(&requests_assign),
            ));
            let steady_creation = match k.steady_creates.unwrap_or(0) {
                0 => None,
                count => {
                    let rate = k.steady_create_rate.unwrap_or(20.0).max(0.01);
                    ctx.step(format!("creating {count} more revisions at {rate}/s"));
                    let names = steady_creation::names(count);
                    let mut s = steady_creation::run(
                        cluster,
                        ns,
                        &names,
                        rate,
                        &members,
                        Duration::from_secs(60),
                        &ctx.cancel,
                    )
                    .await;
                    if !stand_ins.is_empty() {
                        s.applied_ms = Some(
                            steady_creation::applied_on_nodes(
                                &s,
                                ns,
                                &members,
                                &stand_ins,
                                Duration::from_secs(30),
                            )
                            .await,
                        );
                    }
                    if let Some(cp) = &mut cp {
                        cp.phase("steady creation", ctx).await;
                    }
                    ctx.note(&s.text());
                    Some(s)
                }
            };
            // Sampled: nodes that are members of some subset (then those that are not), so the
            // steady state has active revisions with a sampled member to send through. Seen
            // under CI's load: the first nodes in no subset at all, no steady traffic.
            let m = members.members();
            let in_subsets: std::collections::HashSet<&String> = m.values().flatten().collect();
            let (with, without): (Vec<&String>, Vec<&String>) =
                nodes.iter().partition(|n| in_subsets.contains(n));
            let sampled: Vec<String> = with
                .into_iter()
                .chain(without)
                .take(sample)
                .cloned()
                .collect();
            ctx.step(format!("starting {sample} real activators"));
            let t = Instant::now();
            // A sampled node's stand-in gives way to its real activator.
            stand_ins.retain(|(n, _)| !sampled.contains(n));
            // One that is slow to turn Ready (a real API server busy with the run) is noted
            // and left running: an hour's run is not thrown away for it.
            let mut late = 0usize;
            for node in &sampled {
                if let Err(e) = cluster.add_activator(node, None).await {
                    late += 1;
                    ctx.note(&format!("sampled activator on {node}: {e}; going on without waiting for it"));
                }
            }
            let activators_ready = t.elapsed();
            let rss_activators = rss_mib();
            let per_activator = (rss_activators - rss_revisions) / sample as f64;
            ctx.note(&format!(
                "{sample} sampled activators ready in {:.1} s ({late} not Ready in time): \
                 {rss_activators:.0} MiB, {per_activator:.1} MiB per activator",
                activators_ready.as_secs_f64()
            ));
            let events_start = watch_events(cluster, &sampled);
            // By now the process's watch has had the assignment's events as long as the
            // sample took to start.
            let process_with = match &process {
                Some(p) => p.settled(PROCESS_SETTLE).await,
                None => None,
            };
            let process_subsets = process_node.as_deref().map(|n| members.subsets_of(n));

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
            // Of the bulk's revisions (the steady creation's are counted on their own).
            let assigned: usize = names
                .iter()
                .filter(|n| m.get(*n).is_some_and(|s| !s.is_empty()))
                .count();
            let entries = cluster.entries();
            let sender = Sender::new(ns, k.by_host()?);
            let mut samples: Vec<Sample> = Vec::new();
            ctx.step(format!("waking {} active revisions", active.len()));
            for (rev, node) in &active {
                if let Some(e) = entries.iter().find(|(n, _)| n == node) {
                    samples.push(sender.send(e, rev, &[]).await);
                }
            }
            let duration = Duration::from_secs_f64(k.duration_secs.unwrap_or(5.0).max(1.0));
            let before = total_requests(cluster);
            let components_before = cluster.api_requests_by_component();
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
            let steady_secs = t.elapsed().as_secs_f64();
            let api_rps = (total_requests(cluster) - before) as f64 / steady_secs;
            let requests_steady =
                by_component_since(&cluster.api_requests_by_component(), &components_before);
            let events_steady = watch_events(cluster, &sampled);
            if let Some(cp) = &mut cp {
                cp.phase("steady state", ctx).await;
            }
            ctx.note(&format!(
                "steady state ({} active revisions, {steady_secs:.1} s): {api_rps:.0} API \
                 requests/s in all; {}",
                active.len(),
                requests_line(&requests_steady)
            ));

            // One cluster-wide change: an activator (not sampled) leaves; the subsetter
            // repairs every subset it was in.
            // The node (not sampled) in the most subsets: the largest repair one node causes.
            let (in_subsets, leaving) = members
                .busiest(nodes.iter().filter(|n| {
                    !sampled.contains(n) && Some(n.as_str()) != process_node.as_deref()
                }))
                .into_iter()
                .next()
                .unwrap_or_default();
            ctx.step(format!("{leaving} leaves ({in_subsets} subsets)"));
            stand_ins.retain(|(n, _)| *n != leaving);
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
                .wait_gone(&leaving, replacement_hold + Duration::from_secs(120))
                .await;
            let repair_ms = repaired.then(|| t.elapsed().as_secs_f64() * 1e3);
            // Its node stays Ready, so the subsetter first holds it for a replacement that
            // never comes (`--replacement-hold-seconds`).
            ctx.note(&format!(
                "one activator leaving ({leaving}, in {in_subsets} subsets, its node Ready): \
                 repaired in {} (after a {:.0} s hold for its replacement)",
                repair_ms.map_or("NOT within the hold and 120 s".into(), |ms| format!("{ms:.0} ms")),
                replacement_hold.as_secs_f64(),
            ));
            let events_after = watch_events(cluster, &sampled);
            if let Some(cp) = &mut cp {
                cp.phase("one activator leaving", ctx).await;
            }

            // A node lost (its kubelet, apps and activator stop at once): the subsetter repairs
            // once the node lifecycle controller marks it NotReady (after the node grace
            // period); the goal counts from NotReady.
            let (lost_subsets, lost) = members
                .busiest(nodes.iter().filter(|n| {
                    !sampled.contains(n)
                        && **n != leaving
                        && Some(n.as_str()) != process_node.as_deref()
                }))
                .into_iter()
                .next()
                .unwrap_or_default();
            ctx.step(format!("{lost} lost ({lost_subsets} subsets); waiting for NotReady"));
            let node_api: kube::Api<k8s_openapi::api::core::v1::Node> =
                kube::Api::all(cluster.client.clone());
            let not_ready = kube::runtime::wait::await_condition(
                node_api,
                &lost,
                |n: Option<&k8s_openapi::api::core::v1::Node>| n.is_some_and(|n| !node_ready(n)),
            );
            let killed_at = Instant::now();
            stand_ins.retain(|(n, _)| *n != lost);
            cluster.kill_node(&lost).await?;
            ctx.note(&format!("{lost} killed (in {lost_subsets} subsets)"));
            let not_ready_at = match tokio::time::timeout(grace + NOT_READY_SLACK, not_ready).await {
                Ok(Ok(_)) => Some(Instant::now()),
                _ => None,
            };
            ctx.note(&format!(
                "{lost} NotReady {}",
                not_ready_at.map_or("NOT seen".into(), |t| format!(
                    "{:.0} ms after the kill",
                    (t - killed_at).as_secs_f64() * 1e3
                ))
            ));
            let loss_repaired_at = members
                .wait_gone(&lost, Duration::from_secs(120))
                .await
                .then(Instant::now);
            let not_ready_ms = not_ready_at.map(|t| (t - killed_at).as_secs_f64() * 1e3);
            // Repaired before NotReady was seen (the watches race): 0, not negative.
            let loss_repair_ms = match (not_ready_at, loss_repaired_at) {
                (Some(n), Some(r)) => Some(r.saturating_duration_since(n).as_secs_f64() * 1e3),
                _ => None,
            };
            // Also from the kill: a NotReady the harness did not see in time (the node
            // lifecycle controller late) is no repair that did not happen.
            let loss_repair_after_kill_ms =
                loss_repaired_at.map(|r| (r - killed_at).as_secs_f64() * 1e3);
            let loss_repair_text = match (loss_repair_ms, loss_repair_after_kill_ms) {
                (Some(ms), Some(k)) => {
                    format!("{ms:.0} ms after NotReady ({k:.0} ms after the kill)")
                }
                (None, Some(k)) => format!("{k:.0} ms after the kill (NotReady not seen)"),
                _ => "NOT within 120 s after NotReady".to_string(),
            };
            ctx.note(&format!(
                "one node lost ({lost}, in {lost_subsets} subsets): repaired {loss_repair_text}"
            ));
            if loss_repaired_at.is_none() {
                // Whose lag: this harness's watch, or the subsetter's writes?
                let watched = members.subsets_of(&lost);
                let aeps: kube::Api<crds::ActivationEndpoints> =
                    kube::Api::namespaced(cluster.client.clone(), ns);
                let listed = aeps
                    .list(
                        &kube::api::ListParams::default()
                            .labels(&crds::contract::member_selector(&lost))
                            .match_any(),
                    )
                    .await
                    .map(|l| {
                        let in_status = l
                            .items
                            .iter()
                            .filter(|a| {
                                a.status
                                    .as_ref()
                                    .is_some_and(|s| s.activators.iter().any(|m| m.node == lost))
                            })
                            .count();
                        format!("{} labelled, {in_status} with it in their status", l.items.len())
                    })
                    .unwrap_or_else(|e| format!("not listed: {e}"));
                ctx.note(&format!(
                    "{lost} still a member of {watched} subsets as the harness's watch shows \
                     them; the API server's ActivationEndpoints: {listed}"
                ));
            }
            if let Some(cp) = &mut cp {
                cp.phase("one node lost", ctx).await;
            }
            // A DaemonSet rollout: every stand-in replaced, maxUnavailable at a time.
            // What it cost the subsets: members moved, ActivationEndpoints written, and the
            // subsetter's holds for the replacements.
            let sm = cluster.subsetter_metrics();
            // With --rollout-compare, twice: listing the memberships, then from the
            // directory, so the two starts are compared in one run on the same objects.
            let passes: Vec<bool> = if compare {
                vec![false, true]
            } else {
                vec![from_directory]
            };
            let mut rollouts: Vec<(bool, control_plane::Rollout)> = Vec::new();
            if !stand_ins.is_empty() && rollout_share > 0.0 {
                for (pass, from_dir) in passes.into_iter().enumerate() {
                    cluster.set_members_from_directory(from_dir);
                    // The repairs above are counted when their writes return, which may be
                    // after the harness's watch showed them.
                    subsetter_idle(sm, Duration::from_secs(60)).await;
                    let before = (
                        members.changes(),
                        members.events(),
                        sm.replacement_holds.get(),
                        sm.replacement_holds_expired.get(),
                        sm.members_left.get(),
                        rebalanced(sm),
                        cluster.activator_subset_lists(),
                    );
                    let mut r = match control_plane::rollout(
                        cluster,
                        &mut stand_ins,
                        rollout_share,
                        replace_pods,
                        pass + 1,
                        ctx,
                    )
                    .await
                    {
                        Ok(r) => r,
                        Err(e) => {
                            ctx.note(&format!("rollout of the stand-in activators: {e}"));
                            break;
                        }
                    };
                    // The last wave's replacements are written after its activators listed.
                    let settled = subsetter_idle(sm, Duration::from_secs(60)).await;
                    r.cost = Some(RolloutCost {
                        member_changes: members.changes() - before.0,
                        endpoints_events: (members.events() - before.1) as u64,
                        holds: sm.replacement_holds.get() - before.2,
                        holds_expired: sm.replacement_holds_expired.get() - before.3,
                        members_left: sm.members_left.get() - before.4,
                        rebalanced: rebalanced(sm) - before.5,
                        subset_lists: cluster
                            .activator_subset_lists()
                            .zip(before.6)
                            .map(|(now, then)| now - then),
                        settled,
                    });
                    ctx.note(&format!(
                        "rollout of {} stand-in activators ({}; memberships {}), {} at a time: {:.1} s in {} waves, the slowest {:.1} s; {}",
                        stand_ins.len(),
                        if r.pods_replaced { "pods deleted and created again, as a DaemonSet does" } else { "processes restarted, pods kept" },
                        starts(from_dir),
                        r.per_wave,
                        r.took.as_secs_f64(),
                        r.waves,
                        r.slowest_wave.as_secs_f64(),
                        r.cost.as_ref().map_or(String::new(), RolloutCost::text),
                    ));
                    if let Some(cp) = &mut cp {
                        let phase = if compare {
                            format!("stand-in activators rolled, memberships {}", starts(from_dir))
                        } else {
                            "stand-in activators rolled".to_string()
                        };
                        cp.phase(&phase, ctx).await;
                    }
                    rollouts.push((from_dir, r));
                }
            }
            let rollout = rollouts.pop();
            let rollout_listed = rollouts.pop().filter(|_| compare);
            // Whether each stand-in holds the subsets the API server has for its node (its
            // start from the directory included), once their watches have had time to show
            // the last writes: the subsetter is settled, so nothing changes meanwhile.
            let stand_ins_off = {
                let off = || {
                    stand_ins
                        .iter()
                        .filter(|(n, w)| w.counts().0 != members.subsets_of(n))
                        .count()
                };
                let deadline = Instant::now() + Duration::from_secs(10);
                while off() > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                off()
            };
            let stand_in_counts: Vec<(usize, usize, usize)> =
                stand_ins.iter().map(|(_, w)| w.counts()).collect();
            drop(stand_ins);
            let process_end = process.as_ref().and_then(|p| p.memory());
            let process_line = process_figures(
                process_node.as_deref(),
                process_idle,
                process_with,
                process_end,
                process_subsets,
            );
            drop(process);
            let peak_mib = peak_rss_mib();
            let cpu_all = cpu_secs();
            let requests_all =
                by_component_since(&cluster.api_requests_by_component(), &requests_start);
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
                 subsetter: all {} revisions created and assigned in {:.1} s ({assigned} with members; {} reconciles at once); the creates took {:.1} s, the last assignment {:.1} s after them; {cpu_assign:.0} s of CPU meanwhile\n\
                 memory: process {rss_cluster:.0} MiB with the cluster, {rss_revisions:.0} MiB with the revisions, \
                 {rss_activators:.0} MiB with the sampled activators: {per_activator:.1} MiB per activator; peak {peak_mib:.0} MiB\n\
                 {}\n\
                 sampled activators ready in {:.1} s ({late} of them not Ready within the limit)\n\
                 cached per sampled activator: subsets {subsets_mean:.1} (max {subsets_max}), revisions {revisions_mean:.1} (max {revisions_max}), pods {pods_mean:.1} (max {pods_max}) — of {} revisions in the cluster\n\
                 steady state ({} active revisions, {:.0} req/s for {:.1} s): {api_rps:.0} API requests/s in all \
                 (kubelet leases and status included); watch events per sampled activator {}\n\
                 one activator leaving ({in_subsets} subsets repaired in {}): watch events per sampled activator {}\n\
                 one node lost ({lost} in {lost_subsets} subsets): NotReady {} after the kill, subsets repaired {loss_repair_text}\n\
                 API requests by component while revisions were created and assigned: {}\n\
                 API requests by component in steady state ({steady_secs:.1} s): {}\n\
                 API requests by component over the whole run: {}\n\
                 CPU: {cpu_all:.0} s in all ({cpu_cluster:.0} s to start the cluster)\n\
                 warm latency {}\n{}",
                nodes.len(),
                names.len(),
                k.activators.unwrap_or(3),
                nodes.len(),
                cluster.api_description(),
                names.len(),
                assign.as_secs_f64(),
                k.subsetter_concurrency.unwrap_or(128),
                creation.created.as_secs_f64(),
                backlog.as_secs_f64(),
                process_line.0,
                activators_ready.as_secs_f64(),
                names.len(),
                active.len(),
                k.rate.unwrap_or(200.0),
                duration.as_secs_f64(),
                events_line(&steady_events, cluster.api.is_some()),
                repair_ms.map_or("NOT within 120 s".into(), |ms| format!("{ms:.0} ms")),
                events_line(&per_change, cluster.api.is_some()),
                not_ready_ms.map_or("NOT seen".into(), |ms| format!("{ms:.0} ms")),
                requests_line(&requests_assign),
                requests_line(&requests_steady),
                requests_line(&requests_all),
                latency.map_or("-".into(), |l| {
                    // A percentile among the failed requests (ranked last) has no time.
                    let ms = |v: f64| if v.is_finite() { format!("{v:.2} ms") } else { "failed".into() };
                    format!("p50 {}, p99 {} ({} of {} failed)", ms(l.p50), ms(l.p99), l.failed + l.incomplete, l.count)
                }),
                summary.lines(),
            );
            let mut control = String::new();
            let subs: Vec<u64> = stand_in_counts.iter().map(|c| c.0 as u64).collect();
            let revs: Vec<u64> = stand_in_counts.iter().map(|c| c.1 as u64).collect();
            if let Some(t) = stand_ins_synced {
                control.push_str(&format!(
                    "stand-in activators (an activator's watches and reads ahead, no serving) on every node without a real one: first lists of all {} in {:.1} s; at the end each held subsets {:.1} (max {}), revisions {:.1} (max {}); {stand_ins_off} held other subsets than the API server's for their node\n",
                    nodes.len(),
                    t.as_secs_f64(),
                    mean(&subs),
                    subs.iter().max().unwrap_or(&0),
                    mean(&revs),
                    revs.iter().max().unwrap_or(&0),
                ));
            }
            for (from_dir, r) in rollout_listed.iter().chain(&rollout) {
                control.push_str(&format!(
                    "rollout: {} stand-in activators replaced {} at a time ({}; memberships {}) in {:.1} s ({} waves, the slowest {:.1} s); {}\n",
                    stand_in_counts.len(),
                    r.per_wave,
                    if r.pods_replaced { "pods replaced" } else { "pods kept" },
                    starts(*from_dir),
                    r.took.as_secs_f64(),
                    r.waves,
                    r.slowest_wave.as_secs_f64(),
                    r.cost.as_ref().map_or(String::new(), RolloutCost::text),
                ));
            }
            if let Some(s) = &steady_creation {
                control.push_str(&s.text());
                control.push('\n');
            }
            if let Some(r) = &replica_kill {
                control.push_str(&r.text());
                control.push('\n');
            }
            let mut api_server_mib = serde_json::Value::Null;
            if let Some(cp) = &cp {
                control.push_str(&cp.text());
                let at = |phase: &str| cp.rss_mib(phase);
                let cluster_mib = at("cluster started (nodes and their activator pods)");
                let watches_mib = at("stand-in activators' watches started");
                let revisions_mib = at("revisions created and assigned");
                let per_1000 = match (cluster_mib, watches_mib) {
                    (Some(a), Some(b)) => Some((b - a) / (nodes.len() as f64 / 1000.0)),
                    _ => None,
                };
                let objects = match (watches_mib.or(cluster_mib), revisions_mib) {
                    (Some(a), Some(b)) => Some(b - a),
                    _ => None,
                };
                control.push_str(&format!(
                    "API server memory for the product: activators' watches {} per 1,000 nodes; the revisions and their subsets {}\n",
                    per_1000.map_or("-".into(), |m| format!("{m:.0} MiB")),
                    objects.map_or("-".into(), |m| format!("{m:.0} MiB for {}", names.len())),
                ));
                api_server_mib = json!({"watches_per_1000_nodes": per_1000, "revisions": objects});
            }
            let text = format!("{text}{control}");
            Ok(Outcome {
                figures: json!({
                    "nodes": nodes.len(),
                    "revisions": names.len(),
                    "sampled_activators": sample,
                    "sampled_not_ready_in_time": late,
                    "assigned_revisions": assigned,
                    "assignment_s": assign.as_secs_f64(),
                    "creation_s": creation.created.as_secs_f64(),
                    "subsetter_concurrency": k.subsetter_concurrency,
                    "cpu_s": {"cluster": cpu_cluster, "assign": cpu_assign, "all": cpu_all},
                    "assigned_after_creation_s": backlog.as_secs_f64(),
                    "rss_mib": {"cluster": rss_cluster, "with_revisions": rss_revisions, "with_activators": rss_activators, "peak": peak_mib},
                    "per_activator_mib": per_activator,
                    "activator_process": process_line.1,
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
                    "node_loss": {"node": lost, "node_grace_s": grace.as_secs_f64(), "subsets": lost_subsets, "not_ready_ms": not_ready_ms,
                                  "repaired_after_not_ready_ms": loss_repair_ms,
                                  "repaired_after_kill_ms": loss_repair_after_kill_ms},
                    "api_requests_by_component": {"assign": requests_assign, "steady": requests_steady, "all": requests_all},
                    "latency_ms": latency,
                    "errors": summary.errors + run.as_ref().map_or(0, |r| r.errors() as usize),
                    "stand_ins": stand_ins_synced.map(|t| json!({
                        "nodes": nodes.len(), "first_lists_s": t.as_secs_f64(),
                        "subsets_mean": mean(&subs), "revisions_mean": mean(&revs),
                        "subsets_off": stand_ins_off,
                    })),
                    "rollout": rollout.as_ref().map(|r| rollout_json(r, stand_in_counts.len(), replacement_hold)),
                    "steady_creation": steady_creation,
                    "replica_kill": replica_kill,
                    "rollout_listed": rollout_listed.as_ref().map(|r| rollout_json(r, stand_in_counts.len(), replacement_hold)),
                    "control_plane": cp.as_ref().map(|c| c.json()),
                    "api_server_product_mib": api_server_mib,
                }),
                text,
                plots: Vec::new(),
            })
        },
    )
    .await
}

/// Starts one node's activator as its own process (`activator_process`), when there is a
/// binary and the API server is the embedded one; a failure is noted and the run goes on.
async fn start_process(
    cluster: &crate::SimCluster,
    k: &Knobs,
    nodes: &[String],
    ctx: &Ctx,
) -> Option<crate::activator_process::ActivatorProcess> {
    let binary = k
        .activator_binary
        .clone()
        .or_else(|| crate::activator_process::beside_this_program().filter(|p| p.is_file()))?;
    let node = nodes.last()?;
    let dir = std::env::temp_dir().join(format!("la-scale-{}", std::process::id()));
    let spec = match cluster.process_spec(node, &binary, &dir) {
        Ok(Some(spec)) => spec,
        Ok(None) => return None,
        Err(e) => {
            ctx.note(&format!(
                "activator process on {node}: {e}; going on without it"
            ));
            return None;
        }
    };
    ctx.step(format!(
        "starting {node}'s activator as its own process ({})",
        binary.display()
    ));
    match crate::activator_process::ActivatorProcess::start(spec, Duration::from_secs(60)).await {
        Ok(p) => {
            ctx.note(&format!("activator process on {node} ready"));
            Some(p)
        }
        Err(e) => {
            ctx.note(&format!(
                "activator process on {node}: {e}; going on without it"
            ));
            None
        }
    }
}

/// How long the activator process's memory may take to settle before it is read.
const PROCESS_SETTLE: Duration = Duration::from_secs(10);

fn mib(m: Option<Memory>) -> String {
    m.map_or("-".into(), |m| {
        format!(
            "{:.2} MiB (anonymous {:.2} MiB)",
            m.rss as f64 / MIB,
            m.anon as f64 / MIB
        )
    })
}

const MIB: f64 = 1024.0 * 1024.0;

/// The process activator's line of the report and its JSON.
fn process_figures(
    node: Option<&str>,
    idle: Option<Memory>,
    with: Option<Memory>,
    end: Option<Memory>,
    subsets: Option<usize>,
) -> (String, serde_json::Value) {
    let Some(node) = node else {
        return (
            "activator process: not run (no activator binary beside this program, or not on the embedded cluster)".into(),
            serde_json::Value::Null,
        );
    };
    let above = |m: Option<Memory>| match (m, idle) {
        (Some(m), Some(i)) => Some((
            (m.rss as f64 - i.rss as f64) / MIB,
            (m.anon as f64 - i.anon as f64) / MIB,
        )),
        _ => None,
    };
    let above_text = |m: Option<Memory>| {
        above(m).map_or("-".into(), |(r, a)| {
            format!("{r:.2} MiB above idle, anonymous {a:.2} MiB")
        })
    };
    let text = format!(
        "activator process on {node} (its own memory, settled): idle {} (ready, no revision yet); with its {} subsets {} ({}); at the end {} ({})",
        mib(idle),
        subsets.map_or("-".into(), |s| s.to_string()),
        mib(with),
        above_text(with),
        mib(end),
        above_text(end),
    );
    let js = |m: Option<Memory>| {
        m.map(|m| json!({"rss_mib": m.rss as f64 / MIB, "anon_mib": m.anon as f64 / MIB}))
    };
    let js_above = |m: Option<Memory>| above(m).map(|(r, a)| json!({"rss_mib": r, "anon_mib": a}));
    (
        text,
        json!({"node": node, "subsets": subsets, "idle": js(idle), "with_subsets": js(with),
               "end": js(end), "above_idle": js_above(with), "above_idle_end": js_above(end)}),
    )
}

/// How a rollout's activators found their memberships.
fn starts(from_directory: bool) -> &'static str {
    if from_directory {
        "from the directory"
    } else {
        "listed"
    }
}

/// A rollout in the report: `(memberships from the directory, what it took)`.
fn rollout_json(
    (from_dir, r): &(bool, control_plane::Rollout),
    activators: usize,
    hold: Duration,
) -> serde_json::Value {
    json!({
        "activators": activators, "per_wave": r.per_wave, "waves": r.waves,
        "took_s": r.took.as_secs_f64(), "slowest_wave_s": r.slowest_wave.as_secs_f64(),
        "pods_replaced": r.pods_replaced,
        "members_from_directory": from_dir,
        "replacement_hold_s": hold.as_secs_f64(),
        "member_changes": r.cost.as_ref().map(|c| c.member_changes),
        "endpoints_events": r.cost.as_ref().map(|c| c.endpoints_events),
        "replacement_holds": r.cost.as_ref().map(|c| c.holds),
        "replacement_holds_expired": r.cost.as_ref().map(|c| c.holds_expired),
        "members_left": r.cost.as_ref().map(|c| c.members_left),
        "members_rebalanced": r.cost.as_ref().map(|c| c.rebalanced),
        "subset_lists": r.cost.as_ref().and_then(|c| c.subset_lists),
        "settled": r.cost.as_ref().map(|c| c.settled),
    })
}

/// What a rollout cost the subsets, from the harness's ActivationEndpoints watch and the
/// subsetter's metrics.
pub struct RolloutCost {
    /// Nodes that joined or left a subset (a member moved is two).
    pub member_changes: u64,
    /// ActivationEndpoints events the watch saw (each a write by the subsetter).
    pub endpoints_events: u64,
    /// Activators the subsetter held for their replacement, and held past the hold.
    pub holds: u64,
    pub holds_expired: u64,
    /// Members the subsetter removed from subsets, and of those, the ones its rebalancer
    /// moved (at most `--rebalance-max-moves` a minute, whatever the rollout does).
    pub members_left: u64,
    pub rebalanced: u64,
    /// LISTs of ActivationEndpoints the activators made (embedded API server only): each new
    /// one's memberships come from the directory, else from such a list.
    pub subset_lists: Option<u64>,
    /// Whether the subsetter had nothing held or queued within a minute of the last wave.
    pub settled: bool,
}

impl RolloutCost {
    fn text(&self) -> String {
        format!(
            "{} member changes, {} ActivationEndpoints writes, {} activators held for their \
             replacement ({} past the hold), {} members removed ({} by the rebalancer){}{}",
            self.member_changes,
            self.endpoints_events,
            self.holds,
            self.holds_expired,
            self.members_left,
            self.rebalanced,
            self.subset_lists.map_or(String::new(), |n| format!(
                ", {n} ActivationEndpoints lists by the activators"
            )),
            if self.settled {
                ""
            } else {
                " (the subsetter NOT settled a minute after)"
            }
        )
    }
}

/// Waits until the subsetter holds no activator for its replacement and has no reconcile
/// queued or running, at most `limit`; false on timeout. Its metrics have no event to await,
/// so this polls them.
async fn subsetter_idle(sm: &subsetter::metrics::Metrics, limit: Duration) -> bool {
    tokio::time::timeout(limit, async {
        while sm.held_for_replacement.get() > 0
            || sm.reconciles_queued.get() > 0
            || sm.reconciles_in_flight.get() > 0
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .is_ok()
}

/// Members the subsetter's rebalancer moved so far.
fn rebalanced(sm: &subsetter::metrics::Metrics) -> u64 {
    sm.members_replaced
        .get_or_create(&subsetter::metrics::ReplacedBy {
            reason: "rebalance",
        })
        .get()
}
