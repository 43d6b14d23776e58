//! Which node failures are repaired at once (pure). A Node that turns NotReady is, alone, a
//! node failure: its subsets are repaired as soon as the watch shows it (a member lost is a
//! revision's requests failing over, and each second of waiting is theirs). Many at once
//! are more likely the control plane's or the network's trouble, which a moment later shows
//! itself as most nodes NotReady (`ActivatorSet::disrupted`) — the controller-manager marks
//! stale nodes over a pass of its monitor, not all in one instant — and moving their
//! subsets would cost every revision on them a cold start on nodes no healthier. So at most
//! [`LossBurst::budget`] NotReady nodes in any [`WINDOW`] are repaired at once; past that,
//! losses wait `LOSS_SETTLE` to show which of the two it is, as every loss did before.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back the NotReady nodes are counted: two passes of kube-controller-manager's node
/// monitor (`--node-monitor-period`, 5 s), over which one disruption's marks arrive.
pub const WINDOW: Duration = Duration::from_secs(10);

/// One node repaired at once per this many nodes (at least one) in a [`WINDOW`]: 1 of 3, 10
/// of 5,000. Independent node failures are rarer than that; a disruption that starts below
/// it costs at most that share of the nodes' subsets a move.
pub const NODES_PER_FAST_REPAIR: usize = 500;

/// The NotReady nodes seen in the last [`WINDOW`].
#[derive(Debug, Default)]
pub struct LossBurst {
    seen: VecDeque<Instant>,
}

impl LossBurst {
    /// How many NotReady nodes in a [`WINDOW`] are repaired at once among `nodes`.
    pub fn budget(nodes: usize) -> usize {
        (nodes / NODES_PER_FAST_REPAIR).max(1)
    }

    /// Counts `n` nodes turning NotReady at `now`, among `nodes`, and says whether they are
    /// within the budget (every one counted in the window, these included): repaired at once.
    pub fn admit(&mut self, now: Instant, n: usize, nodes: usize) -> bool {
        while self
            .seen
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
        {
            self.seen.pop_front();
        }
        self.seen.extend(std::iter::repeat_n(now, n));
        self.seen.len() <= Self::budget(nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_one_node_in_five_hundred_and_at_least_one() {
        assert_eq!(LossBurst::budget(0), 1);
        assert_eq!(LossBurst::budget(3), 1);
        assert_eq!(LossBurst::budget(999), 1);
        assert_eq!(LossBurst::budget(1000), 2);
        assert_eq!(LossBurst::budget(5000), 10);
    }

    #[test]
    fn a_lone_failure_is_repaired_at_once_and_a_second_within_the_window_waits() {
        let t = Instant::now();
        let mut b = LossBurst::default();
        assert!(b.admit(t, 1, 3), "the first NotReady node of three");
        assert!(
            !b.admit(t + Duration::from_secs(2), 1, 3),
            "a second within the window may be the start of a disruption"
        );
        // Both counted: a third just after the first has left the window is still the
        // second's company.
        assert!(!b.admit(t + WINDOW, 1, 3));
        assert!(
            b.admit(t + Duration::from_secs(2) + 2 * WINDOW, 1, 3),
            "alone again once the others are a window old"
        );
    }

    #[test]
    fn a_burst_larger_than_the_budget_waits_whole() {
        let t = Instant::now();
        let mut b = LossBurst::default();
        assert!(!b.admit(t, 11, 5000), "11 of 5,000 at once is past 10");
        let mut b = LossBurst::default();
        assert!(b.admit(t, 10, 5000));
        assert!(
            !b.admit(t + Duration::from_millis(500), 1, 5000),
            "the eleventh in the window waits"
        );
    }
}
