//! Who is streaming which node's memberships, and handing each change to those it concerns:
//! O(members) per write, where the API server's member-label watches cost O(activators)
//! (`crds::member_stream`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use crds::ActivationEndpoints;
use crds::member_stream::Frame;
use keep_serving::Locked;
use tokio::sync::{mpsc, watch};

use crate::cluster::metrics::Metrics;

/// Frames a stream may have queued before it is taken for a reader that fell behind (it
/// resumes from its version, at the price of a delta sync).
pub const QUEUE: usize = 1024;

/// A change to pass on: the version it was made at and its line.
pub type Queued = (u64, Bytes);

struct Sub {
    id: u64,
    tx: mpsc::Sender<Queued>,
}

/// The streams open on this replica, by the member label of their node.
pub struct MemberHub {
    subs: Mutex<HashMap<Arc<str>, Vec<Sub>>>,
    next_id: AtomicU64,
    /// The newest version the ActivationEndpoints watch has shown (0: none yet). Moved on
    /// after the changes up to it were handed out, so a bookmark at it never runs ahead of a
    /// queued change.
    version: watch::Sender<u64>,
    /// Subscriptions alive (a stream whose reader went stays until its server notices).
    alive: watch::Sender<usize>,
    metrics: Arc<Metrics>,
}

/// A stream's place in the hub; leaving it (drop) takes the stream out.
pub struct Subscription {
    hub: Arc<MemberHub>,
    label: Arc<str>,
    id: u64,
    pub rx: mpsc::Receiver<Queued>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut subs = self.hub.subs.locked();
        if let Some(v) = subs.get_mut(&self.label) {
            v.retain(|s| s.id != self.id);
            if v.is_empty() {
                subs.remove(&self.label);
            }
        }
        self.hub.metrics.member_streams.dec();
        self.hub.alive.send_modify(|n| *n -= 1);
    }
}

impl MemberHub {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            subs: Mutex::default(),
            next_id: AtomicU64::new(0),
            version: watch::Sender::new(0),
            alive: watch::Sender::new(0),
            metrics,
        })
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        self.subs.locked().values().map(Vec::len).sum()
    }

    /// The member labels of the nodes with a stream open here now.
    pub fn labels(&self) -> Vec<String> {
        self.subs.locked().keys().map(|l| l.to_string()).collect()
    }

    /// A new stream of the node whose member label is `label`. Taken before its first state is
    /// read, so no change made after that read is missed.
    pub fn subscribe(self: &Arc<Self>, label: &str) -> Subscription {
        let (tx, rx) = mpsc::channel(QUEUE);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let label: Arc<str> = Arc::from(label);
        self.subs
            .locked()
            .entry(label.clone())
            .or_default()
            .push(Sub { id, tx });
        self.metrics.member_streams.inc();
        self.alive.send_modify(|n| *n += 1);
        Subscription {
            hub: Arc::clone(self),
            label,
            id,
            rx,
        }
    }

    /// Waits until at most `n` subscriptions are alive.
    pub async fn alive_at_most(&self, n: usize) {
        let _ = self.alive.subscribe().wait_for(|a| *a <= n).await;
    }

    /// The newest version handed out.
    pub fn version(&self) -> u64 {
        *self.version.borrow()
    }

    /// Waits until the version is at least `v`; false if `limit` passes first.
    pub async fn reached(&self, v: u64, limit: std::time::Duration) -> bool {
        let mut rx = self.version.subscribe();
        matches!(
            tokio::time::timeout(limit, rx.wait_for(|now| *now >= v)).await,
            Ok(Ok(_))
        )
    }

    /// The watch showed every change up to `v`.
    pub fn advance(&self, v: u64) {
        self.version.send_if_modified(|now| {
            let moved = v > *now;
            if moved {
                *now = v;
            }
            moved
        });
    }

    /// One subset changed at `rv`: `object` (None: deleted) now lists the nodes of `now`;
    /// before, those of `before`. Each stream of a node in `now` gets the object, each of a
    /// node only in `before` a [`Frame::Left`]. A stream whose queue is full is closed.
    pub fn changed(
        &self,
        rv: u64,
        key: &crds::ObjectKey,
        object: Option<&ActivationEndpoints>,
        before: &[Arc<str>],
        now: &[Arc<str>],
    ) {
        let mut subs = self.subs.locked();
        if subs.is_empty() {
            return;
        }
        let mut apply: Option<Bytes> = None;
        let mut left: Option<Bytes> = None;
        let was_only = before.iter().filter(|l| !now.contains(l));
        let labels = now
            .iter()
            .map(|l| (l, true))
            .chain(was_only.map(|l| (l, false)));
        for (label, is_member) in labels {
            let Some(list) = subs.get_mut(&**label) else {
                continue;
            };
            let line = if is_member {
                let Some(o) = object else { continue };
                apply
                    .get_or_insert_with(|| {
                        Bytes::from(
                            Frame::Apply {
                                object: Box::new(o.clone()),
                            }
                            .line(),
                        )
                    })
                    .clone()
            } else {
                left.get_or_insert_with(|| {
                    Bytes::from(
                        Frame::Left {
                            namespace: key.namespace.clone(),
                            name: key.name.clone(),
                            resource_version: rv.to_string(),
                        }
                        .line(),
                    )
                })
                .clone()
            };
            self.send(list, rv, &line);
            if list.is_empty() {
                subs.remove(&**label);
            }
        }
    }

    /// Subsets carrying these host labels changed at `rv`: every stream is told (a host move
    /// is rare beside membership changes, and the labels are hashes, not the hosts).
    pub fn hosts_changed(&self, rv: u64, labels: Vec<String>) {
        let line = Bytes::from(
            Frame::Hosts {
                resource_version: rv.to_string(),
                labels,
            }
            .line(),
        );
        let mut subs = self.subs.locked();
        subs.retain(|_, list| {
            self.send(list, rv, &line);
            !list.is_empty()
        });
    }

    /// Closes every stream (their readers resume from their versions, on this replica or
    /// another): after a relist, whose changes were never seen one by one.
    pub fn close_all(&self) {
        self.subs.locked().clear();
    }

    /// A stream request was refused.
    pub fn refused(&self) {
        self.metrics.member_streams_refused.inc();
    }

    /// A chunk was sent on a stream.
    pub fn sent(&self) {
        self.metrics.member_stream_frames.inc();
    }

    fn send(&self, list: &mut Vec<Sub>, rv: u64, line: &Bytes) {
        list.retain(|s| match s.tx.try_send((rv, line.clone())) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.metrics.member_streams_dropped_slow.inc();
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ae(name: &str, rv: &str) -> ActivationEndpoints {
        let mut a = ActivationEndpoints::new(name, Default::default());
        a.metadata.namespace = Some("ns".into());
        a.metadata.resource_version = Some(rv.into());
        a
    }

    #[tokio::test]
    async fn a_change_reaches_the_streams_of_its_nodes_only() {
        let hub = MemberHub::new(Arc::default());
        let (l1, l2, l3): (Arc<str>, Arc<str>, Arc<str>) =
            ("m/1".into(), "m/2".into(), "m/3".into());
        let mut s1 = hub.subscribe(&l1);
        let mut s2 = hub.subscribe(&l2);
        let mut s3 = hub.subscribe(&l3);
        assert_eq!(hub.streams(), 3);
        let key = crds::ObjectKey::new("ns", "a");
        hub.changed(
            5,
            &key,
            Some(&ae("a", "5")),
            std::slice::from_ref(&l2),
            std::slice::from_ref(&l1),
        );
        let (rv, line) = s1.rx.try_recv().expect("member told");
        assert_eq!(rv, 5);
        assert!(line.starts_with(br#"{"type":"APPLY""#));
        let (_, line) = s2.rx.try_recv().expect("former member told");
        assert!(line.starts_with(br#"{"type":"LEFT""#));
        assert!(s3.rx.try_recv().is_err(), "not concerned");
        drop(s3);
        assert_eq!(hub.streams(), 2);
        let mut labels = hub.labels();
        labels.sort();
        assert_eq!(labels, ["m/1", "m/2"], "a stream gone leaves the labels");
        hub.hosts_changed(6, vec!["h/x".into()]);
        assert!(
            s1.rx
                .try_recv()
                .unwrap()
                .1
                .starts_with(br#"{"type":"HOSTS""#)
        );
        assert!(
            s2.rx
                .try_recv()
                .unwrap()
                .1
                .starts_with(br#"{"type":"HOSTS""#)
        );
    }

    #[tokio::test]
    async fn a_reader_that_falls_behind_is_closed_not_waited_for() {
        let metrics: Arc<Metrics> = Arc::default();
        let hub = MemberHub::new(metrics.clone());
        let label: Arc<str> = "m/1".into();
        let mut slow = hub.subscribe(&label);
        let key = crds::ObjectKey::new("ns", "a");
        for rv in 1..=(QUEUE as u64 + 1) {
            hub.changed(
                rv,
                &key,
                Some(&ae("a", &rv.to_string())),
                &[],
                std::slice::from_ref(&label),
            );
        }
        assert_eq!(hub.streams(), 0);
        assert_eq!(metrics.member_streams_dropped_slow.get(), 1);
        let mut n = 0;
        while slow.rx.recv().await.is_some() {
            n += 1;
        }
        assert_eq!(n, QUEUE, "what was queued is read, then the stream ends");
    }

    #[tokio::test]
    async fn the_version_only_moves_on() {
        let hub = MemberHub::new(Arc::default());
        hub.advance(7);
        hub.advance(3);
        assert_eq!(hub.version(), 7);
        assert!(hub.reached(7, std::time::Duration::ZERO).await);
        assert!(!hub.reached(8, std::time::Duration::from_millis(1)).await);
    }
}
