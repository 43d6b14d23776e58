//! Revisions created at a steady rate once the bulk exists (`scale --steady-creates`): what a
//! platform's ongoing deployments cost the control plane at full size. The bulk creation
//! before it sends as fast as 32 creates at once go, which takes any API server to its limit
//! (on this machine ~300 writes/s, docs/kubesim.md), so its SLO figures measure the server's
//! ceiling; this phase measures the product at a rate the server is not saturated by.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::Revision;
use kube::Api;
use kube::api::PostParams;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::SimCluster;
use crate::demo::{echo_revision, host_of};
use crate::observe::MemberWatch;
use crate::open_loop::{Latency, OpenLoop};

/// What the steady creation measured.
#[derive(Debug, Clone, Serialize)]
pub struct SteadyCreation {
    /// Revisions created per second, as asked.
    pub rate: f64,
    /// Revisions due (each one create).
    pub count: usize,
    /// From each create's intended send time to its answer; failed creates ranked last.
    pub create_ms: Latency,
    /// From each create's answer until the harness's watch showed the revision with members;
    /// a create that failed, or a revision not assigned within the limit, ranked last.
    pub assigned_ms: Latency,
    /// Creates that failed (any error but 409: the name already taken counts as created).
    pub failed: u64,
    /// Created but not assigned within the limit.
    pub unassigned: usize,
    /// From the first create to the last assignment seen (or the limit).
    pub took_s: f64,
    /// From each create's answer until each member node's activator held the membership
    /// ([`applied_on_nodes`]; None: not measured, no stand-ins).
    pub applied_ms: Option<Latency>,
    /// When each create was answered (by name): where the applied-on-its-node times start.
    #[serde(skip)]
    pub answered: HashMap<String, Instant>,
}

impl SteadyCreation {
    pub fn text(&self) -> String {
        let ms = crate::open_loop::whole_ms;
        let applied = self.applied_ms.map_or(String::new(), |a| {
            format!(
                "; applied on its member nodes after the create ({} memberships) p50 {} / p99 {} \
                 / max {} ms ({} never held)",
                a.count,
                ms(a.p50),
                ms(a.p99),
                ms(a.max),
                a.failed
            )
        });
        format!(
            "steady creation: {} revisions at {:.1}/s in {:.1} s; create p50 {} / p99 {} ms \
             ({} failed); assigned after its create p50 {} / p99 {} / max {} ms ({} not assigned \
             within the limit){applied}",
            self.count,
            self.rate,
            self.took_s,
            ms(self.create_ms.p50),
            ms(self.create_ms.p99),
            self.failed,
            ms(self.assigned_ms.p50),
            ms(self.assigned_ms.p99),
            ms(self.assigned_ms.max),
            self.unassigned,
        )
    }
}

/// The names of the steady phase's revisions, apart from the bulk's `rev-NNNN`.
pub fn names(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("steady-{i:05}")).collect()
}

/// Creates `names` at `rate` per second (open loop: each at its time, however the earlier
/// ones fare), then waits up to `limit` after the last for each to be seen with members.
pub async fn run(
    cluster: &SimCluster,
    namespace: &str,
    names: &[String],
    rate: f64,
    members: &MemberWatch,
    limit: Duration,
    cancel: &CancellationToken,
) -> SteadyCreation {
    let rate = rate.max(0.01);
    let api: Api<Revision> = Api::namespaced(cluster.client.clone(), namespace);
    let answered: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();
    let load = OpenLoop {
        rate,
        // One more create's interval than the count needs, so the schedule holds all of them
        // whatever the float rounding.
        duration: Duration::from_secs_f64((names.len() as f64 + 0.5) / rate),
        // A server that stops answering shows as creates never sent, not as a pile-up.
        max_in_flight: 256,
    };
    let start = Instant::now();
    let run = load
        .run_until(cancel, |i| {
            let i = i as usize;
            let api = api.clone();
            let answered = answered.clone();
            let rev = names
                .get(i)
                .map(|n| echo_revision(n, namespace, vec![host_of(n, namespace)]));
            async move {
                let Some(rev) = rev else { return false };
                let ok = match api.create(&PostParams::default(), &rev).await {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) if s.code == 409 => true,
                    Err(e) => {
                        tracing::warn!(error = %e, "a steady create failed");
                        false
                    }
                };
                if ok {
                    answered
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(i, Instant::now());
                }
                ok
            }
        })
        .await;
    let answered = answered.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let created: Vec<&String> = (0..names.len())
        .filter(|i| answered.contains_key(i))
        .filter_map(|i| names.get(i))
        .collect();
    members
        .wait(limit, |m| {
            created
                .iter()
                .all(|n| m.get(n.as_str()).is_some_and(|s| !s.is_empty()))
        })
        .await;
    let mut waits = Vec::new();
    let mut unassigned = 0;
    let mut last = start;
    for (i, name) in names.iter().enumerate() {
        match (answered.get(&i), members.first_assigned(name)) {
            (Some(a), Some(f)) => {
                last = last.max(f);
                waits.push((f.saturating_duration_since(*a), true));
            }
            (Some(_), None) => {
                unassigned += 1;
                waits.push((Duration::ZERO, false));
            }
            (None, _) => waits.push((Duration::ZERO, false)),
        }
    }
    let assigned_ms = Latency::of_fates(waits.into_iter().map(|(d, ok)| {
        let fate = if ok {
            crate::open_loop::Fate::Answered
        } else {
            crate::open_loop::Fate::Failed
        };
        (d, fate)
    }));
    let took = if unassigned > 0 {
        start.elapsed()
    } else {
        last.saturating_duration_since(start)
    };
    SteadyCreation {
        rate,
        count: names.len(),
        create_ms: run.latency(),
        assigned_ms,
        failed: run.errors(),
        unassigned,
        took_s: took.as_secs_f64(),
        applied_ms: None,
        answered: answered
            .into_iter()
            .filter_map(|(i, t)| Some((names.get(i)?.clone(), t)))
            .collect(),
    }
}

/// From each create's answer until every member node's activator (a stand-in) held the
/// membership: a change applied on its node, the stream's or watch's delay included with the
/// subsetter's. Members with no stand-in (a real activator, the separate process) are left
/// out; a membership a stand-in does not hold within `limit` ranks last, as failed. (Held
/// times are stamped as each stand-in's events arrive; the wait only decides when to stop.)
pub async fn applied_on_nodes(
    s: &SteadyCreation,
    namespace: &str,
    members: &MemberWatch,
    stand_ins: &[(String, activator::WatchOnly)],
    limit: Duration,
) -> Latency {
    let by_node: HashMap<&str, &activator::WatchOnly> =
        stand_ins.iter().map(|(n, w)| (n.as_str(), w)).collect();
    let now = members.members();
    let due: Vec<(&Instant, &activator::WatchOnly, &String)> = s
        .answered
        .iter()
        .flat_map(|(name, answered)| {
            now.get(name)
                .into_iter()
                .flatten()
                .filter_map(|node| by_node.get(node.as_str()))
                .map(move |w| (answered, *w, name))
        })
        .collect();
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline
        && due
            .iter()
            .any(|(_, w, name)| w.joined_at(namespace, name).is_none())
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Latency::of_fates(
        due.iter()
            .map(|(answered, w, name)| match w.joined_at(namespace, name) {
                Some(t) => (
                    t.saturating_duration_since(**answered),
                    crate::open_loop::Fate::Answered,
                ),
                None => (Duration::ZERO, crate::open_loop::Fate::Failed),
            }),
    )
}
