//! One retry policy for every watch of the activator and the subsetter (and the subsetter's
//! Lease), so that all of them come back within about a second of the API server answering
//! again, whatever the outage's length (docs/architecture.md, "The scale it must hold": "when it returns, every watch resumes in
//! seconds").
//!
//! kube-runtime's `default_backoff()` grows to 30 s (client-go's reflector policy, meant to
//! spare a struggling API server): after a long outage a watch may sleep up to 30 s past the
//! API server's return, and a `410 Gone` for the old resourceVersion then costs another sleep
//! before the re-list. Measured on a real cluster: about 90 s of broken cold starts.
//!
//! [`WatchBackoff`] is bounded at [`CAP`] and jittered; [`resilient`] applies it to a watch
//! stream and re-lists at once after a `410`. What it costs while the API server is down, at
//! the cap, is one attempt per 0.75 s on average per watch (see docs/operations.md for the
//! cluster-wide figure and why the cap is where it is).

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

/// The first retry's bound.
pub const FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two attempts: a watch resumes at most this long (plus one
/// request) after the API server answers again.
pub const CAP: Duration = Duration::from_secs(1);

/// A doubling back-off from [`FIRST`] to [`CAP`], each wait drawn uniformly from the upper
/// half of the current bound ("equal jitter"): retries of thousands of processes that lost
/// the API server at the same instant spread out within a few rounds instead of arriving
/// together, and no wait is near zero, so at the cap a watch tries at most once per
/// `CAP / 2` (on average once per `3 CAP / 4`).
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    first: Duration,
    cap: Duration,
    bound: Duration,
}

impl WatchBackoff {
    pub fn new(first: Duration, cap: Duration) -> Self {
        let first = first.min(cap);
        Self {
            first,
            cap,
            bound: first,
        }
    }

    /// The next wait, and the bound grows for the one after.
    pub fn next_wait(&mut self) -> Duration {
        let hi = self.bound;
        self.bound = (self.bound * 2).min(self.cap);
        let lo = hi / 2;
        let span = (hi - lo).as_nanos() as u64;
        lo + Duration::from_nanos(if span == 0 {
            0
        } else {
            rand::random_range(0..=span)
        })
    }

    /// Back to the first, short wait (the API server answered).
    pub fn reset_wait(&mut self) {
        self.bound = self.first;
    }
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self::new(FIRST, CAP)
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_wait())
    }
}

/// For kube-runtime's `WatchStreamExt::backoff`, where a stream needs no 410 handling.
impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.reset_wait();
    }
}

/// `events` (a kube-runtime watcher) retried with [`WatchBackoff`]: after an error the next
/// poll waits, except after a `410 Gone` in the watch stream, where the watcher has already
/// dropped its resourceVersion and its next step is a re-list: that one goes at once (an API
/// server that has just restarted answers 410 to every resumed watch, and the re-list is
/// the only way back). At most one 410 per [`CAP`] skips the wait, so a server answering 410
/// to every watch gets the ordinary back-off, not a list-watch loop.
///
/// The wait is reset by an event of the watch itself (an object added, changed or deleted),
/// not by the pieces of a re-list: a server that lists but then fails every watch keeps
/// being backed off. Errors are passed on for the caller to log.
pub fn resilient<K, S>(events: S) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    resilient_with(events, WatchBackoff::default())
}

/// [`resilient`] with a back-off of its own (tests shorten it).
pub fn resilient_with<K, S>(
    events: S,
    backoff: WatchBackoff,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let state = Retry {
        events: Box::pin(events),
        backoff,
        wait: None,
        free_relist_at: None,
    };
    futures::stream::unfold(state, |mut st| async move {
        if let Some(d) = st.wait.take() {
            tokio::time::sleep(d).await;
        }
        let item = st.events.next().await?;
        match &item {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => st.backoff.reset_wait(),
            Ok(_) => {}
            Err(e)
                if is_gone(e)
                    && st
                        .free_relist_at
                        .is_none_or(|t| t.elapsed() >= st.backoff.cap) =>
            {
                st.free_relist_at = Some(tokio::time::Instant::now());
                tracing::debug!(error = %e, "watch expired; re-listing at once");
            }
            Err(_) => st.wait = Some(st.backoff.next_wait()),
        }
        Some((item, st))
    })
}

struct Retry<S> {
    events: std::pin::Pin<Box<S>>,
    backoff: WatchBackoff,
    wait: Option<Duration>,
    /// When a 410 last re-listed without waiting.
    free_relist_at: Option<tokio::time::Instant>,
}

/// A `410 Gone` inside the watch stream: the watcher starts over with a re-list. (A 410 in
/// answer to the watch request itself leaves kube-runtime's watcher retrying the same
/// resourceVersion, so that one waits like any error.)
pub fn is_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(s) if s.code == 410)
}

/// The API server gave no answer at all: the connection was refused, reset or timed out, or
/// the request outlived its bound. Unlike an answer (a 4xx or 5xx status), this says nothing
/// about the request, only that the control plane cannot be reached now.
pub fn unanswered(e: &kube::Error) -> bool {
    matches!(
        e,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_the_first_to_the_cap_within_their_upper_half() {
        let mut b = WatchBackoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let bounds = [100, 200, 400, 800, 1000, 1000, 1000];
        for hi in bounds {
            let hi = Duration::from_millis(hi);
            let w = b.next_wait();
            assert!(
                w >= hi / 2 && w <= hi,
                "{w:?} outside [{:?}, {hi:?}]",
                hi / 2
            );
        }
        b.reset_wait();
        assert!(b.next_wait() <= Duration::from_millis(100));
    }

    #[test]
    fn a_first_wait_above_the_cap_is_the_cap() {
        let mut b = WatchBackoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert!(b.next_wait() <= Duration::from_secs(1));
    }

    #[test]
    fn the_waits_are_not_all_the_same() {
        let mut b = WatchBackoff::default();
        let waits: std::collections::BTreeSet<Duration> = (0..20)
            .map(|_| {
                b.reset_wait();
                b.next_wait()
            })
            .collect();
        assert!(waits.len() > 1, "no jitter: {waits:?}");
    }

    type Item = Result<watcher::Event<()>, watcher::Error>;

    fn gone() -> Item {
        let s = kube::core::Status::failure("too old resource version", "Expired").with_code(410);
        Err(watcher::Error::WatchError(s.boxed()))
    }

    fn refused() -> Item {
        Err(watcher::Error::WatchStartFailed(kube::Error::Service(
            "client error (Connect)".into(),
        )))
    }

    /// The (virtual) time each item of `items` comes out of [`resilient`] at.
    async fn arrivals(items: Vec<Item>) -> Vec<Duration> {
        let start = tokio::time::Instant::now();
        resilient(futures::stream::iter(items))
            .map(|_| start.elapsed())
            .collect()
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_waits_and_a_410_relists_at_once() {
        let t = arrivals(vec![
            refused(),
            Ok(watcher::Event::Init),
            gone(),
            Ok(watcher::Event::Init),
        ])
        .await;
        // The refused attempt is followed by a wait before the next poll...
        assert!(t[1] >= FIRST / 2, "no wait after an error: {t:?}");
        // ...the 410 by none: the re-list goes at once.
        assert_eq!(t[3], t[2], "waited before the re-list: {t:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_410_in_a_row_waits() {
        let t = arrivals(vec![
            gone(),
            Ok(watcher::Event::Init),
            gone(),
            Ok(watcher::Event::Init),
        ])
        .await;
        assert_eq!(t[1], t[0]);
        assert!(t[3] > t[2], "410 loop not backed off: {t:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn waits_never_pass_the_cap_and_an_event_resets_them() {
        let mut items: Vec<Item> = (0..12).map(|_| refused()).collect();
        items.push(Ok(watcher::Event::Apply(())));
        items.push(refused());
        items.push(Ok(watcher::Event::Init));
        let t = arrivals(items).await;
        for w in t.windows(2).take(12) {
            assert!(w[1] - w[0] <= CAP, "waited past the cap: {t:?}");
        }
        // After the Apply, the wait is back to the first one.
        let last = t[14] - t[13];
        assert!(last <= FIRST, "not reset by an event: {last:?}");
    }
}
