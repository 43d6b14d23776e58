//! The scaler: one task per [`Pool`], the only writer of its revision's pods on this node.
//! It turns the pod watch (and its own readiness probes) into usable slots in the throttle,
//! asks [`crate::node::pod_count::decide`] how many pods the demand needs, and creates or deletes pods
//! to match — within the member's share of maxScale. A pod the node cannot run marks the
//! node full for the revision, and waiting requests go to another member. An idle pool at
//! zero pods retires.
//!
//! The pool owns its state: the scaler reads and changes it only through the pool's methods
//! ([`Pool::change_pods`], the `*_waiters*` answers, the cold-start marks), each under the
//! pool's lock as one step. The scaler is started by [`crate::node::pools`]; the pool does
//! not know it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crds::backoff::WatchBackoff;
use dashmap::DashMap;
use futures::future::join_all;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cache::pods::{LocalPod, RevisionPods};
use crate::node::pod_count::{self, Decision, Observed, Policy};
use crate::node::pod_writer::{CreateError, LocalScheduler};
use crate::node::pool::{Demand, PodChanges, Pool, Shared};
use crate::node::readiness::Check;
use crate::node::throttle::PodRef;
use crate::ops::metrics::{AddressFrom, AddressSource, PodReason};
use crds::ObjectKey as RevisionKey;

/// An empty pool lingers this long before retiring, so a request that just looked it up
/// does not race its retirement on every cold start.
const RETIRE_AFTER: Duration = Duration::from_secs(1);
/// Back-off after the API server refused a create, doubling up to `CREATE_BACKOFF_MAX`.
const CREATE_BACKOFF: Duration = Duration::from_millis(200);
const CREATE_BACKOFF_MAX: Duration = Duration::from_secs(10);
/// The back-off's bound while the API server does not answer at all. Lower than for an
/// answer (an API server that says it is overloaded is given room): while it is gone, the
/// requests for a cold revision here are refused at once whatever the back-off, so what
/// the back-off sets is how soon after its return this revision starts pods again, and how
/// many connects a pool with demand makes meanwhile (one per 1-2 s).
const UNREACHABLE_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// The scaler looks again at least this often (idle and stable-window clocks).
/// How long a scaler made before this node's pods are first listed waits for the list before
/// it acts (a just-started activator: a request that came before the list would otherwise
/// create a pod that is already running, get 409 and adopt it, answering warm work as cold).
/// Given up at once when the API server is known down: that list will not come soon, and the
/// cold start's create fails fast instead.
const POD_LIST_WAIT: Duration = Duration::from_secs(5);

const TICK: Duration = Duration::from_secs(1);
/// A starting pod's readiness is checked this often at first (a refused connect costs a
/// round trip on the node's bridge)...
const PROBE_FAST: Duration = Duration::from_millis(5);
/// ...for this long; then the interval doubles up to `--probe-interval-max`.
const PROBE_FAST_FOR: Duration = Duration::from_secs(2);

pub(crate) fn spawn(pool: Arc<Pool>, map: Arc<DashMap<RevisionKey, Arc<Pool>>>) {
    tokio::spawn(async move {
        let mut s = Scaler::new(pool.clone());
        s.run().await;
        s.stop_probes();
        // Retired or stopped: make sure a fresh pool is used from now on.
        map.remove_if(pool.key(), |_, p| Arc::ptr_eq(p, &pool));
    });
}

/// What the scaler knows of one pod beyond the watch.
struct Tracked {
    first_seen: Instant,
    slot: Option<PodRef>,
    probe: Option<JoinHandle<()>>,
    /// The address the node agent gave, before the watch had one.
    agent_ip: Option<IpAddr>,
    /// The question to the node agent in progress.
    lookup: Option<JoinHandle<()>>,
    /// First seen without an address: where its address came from is counted once.
    saw_without_ip: bool,
    address_counted: bool,
    /// A probe got an answer before the watch said Ready.
    probed: bool,
    /// When the first probe answered (to measure its lead over the kubelet's Ready).
    probed_at: Option<Instant>,
    /// The watch has said Ready at least once (after that, its word counts).
    was_ready: bool,
    /// A request could not connect: out until a probe answers.
    suspect: bool,
    /// Deleted (or being deleted) by this scaler.
    removing: bool,
    ever_usable: bool,
}

/// What one pass of [`Scaler::sync`] checks every pod against, and what it found.
struct Pass<'a> {
    now: Instant,
    /// The revision's port (0: none, so no pod is usable).
    port: u16,
    /// The readiness check of the revision's template.
    check: Check,
    shared: &'a Shared,
    key: &'a RevisionKey,
    /// Where the node agent's addresses come back.
    addr_tx: &'a mpsc::UnboundedSender<(String, IpAddr)>,
    /// Where the probes report a pod that answers.
    probe_tx: &'a mpsc::UnboundedSender<String>,
    /// Why this node cannot run the revision, when a pod showed it.
    full: Option<String>,
    /// Pods to delete once the pool's lock is released.
    to_delete: Vec<(String, PodReason)>,
    /// Pods someone else deleted before they ever took a request.
    lost: Vec<String>,
    /// A pod took its first request slot in this pass.
    usable_now: bool,
}

/// Forgets the pods the watch no longer has: out of the throttle, their probes and address
/// lookups stopped. Returns those that went before they ever served, and not by this scaler.
fn forget_gone(
    tracked: &mut HashMap<String, Tracked>,
    pods: &RevisionPods,
    changes: &mut PodChanges<'_>,
) -> Vec<String> {
    let mut lost = Vec::new();
    tracked.retain(|name, t| {
        if pods.contains_key(name) {
            return true;
        }
        if !t.removing && !t.ever_usable {
            lost.push(name.clone());
        }
        if let Some(id) = t.slot.take() {
            changes.remove(id);
        }
        if let Some(p) = t.probe.take() {
            p.abort();
        }
        if let Some(l) = t.lookup.take() {
            l.abort();
        }
        false
    });
    lost
}

impl Tracked {
    fn new(now: Instant, p: &LocalPod) -> Self {
        Self {
            first_seen: now,
            slot: None,
            probe: None,
            agent_ip: None,
            lookup: None,
            saw_without_ip: p.ip.is_none(),
            address_counted: false,
            probed: false,
            probed_at: None,
            was_ready: false,
            suspect: false,
            removing: false,
            ever_usable: false,
        }
    }

    /// One pod in a pass: its readiness noted, its address, whether it failed to start, its
    /// slot in the throttle, its probe.
    fn sync(
        &mut self,
        name: &str,
        p: &LocalPod,
        pass: &mut Pass<'_>,
        changes: &mut PodChanges<'_>,
    ) {
        self.note_ready(p, pass);
        let addr = self
            .address(name, p, pass, changes)
            .map(|ip| SocketAddr::new(ip, pass.port));
        self.check_start(name, p, pass);
        let usable = self.update_slot(name, p, addr, pass, changes);
        self.update_probe(name, p, addr, usable, pass);
    }

    fn note_ready(&mut self, p: &LocalPod, pass: &Pass<'_>) {
        let now = pass.now;
        // A pod this scaler saw start turns Ready: did the activator's own probe find it
        // answering first, and by how long?
        if p.ready && !self.was_ready && self.first_seen != now {
            let lead = self.probed_at.map(|at| now.saturating_duration_since(at));
            pass.shared.metrics.observe_ready_lead(lead);
        }
        self.was_ready |= p.ready;
    }

    /// The pod's address: the watch's when it has one (the kubelet's word); until then the
    /// node agent's, from the pod's sandbox, asked for here.
    fn address(
        &mut self,
        name: &str,
        p: &LocalPod,
        pass: &Pass<'_>,
        changes: &mut PodChanges<'_>,
    ) -> Option<IpAddr> {
        let sh = pass.shared;
        let ip = p.ip.or(self.agent_ip);
        if ip.is_some() && !self.address_counted {
            self.address_counted = true;
            changes.pod_addressed(pass.now);
            if self.saw_without_ip {
                let source = if self.agent_ip.is_some() {
                    AddressSource::Agent
                } else {
                    AddressSource::Watch
                };
                sh.metrics
                    .pod_address
                    .get_or_create(&AddressFrom { source })
                    .inc();
            }
        }
        let asking = p.ip.is_none() && self.agent_ip.is_none() && p.live() && !self.removing;
        match (&sh.node_addresses, asking) {
            (Some(agent), true) if self.lookup.is_none() && !p.uid.is_empty() => {
                self.lookup = Some(tokio::spawn(agent.clone().find(
                    p.uid.clone(),
                    name.to_string(),
                    sh.cfg.pod_start_timeout,
                    pass.addr_tx.clone(),
                )));
            }
            (_, false) => {
                if let Some(l) = self.lookup.take() {
                    l.abort();
                }
            }
            _ => {}
        }
        ip
    }

    /// A pod that failed, or did not become usable in time, is deleted; one that never
    /// started marks the node full for the revision.
    fn check_start(&mut self, name: &str, p: &LocalPod, pass: &mut Pass<'_>) {
        let sh = pass.shared;
        // Deleted by someone else before it ever served: the garbage collector (the pod's
        // owner is gone), a policy, an operator. Its replacement waits for the scaler's
        // back-off: replacing it at once makes a loop as fast as the API server answers.
        if p.terminating && !self.removing && !self.ever_usable {
            self.removing = true;
            pass.lost.push(name.to_string());
        }
        if let Some(reason) = &p.failed
            && !self.removing
            && !p.terminating
        {
            self.removing = true;
            // A pod the kubelet refused at admission (OutOfpods, OutOfcpu...) never got an
            // address: this node is full for the revision. One that ran and ended (a crash,
            // a completed deletion) is only replaced.
            if !self.ever_usable && p.ip.is_none() {
                pass.full = Some(format!(
                    "node {}: pod {name} of revision {} failed: {reason}",
                    sh.node, pass.key
                ));
            }
            pass.to_delete.push((name.to_string(), PodReason::Failed));
        }
        if !self.removing
            && p.live()
            && !self.ever_usable
            && pass.now.duration_since(self.first_seen) >= sh.cfg.pod_start_timeout
        {
            self.removing = true;
            pass.full = Some(format!(
                "node {}: pod {name} of revision {} was not ready within {}s",
                sh.node,
                pass.key,
                sh.cfg.pod_start_timeout.as_secs()
            ));
            pass.to_delete.push((name.to_string(), PodReason::NotReady));
        }
    }

    /// Puts a usable pod in the throttle and takes out one that is not; returns whether it
    /// is usable.
    fn update_slot(
        &mut self,
        name: &str,
        p: &LocalPod,
        addr: Option<SocketAddr>,
        pass: &mut Pass<'_>,
        changes: &mut PodChanges<'_>,
    ) -> bool {
        let usable = p.live()
            && !self.removing
            && !self.suspect
            && addr.is_some()
            && pass.port != 0
            && (p.ready || (self.probed && !self.was_ready));
        match (usable, self.slot) {
            (true, None) => {
                // Ready the first time this scaler saw it: a pod it never saw start.
                let adopted = self.first_seen == pass.now && p.ready;
                let addr = addr.expect("usable has an address");
                self.slot = Some(changes.add(name, addr, adopted));
                self.ever_usable = true;
                pass.usable_now = true;
            }
            (false, Some(id)) => {
                changes.remove(id);
                self.slot = None;
            }
            _ => {}
        }
        usable
    }

    /// A pod that stopped answering is checked until it answers again; one not Ready yet
    /// only when its template's probe can be run from here.
    fn update_probe(
        &mut self,
        name: &str,
        p: &LocalPod,
        addr: Option<SocketAddr>,
        usable: bool,
        pass: &Pass<'_>,
    ) {
        let check = &pass.check;
        let wants_probe = p.live()
            && !self.removing
            && !usable
            && (self.suspect
                || (check.before_ready() && !p.ready && !self.probed && !self.was_ready));
        match (wants_probe, addr) {
            (true, Some(addr)) if self.probe.is_none() && pass.port != 0 => {
                self.probe = Some(tokio::spawn(probe(
                    addr,
                    check.clone(),
                    pass.shared.cfg.probe_interval_max,
                    name.to_string(),
                    pass.probe_tx.clone(),
                )));
            }
            (false, _) => {
                if let Some(p) = self.probe.take() {
                    p.abort();
                }
            }
            _ => {}
        }
    }
}

struct Scaler {
    pool: Arc<Pool>,
    scheduler: LocalScheduler,
    tracked: HashMap<String, Tracked>,
    below_since: Option<Instant>,
    create_backoff: Duration,
    next_create: Option<Instant>,
    probe_tx: mpsc::UnboundedSender<String>,
    probe_rx: mpsc::UnboundedReceiver<String>,
    /// Addresses the node agent found, by pod name.
    addr_tx: mpsc::UnboundedSender<(String, IpAddr)>,
    addr_rx: mpsc::UnboundedReceiver<(String, IpAddr)>,
    /// The Revision (as read) whose pods the API server refused, and why: its requests fail
    /// at once until the Revision changes.
    invalid: Option<(Arc<crds::Revision>, String)>,
    /// The last create got no answer from the API server, with what requests are told:
    /// until a create is answered, requests that would wait for a pod are refused (503) at
    /// once instead of waiting for one that cannot be made.
    unreachable: Option<String>,
    /// The back-off between creates while the API server does not answer.
    unreachable_backoff: WatchBackoff,
    /// The wait before replacing pods someone else deleted before they served; doubles each
    /// time, back to the start once a pod serves.
    lost_backoff: Duration,
}

impl Scaler {
    fn new(pool: Arc<Pool>) -> Self {
        let sh = pool.shared();
        let scheduler =
            LocalScheduler::new(sh.client.clone(), sh.api.clone(), &sh.node, sh.pods.clone());
        let (probe_tx, probe_rx) = mpsc::unbounded_channel();
        let (addr_tx, addr_rx) = mpsc::unbounded_channel();
        Self {
            pool,
            scheduler,
            tracked: HashMap::new(),
            below_since: None,
            create_backoff: CREATE_BACKOFF,
            next_create: None,
            probe_tx,
            probe_rx,
            addr_tx,
            addr_rx,
            invalid: None,
            unreachable: None,
            unreachable_backoff: WatchBackoff::new(CREATE_BACKOFF, UNREACHABLE_BACKOFF_MAX),
            lost_backoff: CREATE_BACKOFF,
        }
    }

    async fn run(&mut self) {
        let pool = self.pool.clone();
        let sh = pool.shared().clone();
        let mut pods_rx = sh.pods.subscribe(pool.key());
        let Some(mut unreachable) = pool.take_unreachable() else {
            return;
        };
        tokio::select! {
            _ = sh.stop.cancelled() => return,
            _ = sh.api.within(POD_LIST_WAIT, sh.pods.synced()) => {}
        }
        loop {
            let pods = pods_rx.borrow_and_update().clone();
            self.sync(&pods);
            if self.act(&pods).await {
                return;
            }
            let next = self.next_deadline();
            tokio::select! {
                _ = sh.stop.cancelled() => return,
                r = pods_rx.changed() => if r.is_err() { return },
                _ = pool.demand_changed() => {}
                Some(name) = self.probe_rx.recv() => {
                    if let Some(t) = self.tracked.get_mut(&name) {
                        t.probed = true;
                        t.probed_at.get_or_insert_with(Instant::now);
                        t.suspect = false;
                        t.probe = None;
                    }
                }
                Some((name, ip)) = self.addr_rx.recv() => {
                    if let Some(t) = self.tracked.get_mut(&name) {
                        t.agent_ip = Some(ip);
                        t.lookup = None;
                    }
                }
                Some(name) = unreachable.recv() => {
                    if let Some(t) = self.tracked.get_mut(&name) {
                        // The request path took it out of the throttle already.
                        t.slot = None;
                        t.suspect = true;
                        t.probed = false;
                    }
                }
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }

    fn stop_probes(&mut self) {
        for t in self.tracked.values_mut() {
            if let Some(p) = t.probe.take() {
                p.abort();
            }
            if let Some(l) = t.lookup.take() {
                l.abort();
            }
        }
    }

    /// Brings the throttle in line with the pods: usable ones in, the rest out; probes
    /// started for pods that have an address but no Ready yet, or that stopped answering.
    fn sync(&mut self, pods: &RevisionPods) {
        let now = Instant::now();
        let pool = self.pool.clone();
        let sh = pool.shared();
        let (port, check) = {
            let rev = pool.revision();
            let port = u16::try_from(rev.spec.port).unwrap_or(0);
            (port, Check::of_template(&rev.spec.template.value(), port))
        };
        let mut pass = Pass {
            now,
            port,
            check,
            shared: sh,
            key: pool.key(),
            addr_tx: &self.addr_tx,
            probe_tx: &self.probe_tx,
            full: None,
            to_delete: Vec::new(),
            lost: Vec::new(),
            usable_now: false,
        };
        // One step under the pool's lock: a request sees every change of this pass or none.
        pool.change_pods(|changes| {
            pass.lost = forget_gone(&mut self.tracked, pods, changes);
            for (name, p) in pods {
                let t = self
                    .tracked
                    .entry(name.clone())
                    .or_insert_with(|| Tracked::new(now, p));
                t.sync(name, p, &mut pass, changes);
            }
            if let Some(why) = &pass.full {
                changes.node_full(why);
            }
        });
        let Pass {
            full,
            to_delete,
            lost,
            usable_now,
            ..
        } = pass;
        if usable_now {
            self.lost_backoff = CREATE_BACKOFF;
        }
        if !lost.is_empty() {
            let wait = self.lost_backoff;
            self.lost_backoff = (self.lost_backoff * 2).min(CREATE_BACKOFF_MAX);
            let until = Instant::now() + wait;
            self.next_create = Some(self.next_create.map_or(until, |t| t.max(until)));
            let why = format!(
                "pod(s) {} deleted by someone else before they took a request (the next in {:?})",
                lost.join(", "),
                wait
            );
            tracing::warn!(revision = %pool.key(), "{why}");
            sh.events
                .cold_start_failed(&pool.revision(), "PodDeleted", why);
        }
        if let Some(why) = full {
            tracing::warn!(revision = %pool.key(), reason = %why, "node full for revision");
            sh.metrics.node_full.inc();
            let rev = pool.revision();
            sh.events.node_full(&rev, &sh.node, &why);
        }
        for (name, reason) in to_delete {
            sh.metrics.pod_deleted(reason);
            let (sched, key) = (self.scheduler.clone(), pool.key().clone());
            tokio::spawn(async move { sched.delete(&key, &name).await });
        }
    }

    /// Decides and acts. True when the pool retired.
    async fn act(&mut self, pods: &RevisionPods) -> bool {
        let pool = self.pool.clone();
        let sh = pool.shared();
        let now = Instant::now();
        let live = |t: &Tracked, p: &LocalPod| p.live() && !t.removing;
        let live_count = pods
            .iter()
            .filter(|(n, p)| self.tracked.get(*n).is_some_and(|t| live(t, p)))
            .count() as u32;
        let Demand {
            in_flight,
            queued,
            spec,
        } = pool.demand();
        let rev = &spec.rev.spec;
        let observed = Observed {
            pods: live_count,
            in_flight,
            queued,
            container_concurrency: u32::try_from(rev.container_concurrency).unwrap_or(0),
            max_pods: (rev.max_scale > 0).then(|| u32::try_from(spec.me.max_pods).unwrap_or(0)),
            min_pods: u32::try_from(spec.me.min_pods).unwrap_or(0),
            idle_for: pool.idle_for(),
            below_for: self.below_since.map(|b| now.duration_since(b)),
        };
        let policy = Policy {
            target_utilisation: sh.cfg.target_utilisation,
            idle_timeout: Duration::from_secs(rev.idle_timeout_seconds.max(1).unsigned_abs()),
            stable_window: sh.cfg.scale_in_window,
            node_cap: sh.cfg.max_pods_per_revision,
        };
        if pod_count::below(&observed, &policy) {
            self.below_since.get_or_insert(now);
        } else {
            self.below_since = None;
        }
        match pod_count::decide(&observed, &policy) {
            Decision::Hold => {}
            Decision::Add(n) => self.add(pods, n, live_count == 0).await,
            Decision::RemoveOne => {
                self.remove(pods, 1, PodReason::ScaleIn);
                self.below_since = None;
            }
            Decision::SleepTo(k) => {
                self.remove(pods, live_count.saturating_sub(k), PodReason::Idle);
            }
        }
        // Counted after the decision is acted on: whoever sees this count also sees any pod
        // that decision removed (`pods_deleted`, counted as it is removed).
        if in_flight == 0
            && queued == 0
            && observed.idle_for >= policy.idle_timeout
            && observed.min_pods > 0
        {
            sh.metrics.idle_kept_min_scale.inc();
        }
        // Retire: nothing here, nothing waiting, nothing to keep.
        if live_count == 0
            && observed.min_pods == 0
            && in_flight == 0
            && queued == 0
            && observed.idle_for >= RETIRE_AFTER
            && pool.retire_if_empty()
        {
            tracing::debug!(revision = %pool.key(), "pool retired");
            return true;
        }
        false
    }

    async fn add(&mut self, pods: &RevisionPods, n: u32, cold: bool) {
        let pool = self.pool.clone();
        let sh = pool.shared();
        if let Some(why) = sh.full_reason(pool.key()) {
            pool.redirect_waiters_without_pod(&why);
            return;
        }
        let (rev, cold_start) = pool.revision_to_create();
        if let Some((bad, why)) = &self.invalid {
            if Arc::ptr_eq(bad, &rev) {
                pool.fail_waiters(why);
                return;
            }
            self.invalid = None;
            self.next_create = None;
        }
        if self.next_create.is_some_and(|t| t > Instant::now()) {
            // Backing off from an API server that does not answer: the requests that found
            // no pod cannot get one before the next attempt, which may fail too.
            if let Some(why) = &self.unreachable {
                pool.refuse_waiters_without_pod(why);
            }
            return;
        }
        let mut ordinals = Vec::new();
        for _ in 0..n {
            let o = self.scheduler.free_ordinal(pool.key(), pods, &ordinals);
            ordinals.push(o);
        }
        // The phases are recorded when the cold start ends (`Pool::add_pod`), all together.
        if cold_start {
            pool.cold_start_posted();
        }
        let results = join_all(
            ordinals
                .iter()
                .map(|o| self.scheduler.create(pool.key(), &rev, *o)),
        )
        .await;
        let reason = if cold {
            PodReason::Cold
        } else {
            PodReason::ScaleOut
        };
        let mut failed = None;
        for r in results {
            match r {
                Ok(_) => {
                    sh.metrics.pod_created(reason);
                    if cold_start {
                        pool.cold_start_bound();
                    }
                }
                Err(e) => failed = Some(e),
            }
        }
        self.answered(failed, &rev);
    }

    /// What the creates' answers change: the back-offs, and the requests waiting here when
    /// no pod can be made (`failed`: the last create that failed, if one did).
    fn answered(&mut self, failed: Option<CreateError>, rev: &Arc<crds::Revision>) {
        let pool = self.pool.clone();
        let sh = pool.shared();
        if !matches!(failed, Some(CreateError::Unreachable(_))) {
            if self.unreachable.take().is_some() {
                tracing::info!(revision = %pool.key(), "the API server answers pod creates again");
            }
            self.unreachable_backoff.reset_wait();
        }
        match failed {
            None => {
                self.create_backoff = CREATE_BACKOFF;
                self.next_create = None;
            }
            Some(e @ (CreateError::Invalid(_) | CreateError::Refused(_))) => {
                let why = e.to_string();
                tracing::warn!(revision = %pool.key(), error = %why, "cannot create pod");
                sh.events.cold_start_failed(rev, "PodRefused", why.clone());
                // What the client reads: a template fault is the revision's own; the API
                // server's words (policy names, the cluster's rules) stay in the event.
                let told = match e {
                    CreateError::Refused(_) => format!(
                        "revision {}: the API server refused its pod (the reason is in the \
                         Revision's events)",
                        pool.key()
                    ),
                    _ => why,
                };
                pool.fail_waiters_without_pod(&told);
                self.invalid = Some((rev.clone(), told));
            }
            Some(CreateError::Unreachable(why)) => {
                // No Event: there is no API server to write it to. Logged at warn once per
                // pool (it retries every second or two meanwhile, while requests come).
                if self.unreachable.is_none() {
                    tracing::warn!(revision = %pool.key(), error = %why, "creating pod: the API server does not answer; cold starts refused until it does");
                } else {
                    tracing::debug!(revision = %pool.key(), error = %why, "creating pod");
                }
                let told = format!(
                    "revision {}: cannot start a pod now: the Kubernetes API server does not \
                     answer",
                    pool.key()
                );
                pool.refuse_waiters_without_pod(&told);
                self.unreachable = Some(told);
                // Jittered: the pools of thousands of activators that lost the API server
                // together do not retry together.
                self.next_create = Some(Instant::now() + self.unreachable_backoff.next_wait());
            }
            Some(CreateError::Api(why)) => {
                sh.events
                    .cold_start_failed(rev, "PodCreateFailed", why.clone());
                tracing::warn!(revision = %pool.key(), error = %why, backoff = ?self.create_backoff, "creating pod");
                self.next_create = Some(Instant::now() + self.create_backoff);
                self.create_backoff = (self.create_backoff * 2).min(CREATE_BACKOFF_MAX);
            }
        }
    }

    /// Removes `n` pods: starting ones first (newest first), then the least busy.
    fn remove(&mut self, pods: &RevisionPods, n: u32, reason: PodReason) {
        if n == 0 {
            return;
        }
        let pool = self.pool.clone();
        let live: Vec<(&String, &Tracked)> = pods
            .iter()
            .filter_map(|(name, p)| {
                let t = self.tracked.get(name)?;
                (p.live() && !t.removing).then_some((name, t))
            })
            .collect();
        // Their load, read at one moment.
        let busy = pool.in_flight_on(live.iter().filter_map(|(_, t)| t.slot));
        let mut candidates: Vec<(bool, u32, Instant, String)> = live
            .into_iter()
            .map(|(name, t)| {
                let busy = t.slot.and_then(|id| busy.get(&id).copied());
                (
                    busy.is_some(),
                    busy.unwrap_or(0),
                    t.first_seen,
                    name.clone(),
                )
            })
            .collect();
        // Not serving first, then fewest in flight, then newest.
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.cmp(&a.2)));
        for (_, _, _, name) in candidates.into_iter().take(n as usize) {
            if let Some(t) = self.tracked.get_mut(&name) {
                t.removing = true;
                if let Some(id) = t.slot.take() {
                    pool.change_pods(|changes| changes.remove(id));
                }
                if let Some(p) = t.probe.take() {
                    p.abort();
                }
            }
            pool.shared().metrics.pod_deleted(reason);
            let (sched, key) = (self.scheduler.clone(), pool.key().clone());
            tokio::spawn(async move { sched.delete(&key, &name).await });
        }
    }

    /// When to look again without an event: the idle and stable-window clocks, a starting
    /// pod's deadline, a create back-off.
    fn next_deadline(&self) -> Instant {
        let now = Instant::now();
        let mut next = now + TICK;
        if let Some(t) = self.next_create {
            next = next.min(t.max(now));
        }
        let start_timeout = self.pool.shared().cfg.pod_start_timeout;
        for t in self.tracked.values() {
            if !t.ever_usable && !t.removing {
                next = next.min((t.first_seen + start_timeout).max(now));
            }
        }
        next
    }
}

/// Runs `check` against the pod at `addr` (backing off to `max_interval`) until it passes,
/// then reports `name`. Kubelets report readiness late (a status write after their own probe
/// period); checking ourselves lets the first request in as soon as the app can serve it.
async fn probe(
    addr: SocketAddr,
    check: Check,
    max_interval: Duration,
    name: String,
    tx: mpsc::UnboundedSender<String>,
) {
    let started = Instant::now();
    let mut wait = PROBE_FAST;
    loop {
        if check.run(addr.ip()).await {
            let _ = tx.send(name);
            return;
        }
        tokio::time::sleep(wait).await;
        // Every few milliseconds while an app would usually be starting (a request is
        // waiting for it), then backing off for one that starts slowly.
        if started.elapsed() >= PROBE_FAST_FOR {
            wait = (wait * 2).min(max_interval);
        }
    }
}
