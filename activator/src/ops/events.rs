//! Kubernetes Events about Revisions: what an operator sees in `kubectl describe revision`
//! when its cold starts fail or this activator's node has no room for its pods.
//!
//! An [`EventSink`] never blocks its caller and never grows without bound:
//! - at most one event per (revision, reason) per [`EventConfig::window`] (60 s); later
//!   repeats within kube's `Recorder` cache (6 min) become a `series` count on the first event
//!   rather than new objects;
//! - it remembers at most [`EventConfig::max_keys`] (revision, reason) pairs, forgetting the
//!   oldest first (an activator may meet 100,000 revisions);
//! - at most [`EventConfig::burst`] events at once and [`EventConfig::per_second`] after that,
//!   so a node-wide failure does not write an event per revision to the API server (and keeps
//!   the `Recorder`'s own cache, which holds every event for 6 min, small);
//! - events are written by one background task through a bounded queue; when the queue is
//!   full the event is dropped (counted in [`EventSink::dropped`]). Write errors are logged.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::Revision;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use keep_serving::Locked;
use kube::Resource as _;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

/// The `reportingController` of the activator's events.
pub const REPORTING_CONTROLLER: &str = "local-activator.dev/activator";
/// Reason of the event written when a cold start fails.
pub const REASON_COLD_START_FAILED: &str = "ColdStartFailed";
/// Reason of the event written when this activator's node has no room for a revision's pod.
pub const REASON_NODE_FULL: &str = "NodeFull";
/// Reason of the event written when a member could not pull a revision's image ahead of its
/// first request.
pub const REASON_IMAGE_PULL_FAILED: &str = "ImagePullFailed";
/// The API server refuses notes longer than this (bytes).
const MAX_NOTE: usize = 1024;

/// Limits of an [`EventSink`].
#[derive(Debug, Clone)]
pub struct EventConfig {
    /// At most one event per (revision, reason) in this window.
    pub window: Duration,
    /// Most (revision, reason) pairs remembered for [`EventConfig::window`]; beyond it the
    /// oldest is forgotten (and may be reported again within its window).
    pub max_keys: usize,
    /// Events written at once after a quiet period.
    pub burst: u32,
    /// Events written per second, sustained.
    pub per_second: f64,
    /// Events waiting to be written; beyond it new events are dropped.
    pub queue: usize,
    /// Event writes in flight at once.
    pub concurrency: usize,
    /// Longest wait for one write.
    pub write_timeout: Duration,
}

impl Default for EventConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            max_keys: 10_000,
            burst: 50,
            per_second: 5.0,
            queue: 256,
            concurrency: 4,
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Publishes Warning events regarding Revisions. Cheap to clone; all clones share the limits
/// and the writer task, which ends once every clone is dropped and the queue is written.
#[derive(Clone)]
pub struct EventSink {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink")
            .field("enabled", &self.inner.is_some())
            .field("dropped", &self.dropped())
            .finish()
    }
}

struct Inner {
    tx: mpsc::Sender<Pending>,
    limits: Mutex<Limits>,
    dropped: AtomicU64,
}

struct Pending {
    event: Event,
    regarding: ObjectReference,
}

impl EventSink {
    /// A sink writing through `client` as `reportingController: local-activator.dev/activator`,
    /// `reportingInstance: <pod_name>` (the activator's pod). Spawns the writer task: call it
    /// within a Tokio runtime.
    pub fn new(client: kube::Client, pod_name: impl Into<String>, cfg: EventConfig) -> Self {
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: REPORTING_CONTROLLER.into(),
                instance: Some(pod_name.into()),
            },
        );
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        tokio::spawn(write(
            recorder,
            rx,
            cfg.concurrency.max(1),
            cfg.write_timeout,
        ));
        Self {
            inner: Some(Arc::new(Inner {
                tx,
                limits: Mutex::new(Limits::new(&cfg, Instant::now())),
                dropped: AtomicU64::new(0),
            })),
        }
    }

    /// A sink that writes nothing (no API access, tests).
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Reports a failed cold start of `rev`: reason `ColdStartFailed`, action `ColdStart`, note
    /// `<cause>: <note>`. Returns whether the event was queued (false: a duplicate within the
    /// window, over the rate, the queue full, or the sink disabled).
    pub fn cold_start_failed(&self, rev: &Revision, cause: &str, note: String) -> bool {
        self.publish(
            rev,
            Event {
                type_: EventType::Warning,
                reason: REASON_COLD_START_FAILED.into(),
                note: Some(truncate(format!("{cause}: {note}"))),
                action: "ColdStart".into(),
                secondary: None,
            },
        )
    }

    /// Reports that `node` (this activator's) has no room for a pod of `rev`: reason
    /// `NodeFull`, action `CreatePod`, the Node as the related object, `why` in the note.
    /// Returns whether the event was queued, as [`EventSink::cold_start_failed`].
    pub fn node_full(&self, rev: &Revision, node: &str, why: &str) -> bool {
        self.publish(
            rev,
            Event {
                type_: EventType::Warning,
                reason: REASON_NODE_FULL.into(),
                note: Some(truncate(format!(
                    "node {node} has no room for a pod of this revision: {why}"
                ))),
                action: "CreatePod".into(),
                secondary: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.into()),
                    ..Default::default()
                }),
            },
        )
    }

    /// Reports that this activator's node could not pull `image` for `rev` ahead of its first
    /// request: reason `ImagePullFailed`, action `PullImage`, the Node as the related object.
    /// One per (revision, image, why) per window: a revision with two bad images hears of
    /// both. Returns whether the event was queued, as [`EventSink::cold_start_failed`].
    pub fn image_pull_failed(&self, rev: &Revision, node: &str, image: &str, why: &str) -> bool {
        self.publish_keyed(
            rev,
            format!("{REASON_IMAGE_PULL_FAILED}/{image}/{why}"),
            Event {
                type_: EventType::Warning,
                reason: REASON_IMAGE_PULL_FAILED.into(),
                note: Some(truncate(format!(
                    "node {node} could not pull image {image} ahead of the first request: {why}"
                ))),
                action: "PullImage".into(),
                secondary: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.into()),
                    ..Default::default()
                }),
            },
        )
    }

    /// Events not written because the queue was full or the rate was exceeded (duplicates
    /// within the window are not counted).
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.dropped.load(Ordering::Relaxed))
    }

    fn publish(&self, rev: &Revision, event: Event) -> bool {
        let reason = event.reason.clone();
        self.publish_keyed(rev, reason, event)
    }

    /// As `publish`, limited per (revision, `limit_key`) rather than per (revision, reason).
    fn publish_keyed(&self, rev: &Revision, limit_key: String, event: Event) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        let key = Key {
            namespace: rev.metadata.namespace.clone().unwrap_or_default(),
            name: rev.metadata.name.clone().unwrap_or_default(),
            reason: limit_key,
        };
        let regarding = regarding(rev);
        let mut limits = inner.limits.locked();
        match limits.admit(&key, Instant::now()) {
            Admit::Duplicate => return false,
            Admit::OverRate => {
                drop(limits);
                inner.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(revision = %key.name, reason = %key.reason, "event over the rate: dropped");
                return false;
            }
            Admit::Yes => {}
        }
        // Under the lock, so a concurrent duplicate cannot pass while this one is undecided.
        if inner.tx.try_send(Pending { event, regarding }).is_err() {
            limits.forget(&key);
            drop(limits);
            inner.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(revision = %key.name, reason = %key.reason, "event queue full: dropped");
            return false;
        }
        true
    }
}

/// The Revision as an event's `regarding`, without its resourceVersion: the Recorder matches
/// repeats by the whole reference, and a Revision's status writes change its version.
fn regarding(rev: &Revision) -> ObjectReference {
    ObjectReference {
        api_version: Some(Revision::api_version(&()).into_owned()),
        kind: Some(Revision::kind(&()).into_owned()),
        name: rev.metadata.name.clone(),
        namespace: rev.metadata.namespace.clone(),
        uid: rev.metadata.uid.clone(),
        ..Default::default()
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_NOTE {
        let mut end = MAX_NOTE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The writer task: writes queued events, `concurrency` at a time, until every sender is gone.
async fn write(
    recorder: Recorder,
    rx: mpsc::Receiver<Pending>,
    concurrency: usize,
    timeout: Duration,
) {
    let queue =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) });
    queue
        .for_each_concurrent(concurrency, |p| {
            let recorder = &recorder;
            async move {
                let name = p.regarding.name.as_deref().unwrap_or_default();
                let ns = p.regarding.namespace.as_deref().unwrap_or_default();
                match tokio::time::timeout(timeout, recorder.publish(&p.event, &p.regarding)).await
                {
                    Ok(Ok(())) => {
                        tracing::debug!(namespace = ns, revision = name, reason = %p.event.reason, "event written")
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(namespace = ns, revision = name, reason = %p.event.reason, error = %e, "writing an event")
                    }
                    Err(_) => {
                        tracing::warn!(namespace = ns, revision = name, reason = %p.event.reason, ?timeout, "writing an event timed out")
                    }
                }
            }
        })
        .await;
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    name: String,
    reason: String,
}

#[derive(Debug, PartialEq, Eq)]
enum Admit {
    Yes,
    Duplicate,
    OverRate,
}

/// The per-key window, its memory bound, and the token bucket. Pure: time is passed in.
struct Limits {
    window: Duration,
    max_keys: usize,
    /// When each remembered key was last admitted.
    last: HashMap<Key, Instant>,
    /// Admissions in time order; an entry whose key was re-admitted or forgotten since is
    /// stale (its instant differs from `last`'s) and skipped.
    order: VecDeque<(Key, Instant)>,
    tokens: f64,
    burst: f64,
    per_second: f64,
    refilled: Instant,
}

impl Limits {
    fn new(cfg: &EventConfig, now: Instant) -> Self {
        let burst = f64::from(cfg.burst.max(1));
        Self {
            window: cfg.window,
            max_keys: cfg.max_keys.max(1),
            last: HashMap::new(),
            order: VecDeque::new(),
            tokens: burst,
            burst,
            per_second: cfg.per_second.max(0.0),
            refilled: now,
        }
    }

    fn admit(&mut self, key: &Key, now: Instant) -> Admit {
        // Forget what the window has passed: the order is by time.
        while let Some((k, t)) = self.order.front() {
            if now.saturating_duration_since(*t) < self.window {
                break;
            }
            if self.last.get(k) == Some(t) {
                self.last.remove(k);
            }
            self.order.pop_front();
        }
        if self.last.contains_key(key) {
            return Admit::Duplicate;
        }
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.refilled = now;
        if self.tokens < 1.0 {
            return Admit::OverRate;
        }
        self.tokens -= 1.0;
        while self.last.len() >= self.max_keys {
            let Some((k, t)) = self.order.pop_front() else {
                break;
            };
            if self.last.get(&k) == Some(&t) {
                self.last.remove(&k);
            }
        }
        self.last.insert(key.clone(), now);
        self.order.push_back((key.clone(), now));
        Admit::Yes
    }

    /// Undoes the admission of `key` (its event could not be queued).
    fn forget(&mut self, key: &Key) {
        self.last.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, reason: &str) -> Key {
        Key {
            namespace: "apps".into(),
            name: name.into(),
            reason: reason.into(),
        }
    }

    fn limits(window: u64, max_keys: usize, burst: u32, per_second: f64, now: Instant) -> Limits {
        Limits::new(
            &EventConfig {
                window: Duration::from_secs(window),
                max_keys,
                burst,
                per_second,
                ..EventConfig::default()
            },
            now,
        )
    }

    #[test]
    fn one_event_per_key_per_window() {
        let t0 = Instant::now();
        let mut l = limits(60, 100, 100, 100.0, t0);
        let a = key("a", REASON_NODE_FULL);
        assert_eq!(l.admit(&a, t0), Admit::Yes);
        assert_eq!(l.admit(&a, t0 + Duration::from_secs(59)), Admit::Duplicate);
        assert_eq!(
            l.admit(&key("a", REASON_COLD_START_FAILED), t0),
            Admit::Yes,
            "another reason is another key"
        );
        assert_eq!(l.admit(&key("b", REASON_NODE_FULL), t0), Admit::Yes);
        assert_eq!(l.admit(&a, t0 + Duration::from_secs(60)), Admit::Yes);
        assert_eq!(l.admit(&a, t0 + Duration::from_secs(61)), Admit::Duplicate);
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_key_goes_first() {
        let t0 = Instant::now();
        let mut l = limits(60, 3, 1000, 1000.0, t0);
        for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
            let t = t0 + Duration::from_millis(i as u64);
            assert_eq!(l.admit(&key(name, "R"), t), Admit::Yes);
        }
        assert_eq!(l.last.len(), 3);
        let t = t0 + Duration::from_millis(10);
        assert_eq!(l.admit(&key("a", "R"), t), Admit::Yes, "a was forgotten");
        assert_eq!(l.admit(&key("c", "R"), t), Admit::Duplicate);
        assert_eq!(l.admit(&key("d", "R"), t), Admit::Duplicate);
        assert!(l.order.len() <= 4);
        // Everything expires with the window.
        l.admit(&key("e", "R"), t0 + Duration::from_secs(120));
        assert_eq!(l.last.len(), 1);
        assert_eq!(l.order.len(), 1);
    }

    #[test]
    fn the_rate_is_bounded_and_refills() {
        let t0 = Instant::now();
        let mut l = limits(60, 100, 2, 1.0, t0);
        assert_eq!(l.admit(&key("a", "R"), t0), Admit::Yes);
        assert_eq!(l.admit(&key("b", "R"), t0), Admit::Yes);
        assert_eq!(l.admit(&key("c", "R"), t0), Admit::OverRate);
        assert_eq!(
            l.admit(&key("c", "R"), t0 + Duration::from_secs(1)),
            Admit::Yes,
            "an event over the rate is not remembered: it can be written later"
        );
    }

    #[test]
    fn forget_lets_the_key_through_again() {
        let t0 = Instant::now();
        let mut l = limits(60, 100, 100, 100.0, t0);
        let a = key("a", "R");
        assert_eq!(l.admit(&a, t0), Admit::Yes);
        l.forget(&a);
        assert_eq!(l.admit(&a, t0), Admit::Yes);
        assert_eq!(l.last.len(), 1);
    }

    #[test]
    fn notes_are_cut_at_a_char_boundary() {
        let s = truncate("é".repeat(1000));
        assert!(s.len() <= MAX_NOTE && s.len() >= MAX_NOTE - 1);
        assert!(s.chars().all(|c| c == 'é'));
        assert_eq!(truncate("short".into()), "short");
    }

    #[test]
    fn a_disabled_sink_writes_nothing() {
        let rev = Revision::new(
            "r",
            serde_json::from_value(serde_json::json!({"template": {}})).unwrap(),
        );
        let sink = EventSink::disabled();
        assert!(!sink.cold_start_failed(&rev, "Timeout", "no pod".into()));
        assert!(!sink.node_full(&rev, "n", "maxPods"));
        assert!(!sink.image_pull_failed(&rev, "n", "r.io/a:v1", "not found"));
        assert_eq!(sink.dropped(), 0);
    }
}
