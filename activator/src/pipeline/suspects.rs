//! Members that did not take a connection lately: tried last, for a while. Pure, no IO.
//!
//! An entry forwards to a revision's members in one order (the primary first, so a trickle
//! wakes one pod). When a member's node is lost with its packets dropped, every connect to it
//! waits out the connect timeout (2 s) before the next member is tried, and the subsetter
//! removes it only once the node is NotReady (about 40 s on a default controller-manager).
//! A member whose connect failed is moved to the end of the order for [`SUSPECT_FOR`]: in
//! that time the next members serve at once, and after it one request tries the member
//! again (a node that came back is used again; one still gone is suspected again).

use std::time::{Duration, Instant};

use crds::ActivatorMember;
use dashmap::DashMap;

/// How long a member whose connect failed is tried last.
pub const SUSPECT_FOR: Duration = Duration::from_secs(10);

/// Suspected members, by address, until when.
#[derive(Default)]
pub struct Suspects {
    until: DashMap<String, Instant>,
}

impl Suspects {
    /// `address` did not take a connection at `now`.
    pub fn failed(&self, address: &str, now: Instant) {
        self.until.insert(address.to_string(), now + SUSPECT_FOR);
    }

    /// `address` took a connection.
    pub fn answered(&self, address: &str) {
        // Cheap when nothing is suspected: the common case reads an empty map.
        if !self.until.is_empty() {
            self.until.remove(address);
        }
    }

    pub fn is_suspect(&self, address: &str, now: Instant) -> bool {
        self.until.get(address).is_some_and(|t| *t > now)
    }

    /// `members` with the suspected ones moved to the end, each group in its order.
    pub fn reorder(&self, members: Vec<ActivatorMember>, now: Instant) -> Vec<ActivatorMember> {
        if self.until.is_empty() {
            return members;
        }
        let (mut ok, suspect): (Vec<_>, Vec<_>) = members
            .into_iter()
            .partition(|m| !self.is_suspect(&m.address, now));
        ok.extend(suspect);
        // Expired marks go, so that the map stays as small as the set of dead members.
        self.until.retain(|_, t| *t > now);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(node: &str) -> ActivatorMember {
        ActivatorMember {
            node: node.into(),
            address: format!("{node}:8080"),
            ..Default::default()
        }
    }

    fn nodes(ms: &[ActivatorMember]) -> Vec<&str> {
        ms.iter().map(|m| m.node.as_str()).collect()
    }

    #[test]
    fn a_failed_member_goes_last_for_a_while_then_is_tried_again() {
        let s = Suspects::default();
        let t0 = Instant::now();
        let order = vec![m("a"), m("b"), m("c")];
        assert_eq!(nodes(&s.reorder(order.clone(), t0)), ["a", "b", "c"]);
        s.failed("a:8080", t0);
        assert_eq!(nodes(&s.reorder(order.clone(), t0)), ["b", "c", "a"]);
        let later = t0 + SUSPECT_FOR - Duration::from_millis(1);
        assert_eq!(nodes(&s.reorder(order.clone(), later)), ["b", "c", "a"]);
        // Its time is up: first again, and the mark is gone.
        let after = t0 + SUSPECT_FOR;
        assert_eq!(nodes(&s.reorder(order.clone(), after)), ["a", "b", "c"]);
        assert!(!s.is_suspect("a:8080", after));
        assert!(s.until.is_empty());
    }

    #[test]
    fn an_answer_clears_the_mark_and_all_suspects_keep_their_order() {
        let s = Suspects::default();
        let t0 = Instant::now();
        s.failed("b:8080", t0);
        s.failed("a:8080", t0);
        let order = vec![m("a"), m("b"), m("c")];
        assert_eq!(nodes(&s.reorder(order.clone(), t0)), ["c", "a", "b"]);
        s.answered("a:8080");
        assert_eq!(nodes(&s.reorder(order, t0)), ["a", "c", "b"]);
    }
}
