//! The closed-loop load: its phases, the answers it records, what the controller waits on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch as signal;
use tokio_util::sync::CancellationToken;

use crate::driver::{Driver, Sample};

/// The phases, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Before,
    Deploy,
    Split,
    Rollback,
    After,
}

pub const PHASES: [Phase; 5] = [
    Phase::Before,
    Phase::Deploy,
    Phase::Split,
    Phase::Rollback,
    Phase::After,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::Deploy => "deploy",
            Phase::Split => "split",
            Phase::Rollback => "rollback",
            Phase::After => "after",
        }
    }
}

/// The revision of an app pod, from its name (`<revision>-<16 hex digits>-<ordinal>`,
/// `crds::contract::pod_name`).
pub fn revision_of_pod(pod: &str) -> Option<&str> {
    let mut parts = pod.rsplitn(3, '-');
    let (ordinal, hash, revision) = (parts.next()?, parts.next()?, parts.next()?);
    let ordinal_ok = !ordinal.is_empty() && ordinal.bytes().all(|b| b.is_ascii_digit());
    let hash_ok = hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    (ordinal_ok && hash_ok && !revision.is_empty()).then_some(revision)
}

/// One request of the load: its phase (at its send), its outcome, the revision that answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub phase: Phase,
    pub sample: Sample,
    /// From the answering pod's name; none for a failure or an answer naming no known pod.
    pub revision: Option<String>,
}

impl Answer {
    pub(super) fn done(&self) -> Instant {
        self.sample.sent + self.sample.latency
    }

    pub(super) fn by(&self, revision: &str) -> bool {
        self.sample.ok() && self.revision.as_deref() == Some(revision)
    }
}

/// What the phase controller waits on: answers since a mark, per entry.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Requests sent before it are not counted.
    mark: Option<Instant>,
    /// The revision awaited.
    target: String,
    entries: BTreeMap<String, Track>,
    /// Requests sent since the mark, failed ones included.
    pub(super) since_mark: usize,
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Track {
    /// Answers from the target.
    pub(super) seen: usize,
    /// Answers from the target since the last answer from another revision.
    pub(super) in_a_row: usize,
}

impl Progress {
    fn aim(&mut self, target: &str, mark: Instant) {
        *self = Progress {
            mark: Some(mark),
            target: target.to_string(),
            ..Progress::default()
        };
    }

    fn record(&mut self, a: &Answer) {
        if self.mark.is_none_or(|m| a.sample.sent < m) {
            return;
        }
        self.since_mark += 1;
        let t = self.entries.entry(a.sample.entry.clone()).or_default();
        match &a.revision {
            Some(r) if a.sample.ok() && *r == self.target => {
                t.seen += 1;
                t.in_a_row += 1;
            }
            Some(_) if a.sample.ok() => t.in_a_row = 0,
            _ => {}
        }
    }

    pub(super) fn every(
        &self,
        entries: &[(String, SocketAddr)],
        f: impl Fn(&Track) -> bool,
    ) -> bool {
        entries
            .iter()
            .all(|(n, _)| self.entries.get(n).is_some_and(&f))
    }
}

/// The closed-loop load's shared state.
pub(super) struct Load {
    pub(super) answers: Mutex<Vec<Answer>>,
    phase: AtomicUsize,
    progress: signal::Sender<Progress>,
    next_entry: AtomicUsize,
}

impl Load {
    pub(super) fn new() -> Self {
        Self {
            answers: Mutex::new(Vec::new()),
            phase: AtomicUsize::new(0),
            progress: signal::Sender::new(Progress::default()),
            next_entry: AtomicUsize::new(0),
        }
    }

    fn enter(&self, phase: Phase) {
        let i = PHASES.iter().position(|p| *p == phase).unwrap_or(0);
        self.phase.store(i, Ordering::Relaxed);
    }

    pub(super) fn aim(&self, target: &str, mark: Instant) {
        self.progress.send_modify(|p| p.aim(target, mark));
    }

    /// Waits until `pred` holds, at most `limit`; false on timeout or Ctrl-C.
    pub(super) async fn until(
        &self,
        cancel: &CancellationToken,
        limit: Duration,
        pred: impl Fn(&Progress) -> bool,
    ) -> bool {
        let mut rx = self.progress.subscribe();
        tokio::select! {
            r = tokio::time::timeout(limit, rx.wait_for(|p| pred(p))) => matches!(r, Ok(Ok(_))),
            _ = cancel.cancelled() => false,
        }
    }

    /// One client: a request at a time, each to the next activator, until `stop`.
    pub(super) async fn client(
        &self,
        driver: Driver,
        entries: &[(String, SocketAddr)],
        host: &str,
        path: &str,
        stop: &CancellationToken,
    ) {
        while !stop.is_cancelled() {
            let (node, addr) =
                &entries[self.next_entry.fetch_add(1, Ordering::Relaxed) % entries.len()];
            let phase = PHASES[self.phase.load(Ordering::Relaxed)];
            let sample = driver.get((node.as_str(), *addr), host, host, path).await;
            let revision = sample
                .pod
                .as_deref()
                .filter(|_| sample.ok())
                .and_then(revision_of_pod)
                .map(str::to_string);
            let a = Answer {
                phase,
                sample,
                revision,
            };
            self.progress.send_modify(|p| p.record(&a));
            self.answers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(a);
        }
    }
}

/// What the controller did, and when.
#[derive(Debug, Default)]
pub(super) struct Marks {
    /// When each phase began.
    pub(super) phases: BTreeMap<usize, Instant>,
    pub(super) deploy_action: Option<Instant>,
    pub(super) split_action: Option<Instant>,
    /// The Route's create answered.
    pub(super) split_decision: Option<Instant>,
    /// Every activator had answered from v1 under the split (or the bound passed): the
    /// measured window starts.
    pub(super) split_settled: Option<Instant>,
    pub(super) split_followed_everywhere: bool,
    pub(super) rollback_action: Option<Instant>,
    /// The Route's patch answered.
    pub(super) rollback_decision: Option<Instant>,
    pub(super) end: Option<Instant>,
}

impl Marks {
    pub(super) fn start(&mut self, load: &Load, phase: Phase) -> Instant {
        load.enter(phase);
        let now = Instant::now();
        let i = PHASES.iter().position(|p| *p == phase).unwrap_or(0);
        self.phases.insert(i, now);
        now
    }

    pub(super) fn phase_window(&self, phase: Phase) -> Option<(Instant, Instant)> {
        let i = PHASES.iter().position(|p| *p == phase)?;
        let from = *self.phases.get(&i)?;
        let to = self.phases.get(&(i + 1)).copied().or(self.end)?;
        Some((from, to))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::answer;
    use super::*;

    #[test]
    fn the_revision_is_read_from_the_pod_name_and_nothing_else_passes() {
        let pod = crds::contract::pod_name("my-app-v2", "node-7", 3);
        assert_eq!(revision_of_pod(&pod), Some("my-app-v2"));
        for not in [
            "v1",
            "v1-abc-0",
            "v1-0123456789abcdef-",
            "-0123456789abcdef-1",
        ] {
            assert_eq!(revision_of_pod(not), None, "{not}");
        }
        assert_eq!(revision_of_pod("v1-0123456789abcdeg-1"), None, "not hex");
    }
    #[test]
    fn progress_counts_from_the_mark_and_resets_a_run_on_the_other_revision() {
        let t0 = Instant::now();
        let mut p = Progress::default();
        p.aim("v1", t0 + Duration::from_millis(10));
        p.record(&answer("a", t0, 5, Some("v1")));
        assert_eq!(p.since_mark, 0, "sent before the mark");
        for (ms, rev) in [
            (11, Some("v1")),
            (12, Some("v1")),
            (13, None),
            (14, Some("v2")),
            (15, Some("v1")),
        ] {
            p.record(&answer("a", t0, ms, rev));
        }
        let t = p.entries["a"];
        assert_eq!((p.since_mark, t.seen, t.in_a_row), (5, 3, 1));
    }
}
