//! The per-revision throttle: which pod a request goes to, and the FIFO of requests waiting
//! for a free slot. Pure logic, no IO: the caller ([`crate::node::pool`]) owns the lock, the
//! wake-ups and the clock.
//!
//! A pod takes at most `containerConcurrency` requests at once (0 = unlimited: the least busy
//! of two random pods). A request that finds no free slot waits in FIFO order; a slot freed,
//! or a pod added, goes to the oldest waiter first. A new request never overtakes a waiter.

use std::collections::VecDeque;
use std::net::SocketAddr;

/// A waiting request.
pub type Ticket = u64;

/// One incarnation of a pod in the throttle. A pod removed and added again (same name or same
/// address) gets a new id, so a request that finishes on the old one frees nothing on the new.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PodRef(u64);

/// A slot granted on a pod: send the request to `addr`, then [`Throttle::release`] `pod`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub pod: PodRef,
    pub addr: SocketAddr,
}

/// What [`Throttle::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Go now.
    Go(Slot),
    /// Queued; a later `release`/`add_pod` hands it a slot.
    Queued,
    /// The queue is at its limit.
    Full,
}

#[derive(Debug, Clone)]
struct Pod {
    id: PodRef,
    addr: SocketAddr,
    in_flight: u32,
}

/// Slots and the waiting queue of one revision on one node.
#[derive(Debug, Clone)]
pub struct Throttle {
    /// containerConcurrency; `None` = unlimited.
    per_pod: Option<u32>,
    pods: Vec<Pod>,
    queue: VecDeque<Ticket>,
    queue_limit: usize,
    /// In flight on pods that were removed (they still finish).
    orphans: u32,
    next_id: u64,
    /// xorshift state for the two random choices.
    rng: u64,
}

impl Throttle {
    /// `container_concurrency` 0 = unlimited; at most `queue_limit` requests wait.
    pub fn new(container_concurrency: u32, queue_limit: usize) -> Self {
        Self {
            per_pod: (container_concurrency > 0).then_some(container_concurrency),
            pods: Vec::new(),
            queue: VecDeque::new(),
            queue_limit,
            orphans: 0,
            next_id: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Changes containerConcurrency (a Revision read again); waiters get slots that opened.
    pub fn set_concurrency(&mut self, container_concurrency: u32) -> Vec<(Ticket, Slot)> {
        self.per_pod = (container_concurrency > 0).then_some(container_concurrency);
        self.dispatch()
    }

    /// A slot now, a place in the queue, or `Full`.
    pub fn admit(&mut self, ticket: Ticket) -> Admit {
        if self.queue.is_empty()
            && let Some(slot) = self.take_slot()
        {
            return Admit::Go(slot);
        }
        if self.queue.len() >= self.queue_limit {
            return Admit::Full;
        }
        self.queue.push_back(ticket);
        Admit::Queued
    }

    /// Takes `ticket` out of the queue (its request went away). False when it was not
    /// queued (it has been handed a slot already, or was never queued).
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        match self.queue.iter().position(|t| *t == ticket) {
            Some(i) => {
                self.queue.remove(i);
                true
            }
            None => false,
        }
    }

    /// A request on `pod` finished; the freed slot goes to the oldest waiter.
    pub fn release(&mut self, pod: PodRef) -> Vec<(Ticket, Slot)> {
        match self.pods.iter_mut().find(|p| p.id == pod) {
            Some(p) => p.in_flight = p.in_flight.saturating_sub(1),
            None => self.orphans = self.orphans.saturating_sub(1),
        }
        self.dispatch()
    }

    /// A pod became usable; waiters get its slots.
    pub fn add_pod(&mut self, addr: SocketAddr) -> (PodRef, Vec<(Ticket, Slot)>) {
        self.next_id += 1;
        let id = PodRef(self.next_id);
        self.pods.push(Pod {
            id,
            addr,
            in_flight: 0,
        });
        (id, self.dispatch())
    }

    /// A pod is no longer usable (gone, unreachable, being removed). Requests on it finish
    /// or fail on their own; nothing new goes to it. Queued requests stay queued.
    pub fn remove_pod(&mut self, pod: PodRef) {
        if let Some(i) = self.pods.iter().position(|p| p.id == pod) {
            self.orphans += self.pods.swap_remove(i).in_flight;
        }
    }

    /// Empties the queue, returning its tickets in order (to send those requests elsewhere).
    pub fn take_queue(&mut self) -> Vec<Ticket> {
        self.queue.drain(..).collect()
    }

    /// Whether a request admitted now would wait (someone waits already, or no slot is free).
    pub fn would_wait(&self) -> bool {
        !self.queue.is_empty() || !self.pods.iter().any(|p| self.free(p))
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Requests holding a slot, including on pods since removed.
    pub fn in_flight(&self) -> u32 {
        self.pods.iter().map(|p| p.in_flight).sum::<u32>() + self.orphans
    }

    /// In flight on one pod (None: not in the throttle).
    pub fn in_flight_on(&self, pod: PodRef) -> Option<u32> {
        self.pods.iter().find(|p| p.id == pod).map(|p| p.in_flight)
    }

    pub fn pods(&self) -> usize {
        self.pods.len()
    }

    /// containerConcurrency (None: unlimited).
    pub fn per_pod(&self) -> Option<u32> {
        self.per_pod
    }

    fn free(&self, p: &Pod) -> bool {
        self.per_pod.is_none_or(|c| p.in_flight < c)
    }

    /// The least busy pod with a free slot: among all of them when concurrency is limited
    /// (few pods per revision on a node), the better of two random ones when not.
    fn take_slot(&mut self) -> Option<Slot> {
        let n = self.pods.len();
        let i = match (self.per_pod, n) {
            (_, 0) => return None,
            (None, 1) => 0,
            (None, _) => {
                let a = self.next_random() % n;
                let mut b = self.next_random() % (n - 1);
                if b >= a {
                    b += 1;
                }
                if self.pods[b].in_flight < self.pods[a].in_flight {
                    b
                } else {
                    a
                }
            }
            (Some(_), _) => {
                self.pods
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| self.free(p))
                    .min_by_key(|(_, p)| p.in_flight)?
                    .0
            }
        };
        let p = &mut self.pods[i];
        p.in_flight += 1;
        Some(Slot {
            pod: p.id,
            addr: p.addr,
        })
    }

    fn dispatch(&mut self) -> Vec<(Ticket, Slot)> {
        let mut out = Vec::new();
        while !self.queue.is_empty() {
            let Some(slot) = self.take_slot() else { break };
            let t = self.queue.pop_front().expect("queue is not empty");
            out.push((t, slot));
        }
        out
    }

    fn next_random(&mut self) -> usize {
        // xorshift64: statistical quality is irrelevant here, only spreading.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, i], 8080))
    }

    #[test]
    fn concurrency_one_never_gives_a_pod_two_requests() {
        let mut t = Throttle::new(1, 100);
        let (p, woken) = t.add_pod(addr(1));
        assert!(woken.is_empty());
        let Admit::Go(s) = t.admit(1) else {
            panic!("first request goes")
        };
        assert_eq!(s.pod, p);
        assert_eq!(t.admit(2), Admit::Queued);
        assert_eq!(t.admit(3), Admit::Queued);
        assert_eq!(t.in_flight_on(p), Some(1));
        // FIFO: the slot goes to 2, then 3.
        assert_eq!(t.release(p), vec![(2, s)]);
        assert_eq!(t.in_flight_on(p), Some(1));
        assert_eq!(t.release(p), vec![(3, s)]);
        assert!(t.release(p).is_empty());
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_new_pod_takes_the_oldest_waiters_up_to_its_capacity() {
        let mut t = Throttle::new(2, 100);
        for i in 0..5 {
            assert_eq!(t.admit(i), Admit::Queued);
        }
        let (p, woken) = t.add_pod(addr(1));
        assert_eq!(
            woken.iter().map(|w| w.0).collect::<Vec<_>>(),
            vec![0, 1],
            "two slots, oldest first"
        );
        assert!(woken.iter().all(|w| w.1.pod == p));
        let (_, woken) = t.add_pod(addr(2));
        assert_eq!(woken.iter().map(|w| w.0).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(t.queued(), 1);
        assert_eq!(t.in_flight(), 4);
    }

    #[test]
    fn a_new_request_never_overtakes_a_waiter() {
        let mut t = Throttle::new(1, 100);
        assert_eq!(t.admit(1), Admit::Queued);
        let (_, woken) = t.add_pod(addr(1));
        assert_eq!(woken.len(), 1);
        assert_eq!(t.admit(2), Admit::Queued, "the only slot is taken");
    }

    #[test]
    fn the_queue_is_bounded_and_cancel_frees_a_place() {
        let mut t = Throttle::new(1, 2);
        assert_eq!(t.admit(1), Admit::Queued);
        assert_eq!(t.admit(2), Admit::Queued);
        assert_eq!(t.admit(3), Admit::Full);
        assert!(t.cancel(1));
        assert!(!t.cancel(1), "already gone");
        assert_eq!(t.admit(3), Admit::Queued);
        let (_, woken) = t.add_pod(addr(1));
        assert_eq!(woken[0].0, 2, "the cancelled request is skipped");
    }

    #[test]
    fn a_removed_pod_takes_nothing_new_and_its_requests_still_count() {
        let mut t = Throttle::new(1, 10);
        let (p, _) = t.add_pod(addr(1));
        let Admit::Go(_) = t.admit(1) else { panic!() };
        t.remove_pod(p);
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.admit(2), Admit::Queued);
        // A release on the removed pod frees no slot anywhere...
        assert!(t.release(p).is_empty());
        assert_eq!(t.in_flight(), 0);
        // ...and the same address added again is a new pod with its own slots.
        let (q, woken) = t.add_pod(addr(1));
        assert_ne!(p, q);
        assert_eq!(woken.len(), 1);
        assert!(
            t.release(p).is_empty(),
            "late release of the old incarnation"
        );
        assert_eq!(t.in_flight_on(q), Some(1));
    }

    #[test]
    fn unlimited_concurrency_spreads_by_least_in_flight() {
        let mut t = Throttle::new(0, 10);
        let pods: Vec<PodRef> = (1..=4).map(|i| t.add_pod(addr(i)).0).collect();
        for i in 0..400 {
            assert!(matches!(t.admit(i), Admit::Go(_)));
        }
        // Two random choices keep the spread tight: no pod far above the mean of 100.
        for p in &pods {
            let n = t.in_flight_on(*p).unwrap();
            assert!((80..=120).contains(&n), "pod has {n} of 400");
        }
        assert_eq!(t.queued(), 0);
    }

    #[test]
    fn raising_concurrency_wakes_waiters() {
        let mut t = Throttle::new(1, 10);
        t.add_pod(addr(1));
        let Admit::Go(_) = t.admit(1) else { panic!() };
        assert_eq!(t.admit(2), Admit::Queued);
        assert_eq!(t.set_concurrency(2).len(), 1);
        assert_eq!(t.set_concurrency(0).len(), 0);
        assert!(matches!(t.admit(3), Admit::Go(_)));
    }

    #[test]
    fn take_queue_empties_it_in_order() {
        let mut t = Throttle::new(1, 10);
        for i in [5, 6, 7] {
            t.admit(i);
        }
        assert_eq!(t.take_queue(), vec![5, 6, 7]);
        assert_eq!(t.queued(), 0);
    }
}
