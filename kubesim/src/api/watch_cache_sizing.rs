//! How big kube-apiserver v1.28.7's watch cache is, and how big a watcher's buffers are:
//! pure arithmetic from `staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go`.
//!
//! - The event window (`watchCache.cache`) starts at 100 events (`defaultLowerBoundCapacity`,
//!   watch_cache.go:62), doubles when it is full and its oldest event is younger than 75 s
//!   (`eventFreshDuration`, :58), up to 102,400 (`defaultUpperBoundCapacity`, :65), and halves
//!   (not below 100) when it is full and even its newest quarter is older than 75 s
//!   (`resizeCacheLocked`, :367-385).
//! - A watcher's input and result channels hold `ceil(capacity / 75)` events, at least 10, at
//!   most 10 for a watch that uses the resource's indexed trigger (pods by `spec.nodeName`),
//!   1000 for other watches of an indexed resource (pods), and 100 for resources without an
//!   index (custom resources and the other built-ins) (`suggestedWatchChannelSize`, :657-681).

use std::time::Duration;

use super::time_budget::{MAX_BUDGET, REFRESH_PER_SECOND};

/// `defaultLowerBoundCapacity`.
pub const WINDOW_MIN: usize = 100;
/// `defaultUpperBoundCapacity`.
pub const WINDOW_MAX: usize = 100 * 1024;
/// `eventFreshDuration`.
pub const EVENT_FRESH: Duration = Duration::from_secs(75);
/// `minWatchChanSize`.
const MIN_CHAN: usize = 10;
/// `maxWatchChanSizeWithIndexAndTrigger`.
const MAX_CHAN_TRIGGER: usize = 10;
/// `maxWatchChanSizeWithIndexWithoutTrigger`.
const MAX_CHAN_INDEX: usize = 1000;
/// `maxWatchChanSizeWithoutIndex`.
const MAX_CHAN_NO_INDEX: usize = 100;

/// The watch cache's knobs; [`Default`] is kube-apiserver v1.28.7's.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchCacheConfig {
    /// The event window's lower bound (real: 100). The upper bound is
    /// [`ApiServerConfig::watch_history`](super::ApiServerConfig::watch_history).
    pub window_min: usize,
    /// The window grows while its oldest event is younger than this (real: 75 s).
    pub event_fresh: Duration,
    /// Every watcher's input (and result) buffer, in events. `None`: as the real server sizes
    /// it from the window's capacity (10 to 100 for custom resources, see the module doc).
    pub chan_size: Option<usize>,
    /// The dispatch budget's refill per second (real: 50 ms).
    pub budget_refresh_per_second: Duration,
    /// The dispatch budget's maximum (real: 100 ms).
    pub budget_max: Duration,
}

impl Default for WatchCacheConfig {
    fn default() -> Self {
        Self {
            window_min: WINDOW_MIN,
            event_fresh: EVENT_FRESH,
            chan_size: None,
            budget_refresh_per_second: REFRESH_PER_SECOND,
            budget_max: MAX_BUDGET,
        }
    }
}

/// What a full window knows when one more event comes: how old (at that event's time) its
/// oldest event is, and the event a quarter of the capacity back from the newest.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FullWindow {
    pub capacity: usize,
    pub oldest_age: Duration,
    pub newest_quarter_age: Duration,
}

/// The capacity after `resizeCacheLocked` for one incoming event on a full window.
pub(crate) fn resized(w: FullWindow, min: usize, max: usize, fresh: Duration) -> usize {
    if w.oldest_age < fresh {
        return (w.capacity * 2).min(max).max(w.capacity.min(max));
    }
    if w.newest_quarter_age > fresh {
        return (w.capacity / 2).max(min).min(w.capacity);
    }
    w.capacity
}

/// Which buffers a watch gets (`suggestedWatchChannelSize(indexExists, triggerUsed)`).
pub(crate) fn chan_size(capacity: usize, index_exists: bool, trigger_used: bool) -> usize {
    let max = match (index_exists, trigger_used) {
        (true, true) => MAX_CHAN_TRIGGER,
        (true, false) => MAX_CHAN_INDEX,
        (false, _) => MAX_CHAN_NO_INDEX,
    };
    capacity
        .div_ceil(EVENT_FRESH.as_secs() as usize)
        .max(MIN_CHAN)
        .min(max)
}

/// The oldest resourceVersion a watch may resume from (`getAllEventsSinceLocked`,
/// watch_cache.go:694-726): the one just before the oldest event the window still holds
/// (`oldest-1`), or the window's start when no event has left it since it was filled. A
/// watch from an older one gets `too old resource version: <asked> (<this>)`.
pub(crate) fn oldest_resumable(window_start: u64, first_kept: Option<u64>, evicted: bool) -> u64 {
    match (evicted, first_kept) {
        (true, Some(rv)) => rv - 1,
        _ => window_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(capacity: usize, oldest_s: u64, quarter_s: u64) -> FullWindow {
        FullWindow {
            capacity,
            oldest_age: Duration::from_secs(oldest_s),
            newest_quarter_age: Duration::from_secs(quarter_s),
        }
    }

    #[test]
    fn the_window_doubles_while_fresh_and_halves_when_stale() {
        let r = |w| resized(w, WINDOW_MIN, WINDOW_MAX, EVENT_FRESH);
        // 100 events within 75 s: room for more.
        assert_eq!(r(full(100, 10, 1)), 200);
        assert_eq!(r(full(51_200, 74, 1)), WINDOW_MAX);
        assert_eq!(
            r(full(WINDOW_MAX, 74, 1)),
            WINDOW_MAX,
            "never above the bound"
        );
        // The oldest is stale but the newest quarter is not: unchanged.
        assert_eq!(r(full(800, 100, 30)), 800);
        // Even the newest quarter is older than 75 s: half.
        assert_eq!(r(full(800, 500, 80)), 400);
        assert_eq!(r(full(100, 500, 80)), 100, "never below the bound");
        // A window configured below the lower bound stays at its own size.
        assert_eq!(resized(full(5, 1, 1), WINDOW_MIN, 5, EVENT_FRESH), 5);
    }

    #[test]
    fn channel_sizes_follow_the_window() {
        // A fresh cache (100 events): the minimum for everyone.
        assert_eq!(chan_size(100, false, false), 10);
        assert_eq!(chan_size(100, true, true), 10);
        // A full-size cache: a custom resource's watchers 100, a pod watch by node 10, other
        // pod watches 1000 (ceil(102400 / 75) = 1366, capped).
        assert_eq!(chan_size(WINDOW_MAX, false, false), 100);
        assert_eq!(chan_size(WINDOW_MAX, true, true), 10);
        assert_eq!(chan_size(WINDOW_MAX, true, false), 1000);
        assert_eq!(chan_size(3200, false, false), 43);
    }

    #[test]
    fn resumable_from_the_version_before_the_oldest_kept_event() {
        // Nothing evicted since the window began at 7 (start, or a compaction at 7).
        assert_eq!(oldest_resumable(7, Some(9), false), 7);
        assert_eq!(oldest_resumable(7, None, false), 7);
        // Events evicted: the oldest kept is 40, so 39 still resumes and 38 does not.
        assert_eq!(oldest_resumable(35, Some(40), true), 39);
    }
}
