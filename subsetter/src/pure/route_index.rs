//! Which revision takes what share of which host, from every Route's served traffic (pure,
//! no IO). The Route watch keeps it on every replica (a standby that takes the lead plans
//! with it at once, so leading never strips a route's labels), and the leader's route pass
//! writes ahead of the watch. A revision's plan reads its shares here (`status.routes`, and
//! a host label each), and the hand-over of plain host claims leaves the hosts a Route owns
//! alone.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crds::HostShare;
use crds::ServedTarget;
use crds::contract::normalize_host;
use crds::route::tag_host;

use crate::pure::key::Key;

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    created: i64,
    hosts: Vec<String>,
    traffic: Vec<ServedTarget>,
}

/// Routes, host owners and revisions' shares.
#[derive(Default, Debug)]
pub struct RouteIndex {
    routes: HashMap<Key, Entry>,
    /// Host → the routes naming it, oldest first: the oldest owns it.
    hosts: HashMap<String, BTreeSet<(i64, Key)>>,
    /// Revision → (route, host) → percent.
    shares: HashMap<Key, BTreeMap<(Key, String), i32>>,
    /// Revision → route → pods to keep started while that route's move waits for them.
    warm: HashMap<Key, BTreeMap<Key, i32>>,
}

impl RouteIndex {
    /// Records route `key` (created at `created` seconds) naming `hosts`, serving `traffic`.
    /// Returns the revisions whose shares changed.
    pub fn upsert(
        &mut self,
        key: &Key,
        created: i64,
        hosts: &[String],
        traffic: &[ServedTarget],
    ) -> BTreeSet<Key> {
        let mut hosts: Vec<String> = hosts.iter().map(|h| normalize_host(h)).collect();
        hosts.sort();
        hosts.dedup();
        let entry = Entry {
            created,
            hosts,
            traffic: traffic.to_vec(),
        };
        if self.routes.get(key) == Some(&entry) {
            return BTreeSet::new();
        }
        let mut touched: BTreeSet<Key> = BTreeSet::from([key.clone()]);
        if let Some(old) = self.routes.remove(key) {
            for h in &old.hosts {
                touched.extend(self.unname(h, old.created, key));
            }
        }
        for h in &entry.hosts {
            let set = self.hosts.entry(h.clone()).or_default();
            set.insert((created, key.clone()));
            touched.extend(set.iter().map(|(_, k)| k.clone()));
        }
        self.routes.insert(key.clone(), entry);
        self.republish(&touched)
    }

    /// Forgets route `key`. Returns the revisions whose shares changed.
    pub fn remove(&mut self, key: &Key) -> BTreeSet<Key> {
        let mut touched = BTreeSet::from([key.clone()]);
        if let Some(old) = self.routes.remove(key) {
            for h in &old.hosts {
                touched.extend(self.unname(h, old.created, key));
            }
        }
        self.warm.retain(|_, by| {
            by.remove(key);
            !by.is_empty()
        });
        self.republish(&touched)
    }

    /// Drops `key` from `host`'s namers; returns the others (one may own it now).
    fn unname(&mut self, host: &str, created: i64, key: &Key) -> Vec<Key> {
        let Some(set) = self.hosts.get_mut(host) else {
            return Vec::new();
        };
        set.remove(&(created, key.clone()));
        let rest: Vec<Key> = set.iter().map(|(_, k)| k.clone()).collect();
        if set.is_empty() {
            self.hosts.remove(host);
        }
        rest
    }

    /// The route that owns `host` (normalized): the oldest naming it.
    pub fn owner(&self, host: &str) -> Option<&Key> {
        self.hosts.get(host)?.first().map(|(_, k)| k)
    }

    /// The route keys known.
    pub fn keys(&self) -> Vec<Key> {
        self.routes.keys().cloned().collect()
    }

    /// `rev`'s shares, by host (a host named by two routes counts once, the owner's).
    pub fn shares_of(&self, rev: &Key) -> Vec<HostShare> {
        let Some(by) = self.shares.get(rev) else {
            return Vec::new();
        };
        let mut out: BTreeMap<&str, i32> = BTreeMap::new();
        for ((_, host), p) in by {
            *out.entry(host).or_default() += *p;
        }
        out.into_iter()
            .map(|(host, percent)| HostShare {
                host: host.to_owned(),
                percent: percent.min(100),
            })
            .collect()
    }

    /// The revisions with a share of `host` (normalized).
    pub fn sharing(&self, host: &str) -> Vec<Key> {
        self.shares
            .iter()
            .filter(|(_, by)| by.keys().any(|(_, h)| h == host))
            .map(|(rev, _)| rev.clone())
            .collect()
    }

    /// The revision with the largest share of `host` (normalized), if a Route routes it.
    pub fn largest_share(&self, host: &str) -> Option<Key> {
        self.owner(host)?;
        self.shares
            .iter()
            .filter_map(|(rev, by)| {
                let p: i32 = by
                    .iter()
                    .filter(|((_, h), _)| h == host)
                    .map(|(_, p)| *p)
                    .sum();
                (p > 0).then_some((p, rev))
            })
            .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
            .map(|(_, rev)| rev.clone())
    }

    /// Sets the pods route `route` wants kept started per revision. Returns the revisions
    /// whose warm count changed.
    pub fn set_warm(&mut self, route: &Key, warm: &[(Key, i32)]) -> BTreeSet<Key> {
        let mut changed = BTreeSet::new();
        for (rev, by) in self.warm.iter_mut() {
            if by.contains_key(route) && !warm.iter().any(|(k, _)| k == rev) {
                by.remove(route);
                changed.insert(rev.clone());
            }
        }
        self.warm.retain(|_, by| !by.is_empty());
        for (rev, n) in warm {
            let by = self.warm.entry(rev.clone()).or_default();
            if by.insert(route.clone(), *n) != Some(*n) {
                changed.insert(rev.clone());
            }
        }
        changed
    }

    /// Pods to keep started for `rev` while a route's move waits for them.
    pub fn warm_of(&self, rev: &Key) -> i32 {
        self.warm
            .get(rev)
            .and_then(|by| by.values().max().copied())
            .unwrap_or(0)
    }

    /// Recomputes the shares the `routes` publish; returns the revisions whose shares changed.
    fn republish(&mut self, routes: &BTreeSet<Key>) -> BTreeSet<Key> {
        // The revisions these routes named before, with what they had.
        let mut before: HashMap<Key, BTreeMap<(Key, String), i32>> = HashMap::new();
        for (rev, by) in &self.shares {
            if by.keys().any(|(r, _)| routes.contains(r)) {
                before.insert(rev.clone(), by.clone());
            }
        }
        for rev in before.keys() {
            if let Some(by) = self.shares.get_mut(rev) {
                by.retain(|(r, _), _| !routes.contains(r));
            }
        }
        let mut added = BTreeSet::new();
        for route in routes {
            let Some(e) = self.routes.get(route) else {
                continue;
            };
            let owned: Vec<&String> = e
                .hosts
                .iter()
                .filter(|h| self.owner(h) == Some(route))
                .collect();
            let mut add: Vec<(Key, String, i32)> = Vec::new();
            for t in &e.traffic {
                let rev = Key::new(route.namespace.clone(), t.revision_name.clone());
                for h in &owned {
                    if t.percent > 0 {
                        add.push((rev.clone(), (*h).clone(), t.percent));
                    }
                    if let Some(tag) = &t.tag {
                        add.push((rev.clone(), tag_host(tag, h), 100));
                    }
                }
            }
            for (rev, host, p) in add {
                added.insert(rev.clone());
                *self
                    .shares
                    .entry(rev)
                    .or_default()
                    .entry((route.clone(), host))
                    .or_default() += p;
            }
        }
        self.shares.retain(|_, by| !by.is_empty());
        let empty = BTreeMap::new();
        before
            .keys()
            .cloned()
            .chain(added)
            .filter(|rev| {
                before.get(rev).unwrap_or(&empty) != self.shares.get(rev).unwrap_or(&empty)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(v: &[(&str, i32, Option<&str>)]) -> Vec<ServedTarget> {
        v.iter()
            .map(|(n, p, t)| ServedTarget {
                revision_name: (*n).into(),
                percent: *p,
                tag: t.map(Into::into),
            })
            .collect()
    }

    fn k(n: &str) -> Key {
        Key::new("apps", n)
    }

    #[test]
    fn shares_follow_the_served_traffic_and_tags() {
        let mut ix = RouteIndex::default();
        let changed = ix.upsert(
            &k("shop"),
            1,
            &["Shop.test:80".into()],
            &served(&[("v1", 90, None), ("v2", 10, Some("canary"))]),
        );
        assert!(changed.contains(&k("v1")) && changed.contains(&k("v2")));
        assert_eq!(
            ix.shares_of(&k("v1")),
            vec![HostShare {
                host: "shop.test".into(),
                percent: 90
            }]
        );
        assert_eq!(
            ix.shares_of(&k("v2")),
            vec![
                HostShare {
                    host: "canary-shop.test".into(),
                    percent: 100
                },
                HostShare {
                    host: "shop.test".into(),
                    percent: 10
                },
            ]
        );
        ix.upsert(
            &k("shop"),
            1,
            &["shop.test".into()],
            &served(&[("v1", 100, None)]),
        );
        assert!(
            ix.shares_of(&k("v2")).is_empty(),
            "a rollback takes v2's share away"
        );
        ix.remove(&k("shop"));
        assert!(ix.shares_of(&k("v1")).is_empty());
    }

    #[test]
    fn the_oldest_route_owns_a_host() {
        let mut ix = RouteIndex::default();
        ix.upsert(
            &k("a"),
            1,
            &["x.test".into()],
            &served(&[("v1", 100, None)]),
        );
        ix.upsert(
            &k("b"),
            2,
            &["x.test".into()],
            &served(&[("v2", 100, None)]),
        );
        assert_eq!(ix.owner("x.test"), Some(&k("a")));
        assert!(ix.shares_of(&k("v2")).is_empty(), "b does not own x.test");
        ix.remove(&k("a"));
        assert_eq!(ix.owner("x.test"), Some(&k("b")));
        assert_eq!(ix.shares_of(&k("v2")).len(), 1, "b owns it now");
    }

    #[test]
    fn warm_counts_are_kept_per_route() {
        let mut ix = RouteIndex::default();
        assert_eq!(
            ix.set_warm(&k("a"), &[(k("v2"), 3)]),
            BTreeSet::from([k("v2")])
        );
        assert!(ix.set_warm(&k("a"), &[(k("v2"), 3)]).is_empty());
        assert_eq!(ix.warm_of(&k("v2")), 3);
        assert_eq!(ix.set_warm(&k("a"), &[]), BTreeSet::from([k("v2")]));
        assert_eq!(ix.warm_of(&k("v2")), 0);
    }
}
