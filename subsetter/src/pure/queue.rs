//! The revisions waiting for a reconcile, counted for the `subsetter_reconciles_queued` gauge.
//!
//! kube-runtime's controller keeps its queue to itself (a scheduler that folds repeated
//! requests for one object into one, then a runner bounded by `--concurrency`), so the
//! subsetter counts at both ends: a revision enters when a trigger is sent to the leading
//! controller and leaves when its reconcile starts (or the controller finds no such Revision).
//! A revision triggered again before it started is one entry, as it is one reconcile in the
//! controller; triggered while its reconcile runs, it enters again, since the controller runs it
//! once more afterwards. Retries after an error wait in the controller's own timer and are not
//! counted (they come back as a reconcile start, which removes nothing).
//!
//! There is no priority in this queue: a user's new or changed Revision waits behind repairs
//! here exactly as the controller runs them; its writes take the urgent lane of the write limit
//! (`write_limit.rs`) once its reconcile runs.

use std::sync::Mutex;

use foldhash::HashSet as FastSet;
use prometheus_client::metrics::gauge::Gauge;

use crate::pure::key::Key;
use keep_serving::Locked;

/// The set of revisions waiting for a reconcile, mirrored in a gauge.
#[derive(Debug, Default)]
pub struct Queued {
    keys: Mutex<FastSet<Key>>,
    gauge: Gauge,
}

impl Queued {
    /// An empty queue that keeps `gauge` at its length.
    pub fn new(gauge: Gauge) -> Self {
        gauge.set(0);
        Self {
            keys: Mutex::default(),
            gauge,
        }
    }

    /// `key` was sent to the controller.
    pub fn entered(&self, key: Key) {
        let mut keys = self.keys.locked();
        keys.insert(key);
        self.gauge.set(keys.len() as i64);
    }

    /// `key`'s reconcile started (or the controller dropped it).
    pub fn left(&self, key: &Key) {
        let mut keys = self.keys.locked();
        if keys.remove(key) {
            self.gauge.set(keys.len() as i64);
        }
    }

    /// The controller stopped: nothing waits any more.
    pub fn clear(&self) {
        let mut keys = self.keys.locked();
        keys.clear();
        self.gauge.set(0);
    }

    pub fn len(&self) -> usize {
        self.keys.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_waiting_revision_and_the_gauge_follows() {
        let gauge = Gauge::default();
        let q = Queued::new(gauge.clone());
        let a = Key::new("ns", "a");
        let b = Key::new("ns", "b");
        q.entered(a.clone());
        q.entered(a.clone());
        q.entered(b.clone());
        assert_eq!((q.len(), gauge.get()), (2, 2));
        q.left(&a);
        assert_eq!((q.len(), gauge.get()), (1, 1));
        // A reconcile that was not queued (a retry) removes nothing.
        q.left(&a);
        assert_eq!((q.len(), gauge.get()), (1, 1));
        // Triggered again while it runs: it waits again.
        q.entered(a.clone());
        assert_eq!(gauge.get(), 2);
        q.clear();
        assert_eq!((q.len(), gauge.get()), (0, 0));
        assert!(q.is_empty());
    }
}
