//! Host claims: which revisions claim which host, and which one a host routes to. Pure, no IO.
//!
//! Several revisions may claim one host (a new revision of an app claims the old one's hosts
//! before the old one is deleted). The greatest claim — creationTimestamp, then name, then
//! namespace — wins, the rule the activators' host table used, so the subsetter and any reader
//! agree on the winner without coordinating.
//!
//! The index is kept from the Revision watch, one event at a time: a change of one revision's
//! hosts touches only the claimants of those hosts, never all revisions (docs/architecture.md, "The scale it must hold").

use std::collections::{BTreeSet, HashMap, HashSet};

use crds::contract::{HOST_LABEL_PREFIX, node_hash, normalize_host};

use crate::pure::key::Key;

/// One revision's claim on a host. The derived order makes the greatest claim the winner.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Claim {
    /// creationTimestamp in seconds (the API stores no finer precision).
    created: i64,
    name: String,
    namespace: String,
}

impl Claim {
    fn new(key: &Key, created: i64) -> Self {
        Self {
            created,
            name: key.name.clone(),
            namespace: key.namespace.clone(),
        }
    }

    fn key(&self) -> Key {
        Key::new(&self.namespace, &self.name)
    }
}

/// The host label of an already normalized host. `host_label` normalizes again, and
/// normalizing is not idempotent for odd spellings (`a:80.` becomes `a:80`, then `a`), so
/// labels derived from the index must hash the stored form as it is.
pub fn label_of_normalized(host: &str) -> String {
    format!("{HOST_LABEL_PREFIX}{}", node_hash(host))
}

/// Host → claimants, and revision → the hosts it claims.
#[derive(Default, Debug)]
pub struct HostIndex {
    claims: HashMap<String, BTreeSet<Claim>>,
    claimed: HashMap<Key, (i64, BTreeSet<String>)>,
}

impl HostIndex {
    /// Records the hosts `key` claims (any spelling; they are normalized). Returns the other
    /// revisions whose outcome may have changed: the older claimants of every host added or
    /// dropped. An unchanged revision (a status write, a relist) returns nothing.
    pub fn upsert(&mut self, key: &Key, created: i64, hosts: &[String]) -> BTreeSet<Key> {
        let hosts: BTreeSet<String> = hosts.iter().map(|h| normalize_host(h)).collect();
        let mut affected = BTreeSet::new();
        match self.claimed.get(key) {
            Some((c, old)) if *c == created => {
                if *old == hosts {
                    return affected;
                }
                let claim = Claim::new(key, created);
                for h in old.symmetric_difference(&hosts) {
                    affected.extend(self.older(h, &claim));
                }
            }
            _ => {
                // New, or a new object under an old name (its age differs): everything it
                // claimed and claims now may change hands.
                affected.extend(self.remove(key));
                let claim = Claim::new(key, created);
                for h in &hosts {
                    affected.extend(self.older(h, &claim));
                }
            }
        }
        self.unlink(key);
        let claim = Claim::new(key, created);
        for h in &hosts {
            self.claims
                .entry(h.clone())
                .or_default()
                .insert(claim.clone());
        }
        self.claimed.insert(key.clone(), (created, hosts));
        affected.remove(key);
        affected
    }

    /// Forgets every claim of `key`. Returns the revisions that were older claimants of its
    /// hosts (one of them may win now).
    pub fn remove(&mut self, key: &Key) -> BTreeSet<Key> {
        let affected = self.older_claimants(key);
        self.unlink(key);
        self.claimed.remove(key);
        affected
    }

    /// Keeps only `keys` (after a relist, drop what the relist no longer shows). Returns the
    /// older claimants of what was dropped.
    pub fn retain(&mut self, keys: &HashSet<Key>) -> BTreeSet<Key> {
        let gone: Vec<Key> = self
            .claimed
            .keys()
            .filter(|k| !keys.contains(*k))
            .cloned()
            .collect();
        let mut affected = BTreeSet::new();
        for k in &gone {
            affected.extend(self.remove(k));
        }
        for k in &gone {
            affected.remove(k);
        }
        affected
    }

    fn unlink(&mut self, key: &Key) {
        let Some((created, hosts)) = self.claimed.get(key) else {
            return;
        };
        let claim = Claim::new(key, *created);
        for h in hosts {
            if let Some(set) = self.claims.get_mut(h) {
                set.remove(&claim);
                if set.is_empty() {
                    self.claims.remove(h);
                }
            }
        }
    }

    /// The claimants of `host` older than `claim`.
    fn older(&self, host: &str, claim: &Claim) -> Vec<Key> {
        self.claims
            .get(host)
            .map(|set| set.range(..claim).map(Claim::key).collect())
            .unwrap_or_default()
    }

    /// The revisions older than `key` on any host it claims: whether `key` can take traffic
    /// decides whether they are in conflict, so they are the ones to look at again when
    /// `key`'s ActivationEndpoints changes.
    pub fn older_claimants(&self, key: &Key) -> BTreeSet<Key> {
        let Some((created, hosts)) = self.claimed.get(key) else {
            return BTreeSet::new();
        };
        let claim = Claim::new(key, *created);
        hosts.iter().flat_map(|h| self.older(h, &claim)).collect()
    }

    /// For each host `key` claims that a newer revision claims too (in host order): the newer
    /// claimants, newest first.
    pub fn newer_claimants(&self, key: &Key) -> Vec<(String, Vec<Key>)> {
        let Some((created, hosts)) = self.claimed.get(key) else {
            return Vec::new();
        };
        let claim = Claim::new(key, *created);
        hosts
            .iter()
            .filter_map(|h| {
                let newer: Vec<Key> = self
                    .claims
                    .get(h)?
                    .range(&claim..)
                    .rev()
                    .filter(|c| **c != claim)
                    .map(Claim::key)
                    .collect();
                (!newer.is_empty()).then(|| (h.clone(), newer))
            })
            .collect()
    }

    /// The revision with the greatest claim on `host` (any spelling).
    pub fn winner(&self, host: &str) -> Option<Key> {
        self.claims
            .get(&normalize_host(host))?
            .last()
            .map(Claim::key)
    }

    /// The claimants of an already normalized `host`, newest first.
    pub fn claimants(&self, host: &str) -> Vec<Key> {
        self.claims
            .get(host)
            .map(|set| set.iter().rev().map(Claim::key).collect())
            .unwrap_or_default()
    }

    /// The claimants of `host` (normalized) older than `key`'s claim, newest first.
    pub fn older_than(&self, host: &str, key: &Key) -> Vec<Key> {
        let Some((created, _)) = self.claimed.get(key) else {
            return Vec::new();
        };
        let mut v = self.older(host, &Claim::new(key, *created));
        v.reverse();
        v
    }

    /// The normalized hosts `key` claims.
    pub fn hosts_of(&self, key: &Key) -> Vec<String> {
        self.claimed
            .get(key)
            .map(|(_, h)| h.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Number of hosts claimed.
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

/// A host a revision loses, and the revision it routes to instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The normalized host.
    pub host: String,
    pub winner: Key,
}

/// The hosts a revision loses: for each host with newer claimants (as
/// [`HostIndex::newer_claimants`] gives them, newest first), the newest one that can take the
/// host's traffic — `routable(revision, normalized host)`, i.e. its ActivationEndpoints carries
/// the host label. A newer claimant that cannot (not written yet, invalid spec) is passed over,
/// so a revision never gives a host up to one that would leave the host without a route.
pub fn conflicts(
    newer: &[(String, Vec<Key>)],
    routable: impl Fn(&Key, &str) -> bool,
) -> Vec<Conflict> {
    newer
        .iter()
        .filter_map(|(host, claimants)| {
            let winner = claimants.iter().find(|k| routable(k, host))?;
            Some(Conflict {
                host: host.clone(),
                winner: winner.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> Key {
        Key::new("ns", n)
    }

    fn hosts(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn keys(v: &[&str]) -> BTreeSet<Key> {
        v.iter().map(|n| key(n)).collect()
    }

    #[test]
    fn newest_then_greatest_name_then_namespace_wins() {
        let mut ix = HostIndex::default();
        ix.upsert(&key("a"), 10, &hosts(&["app.example.com"]));
        ix.upsert(&key("b"), 20, &hosts(&["app.example.com"]));
        assert_eq!(ix.winner("app.example.com"), Some(key("b")));
        ix.upsert(&key("c"), 20, &hosts(&["APP.example.com:8080"]));
        assert_eq!(ix.winner("app.example.com"), Some(key("c")), "same time");
        ix.upsert(&Key::new("zz", "c"), 20, &hosts(&["app.example.com."]));
        assert_eq!(ix.winner("app.example.com"), Some(Key::new("zz", "c")));
        assert_eq!(ix.len(), 1, "spellings of one host are one host");
        ix.remove(&Key::new("zz", "c"));
        ix.remove(&key("c"));
        ix.remove(&key("b"));
        assert_eq!(ix.winner("app.example.com"), Some(key("a")));
        ix.remove(&key("a"));
        assert!(ix.is_empty());
    }

    #[test]
    fn newer_claimants_are_newest_first_per_host() {
        let mut ix = HostIndex::default();
        ix.upsert(&key("a"), 1, &hosts(&["x.test", "y.test", "z.test"]));
        ix.upsert(&key("b"), 2, &hosts(&["x.test"]));
        ix.upsert(&key("c"), 3, &hosts(&["x.test", "y.test"]));
        ix.upsert(&key("old"), 0, &hosts(&["z.test"]));
        assert_eq!(
            ix.newer_claimants(&key("a")),
            vec![
                ("x.test".to_owned(), vec![key("c"), key("b")]),
                ("y.test".to_owned(), vec![key("c")]),
            ]
        );
        assert!(ix.newer_claimants(&key("c")).is_empty());
        assert!(ix.newer_claimants(&key("unknown")).is_empty());
        assert_eq!(ix.older_claimants(&key("c")), keys(&["a", "b"]));
        assert_eq!(ix.older_claimants(&key("a")), keys(&["old"]));
    }

    #[test]
    fn changes_affect_only_older_claimants_of_changed_hosts() {
        let mut ix = HostIndex::default();
        assert!(
            ix.upsert(&key("a"), 1, &hosts(&["x.test", "y.test"]))
                .is_empty()
        );
        // z is newer than a on y.test: a may lose it.
        assert_eq!(ix.upsert(&key("z"), 9, &hosts(&["y.test"])), keys(&["a"]));
        // b is newer than a on x.test: a may lose it. z is newer than b: unaffected.
        assert_eq!(ix.upsert(&key("b"), 2, &hosts(&["x.test"])), keys(&["a"]));
        // The same hosts again (a status write): nobody to look at.
        assert!(ix.upsert(&key("b"), 2, &hosts(&["X.test:80"])).is_empty());
        // b adds y.test: a is older there; z is newer.
        assert_eq!(
            ix.upsert(&key("b"), 2, &hosts(&["x.test", "y.test"])),
            keys(&["a"])
        );
        // z drops y.test: a and b were older claimants.
        assert_eq!(ix.upsert(&key("z"), 9, &[]), keys(&["a", "b"]));
        assert_eq!(ix.remove(&key("b")), keys(&["a"]));
        assert_eq!(ix.winner("y.test"), Some(key("a")));
        // A new object under an old name (another creationTimestamp) replaces its claims.
        assert!(ix.upsert(&key("a"), 50, &hosts(&["x.test"])).is_empty());
        assert_eq!(ix.winner("y.test"), None);
    }

    #[test]
    fn retain_drops_and_reports_what_a_relist_no_longer_shows() {
        let mut ix = HostIndex::default();
        ix.upsert(&key("a"), 1, &hosts(&["x.test"]));
        ix.upsert(&key("b"), 2, &hosts(&["x.test"]));
        ix.upsert(&key("c"), 3, &hosts(&["x.test"]));
        let affected = ix.retain(&HashSet::from([key("a")]));
        assert_eq!(affected, keys(&["a"]), "gone revisions are not reported");
        assert_eq!(ix.winner("x.test"), Some(key("a")));
    }

    #[test]
    fn invalid_hosts_are_still_claimed() {
        let mut ix = HostIndex::default();
        ix.upsert(&key("a"), 1, &hosts(&["not a host!", "", "a:80."]));
        assert_eq!(ix.len(), 3);
        assert_eq!(ix.winner("not a host!"), Some(key("a")));
        let label = label_of_normalized("a:80");
        assert!(label.starts_with(HOST_LABEL_PREFIX));
        assert_eq!(label.len(), HOST_LABEL_PREFIX.len() + 16);
    }

    #[test]
    fn conflicts_pass_over_newer_claimants_that_cannot_take_traffic() {
        let newer = vec![
            ("x.test".to_owned(), vec![key("c"), key("b")]),
            ("y.test".to_owned(), vec![key("c")]),
        ];
        let all = conflicts(&newer, |_, _| true);
        assert_eq!(
            all,
            vec![
                Conflict {
                    host: "x.test".into(),
                    winner: key("c")
                },
                Conflict {
                    host: "y.test".into(),
                    winner: key("c")
                },
            ]
        );
        // c has no ActivationEndpoints yet: b takes x.test, nobody takes y.test from us.
        let some = conflicts(&newer, |k, _| *k != key("c"));
        assert_eq!(
            some,
            vec![Conflict {
                host: "x.test".into(),
                winner: key("b")
            }]
        );
        assert!(conflicts(&newer, |_, _| false).is_empty());
    }
}
