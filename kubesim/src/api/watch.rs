//! Watches: events serialized once and shared, a watcher and what it is scoped to, and the
//! selector transition semantics of the real watch cache (stops matching -> DELETED, starts
//! matching -> ADDED). Which watchers an event is offered to, and what happens when one cannot
//! take it, is [`super::dispatch`]; a watcher's own buffers are [`super::cache_watcher`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;

use super::meta;
use super::selector::{FieldSelector, LabelSelector};
use super::store::Stored;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvType {
    Added,
    Modified,
    Deleted,
}

/// One change. For `Deleted`, `new` is the object's last content at the deletion's
/// resourceVersion.
pub(crate) struct Event {
    pub rv: u64,
    /// When the cache recorded it (the window's resizing reads it).
    pub at: Instant,
    pub ty: EvType,
    pub old: Option<Stored>,
    pub new: Stored,
    added: OnceLock<Bytes>,
    modified: OnceLock<Bytes>,
    deleted: OnceLock<Bytes>,
}

pub(crate) fn event_line(ty: &str, obj_json: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(obj_json.len() + 32);
    b.put_slice(b"{\"type\":\"");
    b.put_slice(ty.as_bytes());
    b.put_slice(b"\",\"object\":");
    b.put_slice(obj_json);
    b.put_slice(b"}\n");
    b.freeze()
}

/// The object as `PartialObjectMetadata` (for `Accept: ...;as=PartialObjectMetadata`).
pub(crate) fn partial_metadata(s: &Stored) -> Value {
    // The view leaves managedFields out; a metadata-only answer has them. Only `metadata` is
    // built from the JSON (serde skips the rest without building it).
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default)]
        metadata: Option<Value>,
    }
    let metadata = serde_json::from_slice::<Meta>(&s.json)
        .ok()
        .and_then(|m| m.metadata)
        .unwrap_or(json!({}));
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
    })
}

impl Event {
    pub fn new(rv: u64, ty: EvType, old: Option<Stored>, new: Stored) -> Self {
        Self {
            rv,
            at: Instant::now(),
            ty,
            old,
            new,
            added: OnceLock::new(),
            modified: OnceLock::new(),
            deleted: OnceLock::new(),
        }
    }

    fn added(&self) -> Bytes {
        self.added
            .get_or_init(|| event_line("ADDED", &self.new.json))
            .clone()
    }
    fn modified(&self) -> Bytes {
        self.modified
            .get_or_init(|| event_line("MODIFIED", &self.new.json))
            .clone()
    }
    fn deleted(&self) -> Bytes {
        self.deleted
            .get_or_init(|| match (self.ty, &self.old) {
                (EvType::Modified, Some(old)) => {
                    let v = meta::with_rv(&old.full(), self.rv);
                    event_line("DELETED", &serde_json::to_vec(&v).unwrap_or_default())
                }
                _ => event_line("DELETED", &self.new.json),
            })
            .clone()
    }

    /// What this event means to a watcher, if anything.
    pub fn line_for(&self, w: &Watcher) -> Option<Bytes> {
        let (ty, obj_for_meta): (EvType, &Stored) = match self.ty {
            EvType::Added => (
                w.matches(&self.new.view).then_some(EvType::Added)?,
                &self.new,
            ),
            EvType::Deleted => (
                w.matches(&self.new.view).then_some(EvType::Deleted)?,
                &self.new,
            ),
            EvType::Modified => {
                let was = self.old.as_ref().is_some_and(|o| w.matches(&o.view));
                let is = w.matches(&self.new.view);
                match (was, is) {
                    (true, true) => (EvType::Modified, &self.new),
                    (false, true) => (EvType::Added, &self.new),
                    (true, false) => (EvType::Deleted, self.old.as_ref().expect("old")),
                    (false, false) => return None,
                }
            }
        };
        if w.meta_only {
            let mut v = partial_metadata(obj_for_meta);
            meta::meta_mut(&mut v)
                .insert("resourceVersion".into(), Value::String(self.rv.to_string()));
            let name = match ty {
                EvType::Added => "ADDED",
                EvType::Modified => "MODIFIED",
                EvType::Deleted => "DELETED",
            };
            return Some(event_line(
                name,
                &serde_json::to_vec(&v).unwrap_or_default(),
            ));
        }
        Some(match ty {
            EvType::Added => self.added(),
            EvType::Modified => self.modified(),
            EvType::Deleted => self.deleted(),
        })
    }
}

/// Per-watch accounting, kept after the watch ends.
#[derive(Debug)]
pub struct WatchStat {
    pub id: u64,
    pub resource: String,
    pub namespace: Option<String>,
    pub label_selector: String,
    pub field_selector: String,
    pub events: AtomicU64,
    pub open: AtomicBool,
}

/// What a watcher's input buffer holds: events as the cache dispatched them (its selectors
/// are applied when it takes them out), and BOOKMARK lines.
pub(crate) enum Input {
    Event(Arc<Event>),
    Line(Bytes),
}

/// What a watch is limited to by the request's path or an exact `metadata.namespace=` /
/// `metadata.name=` field selector ("" for any), as the real cacher's `namespacedName` scope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Scope {
    pub namespace: String,
    pub name: String,
}

pub(crate) struct Watcher {
    pub id: u64,
    pub namespace: Option<String>,
    pub label: Option<LabelSelector>,
    pub field: Option<FieldSelector>,
    /// `spec.nodeName` value this watcher requires (pods' indexed trigger), if any.
    pub node: Option<String>,
    pub scope: Scope,
    /// The input buffer: the dispatcher puts events in, the watcher's own task takes them out.
    pub input: Sender<Input>,
    /// Cancelled when the watch ends (client gone, timeout, forced close, shutdown).
    pub done: CancellationToken,
    /// Events at or below this resourceVersion were already sent as the watch's start.
    pub start_rv: u64,
    /// How the real server names it in its log (`key`, `labels`, `fields`).
    pub identifier: String,
    /// When this watch gets its next BOOKMARK (None: no bookmarks, or none left before its
    /// deadline). Only with `allowWatchBookmarks`.
    pub next_bookmark: std::sync::Mutex<Option<Instant>>,
    /// When the watch ends (`timeoutSeconds`, or the server's default).
    pub deadline: Instant,
    pub meta_only: bool,
    pub stat: Arc<WatchStat>,
}

impl Watcher {
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && meta::namespace_of(obj) != ns
        {
            return false;
        }
        if let Some(n) = &self.node
            && node_name(obj) != n
        {
            return false;
        }
        if let Some(l) = &self.label {
            let labels = meta::meta(obj)
                .and_then(|m| m.get("labels"))
                .and_then(Value::as_object);
            if !l.matches(labels) {
                return false;
            }
        }
        self.field.as_ref().is_none_or(|f| f.matches(obj))
    }

    /// Ends the watch where it is: its task stops taking input, and the client gets what was
    /// already in its result buffer, then the end of the stream.
    pub fn stop(&self) {
        self.stat.open.store(false, Ordering::Relaxed);
        self.done.cancel();
    }
}

pub(crate) fn node_name(obj: &Value) -> &str {
    obj.get("spec")
        .and_then(|s| s.get("nodeName"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The value of a `spec.nodeName=X` (or `==`) term of a raw field selector.
pub(crate) fn node_term(raw: &str) -> Option<String> {
    exact_term(raw, "spec.nodeName")
}

/// The value of a `<field>=X` (or `==`) term of a raw field selector (`RequiresExactMatch`).
pub(crate) fn exact_term(raw: &str, field: &str) -> Option<String> {
    raw.split(',').find_map(|t| {
        let t = t.trim();
        let rest = t.strip_prefix(field)?;
        let v = rest.strip_prefix("==").or_else(|| rest.strip_prefix('='))?;
        Some(v.trim().to_string())
    })
}

/// A `BOOKMARK` line for a resource at a resourceVersion.
/// When a watch that asked for bookmarks gets its next one, as kube-apiserver's watch cache
/// decides (`cacheWatcher.nextBookmarkTime`): `every` after `now`, but 2 s before the watch's
/// deadline if that is sooner, and none once that moment has passed.
pub(crate) fn next_bookmark(now: Instant, every: Duration, deadline: Instant) -> Option<Instant> {
    let heartbeat = now + every;
    let pre_timeout = deadline
        .checked_sub(Duration::from_secs(2))
        .unwrap_or(deadline);
    let at = heartbeat.min(pre_timeout);
    (at >= now).then_some(at)
}

pub(crate) fn bookmark_line(api_version: &str, kind: &str, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let v = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
    event_line("BOOKMARK", &serde_json::to_vec(&v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookmarks_come_every_interval_and_once_just_before_the_deadline() {
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        // A long watch: a minute from now.
        let far = t0 + Duration::from_secs(1800);
        assert_eq!(next_bookmark(t0, minute, far), Some(t0 + minute));
        // A watch ending in 10 s: 2 s before its end, not a minute later.
        let soon = t0 + Duration::from_secs(10);
        assert_eq!(
            next_bookmark(t0, minute, soon),
            Some(t0 + Duration::from_secs(8))
        );
        // After that last one, none.
        assert_eq!(
            next_bookmark(t0 + Duration::from_secs(9), minute, soon),
            None
        );
    }

    #[test]
    fn node_terms() {
        assert_eq!(node_term("spec.nodeName=n1"), Some("n1".into()));
        assert_eq!(
            node_term("status.phase=Running,spec.nodeName==n2"),
            Some("n2".into())
        );
        assert_eq!(node_term("spec.nodeName!=n1"), None);
        assert_eq!(node_term("metadata.name=a"), None);
        assert_eq!(
            exact_term("metadata.name=a,x=y", "metadata.name"),
            Some("a".into())
        );
        assert_eq!(exact_term("metadata.namespace=a", "metadata.name"), None);
    }

    #[test]
    fn lines() {
        let l = event_line("ADDED", b"{\"a\":1}");
        let v: Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v, json!({"type": "ADDED", "object": {"a": 1}}));
        assert!(l.ends_with(b"\n"));
        let b = bookmark_line("v1", "Pod", 7, true);
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "7");
        assert_eq!(
            v["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }
}
