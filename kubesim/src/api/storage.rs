//! The storage model: what a real API server's etcd adds to a request.
//!
//! A real API server answers a watch, and a GET or LIST that names a `resourceVersion`, from
//! its watch cache in memory. Every write is an etcd commit, and a GET or LIST without a
//! `resourceVersion` is a quorum read that etcd answers in order with the commits. Measured on
//! this project's machine (docs/load-testing.md, "The storage model"), a burst of writes makes
//! both wait in line: the model gives the storage a number of lanes, and each write or quorum
//! read holds one for its sampled time, in arrival order. Reads from the cache never wait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::delay::Delay;

/// What one request asks of the storage and of the server itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A watch: no delay (its events are the writes').
    Watch,
    /// A GET or LIST with a `resourceVersion` (e.g. `0`): the watch cache.
    CachedRead,
    /// A GET or LIST without one: etcd, in line with the writes.
    QuorumRead,
    /// create, update, patch, delete: an etcd commit.
    Write,
}

impl Access {
    /// How a request of `verb` with `resourceVersion` = `rv` (empty when absent) is served.
    pub fn of(verb: &str, rv: &str) -> Self {
        match verb {
            "watch" => Access::Watch,
            "get" | "list" if rv.is_empty() => Access::QuorumRead,
            "get" | "list" => Access::CachedRead,
            _ => Access::Write,
        }
    }
}

/// The storage's lanes and the time each kind of access holds one.
pub(crate) struct Storage {
    /// `None`: unbounded, each access waits only its own time (no queueing).
    lanes: Option<Arc<Semaphore>>,
    pub write: Mutex<Delay>,
    pub quorum_read: Mutex<Delay>,
}

impl Storage {
    pub fn new(lanes: Option<usize>, write: Delay, quorum_read: Delay) -> Self {
        Self {
            lanes: lanes.map(|n| Arc::new(Semaphore::new(n.max(1)))),
            write: Mutex::new(write),
            quorum_read: Mutex::new(quorum_read),
        }
    }

    /// Waits for a lane (in arrival order) and holds it for `access`'s sampled time.
    pub async fn serve(&self, access: Access) {
        let model = match access {
            Access::Write => &self.write,
            Access::QuorumRead => &self.quorum_read,
            Access::Watch | Access::CachedRead => return,
        };
        let held = model.lock().unwrap_or_else(|e| e.into_inner()).sample_now();
        if held.is_zero() && self.lanes.is_none() {
            return;
        }
        let _lane = match &self.lanes {
            // The semaphore is never closed.
            Some(s) => s.acquire().await.ok(),
            None => None,
        };
        sleep_unless_zero(held).await;
    }
}

async fn sleep_unless_zero(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_naming_a_resource_version_come_from_the_cache() {
        assert_eq!(Access::of("get", ""), Access::QuorumRead);
        assert_eq!(Access::of("list", ""), Access::QuorumRead);
        assert_eq!(Access::of("get", "0"), Access::CachedRead);
        assert_eq!(Access::of("list", "12345"), Access::CachedRead);
        assert_eq!(Access::of("watch", ""), Access::Watch);
        for w in ["create", "update", "patch", "delete", "deletecollection"] {
            assert_eq!(Access::of(w, ""), Access::Write);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_lane_serves_in_arrival_order_and_a_read_waits_behind_writes() {
        let s = Arc::new(Storage::new(
            Some(1),
            Delay::fixed_ms(10),
            Delay::fixed_ms(1),
        ));
        let t0 = tokio::time::Instant::now();
        let writes: Vec<_> = (0..5)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { s.serve(Access::Write).await })
            })
            .collect();
        // Let the writes queue first.
        tokio::task::yield_now().await;
        let ((), cached) = tokio::join!(s.serve(Access::QuorumRead), async {
            s.serve(Access::CachedRead).await;
            t0.elapsed()
        });
        let read_done = t0.elapsed();
        for w in writes {
            w.await.unwrap();
        }
        assert_eq!(cached, Duration::ZERO, "the cache does not wait for etcd");
        assert_eq!(
            read_done,
            Duration::from_millis(51),
            "5 writes of 10 ms, then 1 ms"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_lanes_nothing_waits_for_another() {
        let s = Arc::new(Storage::new(None, Delay::fixed_ms(10), Delay::fixed_ms(1)));
        let t0 = tokio::time::Instant::now();
        let all: Vec<_> = (0..5)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { s.serve(Access::Write).await })
            })
            .collect();
        for w in all {
            w.await.unwrap();
        }
        assert_eq!(t0.elapsed(), Duration::from_millis(10));
    }
}
