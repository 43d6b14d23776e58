//! Which serving thread a connection is served on.
//!
//! Why not leave it to the kernel (SO_REUSEPORT hashes connections over the threads): a
//! thread with a few busy connections wakes up once per event, where a thread with more of
//! them finds several ready at each wake-up and sleeps less. Spreading a light load over
//! every core costs more CPU per request, and the activator shares its node with the apps it
//! wakes. So a new connection goes to the first thread that has fewer than `pack`
//! connections and is not hot; past that, to the one with the fewest. Since connections
//! differ (one from an ingress may carry thousands of requests a second), a hot thread also
//! moves connections, between two requests, to one that is cool — a few per tick, so that
//! nothing goes back and forth.
//! Pure logic: each serving thread reports how busy it was ([`Placement::record`]), and the
//! threads do the moving ([`crate::threads::serving_threads`], [`crate::fast`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Busy at or above this share of a tick (in thousandths), a thread takes no new connection
/// while another is below it, and moves some of its own (by default).
pub const HOT: u32 = 900;
/// A thread takes moved connections only while below this share (by default).
pub const COOL: u32 = 600;
/// Of a hot thread's connections, this fraction may move per tick (at least one).
const MOVE_SHARE: usize = 4;

/// One serving thread's figures.
#[derive(Debug, Default)]
struct Thread {
    conns: AtomicUsize,
    /// Busy share of the last tick, in thousandths.
    busy: AtomicU32,
    /// Connections it may still move away this tick.
    moves: AtomicUsize,
}

/// The serving threads' figures, and where a connection goes.
#[derive(Debug)]
pub struct Placement {
    threads: Vec<Thread>,
    /// Connections a thread takes before the next one is used; 0: a connection stays where
    /// the kernel put it (unless its thread is hot).
    pack: usize,
    hot: u32,
    cool: u32,
}

impl Placement {
    /// With the default [`HOT`] and [`COOL`].
    pub fn new(threads: usize, pack: usize) -> Arc<Self> {
        Self::with_thresholds(threads, pack, HOT, COOL)
    }

    /// `hot` and `cool` in thousandths of a tick.
    pub fn with_thresholds(threads: usize, pack: usize, hot: u32, cool: u32) -> Arc<Self> {
        Arc::new(Self {
            threads: (0..threads.max(1)).map(|_| Thread::default()).collect(),
            pack,
            hot,
            cool,
        })
    }

    fn busy(&self, i: usize) -> u32 {
        self.threads[i].busy.load(Ordering::Relaxed)
    }

    /// The thread a connection accepted on thread `here` is served on: the first one with
    /// room in its pack that is not hot, else the one with the fewest connections that is
    /// not hot, else the least busy (`here` on a tie, and with no packing while `here` is
    /// not hot).
    pub fn choose(&self, here: usize) -> usize {
        let n = self.threads.len();
        let cool = |i: &usize| self.busy(*i) < self.hot;
        if self.pack == 0 && cool(&here) {
            return here;
        }
        if let Some(i) = (0..n).filter(cool).find(|&i| self.conns(i) < self.pack) {
            return i;
        }
        if let Some(i) = (0..n)
            .filter(cool)
            .min_by_key(|&i| (self.conns(i), i != here))
        {
            return i;
        }
        (0..n)
            .min_by_key(|&i| (self.busy(i), i != here))
            .unwrap_or(here)
    }

    /// Thread `i` was busy for `busy` thousandths of the last tick: it may move a share of
    /// its connections in the next one if that makes it hot.
    pub fn record(&self, i: usize, busy: u32) {
        let t = &self.threads[i];
        t.busy.store(busy, Ordering::Relaxed);
        let moves = if busy >= self.hot {
            t.conns.load(Ordering::Relaxed) / MOVE_SHARE + 1
        } else {
            0
        };
        t.moves.store(moves, Ordering::Relaxed);
    }

    /// Between two requests on thread `i`: the thread the connection should move to, if
    /// any (one of this tick's moves is used up).
    pub fn move_to(&self, i: usize) -> Option<usize> {
        let t = &self.threads[i];
        // The common case, one load: nothing to move.
        if t.moves.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let to = (0..self.threads.len())
            .filter(|&j| j != i)
            .min_by_key(|&j| self.busy(j))?;
        if self.busy(to) >= self.cool {
            return None;
        }
        t.moves
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| m.checked_sub(1))
            .ok()
            .map(|_| to)
    }

    /// Counts a connection on thread `i` until the guard is dropped.
    pub fn enter(self: &Arc<Self>, i: usize) -> Placed {
        self.threads[i].conns.fetch_add(1, Ordering::Relaxed);
        Placed {
            placement: self.clone(),
            thread: i,
        }
    }

    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Connections on thread `i` now.
    pub fn conns(&self, i: usize) -> usize {
        self.threads[i].conns.load(Ordering::Relaxed)
    }
}

/// A connection counted on its thread.
#[derive(Debug)]
pub struct Placed {
    placement: Arc<Placement>,
    thread: usize,
}

impl Drop for Placed {
    fn drop(&mut self) {
        self.placement.threads[self.thread]
            .conns
            .fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Places `n` connections accepted on `here`, holding them.
    fn place(p: &Arc<Placement>, n: usize, here: usize, held: &mut Vec<Placed>) -> Vec<usize> {
        (0..n)
            .map(|_| {
                let i = p.choose(here);
                held.push(p.enter(i));
                i
            })
            .collect()
    }

    #[test]
    fn connections_fill_the_first_thread_then_spill_then_spread() {
        let p = Placement::new(2, 3);
        let mut held = Vec::new();
        assert_eq!(place(&p, 8, 1, &mut held), [0, 0, 0, 1, 1, 1, 1, 0]);
        // One on thread 1 closes: the next goes there.
        held.remove(3);
        assert_eq!(p.choose(0), 1);
    }

    #[test]
    fn a_hot_thread_takes_no_new_connection_while_another_is_not() {
        let p = Placement::new(3, 4);
        let mut held = Vec::new();
        p.record(0, HOT);
        assert_eq!(place(&p, 5, 0, &mut held), [1, 1, 1, 1, 2]);
        p.record(1, 950);
        p.record(2, 990);
        assert_eq!(p.choose(2), 0, "all hot: the least busy");
        p.record(0, 990);
        p.record(1, 990);
        assert_eq!(p.choose(2), 2, "a tie: where it was accepted");
    }

    #[test]
    fn without_packing_a_connection_stays_where_it_was_accepted_unless_that_is_hot() {
        let p = Placement::new(3, 0);
        let mut held = Vec::new();
        assert_eq!(place(&p, 2, 2, &mut held), [2, 2]);
        p.record(2, HOT);
        assert_eq!(p.choose(2), 0, "the fewest connections among the rest");
    }

    #[test]
    fn a_hot_thread_moves_a_quarter_of_its_connections_per_tick_to_a_cool_one() {
        let p = Placement::new(2, 16);
        let _held: Vec<_> = (0..8).map(|_| p.enter(0)).collect();
        assert_eq!(p.move_to(0), None, "no figures yet: nothing moves");
        p.record(0, 990);
        p.record(1, 0);
        let moved: Vec<_> = (0..8).filter_map(|_| p.move_to(0)).collect();
        assert_eq!(moved, [1, 1, 1], "8 / 4 + 1 this tick");
        // The next tick: still hot, but the other thread is no longer cool.
        p.record(0, 950);
        p.record(1, COOL);
        assert_eq!(p.move_to(0), None);
        // Cooler again, but this thread is not hot any more.
        p.record(1, 100);
        p.record(0, HOT - 1);
        assert_eq!(p.move_to(0), None);
        assert_eq!(p.move_to(1), None, "a cool thread never moves");
    }

    #[test]
    fn connections_are_counted_while_held() {
        let p = Placement::new(2, 16);
        let a = p.enter(1);
        let b = p.enter(1);
        assert_eq!(p.conns(1), 2);
        drop(a);
        assert_eq!(p.conns(1), 1);
        drop(b);
        assert_eq!((p.conns(0), p.conns(1)), (0, 0));
    }

    #[test]
    fn one_thread_keeps_everything() {
        let p = Placement::new(1, 16);
        p.record(0, 1000);
        assert_eq!(p.choose(0), 0);
        assert_eq!(p.move_to(0), None);
    }
}
