//! Gradual rebalancing. Subsets are sticky: a new activator takes only new revisions and
//! refills short subsets, because every move costs the app a cold start. Over time that
//! leaves the load uneven (after a node comes back, or a zone grows). So at an interval the
//! subsetter moves a bounded number of members from the most loaded activators to the least
//! loaded — only while the most loaded one is above `threshold` × the mean. Pure: loads and
//! memberships in, moves out; the reconciler makes each move by planning the revision with
//! that member left out (the policy picks the replacement).

use std::collections::{BTreeMap, BTreeSet};

use crate::pure::key::Key;

/// How much rebalancing may do per interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Rebalance only while max / mean members per activator is above this (e.g. 1.2).
    pub threshold: f64,
    /// Moves per interval at most.
    pub max_moves: usize,
}

/// The moves to make now: (revision, the member to move off). `loads` holds every available
/// activator with its member count; `on(node)` the revisions it serves.
pub fn moves(
    loads: &BTreeMap<String, usize>,
    on: impl Fn(&str) -> BTreeSet<Key>,
    limits: Limits,
) -> Vec<(Key, String)> {
    let mut loads = loads.clone();
    let total: usize = loads.values().sum();
    if loads.len() < 2 || total == 0 {
        return Vec::new();
    }
    let mean = total as f64 / loads.len() as f64;
    let mut out: Vec<(Key, String)> = Vec::new();
    let mut moved: BTreeSet<Key> = BTreeSet::new();
    while out.len() < limits.max_moves {
        // Most loaded first (by name among equals); least loaded last.
        let (max_node, max) = loads
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(n, l)| (n.clone(), *l))
            .expect("two or more");
        let (min_node, min) = loads
            .iter()
            .min_by(|a, b| a.1.cmp(b.1).then_with(|| a.0.cmp(b.0)))
            .map(|(n, l)| (n.clone(), *l))
            .expect("two or more");
        if (max as f64) <= limits.threshold * mean || max <= min + 1 {
            break;
        }
        // A revision on the most loaded node, not on the least loaded one, not moved already.
        let min_has = on(&min_node);
        let Some(rev) = on(&max_node)
            .into_iter()
            .find(|k| !moved.contains(k) && !min_has.contains(k))
        else {
            break;
        };
        moved.insert(rev.clone());
        out.push((rev, max_node.clone()));
        *loads.get_mut(&max_node).expect("listed") -= 1;
        *loads.get_mut(&min_node).expect("listed") += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(
        spec: &[(&str, &[u32])],
    ) -> (BTreeMap<String, usize>, BTreeMap<String, BTreeSet<Key>>) {
        let mut on = BTreeMap::new();
        for (node, revs) in spec {
            on.insert(
                (*node).to_owned(),
                revs.iter()
                    .map(|r| Key::new("ns", format!("r{r}")))
                    .collect::<BTreeSet<_>>(),
            );
        }
        let loads = on.iter().map(|(n, s)| (n.clone(), s.len())).collect();
        (loads, on)
    }

    const LIMITS: Limits = Limits {
        threshold: 1.2,
        max_moves: 10,
    };

    #[test]
    fn a_new_empty_activator_takes_members_from_the_most_loaded() {
        // 4 activators with 4 members each, 2 new ones with none: mean 2.67, max 4 > 3.2.
        let (loads, on) = world(&[
            ("a", &[1, 2, 3, 4]),
            ("b", &[1, 2, 5, 6]),
            ("c", &[3, 4, 7, 8]),
            ("d", &[5, 6, 7, 8]),
            ("e", &[]),
            ("f", &[]),
        ]);
        let m = moves(&loads, |n| on.get(n).cloned().unwrap_or_default(), LIMITS);
        // Until the max is within 1.2 × mean (3.2): each of a-d gives one.
        assert_eq!(m.len(), 4, "{m:?}");
        let from: BTreeSet<&str> = m.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(from, BTreeSet::from(["a", "b", "c", "d"]));
        let revs: BTreeSet<&Key> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(revs.len(), 4, "a revision moves once per interval");
    }

    #[test]
    fn balanced_or_nearly_balanced_loads_move_nothing() {
        let (loads, on) = world(&[("a", &[1, 2]), ("b", &[3, 4]), ("c", &[5])]);
        assert!(moves(&loads, |n| on.get(n).cloned().unwrap_or_default(), LIMITS).is_empty());
        // max - min = 1 is as even as it gets, whatever the ratio.
        let (loads, on) = world(&[("a", &[1]), ("b", &[])]);
        assert!(moves(&loads, |n| on.get(n).cloned().unwrap_or_default(), LIMITS).is_empty());
    }

    #[test]
    fn moves_are_bounded_per_interval() {
        let many: Vec<u32> = (0..100).collect();
        let (loads, on) = world(&[("a", &many), ("b", &[])]);
        let m = moves(
            &loads,
            |n| on.get(n).cloned().unwrap_or_default(),
            Limits {
                threshold: 1.2,
                max_moves: 3,
            },
        );
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn a_revision_already_on_the_target_is_not_picked() {
        // Every revision on a is also on b (the least loaded): nothing can move there.
        let (loads, on) = world(&[("a", &[1, 2, 3, 4]), ("b", &[1, 2]), ("c", &[1, 2, 3, 4])]);
        let m = moves(&loads, |n| on.get(n).cloned().unwrap_or_default(), LIMITS);
        assert!(m.iter().all(|(k, _)| !on["b"].contains(k)), "{m:?}");
    }
}
