//! Activators lost on a node that is still Ready, held as members while their replacement
//! comes (pure, no IO; times are passed in, on the caller's clock).
//!
//! A DaemonSet rolling update (maxUnavailable, no surge: the data port is a hostPort) deletes
//! a node's activator pod and creates the new one only once the old one is gone: the shutdown
//! delay, the drain, the new image's pull and start, seconds to a minute. So does a crash
//! (the kubelet restarts the container) and a `kubectl delete pod`. Moving the node's subsets
//! meanwhile moves every one of them: at 1,000 nodes × 100,000 revisions ~300 a node, each a
//! status and a label write, a Revision read by the gaining activator, a cold start for a
//! warm revision whose primary it was, and a pod left idle on the node; a rolling update does
//! it on every node in turn. Held, the member stays; the new activator's pod is written once
//! into each subset when it is Ready (its address and pod name). Requests meanwhile fail over
//! to the next member at their first failed connect (`activator::pipeline::suspects`).
//!
//! The hold runs from when the old pod is gone. While it terminates (its `deletionTimestamp`
//! set, the object still there) the node is held until its grace period ends and for the hold
//! after: the activator drains its in-flight requests for up to `--drain-timeout` (90 s), and
//! the DaemonSet creates the replacement only once the old pod is gone, so a hold counted from
//! the loss would run out under a slow drain and move every subset after all (seen on the
//! repo's cluster: a drain of 90 s against a hold of 60 s).
//!
//! A Node that turns NotReady, or is deleted, ends the hold at once: that is a node failure or
//! removal, repaired as such. An activator not replaced within the hold is repaired then.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long an activator lost on a Ready node is held by default, from when its old pod is
/// gone (a terminating pod is held through its grace period first): the new pod's creation,
/// image pull and readiness. On the repo's cluster the whole gap is ~6 s; a new image pulled
/// over a slow registry takes longer. A node that left the DaemonSet for good pays this long
/// (after its pod's grace period) with a member that fails over on its first connect.
pub const REPLACEMENT_HOLD: Duration = Duration::from_secs(60);

/// Nodes whose activator is held for its replacement, with until when.
#[derive(Debug)]
pub struct Replacements {
    hold: Duration,
    held: BTreeMap<String, Held>,
}

/// One node's hold.
#[derive(Debug, Clone, Copy)]
struct Held {
    until: Instant,
    /// Its old pod was seen terminating and not yet gone.
    terminating: bool,
}

impl Replacements {
    /// Holds of `hold` each; no longer than `settle` (the wait every loss already has) is no
    /// hold at all.
    pub fn new(hold: Duration, settle: Duration) -> Self {
        Self {
            hold: if hold > settle { hold } else { Duration::ZERO },
            held: BTreeMap::new(),
        }
    }

    /// Whether losses are held at all.
    pub fn enabled(&self) -> bool {
        !self.hold.is_zero()
    }

    /// `node`'s activator was lost at `now` on a Ready node: held until `now + hold`. A node
    /// already held keeps its first deadline (a pod that flaps does not hold for ever).
    pub fn lost(&mut self, node: &str, now: Instant) {
        if self.enabled() && !self.held.contains_key(node) {
            let held = Held {
                until: now + self.hold,
                terminating: false,
            };
            self.held.insert(node.to_owned(), held);
        }
    }

    /// `node`'s old pod is terminating, its grace period ending at `grace_end`: held until
    /// then and for the hold after, unless already held longer. Nothing for a node not held.
    pub fn terminating(&mut self, node: &str, grace_end: Instant) {
        let hold = self.hold;
        if let Some(h) = self.held.get_mut(node) {
            h.until = h.until.max(grace_end + hold);
            h.terminating = true;
        }
    }

    /// `node`'s old pod, seen terminating, is gone at `now`: the hold runs from now (the
    /// DaemonSet creates the replacement from now). Nothing for a node not held, or whose
    /// pod was not seen terminating (its hold already runs from the loss).
    pub fn gone(&mut self, node: &str, now: Instant) {
        let hold = self.hold;
        if let Some(h) = self.held.get_mut(node).filter(|h| h.terminating) {
            h.until = now + hold;
            h.terminating = false;
        }
    }

    /// `node` no longer held (its activator is back, or its node failed); whether it was.
    pub fn end(&mut self, node: &str) -> bool {
        self.held.remove(node).is_some()
    }

    pub fn contains(&self, node: &str) -> bool {
        self.held.contains_key(node)
    }

    /// The held nodes.
    pub fn nodes(&self) -> impl Iterator<Item = &String> {
        self.held.keys()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.held.values().map(|h| h.until).min()
    }

    /// The nodes whose hold ended by `now`, no longer held.
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        let due: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for n in &due {
            self.held.remove(n);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_secs(3);

    #[test]
    fn a_loss_is_held_for_the_hold_and_then_due() {
        let t = Instant::now();
        let mut r = Replacements::new(Duration::from_secs(60), SETTLE);
        r.lost("a", t);
        r.lost("b", t + Duration::from_secs(10));
        assert_eq!(r.next(), Some(t + Duration::from_secs(60)));
        assert!(r.due(t + Duration::from_secs(59)).is_empty());
        assert_eq!(r.due(t + Duration::from_secs(60)), vec!["a".to_string()]);
        assert!(!r.contains("a") && r.contains("b"));
        assert_eq!(r.next(), Some(t + Duration::from_secs(70)));
        assert_eq!(r.due(t + Duration::from_secs(300)), vec!["b".to_string()]);
        assert!(r.is_empty() && r.next().is_none());
    }

    #[test]
    fn a_node_lost_again_keeps_its_first_deadline() {
        let t = Instant::now();
        let mut r = Replacements::new(Duration::from_secs(60), SETTLE);
        r.lost("a", t);
        r.lost("a", t + Duration::from_secs(50));
        assert_eq!(r.next(), Some(t + Duration::from_secs(60)));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn a_return_ends_the_hold() {
        let t = Instant::now();
        let mut r = Replacements::new(Duration::from_secs(60), SETTLE);
        r.lost("a", t);
        assert!(r.end("a"));
        assert!(!r.end("a"), "ended once");
        assert!(r.due(t + Duration::from_secs(600)).is_empty());
        // Lost again after its return: a new hold from then.
        r.lost("a", t + Duration::from_secs(100));
        assert_eq!(r.next(), Some(t + Duration::from_secs(160)));
    }

    #[test]
    fn a_terminating_pod_is_held_through_its_grace_period_then_for_the_hold_after_it_is_gone() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let mut r = Replacements::new(s(60), SETTLE);
        r.lost("a", t);
        // Deleted with a grace period of 120 s: held until it ends and 60 s more.
        r.terminating("a", t + s(120));
        assert_eq!(r.next(), Some(t + s(180)));
        assert!(r.due(t + s(90)).is_empty(), "a 90 s drain outlasts no hold");
        // Gone after a 95 s drain: the hold runs from then.
        r.gone("a", t + s(95));
        assert_eq!(r.next(), Some(t + s(155)));
        // Seen again as gone (another event): no new start.
        r.gone("a", t + s(150));
        assert_eq!(r.next(), Some(t + s(155)));
        assert_eq!(r.due(t + s(155)), vec!["a".to_string()]);
    }

    #[test]
    fn a_pod_gone_early_shortens_nothing_but_its_grace_and_a_crash_keeps_its_hold() {
        let t = Instant::now();
        let s = Duration::from_secs;
        let mut r = Replacements::new(s(60), SETTLE);
        r.lost("a", t);
        r.terminating("a", t + s(30));
        assert_eq!(r.next(), Some(t + s(90)));
        // Gone after 5 s: 60 s from then, not from the grace period's end.
        r.gone("a", t + s(5));
        assert_eq!(r.next(), Some(t + s(65)));
        // A container that crashed (its pod never terminating) keeps the hold from its loss.
        r.lost("b", t);
        r.gone("b", t + s(30));
        assert_eq!(r.due(t + s(60)), vec!["b".to_string()]);
        // A node not held is not held by news of its pods.
        r.terminating("c", t + s(30));
        r.gone("c", t + s(40));
        assert!(!r.contains("c"));
    }

    #[test]
    fn a_hold_no_longer_than_the_settle_holds_nothing() {
        let t = Instant::now();
        for hold in [Duration::ZERO, Duration::from_secs(1), SETTLE] {
            let mut r = Replacements::new(hold, SETTLE);
            assert!(!r.enabled());
            r.lost("a", t);
            assert!(r.is_empty() && !r.contains("a"));
        }
        assert!(Replacements::new(SETTLE + Duration::from_millis(1), SETTLE).enabled());
    }
}
