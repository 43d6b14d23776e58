//! Idle keep-alive connections by target address, for the pools to pods and peers
//! ([`crate::upstream::h1`], [`crate::fast::pod_conns`]): bounded per target, expired after an idle
//! timeout, and swept as a whole now and then — targets are pods, which come and go, and a
//! pod that went away must not leave entries behind.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

/// Idle connections kept per target; more are closed when their response ends. A pod takes
/// at most containerConcurrency requests at once, so this bounds only the unlimited case.
pub const MAX_IDLE_PER_TARGET: usize = 256;

pub struct Idle<C> {
    pub conn: C,
    pub since: Instant,
}

pub struct IdleSet<C> {
    by_target: HashMap<SocketAddr, Vec<Idle<C>>>,
    swept: Instant,
    idle_timeout: Duration,
}

impl<C> IdleSet<C> {
    pub fn new(idle_timeout: Duration) -> Self {
        Self {
            by_target: HashMap::new(),
            swept: Instant::now(),
            idle_timeout,
        }
    }

    /// `target`'s idle connections, oldest first (after a sweep, if one is due).
    pub fn of(
        &mut self,
        target: SocketAddr,
        now: Instant,
        open: impl Fn(&C) -> bool,
    ) -> Option<&mut Vec<Idle<C>>> {
        self.sweep_if_due(now, open);
        self.by_target.get_mut(&target)
    }

    /// Keeps `conn` for `target`, unless it already has as many as it may.
    pub fn put(&mut self, target: SocketAddr, conn: C, now: Instant, open: impl Fn(&C) -> bool) {
        self.sweep_if_due(now, open);
        let list = self.by_target.entry(target).or_default();
        if list.len() < MAX_IDLE_PER_TARGET {
            list.push(Idle { conn, since: now });
        }
    }

    /// Connections held, over all targets.
    pub fn len(&self) -> usize {
        self.by_target.values().map(Vec::len).sum()
    }

    /// No target left (the sweep drops targets left with no connection).
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.by_target.is_empty()
    }

    /// Drops closed and expired connections, and targets left with none, every half idle
    /// timeout.
    fn sweep_if_due(&mut self, now: Instant, open: impl Fn(&C) -> bool) {
        if now.duration_since(self.swept) < self.idle_timeout / 2 {
            return;
        }
        self.swept = now;
        let timeout = self.idle_timeout;
        self.by_target.retain(|_, list| {
            list.retain(|i| open(&i.conn) && now.duration_since(i.since) < timeout);
            !list.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_per_target_and_swept_of_closed_and_expired_ones() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        );
        let mut set = IdleSet::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..MAX_IDLE_PER_TARGET + 5 {
            set.put(a, i, t0, |_| true);
        }
        set.put(b, 7, t0, |_| true);
        assert_eq!(set.len(), MAX_IDLE_PER_TARGET + 1);
        // Half the idle timeout later: a sweep drops what is closed (odd ones here).
        let later = t0 + Duration::from_secs(5);
        let list = set.of(a, later, |c| c % 2 == 0).unwrap();
        assert!(list.iter().all(|i| i.conn % 2 == 0));
        // A whole idle timeout later, everything has expired, and its targets are gone.
        assert!(set.of(b, t0 + Duration::from_secs(11), |_| true).is_none());
        assert!(set.is_empty());
    }
}
