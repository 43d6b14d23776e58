//! How many pods a revision should have on this node. Pure logic, no IO: the scaler in
//! [`crate::node::pool`] observes, asks [`decide`], and acts.
//!
//! - **Out**: when in-flight + queued exceeds the target utilisation (70 % by default) of
//!   the capacity of the pods it has (starting ones included), enough pods to bring it back
//!   under, never above the member's share (`maxPods`) or the node cap. With
//!   containerConcurrency 0 a pod has no fixed capacity: one pod takes everything.
//! - **In**: one pod at a time, after demand stayed below what fewer pods would hold for a
//!   stable window (so a burst's tail does not flap pods).
//! - **Idle**: no request for `idleTimeoutSeconds` → down to `minPods` (zero by default): the
//!   app goes back to sleep and the next request is a cold start.

use std::time::Duration;

/// What the scaler sees.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    /// Pods that are live: usable or still starting.
    pub pods: u32,
    pub in_flight: u32,
    pub queued: u32,
    /// containerConcurrency (0 = unlimited).
    pub container_concurrency: u32,
    /// This member's share of maxScale (None: no limit but the node cap).
    pub max_pods: Option<u32>,
    /// This member's share of minScale.
    pub min_pods: u32,
    /// Time since the last request arrived (or finished).
    pub idle_for: Duration,
    /// How long demand has fit in fewer pods (None: it does not).
    pub below_for: Option<Duration>,
}

/// Tuning, from the activator's configuration and the Revision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Fraction of containerConcurrency a pod should run at (0.7).
    pub target_utilisation: f64,
    /// The Revision's idleTimeoutSeconds.
    pub idle_timeout: Duration,
    /// How long demand must stay low before one pod is removed.
    pub stable_window: Duration,
    /// Pods of one revision this node runs at most, whatever maxScale says.
    pub node_cap: u32,
}

/// What to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Hold,
    /// Create this many pods.
    Add(u32),
    /// Remove one pod (scale in).
    RemoveOne,
    /// Idle: remove pods down to this many.
    SleepTo(u32),
}

/// The pods demand needs (at least 1 when anything is waiting or running).
pub fn wanted(o: &Observed, p: &Policy) -> u32 {
    let demand = o.in_flight + o.queued;
    if demand == 0 {
        return 0;
    }
    if o.container_concurrency == 0 {
        return 1;
    }
    let per_pod =
        (f64::from(o.container_concurrency) * p.target_utilisation).max(f64::MIN_POSITIVE);
    let n = (f64::from(demand) / per_pod).ceil();
    if n >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        (n as u32).max(1)
    }
}

/// The most pods this member may run.
pub fn ceiling(o: &Observed, p: &Policy) -> u32 {
    o.max_pods.map_or(p.node_cap, |m| m.min(p.node_cap))
}

pub fn decide(o: &Observed, p: &Policy) -> Decision {
    let cap = ceiling(o, p);
    let floor = o.min_pods.min(cap);
    let busy = o.in_flight + o.queued > 0;
    if !busy && o.idle_for >= p.idle_timeout {
        return if o.pods > floor {
            Decision::SleepTo(floor)
        } else if o.pods < floor {
            Decision::Add(floor - o.pods)
        } else {
            Decision::Hold
        };
    }
    let want = wanted(o, p).max(floor).min(cap);
    if want > o.pods {
        return Decision::Add(want - o.pods);
    }
    // Keep at least one pod while anything is busy or the app has not been idle long enough.
    let keep = want.max(1).max(floor);
    if o.pods > keep && o.below_for.is_some_and(|b| b >= p.stable_window) {
        return Decision::RemoveOne;
    }
    Decision::Hold
}

/// Whether demand fits in fewer pods than there are (starts the stable window).
pub fn below(o: &Observed, p: &Policy) -> bool {
    let floor = o.min_pods.min(ceiling(o, p));
    o.pods > wanted(o, p).max(1).max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            target_utilisation: 0.7,
            idle_timeout: Duration::from_secs(300),
            stable_window: Duration::from_secs(30),
            node_cap: 20,
        }
    }

    fn obs() -> Observed {
        Observed {
            pods: 0,
            in_flight: 0,
            queued: 0,
            container_concurrency: 10,
            max_pods: None,
            min_pods: 0,
            idle_for: Duration::ZERO,
            below_for: None,
        }
    }

    #[test]
    fn a_cold_request_starts_one_pod() {
        let o = Observed { queued: 1, ..obs() };
        assert_eq!(decide(&o, &policy()), Decision::Add(1));
        let started = Observed { pods: 1, ..o };
        assert_eq!(decide(&started, &policy()), Decision::Hold);
    }

    #[test]
    fn unlimited_concurrency_keeps_one_pod_whatever_the_burst() {
        let o = Observed {
            queued: 1000,
            container_concurrency: 0,
            ..obs()
        };
        assert_eq!(decide(&o, &policy()), Decision::Add(1));
        assert_eq!(
            decide(&Observed { pods: 1, ..o }, &policy()),
            Decision::Hold
        );
    }

    #[test]
    fn scales_out_past_the_target_utilisation() {
        // 10 per pod at 70 % = 7: 8 requests need 2 pods, 21 need 3.
        let o = Observed {
            pods: 1,
            in_flight: 7,
            ..obs()
        };
        assert_eq!(decide(&o, &policy()), Decision::Hold);
        let o = Observed { in_flight: 8, ..o };
        assert_eq!(decide(&o, &policy()), Decision::Add(1));
        let o = Observed {
            in_flight: 10,
            queued: 11,
            ..o
        };
        assert_eq!(decide(&o, &policy()), Decision::Add(2));
    }

    #[test]
    fn never_above_the_share_or_the_node_cap() {
        let o = Observed {
            pods: 2,
            queued: 500,
            max_pods: Some(2),
            ..obs()
        };
        assert_eq!(decide(&o, &policy()), Decision::Hold);
        let o = Observed {
            max_pods: None,
            ..o
        };
        assert_eq!(decide(&o, &policy()), Decision::Add(18), "node cap 20");
        let o = Observed { pods: 25, ..o };
        assert_eq!(ceiling(&o, &policy()), 20);
    }

    #[test]
    fn scales_in_one_pod_after_the_stable_window() {
        let o = Observed {
            pods: 3,
            in_flight: 2,
            ..obs()
        };
        assert!(below(&o, &policy()));
        assert_eq!(decide(&o, &policy()), Decision::Hold, "window not started");
        let o = Observed {
            below_for: Some(Duration::from_secs(29)),
            ..o
        };
        assert_eq!(decide(&o, &policy()), Decision::Hold);
        let o = Observed {
            below_for: Some(Duration::from_secs(30)),
            ..o
        };
        assert_eq!(decide(&o, &policy()), Decision::RemoveOne);
        let one = Observed { pods: 1, ..o };
        assert!(!below(&one, &policy()));
        assert_eq!(
            decide(&one, &policy()),
            Decision::Hold,
            "the last pod stays while busy"
        );
    }

    #[test]
    fn idle_goes_to_min_pods_and_zero_by_default() {
        let idle = Observed {
            pods: 3,
            idle_for: Duration::from_secs(300),
            below_for: Some(Duration::from_secs(300)),
            ..obs()
        };
        assert_eq!(decide(&idle, &policy()), Decision::SleepTo(0));
        let min = Observed {
            min_pods: 1,
            ..idle
        };
        assert_eq!(decide(&min, &policy()), Decision::SleepTo(1));
        let at_min = Observed { pods: 1, ..min };
        assert_eq!(decide(&at_min, &policy()), Decision::Hold);
        let asleep = Observed { pods: 0, ..idle };
        assert_eq!(decide(&asleep, &policy()), Decision::Hold);
        // Not idle long enough: the idle pod stays (scale-in keeps one).
        let recent = Observed {
            pods: 1,
            idle_for: Duration::from_secs(299),
            ..asleep
        };
        assert_eq!(decide(&recent, &policy()), Decision::Hold);
    }

    #[test]
    fn min_pods_are_kept_and_created_without_traffic() {
        let o = Observed {
            min_pods: 2,
            idle_for: Duration::from_secs(1000),
            ..obs()
        };
        assert_eq!(decide(&o, &policy()), Decision::Add(2));
        let o = Observed {
            min_pods: 2,
            ..obs()
        };
        assert_eq!(decide(&o, &policy()), Decision::Add(2));
        // A share of minScale above the share of maxScale is clamped.
        let o = Observed {
            min_pods: 5,
            max_pods: Some(3),
            ..obs()
        };
        assert_eq!(decide(&o, &policy()), Decision::Add(3));
    }
}
