//! The watch cache's dispatch, as kube-apiserver v1.28.7 does it
//! (`staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go`):
//!
//! - Which watchers an event is offered to (`startDispatching`, cacher.go:1088-1158): those
//!   scoped to the object's namespace and name, its namespace, its name, and every unscoped
//!   one; plus, for pods (the only resource here with an indexed trigger, `spec.nodeName`),
//!   the watchers of the object's node (old and new). A label selector narrows nothing here:
//!   a label-selected watch of a custom resource is offered every event of the resource, and
//!   its selector is applied when its own task takes the event out of its input buffer.
//! - How (`dispatchEvent`, cacher.go:1001-1068, and `cacheWatcher.add`,
//!   cache_watcher.go:165-233): each watcher's input buffer gets the event without waiting if
//!   it has room; for the ones that are full, the resource's [`TimeBudget`] is taken whole and
//!   each blocked watcher is waited for until that shared deadline; one still full then is
//!   closed ("Forcing ... watcher close due to unresponsiveness") and counted in
//!   `apiserver_terminated_watchers_total`; once the deadline has passed, the remaining
//!   blocked ones are closed without waiting. The time not spent goes back to the budget.
//!
//! Dispatch runs in its own task per resource, fed in commit order (the real cacher's
//! `incoming` channel and `dispatchEvents` goroutine), so a slow watcher delays the other
//! watchers of its resource by at most the budget, and never a write.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc::{self, error::TrySendError};

use super::cache_counters::ResourceCounters;
use super::meta;
use super::time_budget::TimeBudget;
use super::watch::{Event, Input, Scope, Watcher, next_bookmark, node_name};

/// The watchers of one resource, indexed as the real cacher indexes them
/// (`indexedWatchers`: `allWatchers` by scope, `valueWatchers` by trigger value).
#[derive(Default)]
pub(crate) struct WatcherSet {
    all: HashMap<u64, Arc<Watcher>>,
    by_scope: HashMap<Scope, HashSet<u64>>,
    by_trigger: HashMap<String, HashSet<u64>>,
}

fn drop_from<K: std::hash::Hash + Eq>(m: &mut HashMap<K, HashSet<u64>>, k: &K, id: u64) {
    if let Some(s) = m.get_mut(k) {
        s.remove(&id);
        if s.is_empty() {
            m.remove(k);
        }
    }
}

impl WatcherSet {
    pub fn add(&mut self, w: Arc<Watcher>) {
        let id = w.id;
        match &w.node {
            Some(n) => self.by_trigger.entry(n.clone()).or_default().insert(id),
            None => self.by_scope.entry(w.scope.clone()).or_default().insert(id),
        };
        self.all.insert(id, w);
    }

    /// Forgets a watcher and ends its watch.
    pub fn remove(&mut self, id: u64) {
        let Some(w) = self.all.remove(&id) else {
            return;
        };
        w.stop();
        match &w.node {
            Some(n) => drop_from(&mut self.by_trigger, n, id),
            None => drop_from(&mut self.by_scope, &w.scope, id),
        }
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    fn ids<K: std::hash::Hash + Eq>(
        &self,
        m: &HashMap<K, HashSet<u64>>,
        k: &K,
        out: &mut Vec<Arc<Watcher>>,
    ) {
        if let Some(s) = m.get(k) {
            out.extend(s.iter().filter_map(|id| self.all.get(id).cloned()));
        }
    }

    /// The watchers `startDispatching` offers an event to. `indexed`: the resource has an
    /// indexed trigger (pods).
    pub fn candidates(&self, ev: &Event, indexed: bool) -> Vec<Arc<Watcher>> {
        let mut out = Vec::new();
        let obj = &*ev.new.view;
        let namespace = meta::namespace_of(obj).to_string();
        let name = meta::meta_str(obj, "name").unwrap_or("").to_string();
        let scope = |namespace: &str, name: &str| Scope {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        if !namespace.is_empty() {
            if !name.is_empty() {
                self.ids(&self.by_scope, &scope(&namespace, &name), &mut out);
            }
            self.ids(&self.by_scope, &scope(&namespace, ""), &mut out);
        }
        if !name.is_empty() {
            self.ids(&self.by_scope, &scope("", &name), &mut out);
        }
        self.ids(&self.by_scope, &Scope::default(), &mut out);
        if indexed {
            let new = node_name(obj).to_string();
            self.ids(&self.by_trigger, &new, &mut out);
            if let Some(old) = ev.old.as_ref().map(|o| node_name(&o.view))
                && old != new
            {
                self.ids(&self.by_trigger, &old.to_string(), &mut out);
            }
        } else {
            out.extend(
                self.by_trigger
                    .values()
                    .flatten()
                    .filter_map(|id| self.all.get(id).cloned()),
            );
        }
        out
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Watcher>> {
        self.all.values()
    }

    /// Ends every watch (the resource went away or the server stops).
    pub fn close_all(&mut self) {
        let ids: Vec<u64> = self.all.keys().copied().collect();
        for id in ids {
            self.remove(id);
        }
    }
}

/// What the dispatcher is fed, in commit order.
pub(crate) enum Dispatch {
    Event(Arc<Event>),
    /// A BOOKMARK at the current resourceVersion, for the watchers whose bookmark is due.
    Bookmark(Bytes),
}

struct Shared {
    set: Mutex<WatcherSet>,
    budget: Mutex<TimeBudget>,
    counters: Arc<ResourceCounters>,
    /// The resource has an indexed trigger (pods by `spec.nodeName`).
    indexed: bool,
    resource: String,
    bookmark_interval: Duration,
}

/// One resource's watchers and the task that dispatches its events to them.
pub(crate) struct Dispatcher {
    shared: Arc<Shared>,
    queue: Option<mpsc::UnboundedSender<Dispatch>>,
}

/// How a resource's dispatcher is set up.
pub(crate) struct DispatcherSetup {
    pub resource: String,
    pub indexed: bool,
    pub budget: TimeBudget,
    pub counters: Arc<ResourceCounters>,
    pub bookmark_interval: Duration,
}

impl Dispatcher {
    /// Starts the resource's dispatch task (on the current tokio runtime; without one, as in
    /// a unit test of the store, events are offered to no one).
    pub fn new(s: DispatcherSetup) -> Self {
        let shared = Arc::new(Shared {
            set: Mutex::new(WatcherSet::default()),
            budget: Mutex::new(s.budget),
            counters: s.counters,
            indexed: s.indexed,
            resource: s.resource,
            bookmark_interval: s.bookmark_interval,
        });
        let queue = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let (tx, rx) = mpsc::unbounded_channel();
            rt.spawn(run(shared.clone(), rx));
            tx
        });
        Self { shared, queue }
    }

    pub fn watchers(&self) -> MutexGuard<'_, WatcherSet> {
        self.shared.set.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn counters(&self) -> &Arc<ResourceCounters> {
        &self.shared.counters
    }

    pub fn indexed(&self) -> bool {
        self.shared.indexed
    }

    /// Queues an event or a bookmark for dispatch (after everything queued before).
    pub fn send(&self, d: Dispatch) {
        if let Some(q) = &self.queue {
            let _ = q.send(d);
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.watchers().close_all();
    }
}

async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Dispatch>) {
    while let Some(d) = rx.recv().await {
        match d {
            Dispatch::Event(ev) => dispatch_event(&shared, &ev).await,
            Dispatch::Bookmark(line) => dispatch_bookmark(&shared, &line),
        }
        // Let the watchers just woken take their events before the next one is offered, as
        // the real dispatch goroutine's receivers run beside it: without this the task would
        // offer a whole backlog of queued events (up to tokio's cooperative budget) before
        // any watcher task ran, and fill their buffers where the real server does not.
        tokio::task::yield_now().await;
    }
}

fn set(shared: &Shared) -> MutexGuard<'_, WatcherSet> {
    shared.set.lock().unwrap_or_else(|e| e.into_inner())
}

/// `dispatchEvent`: every candidate without waiting, then the blocked ones within the budget.
async fn dispatch_event(shared: &Shared, ev: &Arc<Event>) {
    let candidates = set(shared).candidates(ev, shared.indexed);
    let c = &shared.counters;
    c.dispatched.fetch_add(1, Ordering::Relaxed);
    c.offered
        .fetch_add(candidates.len() as u64, Ordering::Relaxed);
    let mut blocked = Vec::new();
    for w in candidates {
        match w.input.try_send(Input::Event(ev.clone())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => blocked.push(w),
            Err(TrySendError::Closed(_)) => set(shared).remove(w.id),
        }
    }
    if blocked.is_empty() {
        return;
    }
    let start = Instant::now();
    let budget = lock_budget(shared).take_available(start);
    let deadline = tokio::time::Instant::from_std(start + budget);
    let mut fired = false;
    for w in blocked {
        let queued = if fired {
            w.input.try_send(Input::Event(ev.clone())).is_ok()
        } else {
            match tokio::time::timeout_at(deadline, w.input.send(Input::Event(ev.clone()))).await {
                Ok(r) => r.is_ok(),
                Err(_) => {
                    fired = true;
                    false
                }
            }
        };
        if !queued {
            force_close(shared, &w);
        }
    }
    lock_budget(shared).return_unused(budget.saturating_sub(start.elapsed()));
}

fn lock_budget(shared: &Shared) -> MutexGuard<'_, TimeBudget> {
    shared.budget.lock().unwrap_or_else(|e| e.into_inner())
}

/// `cacheWatcher.add`'s `closeFunc`: the watcher could not take the event in time.
fn force_close(shared: &Shared, w: &Watcher) {
    if w.done.is_cancelled() {
        // The client went away meanwhile: an ordinary end, not a forced one.
        set(shared).remove(w.id);
        return;
    }
    tracing::info!(
        "Forcing {} watcher close due to unresponsiveness: {}. len(c.input) = {}",
        shared.resource,
        w.identifier,
        w.input.max_capacity() - w.input.capacity(),
    );
    shared.counters.terminated.fetch_add(1, Ordering::Relaxed);
    set(shared).remove(w.id);
}

/// Bookmarks go only where there is room (`nonblockingAdd`): a full watcher misses one.
fn dispatch_bookmark(shared: &Shared, line: &Bytes) {
    let now = Instant::now();
    let set = set(shared);
    for w in set.iter() {
        let mut due = w.next_bookmark.lock().unwrap_or_else(|e| e.into_inner());
        if due.is_none_or(|d| d > now) {
            continue;
        }
        *due = next_bookmark(now, shared.bookmark_interval, w.deadline);
        let _ = w.input.try_send(Input::Line(line.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::cache_counters::ResourceCounters;
    use crate::api::store::Stored;
    use crate::api::watch::{EvType, WatchStat};
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, AtomicU64};

    const BUDGET: Duration = Duration::from_millis(100);

    fn shared(full_budget: bool) -> Shared {
        let now = Instant::now();
        // A budget made 10 s ago has refilled to its maximum; one made now is empty.
        let made = if full_budget {
            now - Duration::from_secs(10)
        } else {
            now
        };
        Shared {
            set: Mutex::new(WatcherSet::default()),
            budget: Mutex::new(TimeBudget::new(made, Duration::from_millis(50), BUDGET)),
            counters: Arc::new(ResourceCounters::default()),
            indexed: false,
            resource: "widgets.example.com".into(),
            bookmark_interval: Duration::from_secs(60),
        }
    }

    /// A watcher with an input buffer of one, already full.
    fn full_watcher(s: &Shared, id: u64) -> mpsc::Receiver<Input> {
        let (tx, rx) = mpsc::channel(1);
        tx.try_send(Input::Line(Bytes::from_static(b"x"))).unwrap();
        let w = Watcher {
            id,
            namespace: None,
            label: None,
            field: None,
            node: None,
            scope: Scope::default(),
            input: tx,
            done: tokio_util::sync::CancellationToken::new(),
            start_rv: 0,
            identifier: String::new(),
            next_bookmark: Mutex::new(None),
            deadline: Instant::now() + Duration::from_secs(60),
            meta_only: false,
            stat: Arc::new(WatchStat {
                id,
                resource: "widgets".into(),
                namespace: None,
                label_selector: String::new(),
                field_selector: String::new(),
                events: AtomicU64::new(0),
                open: AtomicBool::new(true),
            }),
        };
        set(s).add(Arc::new(w));
        rx
    }

    fn event() -> Arc<Event> {
        let obj = json!({"metadata": {"name": "w", "namespace": "ns"}});
        Arc::new(Event::new(7, EvType::Added, None, Stored::new(obj)))
    }

    fn terminated(s: &Shared) -> u64 {
        s.counters.terminated.load(Ordering::Relaxed)
    }

    #[tokio::test]
    async fn a_full_watcher_is_waited_for_the_whole_budget_then_closed() {
        let s = shared(true);
        let _rx = full_watcher(&s, 1);
        let t0 = Instant::now();
        dispatch_event(&s, &event()).await;
        let waited = t0.elapsed();
        assert!(waited >= BUDGET - Duration::from_millis(5), "{waited:?}");
        assert_eq!(terminated(&s), 1);
        assert_eq!(set(&s).len(), 0, "forgotten");
        // The budget was spent: the next blocked dispatch does not wait.
        let _rx = full_watcher(&s, 2);
        let t1 = Instant::now();
        dispatch_event(&s, &event()).await;
        assert!(
            t1.elapsed() < Duration::from_millis(30),
            "{:?}",
            t1.elapsed()
        );
        assert_eq!(terminated(&s), 2);
    }

    #[tokio::test]
    async fn blocked_watchers_share_one_deadline() {
        let s = shared(true);
        let _a = full_watcher(&s, 1);
        let _b = full_watcher(&s, 2);
        let _c = full_watcher(&s, 3);
        let t0 = Instant::now();
        dispatch_event(&s, &event()).await;
        let waited = t0.elapsed();
        assert!(
            waited < BUDGET * 2,
            "one budget for all, not one each: {waited:?}"
        );
        assert_eq!(terminated(&s), 3);
        assert_eq!(s.counters.offered.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn a_watcher_that_makes_room_in_time_stays_and_the_rest_of_the_budget_returns() {
        let s = shared(true);
        let mut rx = full_watcher(&s, 1);
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let first = rx.recv().await;
            let second = rx.recv().await;
            (
                first.is_some(),
                matches!(second, Some(Input::Event(e)) if e.rv == 7),
            )
        });
        dispatch_event(&s, &event()).await;
        assert_eq!(reader.await.unwrap(), (true, true), "the event got in");
        assert_eq!(terminated(&s), 0);
        assert_eq!(set(&s).len(), 1);
        let left = lock_budget(&s).take_available(Instant::now());
        assert!(
            left > Duration::from_millis(50) && left <= BUDGET,
            "unused time returned: {left:?}"
        );
    }

    #[tokio::test]
    async fn with_an_empty_budget_a_full_watcher_is_closed_at_once() {
        let s = shared(false);
        let _rx = full_watcher(&s, 1);
        let t0 = Instant::now();
        dispatch_event(&s, &event()).await;
        assert!(t0.elapsed() < Duration::from_millis(30));
        assert_eq!(terminated(&s), 1);
    }
}
