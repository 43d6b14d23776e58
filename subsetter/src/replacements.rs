//! Activators lost on a node that is still Ready, held as members while their replacement
//! comes (pure, no IO).
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
//! A Node that turns NotReady, or is deleted, ends the hold at once: that is a node failure or
//! removal, repaired as such. An activator not replaced within the hold is repaired then.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// How long an activator lost on a Ready node is held by default: the old pod's shutdown
/// delay (5 s) and drain, then the new pod's creation, image pull and readiness. On the
/// repo's cluster the whole gap is ~6 s; a new image pulled over a slow registry takes
/// longer. A node that left the DaemonSet for good pays this long with a member that fails
/// over on its first connect.
pub const REPLACEMENT_HOLD: Duration = Duration::from_secs(60);

/// Nodes whose activator is held for its replacement, with until when.
#[derive(Debug)]
pub struct Replacements {
    hold: Duration,
    until: BTreeMap<String, Instant>,
}

impl Replacements {
    /// Holds of `hold` each; no longer than `settle` (the wait every loss already has) is no
    /// hold at all.
    pub fn new(hold: Duration, settle: Duration) -> Self {
        Self {
            hold: if hold > settle { hold } else { Duration::ZERO },
            until: BTreeMap::new(),
        }
    }

    /// Whether losses are held at all.
    pub fn enabled(&self) -> bool {
        !self.hold.is_zero()
    }

    /// `node`'s activator was lost at `now` on a Ready node: held until `now + hold`. A node
    /// already held keeps its first deadline (a pod that flaps does not hold for ever).
    pub fn lost(&mut self, node: &str, now: Instant) {
        if self.enabled() && !self.until.contains_key(node) {
            self.until.insert(node.to_owned(), now + self.hold);
        }
    }

    /// `node` no longer held (its activator is back, or its node failed); whether it was.
    pub fn end(&mut self, node: &str) -> bool {
        self.until.remove(node).is_some()
    }

    pub fn contains(&self, node: &str) -> bool {
        self.until.contains_key(node)
    }

    /// The held nodes.
    pub fn nodes(&self) -> impl Iterator<Item = &String> {
        self.until.keys()
    }

    pub fn len(&self) -> usize {
        self.until.len()
    }

    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.until.values().min().copied()
    }

    /// The nodes whose hold ended by `now`, no longer held.
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        let due: Vec<String> = self
            .until
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for n in &due {
            self.until.remove(n);
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
