//! Reading ahead the Revisions of this node's subsets, so that a member's cold start reads
//! nothing — paced where they come in bulk.
//!
//! A subset that starts listing this node while the activator runs (a new revision, a
//! repair) is one membership: its Revision is read at once, as it always was. An activator's
//! first list of its memberships is all of them at once: ~300 each at 1,000 nodes ×
//! 100,000 revisions, when it restarts while the subsetter keeps its node (a restart, or a
//! DaemonSet rolling update: the subsetter holds the node for its replacement). Read at once,
//! 988 such restarts made 278,078 GETs in 284 s on the test bed's API server
//! (docs/load-testing.md, real-server run 3), which pushed the kubelets' lease renewals to
//! 36 s. So memberships found by a list (at start, or a re-list after the watch failed) are
//! read [`ReadAheadConfig::per_second`], at most [`ReadAheadConfig::in_flight`] at once: N
//! such restarts then read at most N × `per_second` a second, whatever the revisions. A
//! DaemonSet rolling update is one of them: the subsetter keeps a node's memberships while
//! its activator is replaced (`subsetter::replacements`). Nothing waits for this pace: a
//! request for a member revision not read yet
//! reads it itself (one GET from the API server's watch cache), and its queued read, when
//! its turn comes, finds it held and is dropped without spending a turn.

use std::collections::VecDeque;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

use crate::cache::revisions::{RevisionCache, SubsetOf};
use crate::node::prepull::Prepull;
use crds::ObjectKey as RevisionKey;

/// How listed memberships' Revisions are read ahead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadAheadConfig {
    /// Reads a second; 0: not read ahead at all (each is read by its first request).
    pub per_second: f64,
    /// Reads in flight at once.
    pub in_flight: usize,
}

impl Default for ReadAheadConfig {
    /// 0.2 a second: at the design target (5,000 nodes, 100,000 revisions, 3 members each:
    /// 60 memberships a node) a node's are read within 5 minutes of its start, and every
    /// activator restarting at once costs the API server at most 1,000 watch-cache reads a
    /// second.
    fn default() -> Self {
        Self {
            per_second: 0.2,
            in_flight: 2,
        }
    }
}

/// The pace of listed reads, without IO: a queue released one item per period, with at most
/// `limit` taken and not yet [`Pace::done`].
#[derive(Debug)]
pub(crate) struct Pace<T> {
    queue: VecDeque<T>,
    /// None: nothing queued is ever released.
    period: Option<Duration>,
    /// The earliest the next item may be taken.
    next_at: Option<Instant>,
    taken: usize,
    limit: usize,
}

impl<T> Pace<T> {
    pub(crate) fn new(cfg: ReadAheadConfig) -> Self {
        // NaN and ≤ 0: never; so small that the period overflows: never as well.
        let period = (cfg.per_second > 0.0)
            .then(|| Duration::try_from_secs_f64(1.0 / cfg.per_second).ok())
            .flatten();
        Self {
            queue: VecDeque::new(),
            period,
            next_at: None,
            taken: 0,
            limit: cfg.in_flight.max(1),
        }
    }

    /// Queues `item` behind the others (nothing is queued when nothing would be released).
    pub(crate) fn push(&mut self, item: T) {
        if self.period.is_some() {
            self.queue.push_back(item);
        }
    }

    /// The next item due at `now` that `wanted` keeps, its slot taken; those in front of it
    /// that `wanted` refuses are handed to `dropped` and cost no turn.
    pub(crate) fn take(
        &mut self,
        now: Instant,
        mut wanted: impl FnMut(&T) -> bool,
        mut dropped: impl FnMut(T),
    ) -> Option<T> {
        while let Some(front) = self.queue.front() {
            if wanted(front) {
                break;
            }
            dropped(self.queue.pop_front()?);
        }
        let period = self.period?;
        if self.queue.is_empty() || self.taken >= self.limit {
            return None;
        }
        let at = self.next_at.map_or(now, |t| t.max(now));
        if at > now {
            return None;
        }
        self.next_at = Some(at + period);
        self.taken += 1;
        self.queue.pop_front()
    }

    /// A taken item's read has ended: its slot is free.
    pub(crate) fn done(&mut self) {
        self.taken = self.taken.saturating_sub(1);
    }

    /// When [`Pace::take`] may next give an item: None while nothing is queued or every slot
    /// is taken (a [`Pace::done`] changes that, not time).
    pub(crate) fn wake(&self) -> Option<Instant> {
        if self.queue.is_empty() || self.taken >= self.limit || self.period.is_none() {
            return None;
        }
        Some(self.next_at.unwrap_or_else(Instant::now))
    }

    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// A read's end: which membership, and whether it held a paced slot.
type Ended = (RevisionKey, SubsetOf, bool);

/// Reads ahead the Revisions of this node's memberships, as [`ReadAhead::member`] and
/// [`ReadAhead::left`] tell of them, while its owner's loop polls [`ReadAhead::step`].
pub(crate) struct ReadAhead {
    revisions: RevisionCache,
    pace: Pace<(RevisionKey, SubsetOf)>,
    reads: JoinSet<Ended>,
    /// Told of a membership once its Revision is held (its images are then pulled ahead
    /// without a read of their own).
    prepull: Option<Prepull>,
    /// Set to the queue's length after each change (`activator_read_ahead_queued`).
    queued: Option<Gauge>,
}

impl ReadAhead {
    pub(crate) fn new(
        revisions: RevisionCache,
        cfg: ReadAheadConfig,
        prepull: Option<Prepull>,
        queued: Option<Gauge>,
    ) -> Self {
        Self {
            revisions,
            pace: Pace::new(cfg),
            reads: JoinSet::new(),
            prepull,
            queued,
        }
    }

    /// This node is a member of `key`'s subset, written for `of`; `listed`: found by the
    /// watch's list, not as a change.
    pub(crate) fn member(&mut self, key: RevisionKey, of: SubsetOf, listed: bool) {
        self.revisions.pin(&key, &of);
        if !self.revisions.wants_read(&key, &of) {
            self.held(key, of);
        } else if listed {
            self.pace.push((key, of));
            self.gauge();
        } else {
            self.start(key, of, false);
        }
    }

    /// This node left `key`'s subset: its copy ages out like any other; a queued read of it
    /// is dropped when its turn comes.
    pub(crate) fn left(&mut self, key: RevisionKey) {
        self.revisions.unpin(&key);
        if let Some(p) = &self.prepull {
            p.left(key);
        }
    }

    /// Waits for the next thing to do — a read ending, a queued read falling due — and does
    /// it; never returns while there is nothing to wait for. Cancel-safe: it may be dropped
    /// at any await (a `select!` branch).
    pub(crate) async fn step(&mut self) {
        let wake = self.pace.wake();
        tokio::select! {
            Some(ended) = self.reads.join_next(), if !self.reads.is_empty() => {
                if let Ok((key, of, paced)) = ended {
                    if paced {
                        self.pace.done();
                    }
                    if self.revisions.is_pinned(&key) {
                        self.held(key, of);
                    }
                }
            }
            _ = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            else => std::future::pending::<()>().await,
        }
        self.start_due(Instant::now());
    }

    /// Starts the queued reads due at `now`.
    fn start_due(&mut self, now: Instant) {
        let revisions = self.revisions.clone();
        let mut skipped = Vec::new();
        while let Some((key, of)) = self.pace.take(
            now,
            |(k, of)| revisions.wants_read(k, of),
            |item| skipped.push(item),
        ) {
            self.start(key, of, true);
        }
        // Read meanwhile by a request (or by a change's read): held, so nothing to read.
        for (key, of) in skipped {
            if revisions.is_pinned(&key) {
                self.held(key, of);
            }
        }
        self.gauge();
    }

    fn gauge(&self) {
        if let Some(g) = &self.queued {
            g.set(i64::try_from(self.pace.queued()).unwrap_or(i64::MAX));
        }
    }

    fn start(&mut self, key: RevisionKey, of: SubsetOf, paced: bool) {
        let revisions = self.revisions.clone();
        self.reads.spawn(async move {
            revisions.read_ahead(&key, &of).await;
            (key, of, paced)
        });
    }

    /// `key`'s Revision is held (or its read ended): what else follows a membership.
    fn held(&self, key: RevisionKey, of: SubsetOf) {
        if let Some(p) = &self.prepull {
            p.member(key, of);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(per_second: f64, in_flight: usize) -> Pace<u32> {
        Pace::new(ReadAheadConfig {
            per_second,
            in_flight,
        })
    }

    fn take(p: &mut Pace<u32>, now: Instant) -> Option<u32> {
        p.take(now, |_| true, |_| unreachable!("nothing is refused"))
    }

    #[test]
    fn one_item_is_released_per_period_the_first_at_once() {
        let t0 = Instant::now();
        let mut p = pace(2.0, 10);
        for i in 0..4 {
            p.push(i);
        }
        assert_eq!(take(&mut p, t0), Some(0));
        assert_eq!(take(&mut p, t0), None, "the next is due 500 ms later");
        assert_eq!(p.wake(), Some(t0 + Duration::from_millis(500)));
        assert_eq!(take(&mut p, t0 + Duration::from_millis(499)), None);
        assert_eq!(take(&mut p, t0 + Duration::from_millis(500)), Some(1));
        // Idle time earns no burst: after a long pause, one, then the period again.
        let late = t0 + Duration::from_secs(60);
        assert_eq!(take(&mut p, late), Some(2));
        assert_eq!(take(&mut p, late), None);
        assert_eq!(take(&mut p, late + Duration::from_millis(500)), Some(3));
        assert_eq!(p.queued(), 0);
        assert_eq!(p.wake(), None, "nothing queued, nothing to wake for");
    }

    #[test]
    fn no_more_than_the_limit_are_taken_until_one_is_done() {
        let t0 = Instant::now();
        let mut p = pace(1000.0, 2);
        for i in 0..5 {
            p.push(i);
        }
        let later = t0 + Duration::from_secs(1);
        assert_eq!(take(&mut p, t0), Some(0));
        assert_eq!(take(&mut p, later), Some(1));
        assert_eq!(
            take(&mut p, later + Duration::from_secs(1)),
            None,
            "two taken"
        );
        assert_eq!(p.wake(), None, "only a read ending frees a slot");
        p.done();
        assert!(p.wake().is_some());
        assert_eq!(take(&mut p, later + Duration::from_secs(1)), Some(2));
    }

    #[test]
    fn items_no_longer_wanted_are_dropped_without_spending_a_turn() {
        let t0 = Instant::now();
        let mut p = pace(1.0, 10);
        for i in 0..5 {
            p.push(i);
        }
        let mut dropped = Vec::new();
        let got = p.take(t0, |i| *i >= 2, |i| dropped.push(i));
        assert_eq!(got, Some(2));
        assert_eq!(dropped, vec![0, 1]);
        // Refused items behind the front wait their turn; at it, they go without one.
        let got = p.take(t0, |i| *i != 3, |i| dropped.push(i));
        assert_eq!(got, None, "4 is not due yet");
        assert_eq!(dropped, vec![0, 1, 3]);
        assert_eq!(take(&mut p, t0 + Duration::from_secs(1)), Some(4));
    }

    #[test]
    fn a_pace_of_zero_reads_nothing_ahead() {
        let t0 = Instant::now();
        for rate in [0.0, -1.0, f64::NAN, 1e-320] {
            let mut p = pace(rate, 2);
            p.push(1);
            assert_eq!(p.queued(), 0, "{rate}");
            assert_eq!(take(&mut p, t0), None);
            assert_eq!(p.wake(), None);
        }
        // Unbounded: only the slots limit it.
        let mut p = pace(f64::INFINITY, 2);
        p.push(1);
        p.push(2);
        p.push(3);
        assert_eq!(take(&mut p, t0), Some(1));
        assert_eq!(take(&mut p, t0), Some(2));
        assert_eq!(take(&mut p, t0), None);
    }
}
