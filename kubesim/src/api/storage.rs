//! The storage model: what a real API server's etcd adds to a request.
//!
//! A real API server answers a watch, and a GET or LIST that names a `resourceVersion`, from
//! its watch cache in memory. Every write is an etcd commit, and a GET or LIST without a
//! `resourceVersion` is a quorum read that etcd answers in order with the commits.
//!
//! etcd does not commit writes one by one: the raft loop takes every proposal that arrived
//! while the previous batch was being written and commits them together, one WAL fsync for
//! all. So a lone write costs one commit (the latency calibration, docs/kubesim.md), while
//! many concurrent writes share commits (the throughput calibration). The model: requests
//! wait in arrival order; each of the storage's lanes takes the next batch (up to `batch`
//! waiting requests, all those that arrived meanwhile) and holds it for one sampled commit,
//! longer by `write_cost` for each write past the first (the server's own work per write,
//! which batching does not share). Reads from the cache never wait.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::delay::Delay;

/// What one request asks of the storage and of the server itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A watch: no delay (its events are the writes').
    Watch,
    /// A GET or LIST with a `resourceVersion` (e.g. `0`): the watch cache.
    CachedRead,
    /// A GET or LIST without one: etcd, in line with the writes.
    QuorumRead,
    /// create, update, patch, delete: an etcd commit.
    Write,
}

impl Access {
    /// How a request of `verb` with `resourceVersion` = `rv` (empty when absent) is served.
    pub fn of(verb: &str, rv: &str) -> Self {
        match verb {
            "watch" => Access::Watch,
            "get" | "list" if rv.is_empty() => Access::QuorumRead,
            "get" | "list" => Access::CachedRead,
            _ => Access::Write,
        }
    }
}

/// The storage's shape: how many commits run at once and how many requests one commit takes.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageShape {
    /// Commits in flight at once; `None`: unbounded, each access waits only its own time (no
    /// queueing, no batching).
    pub lanes: Option<usize>,
    /// Requests (writes and quorum reads) one commit takes at most; 1: one by one.
    pub batch: usize,
    /// Time each write adds to its commit past the first one's.
    pub write_cost: Delay,
}

impl Default for StorageShape {
    fn default() -> Self {
        Self {
            lanes: None,
            batch: 1,
            write_cost: Delay::ZERO,
        }
    }
}

/// The requests waiting for the storage and the lanes committing: pure bookkeeping, no time,
/// so that what joins which commit is testable by counts.
#[derive(Debug)]
struct Line<T> {
    waiting: VecDeque<(Access, T)>,
    /// Lanes with a committer running.
    busy: usize,
    lanes: usize,
    batch: usize,
}

impl<T> Line<T> {
    fn new(lanes: usize, batch: usize) -> Self {
        Self {
            waiting: VecDeque::new(),
            busy: 0,
            lanes: lanes.max(1),
            batch: batch.max(1),
        }
    }

    /// Queues a request; true when a lane was free and a committer must start for it.
    fn push(&mut self, access: Access, waiter: T) -> bool {
        self.waiting.push_back((access, waiter));
        if self.busy < self.lanes {
            self.busy += 1;
            true
        } else {
            false
        }
    }

    /// The next commit of a lane whose previous one ended (or that just started): up to
    /// `batch` requests, in arrival order. None frees the lane: nothing is waiting.
    fn next_batch(&mut self) -> Option<Vec<(Access, T)>> {
        if self.waiting.is_empty() {
            self.busy = self.busy.saturating_sub(1);
            return None;
        }
        let n = self.waiting.len().min(self.batch);
        Some(self.waiting.drain(..n).collect())
    }
}

/// How long one commit of `writes` writes and `reads` quorum reads holds its lane, given a
/// sampled write commit, quorum read and per-write cost: one commit for all (a write's, if
/// any), plus the cost of each write past the first.
fn commit_time(
    writes: usize,
    reads: usize,
    write: Duration,
    read: Duration,
    cost: Duration,
) -> Duration {
    match (writes, reads) {
        (0, 0) => Duration::ZERO,
        (0, _) => read,
        (w, _) => write + cost.saturating_mul(u32::try_from(w - 1).unwrap_or(u32::MAX)),
    }
}

struct Shared {
    write: Mutex<Delay>,
    quorum_read: Mutex<Delay>,
    write_cost: Delay,
    /// `None`: unbounded (each access sleeps its own time).
    line: Option<Mutex<Line<oneshot::Sender<()>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn sample(&self, access: Access) -> Duration {
        match access {
            Access::Write => lock(&self.write).sample_now(),
            Access::QuorumRead => lock(&self.quorum_read).sample_now(),
            Access::Watch | Access::CachedRead => Duration::ZERO,
        }
    }

    /// A lane's committer: commits batch after batch until nothing waits. It runs as a task
    /// of its own so that a request given up by its client (its handler dropped) cannot leave
    /// the requests batched with it waiting forever.
    async fn commit_loop(self: Arc<Self>) {
        let Some(line) = &self.line else { return };
        loop {
            let Some(batch) = lock(line).next_batch() else {
                return;
            };
            let writes = batch.iter().filter(|(a, _)| *a == Access::Write).count();
            let held = commit_time(
                writes,
                batch.len() - writes,
                if writes > 0 {
                    self.sample(Access::Write)
                } else {
                    Duration::ZERO
                },
                if writes == 0 {
                    self.sample(Access::QuorumRead)
                } else {
                    Duration::ZERO
                },
                if writes > 1 {
                    self.write_cost.sample_now()
                } else {
                    Duration::ZERO
                },
            );
            sleep_unless_zero(held).await;
            for (_, done) in batch {
                // The request may have been given up meanwhile: nobody to tell.
                let _ = done.send(());
            }
        }
    }
}

/// The storage's lanes and the time each kind of access holds one.
pub(crate) struct Storage {
    shared: Arc<Shared>,
}

impl Storage {
    pub fn new(shape: StorageShape, write: Delay, quorum_read: Delay) -> Self {
        Self {
            shared: Arc::new(Shared {
                write: Mutex::new(write),
                quorum_read: Mutex::new(quorum_read),
                write_cost: shape.write_cost,
                line: shape.lanes.map(|n| Mutex::new(Line::new(n, shape.batch))),
            }),
        }
    }

    /// Changes the write commit's latency from the next commit on.
    pub fn set_write(&self, d: Delay) {
        *lock(&self.shared.write) = d;
    }

    /// Waits in arrival order for a commit of a lane and until that commit ends.
    pub async fn serve(&self, access: Access) {
        if matches!(access, Access::Watch | Access::CachedRead) {
            return;
        }
        let Some(line) = &self.shared.line else {
            // Unbounded: each waits only its own time.
            sleep_unless_zero(self.shared.sample(access)).await;
            return;
        };
        let (done, committed) = oneshot::channel();
        let start = lock(line).push(access, done);
        if start {
            tokio::spawn(self.shared.clone().commit_loop());
        }
        // The committer always answers: a closed channel cannot happen while it runs.
        let _ = committed.await;
    }
}

async fn sleep_unless_zero(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_naming_a_resource_version_come_from_the_cache() {
        assert_eq!(Access::of("get", ""), Access::QuorumRead);
        assert_eq!(Access::of("list", ""), Access::QuorumRead);
        assert_eq!(Access::of("get", "0"), Access::CachedRead);
        assert_eq!(Access::of("list", "12345"), Access::CachedRead);
        assert_eq!(Access::of("watch", ""), Access::Watch);
        for w in ["create", "update", "patch", "delete", "deletecollection"] {
            assert_eq!(Access::of(w, ""), Access::Write);
        }
    }

    #[test]
    fn requests_arriving_during_a_commit_join_the_next_one_up_to_the_batch() {
        let mut line = Line::new(1, 3);
        assert!(line.push(Access::Write, 0), "a free lane starts a commit");
        let first = line.next_batch().unwrap();
        assert_eq!(first.len(), 1, "a lone write is committed alone");
        // Five arrive while it commits: the lane is busy, none starts a committer.
        for i in 1..=5 {
            assert!(!line.push(Access::Write, i));
        }
        let ids = |b: Vec<(Access, i32)>| b.into_iter().map(|(_, i)| i).collect::<Vec<_>>();
        assert_eq!(ids(line.next_batch().unwrap()), [1, 2, 3], "arrival order");
        assert_eq!(ids(line.next_batch().unwrap()), [4, 5]);
        assert!(
            line.next_batch().is_none(),
            "nothing waits: the lane is free"
        );
        assert!(
            line.push(Access::QuorumRead, 6),
            "and the next request starts one"
        );
    }

    #[test]
    fn each_lane_runs_its_own_commits() {
        let mut line = Line::new(2, 1);
        assert!(line.push(Access::Write, 0));
        assert!(line.push(Access::Write, 1));
        assert!(!line.push(Access::Write, 2), "both lanes busy");
        assert_eq!(line.next_batch().map(|b| b.len()), Some(1));
        assert_eq!(line.next_batch().map(|b| b.len()), Some(1));
        assert_eq!(line.next_batch().map(|b| b.len()), Some(1));
        assert!(line.next_batch().is_none());
        assert!(line.next_batch().is_none());
        assert!(line.push(Access::Write, 3));
        assert!(line.push(Access::Write, 4));
        assert!(!line.push(Access::Write, 5));
    }

    #[test]
    fn a_commit_costs_one_write_plus_the_cost_of_each_further_write() {
        let (w, r, c) = (
            Duration::from_millis(6),
            Duration::from_millis(1),
            Duration::from_micros(500),
        );
        assert_eq!(
            commit_time(1, 0, w, r, c),
            w,
            "a lone write: the latency calibration"
        );
        assert_eq!(commit_time(1, 3, w, r, c), w, "reads ride along");
        assert_eq!(commit_time(0, 3, w, r, c), r, "reads alone: one read");
        assert_eq!(commit_time(5, 0, w, r, c), Duration::from_millis(8));
        assert_eq!(commit_time(0, 0, w, r, c), Duration::ZERO);
    }

    fn storage(lanes: Option<usize>, batch: usize, cost_us: u64) -> Arc<Storage> {
        Arc::new(Storage::new(
            StorageShape {
                lanes,
                batch,
                write_cost: Delay::Fixed(Duration::from_micros(cost_us)),
            },
            Delay::fixed_ms(10),
            Delay::fixed_ms(1),
        ))
    }

    /// Serves `n` writes queued at once (on tokio's paused clock); when each was answered.
    async fn writes_at_once(s: &Arc<Storage>, n: usize) -> Vec<Duration> {
        let t0 = tokio::time::Instant::now();
        let all: Vec<_> = (0..n)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move {
                    s.serve(Access::Write).await;
                    t0.elapsed()
                })
            })
            .collect();
        let mut done = Vec::new();
        for w in all {
            done.push(w.await.unwrap());
        }
        done
    }

    #[tokio::test(start_paused = true)]
    async fn one_lane_one_by_one_serves_in_arrival_order_and_a_read_waits_behind_writes() {
        let s = storage(Some(1), 1, 0);
        let t0 = tokio::time::Instant::now();
        let writes: Vec<_> = (0..5)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { s.serve(Access::Write).await })
            })
            .collect();
        // Let the writes queue first.
        tokio::task::yield_now().await;
        let ((), cached) = tokio::join!(s.serve(Access::QuorumRead), async {
            s.serve(Access::CachedRead).await;
            t0.elapsed()
        });
        let read_done = t0.elapsed();
        for w in writes {
            w.await.unwrap();
        }
        assert_eq!(cached, Duration::ZERO, "the cache does not wait for etcd");
        assert_eq!(
            read_done,
            Duration::from_millis(51),
            "5 writes of 10 ms, then 1 ms"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn writes_queued_together_share_commits() {
        // All 10 are queued before the committer runs: batches of 4, 4, 2, each one commit
        // of 10 ms plus 1 ms per write past the first.
        let done = writes_at_once(&storage(Some(1), 4, 1000), 10).await;
        let ms = |v: u64| Duration::from_millis(v);
        assert_eq!(done[..4], [ms(13); 4]);
        assert_eq!(done[4..8], [ms(26); 4]);
        assert_eq!(done[8..], [ms(37); 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_write_takes_one_commit() {
        for batch in [1, 64] {
            let done = writes_at_once(&storage(Some(2), batch, 1000), 1).await;
            assert_eq!(done, [Duration::from_millis(10)], "batch {batch}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_lanes_nothing_waits_for_another() {
        let done = writes_at_once(&storage(None, 64, 1000), 5).await;
        assert_eq!(done, [Duration::from_millis(10); 5]);
    }
}
