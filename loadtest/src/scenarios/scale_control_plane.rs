//! What `scale` measures of a real control plane (`--kubeconfig`): the API server's own
//! figures phase by phase (its request latency against the scalability SLOs, watches open,
//! memory, CPU; etcd's process when it runs on this machine), and the activators that stand in
//! for every node without a real one, with the DaemonSet rollout that replaces them all.

use std::time::{Duration, Instant};

use activator::WatchOnly;
use serde_json::json;

use crate::Error;
use crate::SimCluster;
use crate::apiserver_metrics::{Phase, Snapshot, local_process};
use crate::scenario::Ctx;

/// A process's resident bytes and CPU seconds.
type ProcessFigures = Option<(u64, f64)>;

/// The API server's figures at each phase boundary.
pub struct ControlPlane {
    client: kube::Client,
    first: Snapshot,
    last: Snapshot,
    /// (phase, what the API server did in it, etcd's RSS bytes and CPU seconds in it).
    phases: Vec<(String, Phase, ProcessFigures)>,
    etcd_last: ProcessFigures,
}

impl ControlPlane {
    /// The first reading; None (and a note) when `/metrics` cannot be read (a client without
    /// `get` on the `/metrics` non-resource URL).
    pub async fn start(client: &kube::Client, ctx: &Ctx) -> Option<Self> {
        match Snapshot::fetch(client).await {
            Ok(first) => {
                let etcd = local_process("etcd");
                ctx.note(&format!(
                    "API server before: RSS {:.0} MiB, {:.0} watches open; etcd {}",
                    first.rss_bytes / MIB,
                    first.watches,
                    etcd.map_or("not on this machine".into(), |(rss, _)| format!(
                        "RSS {:.0} MiB",
                        rss as f64 / MIB
                    )),
                ));
                Some(Self {
                    client: client.clone(),
                    last: first.clone(),
                    first,
                    phases: Vec::new(),
                    etcd_last: etcd,
                })
            }
            Err(e) => {
                ctx.note(&format!("the API server's /metrics cannot be read: {e}"));
                None
            }
        }
    }

    /// Ends the phase `name` (what happened since the last call), and notes its line.
    pub async fn phase(&mut self, name: &str, ctx: &Ctx) {
        let now = match Snapshot::fetch(&self.client).await {
            Ok(s) => s,
            Err(e) => {
                ctx.note(&format!("{name}: the API server's /metrics: {e}"));
                return;
            }
        };
        let phase = now.since(&self.last);
        let etcd_now = local_process("etcd");
        let etcd = match (etcd_now, self.etcd_last) {
            (Some((rss, cpu)), Some((_, was))) => Some((rss, (cpu - was).max(0.0))),
            (Some((rss, _)), None) => Some((rss, 0.0)),
            _ => None,
        };
        ctx.note(&format!(
            "control plane, {name}: {}; etcd {}",
            phase.line(),
            etcd_line(etcd)
        ));
        self.phases.push((name.to_string(), phase, etcd));
        self.last = now;
        self.etcd_last = etcd_now;
    }

    /// The API server's RSS at the end of phase `name`, MiB.
    pub fn rss_mib(&self, name: &str) -> Option<f64> {
        let (_, p, _) = self.phases.iter().find(|(n, _, _)| n == name)?;
        Some(p.rss_bytes / MIB)
    }

    pub fn text(&self) -> String {
        let mut t = format!(
            "control plane before the run: API server RSS {:.0} MiB, {:.0} watches open\n",
            self.first.rss_bytes / MIB,
            self.first.watches
        );
        for (name, p, etcd) in &self.phases {
            t.push_str(&format!(
                "control plane, {name}: {}; etcd {}\n",
                p.line(),
                etcd_line(*etcd)
            ));
        }
        t
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "before": {"rss_mib": self.first.rss_bytes / MIB, "watches_open": self.first.watches},
            "phases": self.phases.iter().map(|(name, p, etcd)| json!({
                "phase": name,
                "api_server": p.json(),
                "etcd": etcd.map(|(rss, cpu)| json!({"rss_mib": rss as f64 / MIB, "cpu_s": cpu})),
            })).collect::<Vec<_>>(),
        })
    }
}

const MIB: f64 = 1024.0 * 1024.0;

fn etcd_line(etcd: ProcessFigures) -> String {
    etcd.map_or("not on this machine".into(), |(rss, cpu)| {
        format!("RSS {:.0} MiB, {cpu:.0} s CPU", rss as f64 / MIB)
    })
}

/// An activator's API reads for every node in `nodes`, started together; returns once every
/// one has its first lists (or `limit` passed: an error naming how many had).
pub async fn stand_in(
    cluster: &SimCluster,
    nodes: &[String],
    limit: Duration,
) -> Result<Vec<(String, WatchOnly)>, Error> {
    let started: Vec<(String, WatchOnly)> = nodes
        .iter()
        .map(|n| Ok((n.clone(), cluster.watch_only(n)?)))
        .collect::<Result<_, Error>>()?;
    let synced = futures::future::join_all(started.iter().map(|(_, w)| w.synced()));
    if tokio::time::timeout(limit, synced).await.is_err() {
        return Err(Error::Timeout {
            what: format!("{} stand-in activators' first lists", nodes.len()),
            secs: limit.as_secs(),
        });
    }
    Ok(started)
}

/// `node`'s activator pod after `pass` rollouts: the harness's name, then `…-2`, `…-3`.
fn pod_name_at(node: &str, pass: usize) -> String {
    let base = crate::cluster::activator_pod_name(node);
    match pass {
        0 => base,
        n => format!("{base}-{}", n + 1),
    }
}

/// What replacing every stand-in took.
pub struct Rollout {
    pub waves: usize,
    pub per_wave: usize,
    pub took: Duration,
    /// The slowest wave: from stopping its activators to every new one's first lists.
    pub slowest_wave: Duration,
    /// Whether the activator pods were replaced (deleted, then new ones created and Ready),
    /// or only the processes restarted in place.
    pub pods_replaced: bool,
    /// What it cost the subsets (filled in by the scenario).
    pub cost: Option<super::scale::RolloutCost>,
}

/// Replaces every stand-in, `share` of them at a time, as a DaemonSet rolling update with
/// that maxUnavailable does: a wave's old activators stop, their pods unready for the
/// shutdown delay (5 s) and then deleted; once they are gone, new pods (a new name: `…-2` in
/// the first `pass`, `…-3` in the second)
/// are created on the same nodes, and the new
/// activators start once those are Ready; the next wave begins when all of them have their
/// first lists. With `replace_pods` false the pods stay and only the processes restart (a
/// restart in place: what the subsetter sees is nothing).
pub async fn rollout(
    cluster: &SimCluster,
    stand_ins: &mut Vec<(String, WatchOnly)>,
    share: f64,
    replace_pods: bool,
    pass: usize,
    ctx: &Ctx,
) -> Result<Rollout, Error> {
    use futures::StreamExt;
    const LIMIT: Duration = Duration::from_secs(300);
    // The activator's default shutdown delay: SIGTERM to exit, unready throughout.
    const DRAIN: Duration = Duration::from_secs(5);
    let per_wave = ((stand_ins.len() as f64 * share).ceil() as usize).max(1);
    let t = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut waves = 0;
    let mut i = 0;
    while i < stand_ins.len() {
        let end = (i + per_wave).min(stand_ins.len());
        ctx.step(format!(
            "rollout: activators {i}..{end} of {}",
            stand_ins.len()
        ));
        let w = Instant::now();
        let nodes: Vec<String> = stand_ins[i..end].iter().map(|(n, _)| n.clone()).collect();
        // The old ones stop first (maxUnavailable), then the new ones list.
        stand_ins.drain(i..end).for_each(drop);
        if replace_pods {
            let replaced: Vec<Result<(), Error>> = futures::stream::iter(&nodes)
                .map(|node| async move {
                    let old = pod_name_at(node, pass - 1);
                    let new = pod_name_at(node, pass);
                    cluster
                        .replace_activator_pod(node, &old, &new, DRAIN, LIMIT)
                        .await
                })
                .buffer_unordered(32)
                .collect()
                .await;
            replaced.into_iter().collect::<Result<Vec<()>, _>>()?;
        }
        let new = stand_in(cluster, &nodes, LIMIT).await?;
        for (k, s) in new.into_iter().enumerate() {
            stand_ins.insert(i + k, s);
        }
        slowest = slowest.max(w.elapsed());
        waves += 1;
        i = end;
        if ctx.cancel.is_cancelled() {
            break;
        }
    }
    Ok(Rollout {
        waves,
        per_wave,
        took: t.elapsed(),
        slowest_wave: slowest,
        pods_replaced: replace_pods,
        cost: None,
    })
}
