//! One revision's pods on this node as the request path sees them: the [`Throttle`] that
//! hands out slots and the buffer of requests waiting for one. A pool exists while the
//! revision has pods or requests here; an idle one at zero pods retires, and the next
//! request makes a new one (a cold start).
//!
//! The pool owns its state: its scaler task (`scaler.rs`, started beside it by
//! [`crate::node::pools`]), which creates and deletes pods to match, changes it only through
//! the methods here, named for what they do ([`Pool::change_pods`] and [`PodChanges`] for a
//! pass over the pods, the `*_waiters*` answers, the cold-start marks, retiring). The pool
//! knows nothing of its scaler.
//!
//! Locking: one short `std::sync::Mutex` per pool, never held across an await. Grants to
//! waiters are sent after the lock is released, because a grant whose waiter has gone is
//! dropped, and dropping a [`Lease`] takes the lock again to free its slot.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crds::{ActivatorMember, Revision};
use dashmap::DashMap;
use kube::Client;
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cache::pods::PodCache;
use crate::node::cold_start::{ColdStart, ColdTimings};
use crate::node::throttle::{Admit, PodRef, Slot, Throttle, Ticket};
use crate::ops::metrics::{Metrics, Phase};
use crds::ObjectKey as RevisionKey;
use keep_serving::Locked;

/// Tuning of buffering and local scaling (part of [`crate::ActivatorConfig`]).
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Requests one revision may have waiting on this node.
    pub queue_limit: usize,
    /// Requests all revisions together may have waiting on this node.
    pub queue_limit_total: usize,
    /// Fraction of containerConcurrency a pod should run at before another is added.
    pub target_utilisation: f64,
    /// How long demand must fit in fewer pods before one is removed.
    pub scale_in_window: Duration,
    /// Pods of one revision this node runs at most, whatever maxScale says.
    pub max_pods_per_revision: u32,
    /// A pod not usable this long after it appeared is deleted and the node counts as full
    /// for the revision (a kubelet that never starts it, an image that never pulls).
    pub pod_start_timeout: Duration,
    /// How long a node that could not start a revision's pod sends its requests elsewhere.
    pub full_backoff: Duration,
    /// Upper bound on the interval between readiness probes of a starting pod.
    pub probe_interval_max: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            queue_limit: 10_000,
            queue_limit_total: 50_000,
            target_utilisation: 0.7,
            scale_in_window: Duration::from_secs(30),
            max_pods_per_revision: 20,
            pod_start_timeout: Duration::from_secs(120),
            full_backoff: Duration::from_secs(30),
            probe_interval_max: Duration::from_millis(250),
        }
    }
}

/// What every pool shares.
pub struct Shared {
    pub client: Client,
    /// Whether the API server answers: a pod create it does not is given up at once.
    pub api: crate::cache::api_health::ApiHealth,
    pub node: String,
    pub pods: PodCache,
    pub metrics: Arc<Metrics>,
    pub cfg: PoolConfig,
    /// Requests waiting in all pools.
    pub queued_total: AtomicUsize,
    /// Stops every scaler (the activator is shutting down).
    pub stop: CancellationToken,
    /// When the activator started (timestamps are stored as milliseconds since).
    pub epoch: Instant,
    /// Kubernetes Events about Revisions (failed cold starts, a full node).
    pub events: crate::ops::events::EventSink,
    /// Revisions this node could not start a pod for, until when and why. Outlives the
    /// pools (an empty pool retires; the mark must not).
    pub full: DashMap<RevisionKey, (Instant, String)>,
    /// The node agent, when there is one: a starting pod's address from its sandbox.
    pub node_addresses: Option<crate::node::node_addr::NodeAddresses>,
}

/// Full marks kept before expired ones are swept.
const FULL_MARKS_KEPT: usize = 10_000;

impl Shared {
    /// Marks this node full for `key` for the configured back-off.
    pub fn mark_full(&self, key: &RevisionKey, why: String) {
        let now = Instant::now();
        if self.full.len() >= FULL_MARKS_KEPT {
            self.full.retain(|_, (until, _)| *until > now);
        }
        self.full
            .insert(key.clone(), (now + self.cfg.full_backoff, why));
    }

    /// Why this node cannot start `key` now, if it cannot.
    pub fn full_reason(&self, key: &RevisionKey) -> Option<String> {
        let e = self.full.get(key)?;
        (e.0 > Instant::now()).then(|| e.1.clone())
    }
}

/// The revision and this member's share of it, as the latest request saw them.
#[derive(Clone)]
pub struct Spec {
    pub rev: Arc<Revision>,
    pub me: Arc<ActivatorMember>,
}

/// A request waiting for a slot.
struct Waiter {
    tx: oneshot::Sender<Grant>,
    /// It found no usable pod: it waits through a cold start.
    cold: bool,
}

/// What a waiter is eventually told.
pub(crate) enum Grant {
    Slot(Lease),
    /// This node cannot start the revision now: send the request to another member.
    Elsewhere(String),
    /// No pod can be made for the revision (its template is refused).
    Fail(String),
    /// No pod can be made now: the API server does not answer (503, try again later).
    Unavailable(String),
}

/// Why no slot was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoSlot {
    /// The buffer is full: 503.
    Full(String),
    /// This node cannot run the revision now (full node, failed pod): another member may.
    Elsewhere(String),
    /// No pod can be made for the revision (its template is refused): 502.
    Failed(String),
    /// No pod can be made now, on any member (the API server does not answer): 503 with
    /// `Retry-After`, not forwarded, since every member is in the same position.
    Unavailable(String),
    /// The pool retired between lookup and use: take a fresh one.
    Retired,
}

struct State {
    throttle: Throttle,
    waiters: HashMap<Ticket, Waiter>,
    next_ticket: Ticket,
    spec: Spec,
    retired: bool,
    /// The cold start in progress: phases measured from the arrival of the first request
    /// that found no pod; ends when a pod becomes usable.
    cold: Option<ColdStart>,
    /// The phases of the last cold start that ended, for the requests that waited through it
    /// and got their slot later (all of the new pod's slots were taken at first).
    last_cold: Option<ColdTimings>,
    /// Which pod each throttle entry is (for pods reported unreachable).
    names: HashMap<PodRef, String>,
}

/// One revision on this node.
pub struct Pool {
    key: RevisionKey,
    shared: Arc<Shared>,
    state: Mutex<State>,
    /// Wakes the scaler: demand changed.
    wake: Notify,
    /// Pods found unreachable by a request (the scaler takes them out and probes them).
    unreachable_tx: mpsc::UnboundedSender<String>,
    unreachable_rx: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    /// Last request arrival or completion, in ms since `shared.epoch`.
    last_activity: AtomicU64,
    /// `State::retired`, readable without the lock (the warm path's pool lookup).
    retired: std::sync::atomic::AtomicBool,
}

impl Pool {
    pub(crate) fn new(
        key: RevisionKey,
        rev: Arc<Revision>,
        me: Arc<ActivatorMember>,
        shared: Arc<Shared>,
    ) -> Arc<Self> {
        let cc = container_concurrency(&rev);
        let (tx, rx) = mpsc::unbounded_channel();
        let pool = Arc::new(Self {
            retired: Default::default(),
            key,
            state: Mutex::new(State {
                throttle: Throttle::new(cc, shared.cfg.queue_limit),
                waiters: HashMap::new(),
                next_ticket: 0,
                spec: Spec { rev, me },
                retired: false,
                cold: None,
                last_cold: None,
                names: HashMap::new(),
            }),
            wake: Notify::new(),
            unreachable_tx: tx,
            unreachable_rx: Mutex::new(Some(rx)),
            last_activity: AtomicU64::new(0),
            shared,
        });
        pool.touch();
        pool
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters behind, still consistent
        // enough to serve; poisoning would take the revision down on this node for good.
        self.state.locked()
    }

    /// Marks activity now (idle time counts from the last arrival or completion).
    pub fn touch(&self) {
        let ms = self.shared.epoch.elapsed().as_millis() as u64;
        self.last_activity.fetch_max(ms, Ordering::Relaxed);
    }

    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_activity.load(Ordering::Relaxed));
        self.shared.epoch.elapsed().saturating_sub(last)
    }

    /// The revision this pool serves.
    pub fn key(&self) -> &RevisionKey {
        &self.key
    }

    /// What every pool shares.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Resolves when demand changed (a request queued or left, a slot or a pod freed, the
    /// spec changed): the scaler looks again.
    pub(crate) fn demand_changed(&self) -> Notified<'_> {
        self.wake.notified()
    }

    /// The names of the pods requests found unreachable, as they are reported; the first
    /// caller (the scaler) gets the receiver, later ones None.
    pub(crate) fn take_unreachable(&self) -> Option<mpsc::UnboundedReceiver<String>> {
        self.unreachable_rx.locked().take()
    }

    /// The Revision as the latest request (or the member watch) saw it.
    pub(crate) fn revision(&self) -> Arc<Revision> {
        self.lock().spec.rev.clone()
    }

    /// The Revision a pod is made of now, and whether a cold start is waiting for it (then
    /// the create's steps are marks of that cold start).
    pub(crate) fn revision_to_create(&self) -> (Arc<Revision>, bool) {
        let s = self.lock();
        (s.spec.rev.clone(), s.cold.is_some())
    }

    /// Requests in flight and waiting, and the spec, read together.
    pub(crate) fn demand(&self) -> Demand {
        let s = self.lock();
        Demand {
            in_flight: s.throttle.in_flight(),
            queued: s.throttle.queued() as u32,
            spec: s.spec.clone(),
        }
    }

    /// Requests in flight on each of `pods` that takes requests now, read together.
    pub(crate) fn in_flight_on(
        &self,
        pods: impl IntoIterator<Item = PodRef>,
    ) -> HashMap<PodRef, u32> {
        let s = self.lock();
        pods.into_iter()
            .filter_map(|id| Some((id, s.throttle.in_flight_on(id)?)))
            .collect()
    }

    /// The pod create of the cold start in progress (if one still is) was sent.
    pub(crate) fn cold_start_posted(&self) {
        if let Some(c) = self.lock().cold.as_mut() {
            c.posted(Instant::now());
        }
    }

    /// A pod create of the cold start in progress (if one still is) was answered.
    pub(crate) fn cold_start_bound(&self) {
        if let Some(c) = self.lock().cold.as_mut() {
            c.bound(Instant::now());
        }
    }

    /// Changes the pool's pods under one hold of its lock, so a request sees all of `f`'s
    /// changes or none; the slots they free are granted once the lock is released.
    pub(crate) fn change_pods<R>(self: &Arc<Self>, f: impl FnOnce(&mut PodChanges<'_>) -> R) -> R {
        let (out, grants) = {
            let mut s = self.lock();
            let mut changes = PodChanges {
                pool: self,
                s: &mut s,
                grants: Vec::new(),
            };
            let out = f(&mut changes);
            (out, changes.grants)
        };
        deliver(grants);
        out
    }

    /// Whether a pod here takes requests now.
    pub fn has_usable_pod(&self) -> bool {
        !self.is_retired() && self.lock().throttle.pods() > 0
    }

    /// The spec, when a pod here takes requests now.
    pub fn usable_spec(&self) -> Option<Spec> {
        if self.is_retired() {
            return None;
        }
        let st = self.lock();
        (st.throttle.pods() > 0).then(|| st.spec.clone())
    }

    /// A slot on a pod of this revision, waiting in the buffer while none is free. Cancel
    /// safe: a request that goes away leaves the queue. `may_go_elsewhere`: the request can
    /// still be forwarded, so a full node hands it back instead of failing it.
    pub async fn acquire(
        self: &Arc<Self>,
        spec: &Spec,
        arrived: Instant,
        may_go_elsewhere: bool,
    ) -> Result<Lease, NoSlot> {
        self.touch();
        // Declared outside the hold, so that the grants a spec change made are delivered, or
        // dropped on an early answer, only once the lock is released (a lease's drop takes it).
        let changed;
        let queued = {
            let mut s = self.lock();
            if s.retired {
                return Err(NoSlot::Retired);
            }
            changed = self.update_spec(&mut s, spec);
            // A node that cannot start the revision, or whose every slot it may ever run is
            // taken, sends what it cannot serve at once to another member rather than
            // queueing it (a burst past the primary spills to the others).
            if may_go_elsewhere
                && s.throttle.would_wait()
                && let Some(why) = self.cannot_take_more(&s)
            {
                return Err(NoSlot::Elsewhere(why));
            }
            self.admit_or_queue(&mut s, arrived)
        };
        deliver(changed);
        let (ticket, rx) = match queued? {
            Ok(slot) => return Ok(self.lease(slot, false, None, false)),
            Err(waiting) => waiting,
        };
        self.wake.notify_one();
        self.wait_for_grant(ticket, rx).await
    }

    /// Why this node should not queue one more request that would wait (under the lock):
    /// it cannot start the revision, or every slot it may ever run is taken or waited for.
    fn cannot_take_more(&self, s: &State) -> Option<String> {
        if let Some(why) = self.shared.full_reason(&self.key) {
            return Some(why);
        }
        if let Some(slots) = self.slots_at_most(&s.spec)
            && u64::from(s.throttle.in_flight()) + s.throttle.queued() as u64 >= slots
        {
            return Some(format!(
                "revision {}: node {} has all the slots it may run ({slots}) taken",
                self.key, self.shared.node
            ));
        }
        None
    }

    /// Under the lock: a ticket, then a slot at once, or a place in the buffer (Err: the
    /// ticket and where its grant will come), or no room (the activator's or the revision's
    /// buffer is full).
    #[allow(clippy::type_complexity)]
    fn admit_or_queue(
        &self,
        s: &mut State,
        arrived: Instant,
    ) -> Result<Result<Slot, (Ticket, oneshot::Receiver<Grant>)>, NoSlot> {
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        let total = &self.shared.queued_total;
        if s.throttle.would_wait()
            && total.load(Ordering::Relaxed) >= self.shared.cfg.queue_limit_total
        {
            return Err(NoSlot::Full(format!(
                "this activator has {} requests waiting, its limit",
                self.shared.cfg.queue_limit_total
            )));
        }
        match s.throttle.admit(ticket) {
            Admit::Go(slot) => Ok(Ok(slot)),
            Admit::Full => Err(NoSlot::Full(format!(
                "revision {} has {} requests waiting on this node, its limit",
                self.key,
                s.throttle.queued()
            ))),
            Admit::Queued => Ok(Err((ticket, self.enqueue(s, ticket, arrived)))),
        }
    }

    /// Under the lock: `ticket` waits in the buffer; a wait with no usable pod is (or joins)
    /// a cold start.
    fn enqueue(&self, s: &mut State, ticket: Ticket, arrived: Instant) -> oneshot::Receiver<Grant> {
        // No usable pod: this request waits for a pod to start.
        let cold = s.throttle.pods() == 0;
        if cold && s.cold.is_none() {
            s.cold = Some(ColdStart::new(arrived));
            s.last_cold = None;
        }
        let (tx, rx) = oneshot::channel();
        s.waiters.insert(ticket, Waiter { tx, cold });
        self.shared.queued_total.fetch_add(1, Ordering::Relaxed);
        self.shared.metrics.queued.inc();
        rx
    }

    /// Waits in the buffer for `ticket`'s answer. Dropped before it comes (the client went
    /// away, the deadline passed), [`Waiting`] takes the request out of the queue.
    async fn wait_for_grant(
        self: &Arc<Self>,
        ticket: Ticket,
        rx: oneshot::Receiver<Grant>,
    ) -> Result<Lease, NoSlot> {
        let mut waiting = Waiting {
            pool: self,
            ticket,
            rx: Some(rx),
        };
        let rx = waiting.rx.as_mut().expect("set above");
        match rx.await {
            Ok(Grant::Slot(lease)) => {
                waiting.rx = None;
                Ok(lease)
            }
            Ok(Grant::Elsewhere(why)) => {
                waiting.rx = None;
                Err(NoSlot::Elsewhere(why))
            }
            Ok(Grant::Fail(why)) => {
                waiting.rx = None;
                Err(NoSlot::Failed(why))
            }
            Ok(Grant::Unavailable(why)) => {
                waiting.rx = None;
                Err(NoSlot::Unavailable(why))
            }
            // The pool let go of its waiters without an answer: it retired.
            Err(_) => {
                waiting.rx = None;
                Err(NoSlot::Retired)
            }
        }
    }

    /// The most requests this member can ever have in flight and waiting for a slot it may
    /// run: `containerConcurrency` × the pods it may run (its share of maxScale, or the
    /// node's cap per revision). None with unlimited concurrency (one pod takes everything).
    fn slots_at_most(&self, spec: &Spec) -> Option<u64> {
        let cc = u64::from(container_concurrency(&spec.rev));
        if cc == 0 {
            return None;
        }
        let node_cap = u64::from(self.shared.cfg.max_pods_per_revision);
        let share = u64::try_from(spec.me.max_pods).unwrap_or(0);
        let pods = if spec.rev.spec.max_scale > 0 {
            share.min(node_cap)
        } else {
            node_cap
        };
        Some(pods * cc)
    }

    /// Takes a new Revision or share outside a request (the member watch changed it).
    pub fn set_spec(self: &Arc<Self>, spec: &Spec) {
        let grants = {
            let mut s = self.lock();
            self.update_spec(&mut s, spec)
        };
        deliver(grants);
        self.wake.notify_one();
    }

    /// Takes the latest Revision and share; a changed containerConcurrency may free slots,
    /// whose grants the caller delivers after unlocking.
    fn update_spec(
        self: &Arc<Self>,
        s: &mut State,
        spec: &Spec,
    ) -> Vec<(oneshot::Sender<Grant>, Grant)> {
        if Arc::ptr_eq(&s.spec.rev, &spec.rev)
            && (Arc::ptr_eq(&s.spec.me, &spec.me) || s.spec.me == spec.me)
        {
            return Vec::new();
        }
        let cc = container_concurrency(&spec.rev);
        s.spec = spec.clone();
        if s.throttle.per_pod() == (cc > 0).then_some(cc) {
            return Vec::new();
        }
        let woken = s.throttle.set_concurrency(cc);
        self.take_waiters(s, woken)
    }

    fn lease(
        self: &Arc<Self>,
        slot: Slot,
        cold: bool,
        timings: Option<ColdTimings>,
        first_of_cold: bool,
    ) -> Lease {
        self.shared.metrics.in_flight.inc();
        Lease {
            pool: self.clone(),
            slot,
            cold,
            timings,
            first_of_cold,
        }
    }

    /// Removes the woken tickets' senders (under the lock) and pairs them with leases, to be
    /// delivered once the lock is released.
    fn take_waiters(
        self: &Arc<Self>,
        s: &mut State,
        woken: Vec<(Ticket, Slot)>,
    ) -> Vec<(oneshot::Sender<Grant>, Grant)> {
        self.take_waiters_timed(s, woken, false)
    }

    /// As [`Pool::take_waiters`]. A request that waited for a pod start is a cold one and
    /// its lease carries the phases of that start (for the response's `Server-Timing`);
    /// `ended_cold` (a pod just ended a cold start) marks the first of them as the one whose
    /// first byte is the cold start's (`first_byte` is observed once per cold start, so all
    /// phases count the same cold starts).
    fn take_waiters_timed(
        self: &Arc<Self>,
        s: &mut State,
        woken: Vec<(Ticket, Slot)>,
        ended_cold: bool,
    ) -> Vec<(oneshot::Sender<Grant>, Grant)> {
        let mut out = Vec::with_capacity(woken.len());
        let mut first = ended_cold;
        for (ticket, slot) in woken {
            if let Some(w) = s.waiters.remove(&ticket) {
                self.dequeued();
                let timings = if w.cold { s.last_cold } else { None };
                let first_of_cold = first && w.cold;
                first &= !first_of_cold;
                out.push((
                    w.tx,
                    Grant::Slot(self.lease(slot, w.cold, timings, first_of_cold)),
                ));
            }
        }
        out
    }

    /// Hands every waiting request back to the request path to send to another member.
    fn redirect_waiters(&self, s: &mut State, why: &str) -> Vec<(oneshot::Sender<Grant>, Grant)> {
        self.answer_waiters(s, || Grant::Elsewhere(why.to_string()))
    }

    /// With no usable pod here, hands every waiting request back to the request path to send
    /// to another member (this node cannot start the revision now).
    pub(crate) fn redirect_waiters_without_pod(&self, why: &str) {
        self.answer_waiters_without_pod(false, || Grant::Elsewhere(why.to_string()));
    }

    /// Fails every waiting request (no pod can be made of this Revision).
    pub(crate) fn fail_waiters(&self, why: &str) {
        let grants = {
            let mut s = self.lock();
            self.answer_waiters(&mut s, || Grant::Fail(why.to_string()))
        };
        deliver(grants);
    }

    /// With no usable pod here, fails every waiting request (no pod can be made).
    pub(crate) fn fail_waiters_without_pod(&self, why: &str) {
        self.answer_waiters_without_pod(false, || Grant::Fail(why.to_string()));
    }

    /// With no usable pod here, answers every waiting request with a 503 (no pod can be
    /// made now: the API server does not answer). Every waiter is then a cold one: the cold
    /// start they began ends with them, and the next request begins a new one (its phases
    /// are not measured from a request answered long ago).
    pub(crate) fn refuse_waiters_without_pod(&self, why: &str) {
        self.answer_waiters_without_pod(true, || Grant::Unavailable(why.to_string()));
    }

    /// Empties the queue with `answer` when no pod here takes requests (a pod that does
    /// serves the waiters in turn); `ends_cold_start`: the cold start in progress ends too.
    fn answer_waiters_without_pod(&self, ends_cold_start: bool, answer: impl Fn() -> Grant) {
        let grants = {
            let mut s = self.lock();
            if s.throttle.pods() > 0 {
                return;
            }
            if ends_cold_start {
                s.cold = None;
            }
            self.answer_waiters(&mut s, answer)
        };
        deliver(grants);
    }

    /// Empties the queue, pairing each waiter with `answer`, to deliver after unlocking.
    fn answer_waiters(
        &self,
        s: &mut State,
        answer: impl Fn() -> Grant,
    ) -> Vec<(oneshot::Sender<Grant>, Grant)> {
        let mut out = Vec::new();
        for ticket in s.throttle.take_queue() {
            if let Some(w) = s.waiters.remove(&ticket) {
                self.dequeued();
                out.push((w.tx, answer()));
            }
        }
        out
    }

    /// Retires the pool if nothing is left in it; waiters (there should be none) are told
    /// to take a fresh pool.
    pub(crate) fn retire_if_empty(&self) -> bool {
        let mut s = self.lock();
        if s.throttle.queued() > 0 || s.throttle.in_flight() > 0 {
            return false;
        }
        s.retired = true;
        self.retired.store(true, Ordering::Release);
        true
    }

    /// Whether the pool retired (a request must take a fresh one).
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    fn dequeued(&self) {
        self.shared.queued_total.fetch_sub(1, Ordering::Relaxed);
        self.shared.metrics.queued.dec();
    }

    /// Adds a usable pod; returns the grants to deliver after unlocking. `adopted`: the pod
    /// was Ready when this pool first saw it (a previous activator process made it), so no
    /// pod start ends here unless this pool created one for the waiting requests.
    fn add_pod(
        self: &Arc<Self>,
        s: &mut State,
        name: &str,
        addr: SocketAddr,
        adopted: bool,
    ) -> (PodRef, Vec<(oneshot::Sender<Grant>, Grant)>) {
        let (id, woken) = s.throttle.add_pod(addr);
        s.names.insert(id, name.to_string());
        let ended_cold = match s.cold.take() {
            // The requests waited for the pool to learn of a running pod, not for a start:
            // they are warm, and no phase is recorded.
            Some(c) if adopted && !c.created() => {
                for w in s.waiters.values_mut() {
                    w.cold = false;
                }
                false
            }
            Some(c) => {
                // Every phase of a cold start is recorded here, together, so each phase's
                // histogram counts the same cold starts.
                let t = c.ready(Instant::now());
                let m = &self.shared.metrics;
                m.observe_phase(Phase::PodPostSent, t.post);
                m.observe_phase(Phase::PodBoundSeen, t.bound);
                m.observe_phase(Phase::PodReadySeen, t.ready);
                s.last_cold = Some(t);
                true
            }
            None => false,
        };
        (id, self.take_waiters_timed(s, woken, ended_cold))
    }

    fn remove_pod(&self, s: &mut State, id: PodRef) {
        s.throttle.remove_pod(id);
        s.names.remove(&id);
    }

    fn release(self: &Arc<Self>, pod: PodRef) {
        self.touch();
        let grants = {
            let mut s = self.lock();
            let woken = s.throttle.release(pod);
            self.take_waiters(&mut s, woken)
        };
        self.shared.metrics.in_flight.dec();
        deliver(grants);
    }
}

/// What the scaler reads of demand, at one moment.
pub(crate) struct Demand {
    pub in_flight: u32,
    pub queued: u32,
    pub spec: Spec,
}

/// The pool's pods being changed, under its lock ([`Pool::change_pods`]).
pub(crate) struct PodChanges<'a> {
    pool: &'a Arc<Pool>,
    s: &'a mut State,
    grants: Vec<(oneshot::Sender<Grant>, Grant)>,
}

impl PodChanges<'_> {
    /// Puts a usable pod in the throttle (its slots go to waiting requests first); returns
    /// its entry. `adopted`: as in [`Pool::add_pod`].
    pub(crate) fn add(&mut self, name: &str, addr: SocketAddr, adopted: bool) -> PodRef {
        let (id, grants) = self.pool.add_pod(self.s, name, addr, adopted);
        self.grants.extend(grants);
        id
    }

    /// Takes a pod out of the throttle (gone, not usable, or being removed).
    pub(crate) fn remove(&mut self, id: PodRef) {
        self.pool.remove_pod(self.s, id);
    }

    /// A pod got an address: a phase of the cold start in progress, if one is.
    pub(crate) fn pod_addressed(&mut self, at: Instant) {
        if let Some(c) = self.s.cold.as_mut() {
            c.addressed(at);
        }
    }

    /// This node cannot run the revision now: marks it full for the revision, and with no
    /// usable pod here sends the waiting requests to another member.
    pub(crate) fn node_full(&mut self, why: &str) {
        let pool = self.pool;
        pool.shared.mark_full(&pool.key, why.to_string());
        if self.s.throttle.pods() == 0 {
            let grants = pool.redirect_waiters(self.s, why);
            self.grants.extend(grants);
        }
    }
}

/// Sends grants; a grant whose waiter has gone is dropped, which frees its slot.
pub(crate) fn deliver(grants: Vec<(oneshot::Sender<Grant>, Grant)>) {
    for (tx, grant) in grants {
        drop(tx.send(grant));
    }
}

/// containerConcurrency as the throttle takes it (negative values, refused by the schema,
/// count as unlimited).
pub fn container_concurrency(rev: &Revision) -> u32 {
    u32::try_from(rev.spec.container_concurrency).unwrap_or(0)
}

/// A request's place in the queue; leaving it (the client went away, the deadline passed)
/// takes the request out.
struct Waiting<'a> {
    pool: &'a Arc<Pool>,
    ticket: Ticket,
    rx: Option<oneshot::Receiver<Grant>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.rx.is_none() {
            return;
        }
        {
            let mut s = self.pool.lock();
            if s.throttle.cancel(self.ticket) {
                s.waiters.remove(&self.ticket);
                self.pool.dequeued();
            }
        }
        // A grant already sent is dropped with the receiver here, outside the lock: its
        // lease frees the slot.
        self.rx = None;
        self.pool.wake.notify_one();
    }
}

/// A slot on a pod, held while the request (and its response body) is in flight.
pub struct Lease {
    pool: Arc<Pool>,
    slot: Slot,
    /// The request waited for a pod to start (not only for a busy pod's slot).
    pub cold: bool,
    /// The phases of the cold start the request waited through (for `Server-Timing`).
    pub timings: Option<ColdTimings>,
    /// The first request served when its cold start ended: its first byte is the cold
    /// start's `first_byte` phase.
    pub first_of_cold: bool,
}

impl Lease {
    pub fn addr(&self) -> SocketAddr {
        self.slot.addr
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The pod did not accept a connection: take it out at once (the scaler probes it and
    /// puts it back when it answers), and free this slot.
    pub fn unreachable(self) {
        let name = {
            let mut s = self.pool.lock();
            let name = s.names.get(&self.slot.pod).cloned();
            self.pool.remove_pod(&mut s, self.slot.pod);
            name
        };
        if let Some(name) = name {
            let _ = self.pool.unreachable_tx.send(name);
        }
        self.pool.wake.notify_one();
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool.release(self.slot.pod);
    }
}
