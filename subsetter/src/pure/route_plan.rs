//! What one Route serves now (pure, no IO): its spec resolved (`latestRevision` to a name),
//! and the move from what it served toward that, taken in steps that each wait for the
//! gaining revisions' pods — the pods the other revisions serve their share with, scaled to
//! the gainer's new share (at least one, within maxScale) — or for their hand-over bound. With
//! `rolloutDurationSeconds`, a move is cut into ten steps spread over it. An invalid spec
//! changes nothing that is served. The result is the Route's new status; the subsetter
//! publishes it as `status.routes` of the revisions' ActivationEndpoints (`routes.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use crds::route::{ServedTarget, summary};
use crds::{RouteSpec, RouteStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::pure::conditions::{self, Desired};
use crate::pure::handover::needed;

/// Steps of a gradual rollout.
const STEPS: i64 = 10;

/// What a route needs to know of one revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    pub ready: u32,
    pub max_scale: i32,
    pub bound_seconds: i64,
}

/// Inputs of [`decide`].
pub struct Inputs<'a> {
    pub spec: &'a RouteSpec,
    pub generation: Option<i64>,
    pub status: Option<&'a RouteStatus>,
    /// The revision `latestRevision` follows (the newest claimant of the route's hosts).
    pub latest: Option<String>,
    /// A revision of the route's namespace, if it exists (and is valid).
    pub facts: &'a dyn Fn(&str) -> Option<Facts>,
    /// What serves the hosts before the route has served anything (the claim rule's winner,
    /// in the route's namespace): the move starts from it, so a new Route is a warm move too.
    pub serving_now: Option<String>,
    /// Problems found outside the spec (a host another Route routes).
    pub problems: Vec<String>,
    pub now: Timestamp,
}

/// What to write and do.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub status: RouteStatus,
    /// Revisions that wait for pods: keep this many started across their members.
    pub warm: Vec<(String, i32)>,
    /// Look again after this long (the next step, or a bound), even without an event.
    pub requeue: Option<Duration>,
    /// The served split changed: what to say in the Event.
    pub moved: Option<String>,
}

type Shares = BTreeMap<String, i32>;

fn shares(t: &[ServedTarget]) -> Shares {
    let mut s = Shares::new();
    for x in t {
        if x.percent > 0 {
            *s.entry(x.revision_name.clone()).or_default() += x.percent;
        }
    }
    s
}

/// What `inp`'s Route serves now and what to write: its status, the pods to keep warm, when
/// to look again, and whether the served split moved.
pub fn decide(inp: &Inputs<'_>) -> Decision {
    let old = inp.status.cloned().unwrap_or_default();
    let mut problems = inp.spec.problems();
    problems.extend(inp.problems.iter().cloned());
    let desired = resolve(inp, &mut problems);
    let served = served_now(inp, &old);
    if !problems.is_empty() {
        return invalid(inp, &old, &problems);
    }
    let existing = old.conditions.as_slice();
    let want = shares(&desired);
    let have = shares(&served);
    // Nobody serves the hosts yet: no cold start to save.
    if served.is_empty() || want == have {
        return settled(inp, existing, &desired, &served);
    }
    let mv = Move::of(inp, &old, &have, &want);
    let waits = mv.waits(inp, &have);
    if !waits.waiting.is_empty() {
        return mv.wait(inp, existing, &served, waits);
    }
    if mv.target == want {
        let mut d = settled(inp, existing, &desired, &served);
        d.moved = Some(format!("{} -> {}", summary(&served), summary(&desired)));
        return d;
    }
    mv.step(inp, existing, (&served, &desired), (&want, &have))
}

/// What the hosts are served by now: the Route's last traffic, else (a new Route) whoever
/// serves them by the claim rule.
fn served_now(inp: &Inputs<'_>, old: &RouteStatus) -> Vec<ServedTarget> {
    if !old.traffic.is_empty() {
        old.traffic.clone()
    } else if let Some(w) = &inp.serving_now {
        vec![ServedTarget {
            revision_name: w.clone(),
            percent: 100,
            tag: None,
        }]
    } else {
        Vec::new()
    }
}

/// An invalid Route: whatever is served stays served (an invalid route never leaves a host
/// without one), and it says why.
fn invalid(inp: &Inputs<'_>, old: &RouteStatus, problems: &[String]) -> Decision {
    let conds = [Desired {
        type_: conditions::READY,
        status: false,
        reason: "InvalidRoute",
        message: problems.join("; "),
    }];
    Decision {
        status: RouteStatus {
            observed_generation: inp.generation,
            conditions: conditions::merge(&old.conditions, &conds, inp.generation, inp.now),
            ..old.clone()
        },
        warm: Vec::new(),
        requeue: None,
        moved: None,
    }
}

/// A move under way: from what was served when it began (a changed spec starts a new one),
/// at which step, toward which split.
struct Move {
    since: Timestamp,
    from: Shares,
    /// `rolloutDurationSeconds` (0: one step).
    duration: i64,
    step: i64,
    step_start: Timestamp,
    /// The split of this step.
    target: Shares,
}

/// The gaining revisions still short of pods at this step.
struct Waits {
    waiting: Vec<String>,
    warm: Vec<(String, i32)>,
    next_deadline: Option<Timestamp>,
}

impl Move {
    fn of(inp: &Inputs<'_>, old: &RouteStatus, have: &Shares, want: &Shares) -> Self {
        let same_move = old.moving_since.is_some() && old.observed_generation == inp.generation;
        let (since, from) = if same_move {
            (
                old.moving_since.as_ref().map_or(inp.now, |t| t.0),
                shares(&old.moving_from),
            )
        } else {
            (inp.now, have.clone())
        };
        let duration = inp.spec.rollout_duration_seconds.max(0);
        let (step, step_start) = if duration == 0 {
            (STEPS, since)
        } else {
            let elapsed = inp.now.duration_since(since).as_secs().max(0);
            let k = (elapsed * STEPS / duration).clamp(1, STEPS);
            let start = since
                .checked_add(SignedDuration::from_secs(duration * (k - 1) / STEPS))
                .unwrap_or(since);
            (k, start)
        };
        Self {
            target: interpolate(&from, want, step),
            since,
            from,
            duration,
            step,
            step_start,
        }
    }

    /// Which gaining revisions wait for pods: each needs the pods the others serve their
    /// share of the traffic with, scaled to its new share, until its hand-over bound.
    fn waits(&self, inp: &Inputs<'_>, have: &Shares) -> Waits {
        let mut w = Waits {
            waiting: Vec::new(),
            warm: Vec::new(),
            next_deadline: None,
        };
        for (name, &p) in &self.target {
            if p <= have.get(name).copied().unwrap_or(0) {
                continue;
            }
            let f = (inp.facts)(name).unwrap_or(Facts {
                ready: 0,
                max_scale: 0,
                bound_seconds: 0,
            });
            let need = needed(pods_for_share(inp, have, name, p), f.max_scale);
            let deadline = self
                .step_start
                .checked_add(SignedDuration::from_secs(f.bound_seconds))
                .unwrap_or(self.step_start);
            if i64::from(f.ready) < i64::from(need) && inp.now < deadline {
                w.waiting
                    .push(format!("{name}: {} of {need} pods Ready", f.ready));
                w.warm.push((name.clone(), need));
                w.next_deadline = Some(w.next_deadline.map_or(deadline, |d| d.min(deadline)));
            }
        }
        w
    }

    /// The Route's status while moving, serving `traffic`.
    fn status(&self, inp: &Inputs<'_>, traffic: Vec<ServedTarget>) -> RouteStatus {
        RouteStatus {
            observed_generation: inp.generation,
            summary: Some(summary(&traffic)),
            traffic,
            moving_since: Some(Time(self.since)),
            moving_from: self
                .from
                .iter()
                .map(|(n, p)| ServedTarget {
                    revision_name: n.clone(),
                    percent: *p,
                    tag: None,
                })
                .collect(),
            conditions: Vec::new(),
        }
    }

    /// The step waits for pods: what is served stays, the gainers' pods are kept warm.
    fn wait(
        &self,
        inp: &Inputs<'_>,
        existing: &[Condition],
        served: &[ServedTarget],
        waits: Waits,
    ) -> Decision {
        let mut status = self.status(inp, served.to_vec());
        let why = format!(
            "moving to {}: {}",
            summary(&targets_of(&self.target)),
            waits.waiting.join(", ")
        );
        status.conditions = under_way(inp, existing, "WaitingForPods", why);
        Decision {
            status,
            warm: waits.warm,
            requeue: waits.next_deadline.map(|d| until(inp.now, d)),
            moved: None,
        }
    }

    /// A step of a gradual rollout: taken; the next one is due at its share of the duration.
    fn step(
        &self,
        inp: &Inputs<'_>,
        existing: &[Condition],
        (served, desired): (&[ServedTarget], &[ServedTarget]),
        (want, have): (&Shares, &Shares),
    ) -> Decision {
        let step = self.step;
        let traffic = with_tags(&self.target, desired);
        let mut status = self.status(inp, traffic.clone());
        let why = format!(
            "step {step} of {STEPS} toward {}",
            summary(&targets_of(want))
        );
        status.conditions = under_way(inp, existing, "RollingOut", why);
        let next = self
            .since
            .checked_add(SignedDuration::from_secs(self.duration * step / STEPS))
            .unwrap_or(inp.now);
        Decision {
            moved: (shares(&traffic) != *have)
                .then(|| format!("{} -> {}", summary(served), summary(&traffic))),
            status,
            warm: Vec::new(),
            requeue: Some(until(inp.now, next)),
        }
    }
}

/// The pods `name` needs for `percent`: the pods the others serve their share of the traffic
/// with, scaled to this one's new share (its own pods do not count: they would raise what it
/// needs as they come).
fn pods_for_share(inp: &Inputs<'_>, have: &Shares, name: &str, percent: i32) -> u32 {
    let had = have.get(name).copied().unwrap_or(0);
    let others: u64 = have
        .keys()
        .filter(|n| *n != name)
        .filter_map(|n| (inp.facts)(n).map(|f| u64::from(f.ready)))
        .sum();
    let denom = u64::try_from(100 - had).unwrap_or(100).max(1);
    // Rounded up, but never more than the others have in all (2 pods serving 90 % make
    // 2.2 for 100 %: 2, not 3, is what the revision it takes over from had).
    let share = (others * u64::try_from(percent).unwrap_or(0))
        .div_ceil(denom)
        .min(others);
    u32::try_from(share).unwrap_or(u32::MAX)
}

/// The condition type that says whether a route (or a revision's hosts) are where they
/// are meant to be, and why a move waits.
pub const ROUTES_READY: &str = "RoutesReady";

/// The conditions of a move under way: valid, and `RoutesReady=False` with why.
fn under_way(
    inp: &Inputs<'_>,
    existing: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    reason: &'static str,
    message: String,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let waits = Desired {
        type_: ROUTES_READY,
        status: false,
        reason,
        message,
    };
    conditions::merge(existing, &[ready_true(), waits], inp.generation, inp.now)
}

fn ready_true() -> Desired {
    Desired {
        type_: conditions::READY,
        status: true,
        reason: "RouteValid",
        message: String::new(),
    }
}

fn until(now: Timestamp, at: Timestamp) -> Duration {
    let d = at.duration_since(now);
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(0).max(100))
}

/// The move is over: serve `desired`.
fn settled(
    inp: &Inputs<'_>,
    existing: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    desired: &[ServedTarget],
    served: &[ServedTarget],
) -> Decision {
    let status = RouteStatus {
        observed_generation: inp.generation,
        traffic: desired.to_vec(),
        summary: Some(summary(desired)),
        moving_since: None,
        moving_from: Vec::new(),
        conditions: conditions::merge(
            existing,
            &[
                ready_true(),
                Desired {
                    type_: ROUTES_READY,
                    status: true,
                    reason: "Served",
                    message: summary(desired),
                },
            ],
            inp.generation,
            inp.now,
        ),
    };
    Decision {
        moved: (served.is_empty() || shares(served) != shares(desired))
            .then(|| format!("{} -> {}", summary(served), summary(desired))),
        status,
        warm: Vec::new(),
        requeue: None,
    }
}

/// The spec's targets by revision name (`latestRevision` resolved); problems for names that
/// are no revision.
fn resolve(inp: &Inputs<'_>, problems: &mut Vec<String>) -> Vec<ServedTarget> {
    let mut out = Vec::new();
    for t in &inp.spec.traffic {
        let name = match (&t.revision_name, t.latest_revision == Some(true)) {
            (Some(n), _) => n.clone(),
            (None, true) => match &inp.latest {
                Some(n) => n.clone(),
                None => {
                    problems.push(
                        "latestRevision: no revision of the namespace claims the route's hosts"
                            .into(),
                    );
                    continue;
                }
            },
            (None, false) => continue,
        };
        if (inp.facts)(&name).is_none() {
            problems.push(format!("revision {name} does not exist (or is invalid)"));
            continue;
        }
        out.push(ServedTarget {
            revision_name: name,
            percent: t.percent,
            tag: t.tag.clone(),
        });
    }
    out
}

fn targets_of(s: &Shares) -> Vec<ServedTarget> {
    s.iter()
        .map(|(n, p)| ServedTarget {
            revision_name: n.clone(),
            percent: *p,
            tag: None,
        })
        .collect()
}

/// `target`'s shares with the desired targets' tags (tags move at once: a tag's host is new).
fn with_tags(target: &Shares, desired: &[ServedTarget]) -> Vec<ServedTarget> {
    let mut out: Vec<ServedTarget> = Vec::new();
    let mut given = std::collections::BTreeSet::new();
    for t in desired {
        let percent = if given.insert(t.revision_name.clone()) {
            target.get(&t.revision_name).copied().unwrap_or(0)
        } else {
            0
        };
        out.push(ServedTarget {
            percent,
            ..t.clone()
        });
    }
    for (n, p) in target {
        if !given.contains(n) && *p > 0 {
            out.push(ServedTarget {
                revision_name: n.clone(),
                percent: *p,
                tag: None,
            });
        }
    }
    out
}

/// `from` moved `step` tenths of the way to `to`, rounded to whole percents that sum to 100
/// (largest remainder).
pub fn interpolate(from: &Shares, to: &Shares, step: i64) -> Shares {
    let names: std::collections::BTreeSet<&String> = from.keys().chain(to.keys()).collect();
    let mut exact: Vec<(&String, i64, i64)> = names
        .into_iter()
        .map(|n| {
            let a = i64::from(from.get(n).copied().unwrap_or(0));
            let b = i64::from(to.get(n).copied().unwrap_or(0));
            let scaled = a * STEPS + (b - a) * step; // in tenths of a percent
            (n, scaled / STEPS, scaled % STEPS)
        })
        .collect();
    let mut left = 100 - exact.iter().map(|(_, w, _)| *w).sum::<i64>();
    exact.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
    for e in exact.iter_mut() {
        if left <= 0 {
            break;
        }
        if e.2 > 0 {
            e.1 += 1;
            left -= 1;
        }
    }
    exact
        .into_iter()
        .filter(|(_, w, _)| *w > 0)
        .map(|(n, w, _)| (n.clone(), i32::try_from(w).unwrap_or(0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::TrafficTarget;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn spec(traffic: &[(&str, i32)], rollout: i64) -> RouteSpec {
        RouteSpec {
            hosts: vec!["shop.test".into()],
            traffic: traffic
                .iter()
                .map(|(n, p)| TrafficTarget {
                    revision_name: (*n != "latest").then(|| (*n).to_owned()),
                    latest_revision: (*n == "latest").then_some(true),
                    percent: *p,
                    tag: None,
                })
                .collect(),
            rollout_duration_seconds: rollout,
        }
    }

    fn facts<'a>(ready: &'a [(&'a str, u32)]) -> impl Fn(&str) -> Option<Facts> + 'a {
        move |n| {
            ready.iter().find(|(m, _)| *m == n).map(|(_, r)| Facts {
                ready: *r,
                max_scale: 0,
                bound_seconds: 300,
            })
        }
    }

    fn served(d: &Decision) -> Shares {
        shares(&d.status.traffic)
    }

    fn s(v: &[(&str, i32)]) -> Shares {
        v.iter().map(|(n, p)| ((*n).to_owned(), *p)).collect()
    }

    fn cond<'a>(
        d: &'a Decision,
        ty: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        d.status.conditions.iter().find(|c| c.type_ == ty).unwrap()
    }

    #[test]
    fn a_new_route_on_an_unserved_host_serves_at_once() {
        let sp = spec(&[("v1", 100)], 0);
        let f = facts(&[("v1", 0)]);
        let d = decide(&Inputs {
            spec: &sp,
            generation: Some(1),
            status: None,
            latest: None,
            facts: &f,
            serving_now: None,
            problems: vec![],
            now: t(10),
        });
        assert_eq!(served(&d), s(&[("v1", 100)]));
        assert_eq!(cond(&d, ROUTES_READY).reason, "Served");
        assert!(d.moved.is_some());
    }

    #[test]
    fn a_split_waits_for_the_gainers_pods_then_moves() {
        let sp = spec(&[("v1", 10), ("v2", 90)], 0);
        let before = RouteStatus {
            traffic: vec![ServedTarget {
                revision_name: "v1".into(),
                percent: 100,
                tag: None,
            }],
            observed_generation: Some(1),
            ..Default::default()
        };
        let cold = facts(&[("v1", 4), ("v2", 1)]);
        let d = decide(&Inputs {
            spec: &sp,
            generation: Some(2),
            status: Some(&before),
            latest: None,
            facts: &cold,
            serving_now: None,
            problems: vec![],
            now: t(10),
        });
        assert_eq!(served(&d), s(&[("v1", 100)]), "nothing moves yet");
        assert_eq!(
            d.warm,
            vec![("v2".to_owned(), 4)],
            "90% of 4 pods, rounded up"
        );
        assert_eq!(cond(&d, ROUTES_READY).reason, "WaitingForPods");
        assert_eq!(d.requeue, Some(Duration::from_secs(300)));
        let warm = facts(&[("v1", 4), ("v2", 4)]);
        let d2 = decide(&Inputs {
            spec: &sp,
            generation: Some(2),
            status: Some(&d.status),
            latest: None,
            facts: &warm,
            serving_now: None,
            problems: vec![],
            now: t(12),
        });
        assert_eq!(served(&d2), s(&[("v1", 10), ("v2", 90)]));
        assert_eq!(d2.status.moving_since, None);
        assert_eq!(d2.moved.as_deref(), Some("v1=100% -> v1=10% v2=90%"));
    }

    #[test]
    fn the_bound_moves_a_split_without_pods() {
        let sp = spec(&[("v2", 100)], 0);
        let f = facts(&[("v1", 2), ("v2", 0)]);
        let first = decide(&Inputs {
            spec: &sp,
            generation: Some(1),
            status: None,
            latest: None,
            facts: &f,
            serving_now: Some("v1".into()),
            problems: vec![],
            now: t(0),
        });
        assert_eq!(
            served(&first),
            s(&[("v1", 100)]),
            "a new route starts from the claim winner"
        );
        let later = decide(&Inputs {
            spec: &sp,
            generation: Some(1),
            status: Some(&first.status),
            latest: None,
            facts: &f,
            serving_now: Some("v1".into()),
            problems: vec![],
            now: t(300),
        });
        assert_eq!(served(&later), s(&[("v2", 100)]));
    }

    #[test]
    fn an_invalid_route_keeps_what_is_served() {
        let sp = spec(&[("v1", 50), ("nope", 50)], 0);
        let before = RouteStatus {
            traffic: vec![ServedTarget {
                revision_name: "v1".into(),
                percent: 100,
                tag: None,
            }],
            ..Default::default()
        };
        let f = facts(&[("v1", 1)]);
        let d = decide(&Inputs {
            spec: &sp,
            generation: Some(3),
            status: Some(&before),
            latest: None,
            facts: &f,
            serving_now: None,
            problems: vec![],
            now: t(0),
        });
        assert_eq!(served(&d), s(&[("v1", 100)]));
        let ready = cond(&d, conditions::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidRoute")
        );
        assert!(
            ready.message.contains("revision nope does not exist"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn latest_follows_the_newest_claimant() {
        let sp = spec(&[("latest", 100)], 0);
        let f = facts(&[("v1", 1), ("v2", 1)]);
        let d = decide(&Inputs {
            spec: &sp,
            generation: Some(1),
            status: None,
            latest: Some("v2".into()),
            facts: &f,
            serving_now: Some("v1".into()),
            problems: vec![],
            now: t(0),
        });
        assert_eq!(served(&d), s(&[("v2", 100)]), "v2 has v1's one pod");
    }

    #[test]
    fn a_gradual_rollout_steps_by_tenths() {
        let sp = spec(&[("v2", 100)], 100);
        // The last step needs v1's pod scaled from its 70 % to v2's 100 %: two.
        let f = facts(&[("v1", 1), ("v2", 2)]);
        let before = RouteStatus {
            traffic: vec![ServedTarget {
                revision_name: "v1".into(),
                percent: 100,
                tag: None,
            }],
            observed_generation: Some(1),
            ..Default::default()
        };
        let mut st = before;
        let mut seen = Vec::new();
        for now in [0, 10, 35, 100] {
            let d = decide(&Inputs {
                spec: &sp,
                generation: Some(2),
                status: Some(&st),
                latest: None,
                facts: &f,
                serving_now: None,
                problems: vec![],
                now: t(now),
            });
            seen.push(served(&d).get("v2").copied().unwrap_or(0));
            st = d.status;
        }
        assert_eq!(seen, vec![10, 10, 30, 100]);
    }

    #[test]
    fn interpolation_sums_to_100() {
        let from = s(&[("a", 100)]);
        let to = s(&[("b", 33), ("c", 67)]);
        for step in 0..=STEPS {
            let m = interpolate(&from, &to, step);
            assert_eq!(m.values().sum::<i32>(), 100, "step {step}: {m:?}");
        }
        assert_eq!(interpolate(&from, &to, STEPS), to);
        assert_eq!(interpolate(&from, &to, 0), from);
    }
}
