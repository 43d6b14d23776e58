//! The warm hand-over of a host (pure, no IO): a newer revision that claims a host an older
//! revision serves takes it only once it can serve it — as many Ready pods as the older one
//! has now (at least one, within the newer one's maxScale) — or once its bound has passed
//! (`spec.handOverTimeoutSeconds`, default `timeoutSeconds`). Until then the older revision
//! keeps the host: the newer one's ActivationEndpoints carries no label for it, so no
//! activator routes the host there, and its members keep the pods to start (`minPods`).
//! A host nobody serves yet moves at once: there is no cold start to save.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::pure::key::Key;

/// A host of the newer revision that an older one serves now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The normalized host.
    pub host: String,
    /// The revision serving it.
    pub by: Key,
    /// Its Ready pods.
    pub ready: u32,
}

/// What the newer revision does with the hosts others hold.
#[derive(Clone, Debug, PartialEq)]
pub enum HandOver {
    /// Nothing held: its hosts are its own (or nobody's).
    Nothing,
    /// Keep the held hosts' labels off; keep `needed` pods started across the members.
    Wait {
        needed: i32,
        ready: u32,
        deadline: Timestamp,
        message: String,
    },
    /// Take the held hosts now: `warm` when the pods are there, false when the bound passed.
    Move {
        warm: bool,
        ready: u32,
        needed: i32,
        waited: SignedDuration,
        message: String,
    },
}

/// Inputs of [`decide`].
pub struct Inputs<'a> {
    pub held: &'a [Held],
    /// The newer revision's Ready pods.
    pub ready: u32,
    /// Its maxScale (0: unlimited).
    pub max_scale: i32,
    /// Its bound, in seconds (0: move at once).
    pub bound_seconds: i64,
    /// Since when it has waited (its `RoutesReady=False` transition), None if it has not.
    pub waiting_since: Option<Timestamp>,
    pub now: Timestamp,
}

/// The pods a revision needs before it takes a host from revisions that have `ready` pods:
/// as many (at least one), within its maxScale.
pub fn needed(holders_ready: u32, max_scale: i32) -> i32 {
    let n = i32::try_from(holders_ready).unwrap_or(i32::MAX).max(1);
    if max_scale > 0 { n.min(max_scale) } else { n }
}

pub fn decide(inp: &Inputs<'_>) -> HandOver {
    if inp.held.is_empty() {
        return HandOver::Nothing;
    }
    let holders_ready = inp.held.iter().map(|h| h.ready).max().unwrap_or(0);
    let needed = needed(holders_ready, inp.max_scale);
    let since = inp.waiting_since.unwrap_or(inp.now);
    let waited = inp.now.duration_since(since);
    let deadline = since
        .checked_add(SignedDuration::from_secs(inp.bound_seconds))
        .unwrap_or(since);
    let hosts = describe(inp.held);
    let have = i64::from(inp.ready) >= i64::from(needed);
    if have || inp.now >= deadline {
        let message = if have {
            format!(
                "took {hosts} with {} of {needed} pods Ready after {:.1} s",
                inp.ready,
                waited.as_secs_f64()
            )
        } else {
            format!(
                "took {hosts} after the {} s hand-over bound with {} of {needed} pods Ready",
                inp.bound_seconds, inp.ready
            )
        };
        return HandOver::Move {
            warm: have,
            ready: inp.ready,
            needed,
            waited,
            message,
        };
    }
    HandOver::Wait {
        needed,
        ready: inp.ready,
        deadline,
        message: format!(
            "{hosts}: waiting for {needed} pods Ready ({} now); moves by {deadline} at the latest",
            inp.ready
        ),
    }
}

/// `host a.test (served by apps/v1 with 3 pods), host b.test (...)`.
fn describe(held: &[Held]) -> String {
    held.iter()
        .map(|h| format!("host {} from {} ({} pods Ready)", h.host, h.by, h.ready))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn held(ready: u32) -> Vec<Held> {
        vec![Held {
            host: "shop.test".into(),
            by: Key::new("apps", "v1"),
            ready,
        }]
    }

    fn inputs(held: &[Held], ready: u32, since: Option<i64>, now: i64) -> Inputs<'_> {
        Inputs {
            held,
            ready,
            max_scale: 0,
            bound_seconds: 300,
            waiting_since: since.map(t),
            now: t(now),
        }
    }

    #[test]
    fn nothing_held_moves_nothing() {
        assert_eq!(decide(&inputs(&[], 0, None, 100)), HandOver::Nothing);
    }

    #[test]
    fn waits_for_as_many_pods_as_the_holder_has() {
        let h = held(3);
        match decide(&inputs(&h, 2, None, 100)) {
            HandOver::Wait {
                needed,
                ready,
                deadline,
                message,
            } => {
                assert_eq!((needed, ready), (3, 2));
                assert_eq!(deadline, t(400));
                assert!(
                    message.contains("waiting for 3 pods Ready (2 now)"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        match decide(&inputs(&h, 3, Some(100), 102)) {
            HandOver::Move { warm, waited, .. } => {
                assert!(warm);
                assert_eq!(waited, SignedDuration::from_secs(2));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_holder_without_pods_still_needs_one() {
        let h = held(0);
        assert!(matches!(
            decide(&inputs(&h, 0, None, 100)),
            HandOver::Wait { needed: 1, .. }
        ));
        assert!(matches!(
            decide(&inputs(&h, 1, Some(100), 101)),
            HandOver::Move { warm: true, .. }
        ));
    }

    #[test]
    fn the_bound_moves_it_cold_and_max_scale_caps_the_need() {
        let h = held(5);
        match decide(&inputs(&h, 1, Some(100), 400)) {
            HandOver::Move { warm, message, .. } => {
                assert!(!warm);
                assert!(
                    message.contains("after the 300 s hand-over bound"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        let mut capped = inputs(&h, 2, Some(100), 101);
        capped.max_scale = 2;
        assert!(matches!(
            decide(&capped),
            HandOver::Move {
                warm: true,
                needed: 2,
                ..
            }
        ));
        let mut at_once = inputs(&h, 0, None, 100);
        at_once.bound_seconds = 0;
        assert!(matches!(
            decide(&at_once),
            HandOver::Move { warm: false, .. }
        ));
    }
}
