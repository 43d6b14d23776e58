//! Ready app pods by revision, from a watch of the pods the activators create (label
//! `local-activator.dev/revision`). Pure bookkeeping, no IO: the watch (`app_pods.rs`) feeds
//! it one event at a time.
//!
//! Why the subsetter counts pods: a host moves to a newer revision (a hand-over, or a Route's
//! step) only once that revision has the pods to serve it, as many as the revision serving it
//! has now. Only counts are kept (a name and a flag a pod), never the pods.

use std::collections::{BTreeSet, HashMap};

use crate::pure::key::Key;

/// Ready pods per revision, and the revisions someone waits on.
#[derive(Default, Debug)]
pub struct ReadyPods {
    /// Revision → pod name → Ready.
    pods: HashMap<Key, HashMap<String, bool>>,
    /// Revisions whose readiness changes matter now (a hand-over or a Route step waits on
    /// them): a change of theirs is reported by [`ReadyPods::apply`].
    watched: BTreeSet<Key>,
    /// True once the watch has listed.
    synced: bool,
}

impl ReadyPods {
    /// Ready pods of `key`.
    pub fn ready(&self, key: &Key) -> u32 {
        self.pods.get(key).map_or(0, |p| {
            u32::try_from(p.values().filter(|r| **r).count()).unwrap_or(u32::MAX)
        })
    }

    /// Records `pod` of `key` as `ready` (None: gone). Returns whether a watched revision's
    /// ready count changed.
    pub fn apply(&mut self, key: &Key, pod: &str, ready: Option<bool>) -> bool {
        let before = self.ready(key);
        match ready {
            Some(r) => {
                self.pods
                    .entry(key.clone())
                    .or_default()
                    .insert(pod.to_owned(), r);
            }
            None => {
                if let Some(p) = self.pods.get_mut(key) {
                    p.remove(pod);
                    if p.is_empty() {
                        self.pods.remove(key);
                    }
                }
            }
        }
        self.watched.contains(key) && self.ready(key) != before
    }

    /// Starts a relist: what it does not show again is dropped by [`ReadyPods::relisted`].
    pub fn relist_start(&mut self) {
        self.pods.clear();
    }

    /// A relist finished: every watched revision may have changed.
    pub fn relisted(&mut self) -> Vec<Key> {
        self.synced = true;
        self.watched.iter().cloned().collect()
    }

    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Asks for `key`'s readiness changes (it waits for pods), or stops asking.
    pub fn watch(&mut self, key: &Key, on: bool) {
        if on {
            self.watched.insert(key.clone());
        } else {
            self.watched.remove(key);
        }
    }

    pub fn is_watched(&self, key: &Key) -> bool {
        self.watched.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_ready_pods_and_reports_only_watched_changes() {
        let mut r = ReadyPods::default();
        let v2 = Key::new("apps", "v2");
        assert!(!r.apply(&v2, "p1", Some(false)), "not watched");
        r.watch(&v2, true);
        assert!(r.apply(&v2, "p1", Some(true)));
        assert!(!r.apply(&v2, "p1", Some(true)), "no change");
        assert!(r.apply(&v2, "p2", Some(true)));
        assert_eq!(r.ready(&v2), 2);
        assert!(r.apply(&v2, "p1", None));
        assert_eq!(r.ready(&v2), 1);
        r.watch(&v2, false);
        assert!(!r.apply(&v2, "p2", None));
        assert_eq!(r.ready(&v2), 0);
        assert!(
            r.pods.is_empty(),
            "no entry left for a revision without pods"
        );
    }

    #[test]
    fn a_relist_drops_what_it_does_not_show() {
        let mut r = ReadyPods::default();
        let v1 = Key::new("apps", "v1");
        r.apply(&v1, "p1", Some(true));
        r.watch(&v1, true);
        r.relist_start();
        assert_eq!(r.ready(&v1), 0);
        assert_eq!(r.relisted(), vec![v1]);
        assert!(r.is_synced());
    }
}
