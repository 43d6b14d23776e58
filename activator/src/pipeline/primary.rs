//! Which member of a revision's subset takes its traffic first (the primary), and in what
//! order the others are tried. Pure logic, no IO.
//!
//! Why one primary for every entry: a mostly idle revision woken through several entry nodes
//! used to start a pod on every member, because each entry picked a member by a hash of
//! (entry node, revision). With every entry ranking the members by the revision alone, a
//! trickle wakes one pod on one node; the other members take requests only when the primary
//! refuses them (no slot, node full, its share of maxScale used, unreachable, draining), and
//! stay in the subset for failover and burst capacity.
//!
//! Why rendezvous (highest-random-weight) hashing and not an index into the list: every
//! entry ranks the same members the same way whatever order its copy of the subset lists
//! them in, and when a member leaves only the revisions it was primary for move — to the
//! member that was second for them — so a membership change costs as few cold starts as it
//! can. Across revisions each member is primary for about 1/N of the revisions it holds, so
//! the subsetter's balance of revisions over activators is also the balance of primaries.

use crds::ActivatorMember;

use crate::wire::naming::RevisionKey;

/// The weight of `node` for `key`: the highest weight is the primary
/// (`crds::contract::member_weight`, which the subsetter uses too).
fn weight(key: &RevisionKey, node: &str) -> u64 {
    crds::contract::member_weight(&key.namespace, &key.name, node)
}

/// A member's place in the ranking for `key`: lower sorts first (the highest weight, then
/// the node's name to break a tie).
/// Borrows the name: the fast lane asks [`is_primary`] on every request that is not the
/// primary's, and allocates nothing for it.
fn rank<'a>(key: &RevisionKey, node: &'a str) -> (std::cmp::Reverse<u64>, &'a str) {
    (std::cmp::Reverse(weight(key, node)), node)
}

/// `members` in the order requests for `key` try them: the primary first. The same for every
/// entry, whatever order the members come in.
pub fn ranked(key: &RevisionKey, mut members: Vec<ActivatorMember>) -> Vec<ActivatorMember> {
    members.sort_by_cached_key(|m| {
        let (w, node) = rank(key, &m.node);
        (w, node.to_string())
    });
    members
}

/// Whether `node` ranks first among itself and `others` for `key`.
pub fn is_primary<'a>(
    key: &RevisionKey,
    node: &str,
    others: impl IntoIterator<Item = &'a ActivatorMember>,
) -> bool {
    let mine = rank(key, node);
    others
        .into_iter()
        .filter(|m| m.node != node)
        .all(|m| mine < rank(key, &m.node))
}

/// The members ranked ahead of `node` for `key`: those a request entering at `node` tries
/// before serving it there.
pub fn ahead_of(
    key: &RevisionKey,
    node: &str,
    others: impl IntoIterator<Item = ActivatorMember>,
) -> Vec<ActivatorMember> {
    let mine = rank(key, node);
    let ahead: Vec<ActivatorMember> = others
        .into_iter()
        .filter(|m| m.node != node && rank(key, &m.node) < mine)
        .collect();
    ranked(key, ahead)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn member(node: &str) -> ActivatorMember {
        ActivatorMember {
            node: node.into(),
            address: "127.0.0.1:8080".into(),
            pod: format!("la-{node}"),
            max_pods: 0,
            min_pods: 0,
        }
    }

    fn nodes(ms: &[ActivatorMember]) -> Vec<&str> {
        ms.iter().map(|m| m.node.as_str()).collect()
    }

    #[test]
    fn every_order_of_the_members_ranks_them_the_same() {
        let key = RevisionKey::new("demo", "hello");
        let a = ranked(&key, vec![member("n1"), member("n2"), member("n3")]);
        let b = ranked(&key, vec![member("n3"), member("n1"), member("n2")]);
        let c = ranked(&key, vec![member("n2"), member("n3"), member("n1")]);
        assert_eq!(nodes(&a), nodes(&b));
        assert_eq!(nodes(&a), nodes(&c));
        // The primary knows it is, the others know they are not.
        let all = [member("n1"), member("n2"), member("n3")];
        for m in &all {
            assert_eq!(
                is_primary(&key, &m.node, &all),
                m.node == a[0].node,
                "{}",
                m.node
            );
        }
    }

    #[test]
    fn ahead_of_is_the_prefix_of_the_ranking_before_a_member() {
        let key = RevisionKey::new("ns", "r");
        let all = vec![member("a"), member("b"), member("c"), member("d")];
        let order = ranked(&key, all.clone());
        for (i, m) in order.iter().enumerate() {
            let ahead = ahead_of(&key, &m.node, all.clone());
            assert_eq!(nodes(&ahead), nodes(&order[..i]), "ahead of {}", m.node);
        }
    }

    #[test]
    fn a_member_leaving_moves_only_the_revisions_it_was_primary_for() {
        let members: Vec<ActivatorMember> = (0..5).map(|i| member(&format!("node-{i}"))).collect();
        let without: Vec<ActivatorMember> = members
            .iter()
            .filter(|m| m.node != "node-2")
            .cloned()
            .collect();
        let mut moved = 0;
        for r in 0..2000 {
            let key = RevisionKey::new("ns", format!("rev-{r}"));
            let before = ranked(&key, members.clone());
            let after = ranked(&key, without.clone());
            if before[0].node == "node-2" {
                assert_eq!(after[0].node, before[1].node, "{key}: to the second");
                moved += 1;
            } else {
                assert_eq!(after[0].node, before[0].node, "{key}: unmoved");
            }
        }
        assert!(moved > 0);
    }

    /// Across revisions each member is primary for about its share: the spread of load over
    /// activators is the subsetter's balance, not skewed by the ranking.
    #[test]
    fn primaries_spread_over_the_members_across_revisions() {
        let members: Vec<ActivatorMember> =
            (0..3).map(|i| member(&format!("la-node{i}"))).collect();
        let mut count: HashMap<String, u32> = HashMap::new();
        let revisions = 30_000;
        for r in 0..revisions {
            let key = RevisionKey::new("default", format!("app-{r}"));
            *count
                .entry(ranked(&key, members.clone())[0].node.clone())
                .or_default() += 1;
        }
        let expected = revisions as f64 / 3.0;
        for (node, n) in &count {
            let off = (*n as f64 - expected).abs() / expected;
            assert!(
                off < 0.05,
                "{node}: {n} of {revisions} (expected about {expected})"
            );
        }
        assert_eq!(count.len(), 3);
    }

    #[test]
    fn the_parts_cannot_run_into_each_other() {
        // ("a", "bc") and ("ab", "c") are different revisions on the same node.
        assert_ne!(
            weight(&RevisionKey::new("a", "bc"), "n"),
            weight(&RevisionKey::new("ab", "c"), "n")
        );
        assert_ne!(
            weight(&RevisionKey::new("a", "b"), "n"),
            weight(&RevisionKey::new("a", "b"), "m")
        );
    }
}
