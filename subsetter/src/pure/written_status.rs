//! The Revision statuses this controller wrote that the Revision watch has not shown yet.
//!
//! A new revision's reconcile writes its subset, then the Revision's status. The subset's own
//! watch events trigger the next reconciles at once, often before the Revision watch shows the
//! status just written: planned from the cached Revision, that status looks unwritten and was
//! written again (1.5 Revision status writes per new revision in a burst of 60, measured by
//! `tests/writes.rs`; at 100,000 revisions, 50,000 writes an etcd commits for nothing). Each
//! write is remembered with the resourceVersion it was made over and the one it made; while a
//! reconcile plans from the version it was made over, the same status is not written again.
//! A reconcile plans from the Revision as it was when it started, so the entry outlives the
//! watch showing the write; it goes when the watch shows a third version (someone else's
//! write) or the Revision is deleted. Versions are kept as hashes (they are opaque strings):
//! an entry is a few dozen bytes besides its key.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::pure::key::Key;

/// What was written over which version, and the version it made (hashes: this holds an
/// entry per revision, and at 100,000 revisions every byte counts).
struct Written {
    over: u64,
    made: u64,
    fingerprint: u64,
}

#[derive(Default)]
pub struct WrittenStatuses {
    by_key: HashMap<Key, Written>,
}

impl WrittenStatuses {
    /// Whether writing `conditions` at `generation` for `key`, planned from the Revision at
    /// `rv`, repeats the write last made over that same version. `lastTransitionTime` is left
    /// out: planned from a copy without the written conditions, it is "now" again.
    pub fn repeats(
        &self,
        key: &Key,
        rv: Option<&str>,
        generation: Option<i64>,
        conditions: &[Condition],
    ) -> bool {
        self.by_key.get(key).is_some_and(|w| {
            w.over == version(rv) && w.fingerprint == fingerprint(generation, conditions)
        })
    }

    /// `conditions` at `generation` were written for `key` over version `over`, making `made`.
    pub fn wrote(
        &mut self,
        key: Key,
        over: Option<&str>,
        made: Option<&str>,
        generation: Option<i64>,
        conditions: &[Condition],
    ) {
        let w = Written {
            over: version(over),
            made: version(made),
            fingerprint: fingerprint(generation, conditions),
        };
        self.by_key.insert(key, w);
    }

    /// The watch shows `key` at `rv`: a version neither written over nor made by the last
    /// write is someone else's, and what was written is planned afresh from it.
    pub fn seen(&mut self, key: &Key, rv: Option<&str>) {
        let v = version(rv);
        if self
            .by_key
            .get(key)
            .is_some_and(|w| w.over != v && w.made != v)
        {
            self.by_key.remove(key);
        }
    }

    /// `key` is gone, or what was written for it is in doubt (a failed reconcile).
    pub fn forget(&mut self, key: &Key) {
        self.by_key.remove(key);
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

fn version(rv: Option<&str>) -> u64 {
    let mut h = DefaultHasher::new();
    rv.hash(&mut h);
    h.finish()
}

fn fingerprint(generation: Option<i64>, conditions: &[Condition]) -> u64 {
    let mut h = DefaultHasher::new();
    generation.hash(&mut h);
    for c in conditions {
        (
            &c.type_,
            &c.status,
            &c.reason,
            &c.message,
            c.observed_generation,
        )
            .hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn ready(status: &str, at: i64) -> Vec<Condition> {
        vec![Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: "Assigned".into(),
            message: "2 members".into(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::from_second(at).unwrap()),
        }]
    }

    fn key() -> Key {
        Key::new("ns", "r")
    }

    #[test]
    fn the_same_status_over_the_same_version_is_a_repeat_whatever_its_transition_time() {
        let mut w = WrittenStatuses::default();
        assert!(!w.repeats(&key(), Some("5"), Some(1), &ready("True", 10)));
        w.wrote(key(), Some("5"), Some("6"), Some(1), &ready("True", 10));
        assert!(w.repeats(&key(), Some("5"), Some(1), &ready("True", 99)));
        // Another status, generation, or version: written.
        assert!(!w.repeats(&key(), Some("5"), Some(1), &ready("False", 10)));
        assert!(!w.repeats(&key(), Some("5"), Some(2), &ready("True", 10)));
        assert!(!w.repeats(&key(), Some("6"), Some(1), &ready("True", 10)));
        assert!(!w.repeats(
            &Key::new("ns", "other"),
            Some("5"),
            Some(1),
            &ready("True", 10)
        ));
    }

    #[test]
    fn the_entry_outlives_the_watch_showing_the_write_and_goes_with_a_third_version() {
        let mut w = WrittenStatuses::default();
        w.wrote(key(), Some("5"), Some("6"), Some(1), &ready("True", 10));
        w.seen(&key(), Some("5"));
        w.seen(&key(), Some("6"));
        // A reconcile that started from version 5 before the watch showed 6.
        assert!(w.repeats(&key(), Some("5"), Some(1), &ready("True", 10)));
        w.seen(&key(), Some("9"));
        assert!(w.is_empty(), "someone else's write: planned afresh");
        w.wrote(key(), Some("9"), Some("10"), Some(1), &ready("True", 10));
        w.forget(&key());
        assert!(!w.repeats(&key(), Some("9"), Some(1), &ready("True", 10)));
    }
}
