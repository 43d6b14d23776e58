//! A directory replica killed under load (`scale --directory-replicas 2`): the activators
//! that streamed their memberships from it must open a stream on another replica, from
//! their versions, without the API server (docs/member-stream.md).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::SimCluster;
use crate::open_loop::{Fate, Latency};

/// What killing one replica did to the stand-ins streaming from it.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaKill {
    /// Stand-ins streaming from the killed replica at the kill.
    pub streaming: usize,
    /// From the kill until each of them had opened its next stream; one that had not within
    /// the limit ranks last, as failed.
    pub resumed_ms: Latency,
    /// Stand-ins (all of them) whose API server watch took over meanwhile.
    pub fallbacks: u64,
}

impl ReplicaKill {
    pub fn text(&self) -> String {
        let ms = crate::open_loop::whole_ms;
        format!(
            "a directory replica killed halfway through the creation: {} activators streamed \
             from it; each on another stream after p50 {} / p99 {} / max {} ms ({} not within \
             the limit); {} fell back to the API server's watch",
            self.streaming,
            ms(self.resumed_ms.p50),
            ms(self.resumed_ms.p99),
            ms(self.resumed_ms.max),
            self.resumed_ms.failed,
            self.fallbacks,
        )
    }
}

/// Kills one replica beside the subsetter's own and times the stand-ins that streamed from it
/// to their next stream (looked at every 20 ms: the figure is that coarse). None when the
/// cluster has no such replica.
pub async fn run(
    cluster: &SimCluster,
    stand_ins: &[(String, activator::WatchOnly)],
    limit: Duration,
) -> Option<ReplicaKill> {
    let before: Vec<(u64, u64)> = stand_ins
        .iter()
        .map(|(_, w)| (w.streams_opened(), w.member_fallbacks()))
        .collect();
    let t = Instant::now();
    let streaming: HashSet<String> = cluster.kill_directory_replica()?.into_iter().collect();
    let moved: Vec<usize> = stand_ins
        .iter()
        .enumerate()
        .filter(|(_, (n, _))| streaming.contains(&crds::contract::member_label(n)))
        .map(|(i, _)| i)
        .collect();
    let mut resumed: Vec<Option<Duration>> = vec![None; moved.len()];
    while t.elapsed() < limit {
        for (slot, &i) in resumed.iter_mut().zip(&moved) {
            if slot.is_none() && stand_ins[i].1.streams_opened() > before[i].0 {
                *slot = Some(t.elapsed());
            }
        }
        if resumed.iter().all(Option::is_some) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fallbacks = stand_ins
        .iter()
        .zip(&before)
        .map(|((_, w), (_, f))| w.member_fallbacks() - f)
        .sum();
    Some(ReplicaKill {
        streaming: moved.len(),
        resumed_ms: Latency::of_fates(resumed.into_iter().map(|r| match r {
            Some(d) => (d, Fate::Answered),
            None => (Duration::ZERO, Fate::Failed),
        })),
        fallbacks,
    })
}
