//! The figures: per phase, per move, per activator, the split's shares; the text and plot.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use serde::Serialize;

use super::load::{Answer, Marks, PHASES, Phase};
use super::watches::{ReadyPods, StatusEvent};
use super::{IN_A_ROW, NEW, OLD, SPLIT};
use crate::Error;
use crate::driver::Sample;
use crate::plot::{self, Line};
use crate::scenarios::common::{SampleSummary, pct_line};
use crate::stats::Percentiles;

/// ms from `from` to `t`, negative when `t` is earlier.
pub(super) fn signed_ms(t: Instant, from: Instant) -> f64 {
    if t >= from {
        (t - from).as_secs_f64() * 1e3
    } else {
        -((from - t).as_secs_f64() * 1e3)
    }
}
/// One phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseFigures {
    pub phase: Phase,
    pub secs: f64,
    pub requests: usize,
    pub failed: usize,
    /// Failed requests by HTTP status (`no answer`: the connection failed or broke).
    pub failed_by_status: BTreeMap<String, usize>,
    /// Requests whose answer the activator marked as having waited for a pod start
    /// (`x-activator-cold-start`), failed ones included.
    pub waited_for_pod_start: usize,
    /// Distinct pods that answered such requests.
    pub pods_cold_started: usize,
    /// Answered requests by the revision of the pod that answered (`unknown`: no pod named).
    pub answered_by: BTreeMap<String, usize>,
    /// Every request, the failures ranked after every answer.
    pub latency_ms: Percentiles,
    /// Answered requests that waited for a pod start, and the others.
    pub cold_ms: Percentiles,
    pub warm_ms: Percentiles,
    /// The first few failures, verbatim.
    pub error_samples: Vec<String>,
}

impl PhaseFigures {
    fn of(phase: Phase, secs: f64, answers: &[&Answer]) -> Self {
        let samples: Vec<Sample> = answers.iter().map(|a| a.sample.clone()).collect();
        let s = SampleSummary::of(&samples);
        let mut failed_by_status = BTreeMap::new();
        let mut answered_by = BTreeMap::new();
        for a in answers {
            if a.sample.ok() {
                let rev = a.revision.clone().unwrap_or_else(|| "unknown".into());
                *answered_by.entry(rev).or_default() += 1;
            } else {
                let key = match a.sample.status {
                    0 => "no answer".to_string(),
                    code => code.to_string(),
                };
                *failed_by_status.entry(key).or_default() += 1;
            }
        }
        Self {
            phase,
            secs,
            requests: s.requests,
            failed: s.errors,
            failed_by_status,
            waited_for_pod_start: s.cold,
            pods_cold_started: s.cold_starts,
            answered_by,
            latency_ms: s.all_ms,
            cold_ms: s.cold_ms,
            warm_ms: s.warm_ms,
            error_samples: s.error_samples,
        }
    }
}

/// p50, p99 and max over activators, those that never moved ranked last (`null`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spread {
    pub activators: usize,
    pub not_moved: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl Spread {
    /// Nearest rank over `ms` (signed: an activator may move before the decision is seen)
    /// and `not_moved` more, ranked last.
    pub fn of(ms: &[f64], not_moved: usize) -> Self {
        let n = ms.len() + not_moved;
        let mut v = ms.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let r = ((p * n as f64).ceil() as usize).clamp(1, n.max(1));
            v.get(r - 1).copied()
        };
        if n == 0 {
            return Self::default();
        }
        Self {
            activators: n,
            not_moved,
            p50_ms: rank(0.5),
            p99_ms: rank(0.99),
            max_ms: rank(1.0),
        }
    }
}

/// One activator's part in a move, ms from the decision.
#[derive(Debug, Clone, Serialize)]
pub struct ActivatorMove {
    pub node: String,
    /// To the first answer from the gaining revision.
    pub first_new_ms: Option<f64>,
    /// To the first answer from the gaining revision sent after the entry's last request the
    /// losing one answered: from then on it answered from the gaining one only (moves to
    /// 100 % only; none unless 20 answers in a row from the gaining one prove it, so an entry
    /// still split at the end of the run has not moved).
    pub moved_ms: Option<f64>,
    /// The same as `moved_ms` (or `first_new_ms`), from the action (the create or patch sent).
    pub from_action_ms: Option<f64>,
    /// Answers from the losing revision to requests sent after the decision.
    pub old_after_decision: usize,
}

/// A move of the host between revisions.
#[derive(Debug, Clone, Serialize)]
pub struct Move {
    pub name: &'static str,
    pub from: &'static str,
    pub to: &'static str,
    /// What the times count from.
    pub decision: String,
    /// The decision was seen (else the times count from the action).
    pub decision_seen: bool,
    /// The decision after the action, ms.
    pub decision_after_action_ms: Option<f64>,
    /// The gaining revision takes all of the host (else a share).
    pub exclusive: bool,
    pub per_activator: Vec<ActivatorMove>,
    /// Over activators, of `moved_ms` (exclusive moves) or `first_new_ms`.
    pub over_activators: Spread,
    pub moved_everywhere: bool,
    /// Answers from the losing revision to requests sent after the decision, all activators.
    pub old_after_decision: usize,
    /// Ready pods by revision at the decision, and when the last activator had moved.
    pub ready_pods_at_decision: BTreeMap<String, usize>,
    pub ready_pods_when_moved_everywhere: Option<BTreeMap<String, usize>>,
}

/// Per entry, the answers sent in `window`: when it moved from `from` to `to`.
pub fn per_activator(
    answers: &[Answer],
    entries: &[(String, SocketAddr)],
    (from, to): (&str, &str),
    window: (Instant, Instant),
    action: Instant,
    decision: Instant,
    exclusive: Option<usize>,
) -> Vec<(ActivatorMove, Option<Instant>)> {
    entries
        .iter()
        .map(|(node, _)| {
            let mut mine: Vec<&Answer> = answers
                .iter()
                .filter(|a| a.sample.entry == *node)
                .filter(|a| a.sample.sent >= window.0 && a.sample.sent < window.1)
                .collect();
            mine.sort_by_key(|a| a.sample.sent);
            let first_new = mine.iter().filter(|a| a.by(to)).map(|a| a.done()).min();
            let last_old = mine.iter().rposition(|a| a.by(from));
            let after_old = last_old.map_or(&mine[..], |i| &mine[i + 1..]);
            let new_after_old: Vec<Instant> = after_old
                .iter()
                .filter(|a| a.by(to))
                .map(|a| a.done())
                .collect();
            // Moved for good only on evidence: an entry still split at the window's end has
            // a last answer from the losing revision too, followed by a few from the other.
            let moved = exclusive
                .filter(|n| new_after_old.len() >= *n)
                .and_then(|_| new_after_old.iter().min().copied());
            let moved_at = if exclusive.is_some() {
                moved
            } else {
                first_new
            };
            let old_after_decision = mine
                .iter()
                .filter(|a| a.by(from) && a.sample.sent >= decision)
                .count();
            (
                ActivatorMove {
                    node: node.clone(),
                    first_new_ms: first_new.map(|t| signed_ms(t, decision)),
                    moved_ms: moved.map(|t| signed_ms(t, decision)),
                    from_action_ms: moved_at.map(|t| signed_ms(t, action)),
                    old_after_decision,
                },
                moved_at,
            )
        })
        .collect()
}

/// The measured share of one revision under the split.
#[derive(Debug, Clone, Serialize)]
pub struct Share {
    pub revision: String,
    pub expected_percent: f64,
    pub answered: usize,
    pub measured_percent: f64,
    /// Half the 95 % interval of the measured percent (normal approximation), in points.
    pub ci95_points: f64,
    /// measured − expected, in points.
    pub off_by_points: f64,
}

/// The split's measured window.
#[derive(Debug, Clone, Serialize)]
pub struct SplitFigures {
    /// Every activator had answered from v1 under the split before the window began.
    pub followed_everywhere: bool,
    pub requests: usize,
    pub failed: usize,
    /// Answered by a pod of neither revision (or naming none).
    pub unknown: usize,
    pub shares: Vec<Share>,
}

impl SplitFigures {
    pub fn of(window: &[&Answer], split: &[(&str, i32)], followed_everywhere: bool) -> Self {
        let failed = window.iter().filter(|a| !a.sample.ok()).count();
        let answered = window.len() - failed;
        let count = |rev: &str| window.iter().filter(|a| a.by(rev)).count();
        let known: usize = split.iter().map(|(r, _)| count(r)).sum();
        let shares = split
            .iter()
            .map(|(rev, pct)| {
                let n = count(rev);
                let p = n as f64 / answered.max(1) as f64;
                Share {
                    revision: rev.to_string(),
                    expected_percent: f64::from(*pct),
                    answered: n,
                    measured_percent: 100.0 * p,
                    ci95_points: 100.0 * 1.96 * (p * (1.0 - p) / answered.max(1) as f64).sqrt(),
                    off_by_points: 100.0 * p - f64::from(*pct),
                }
            })
            .collect();
        Self {
            followed_everywhere,
            requests: window.len(),
            failed,
            unknown: answered - known,
            shares,
        }
    }
}

/// Everything measured.
pub(super) struct Figures {
    pub(super) phases: Vec<PhaseFigures>,
    pub(super) moves: Vec<Move>,
    pub(super) split: Option<SplitFigures>,
    /// What the reader should know about the figures (a window cut short).
    notes: Vec<String>,
}

impl Figures {
    pub(super) fn build(
        answers: &[Answer],
        m: &Marks,
        entries: &[(String, SocketAddr)],
        log: &[StatusEvent],
        pods: &ReadyPods,
        split_requests: usize,
    ) -> Self {
        let phases = PHASES
            .iter()
            .filter_map(|p| {
                let (from, to) = m.phase_window(*p)?;
                let mine: Vec<&Answer> = answers.iter().filter(|a| a.phase == *p).collect();
                Some(PhaseFigures::of(*p, (to - from).as_secs_f64(), &mine))
            })
            .collect();
        let mut moves = Vec::new();
        let mut notes = Vec::new();
        let end = m.end.unwrap_or_else(Instant::now);
        let next_phase = |p: Phase| m.phase_window(p).map_or(end, |w| w.1);
        if let Some(action) = m.deploy_action {
            let seen = log
                .iter()
                .find(|e| {
                    e.at >= action
                        && e.kind == "Revision"
                        && e.object == NEW
                        && e.field == "RoutesReady"
                        && e.value.starts_with("True")
                })
                .map(|e| e.at);
            let decision = format!(
                "{}: the harness's watch saw {NEW}'s RoutesReady=True",
                if seen.is_some() {
                    "seen"
                } else {
                    "NOT seen (times from the create)"
                }
            );
            moves.push(one_move(
                answers,
                entries,
                pods,
                ("deploy", OLD, NEW, true),
                (action, next_phase(Phase::Deploy)),
                seen,
                decision,
            ));
        }
        if let (Some(action), Some(decision)) = (m.split_action, m.split_decision) {
            moves.push(one_move(
                answers,
                entries,
                pods,
                ("split", NEW, OLD, false),
                (action, m.split_settled.unwrap_or(end)),
                Some(decision),
                "the Route's create answered (v1 10 % / v2 90 %); the gaining revision is v1"
                    .into(),
            ));
        }
        if let (Some(action), Some(decision)) = (m.rollback_action, m.rollback_decision) {
            moves.push(one_move(
                answers,
                entries,
                pods,
                ("rollback", NEW, OLD, true),
                (action, end),
                Some(decision),
                "the Route's patch to v1 100 % answered".into(),
            ));
        }
        let split = m.split_settled.map(|settled| {
            let to = next_phase(Phase::Split);
            let window: Vec<&Answer> = answers
                .iter()
                .filter(|a| {
                    a.phase == Phase::Split && a.sample.sent >= settled && a.sample.sent < to
                })
                .collect();
            SplitFigures::of(&window, &SPLIT, m.split_followed_everywhere)
        });
        if let Some(s) = &split
            && s.requests < split_requests
        {
            notes.push(format!(
                "the split's window has {} requests, fewer than the {split_requests} asked (cut short)",
                s.requests
            ));
        }
        Self {
            phases,
            moves,
            split,
            notes,
        }
    }

    /// The table after `heading`; `log`'s times from `t0`.
    pub(super) fn text(&self, heading: String, log: &[StatusEvent], t0: Instant) -> String {
        let mut o = heading;
        o += &format!(
            "{:<9} {:>6} {:>8} {:>7} {:>5} {:>8} {:>8}  failed by status\n",
            "phase", "secs", "requests", "failed", "cold", OLD, NEW
        );
        for p in &self.phases {
            let by = |r: &str| p.answered_by.get(r).copied().unwrap_or(0);
            let statuses = if p.failed_by_status.is_empty() {
                "-".to_string()
            } else {
                p.failed_by_status
                    .iter()
                    .map(|(s, n)| format!("{s}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            o += &format!(
                "{:<9} {:>6.1} {:>8} {:>7} {:>5} {:>8} {:>8}  {statuses}\n",
                p.phase.name(),
                p.secs,
                p.requests,
                p.failed,
                p.waited_for_pod_start,
                by(OLD),
                by(NEW)
            );
        }
        for p in &self.phases {
            o += &pct_line(&format!("{} all ms", p.phase.name()), &p.latency_ms);
            if p.cold_ms.count > 0 {
                o += &pct_line(
                    &format!("{} cold ms (answered)", p.phase.name()),
                    &p.cold_ms,
                );
            }
            for e in &p.error_samples {
                o += &format!("  {} error: {e}\n", p.phase.name());
            }
        }
        let ms = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.1} ms"));
        for mv in &self.moves {
            o += &format!(
                "move {} ({} → {}): times from the decision, {}\n",
                mv.name, mv.from, mv.to, mv.decision
            );
            if let Some(d) = mv.decision_after_action_ms {
                o += &format!("  decision {d:.1} ms after the action\n");
            }
            let pods = |m: &BTreeMap<String, usize>| {
                [mv.to, mv.from]
                    .iter()
                    .map(|r| format!("{r} {}", m.get(*r).copied().unwrap_or(0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            o += &format!(
                "  Ready pods at the decision: {}; when every activator had moved: {}\n",
                pods(&mv.ready_pods_at_decision),
                mv.ready_pods_when_moved_everywhere
                    .as_ref()
                    .map_or("never moved everywhere".to_string(), pods)
            );
            for a in &mv.per_activator {
                o += &format!(
                    "  {:<20} first answer from {}: {:>10}{}; from the action {}; answers from {} after the decision: {}\n",
                    a.node,
                    mv.to,
                    ms(a.first_new_ms),
                    if mv.exclusive {
                        format!(", only {} from {:>10}", mv.to, ms(a.moved_ms))
                    } else {
                        String::new()
                    },
                    ms(a.from_action_ms),
                    mv.from,
                    a.old_after_decision
                );
            }
            let s = &mv.over_activators;
            o += &format!(
                "  over {} activators: p50 {}, p99 {}, max {} (never moved: {}, ranked last); answers from {} after the decision: {}\n",
                s.activators,
                ms(s.p50_ms),
                ms(s.p99_ms),
                ms(s.max_ms),
                s.not_moved,
                mv.from,
                mv.old_after_decision
            );
        }
        if let Some(s) = &self.split {
            o += &format!(
                "split, measured once every activator had answered from {OLD} ({}): {} requests, {} failed, {} from an unknown pod\n",
                if s.followed_everywhere {
                    "yes"
                } else {
                    "NO: bound reached"
                },
                s.requests,
                s.failed,
                s.unknown
            );
            for sh in &s.shares {
                o += &format!(
                    "  {} {:.2} % ±{:.2} (95 %), expected {:.0} %, off by {:+.2} points\n",
                    sh.revision,
                    sh.measured_percent,
                    sh.ci95_points,
                    sh.expected_percent,
                    sh.off_by_points
                );
            }
        }
        o += "status changes, ms from the load's start (as the harness's watches saw them):\n";
        for e in log {
            o += &format!(
                "  {:>10.1} {} {} {}: {}{}\n",
                signed_ms(e.at, t0),
                e.kind,
                e.object,
                e.field,
                e.value,
                if e.detail.is_empty() {
                    String::new()
                } else {
                    format!(" — {}", e.detail)
                }
            );
        }
        for n in &self.notes {
            o += &format!("note: {n}\n");
        }
        o
    }
}

fn one_move(
    answers: &[Answer],
    entries: &[(String, SocketAddr)],
    pods: &ReadyPods,
    (name, from, to, exclusive): (&'static str, &'static str, &'static str, bool),
    window: (Instant, Instant),
    decision: Option<Instant>,
    what: String,
) -> Move {
    let action = window.0;
    let at = decision.unwrap_or(action);
    let proof = exclusive.then_some(IN_A_ROW);
    let rows = per_activator(answers, entries, (from, to), window, action, at, proof);
    let moved: Vec<f64> = rows
        .iter()
        .filter_map(|(r, _)| {
            if exclusive {
                r.moved_ms
            } else {
                r.first_new_ms
            }
        })
        .collect();
    let not_moved = rows.len() - moved.len();
    let last = rows
        .iter()
        .map(|(_, t)| *t)
        .collect::<Option<Vec<Instant>>>()
        .and_then(|ts| ts.into_iter().max());
    Move {
        name,
        from,
        to,
        decision: what,
        decision_seen: decision.is_some(),
        decision_after_action_ms: decision.map(|d| signed_ms(d, action)),
        exclusive,
        old_after_decision: rows.iter().map(|(r, _)| r.old_after_decision).sum(),
        over_activators: Spread::of(&moved, not_moved),
        moved_everywhere: not_moved == 0,
        ready_pods_at_decision: pods.at(at),
        ready_pods_when_moved_everywhere: last.map(|t| pods.at(t)),
        per_activator: rows.into_iter().map(|(r, _)| r).collect(),
    }
}

/// Answers by revision and failures per 100 ms, with the controller's steps and the status
/// changes as marks.
pub(super) fn timeline(
    answers: &[Answer],
    m: &Marks,
    log: &[StatusEvent],
    t0: Instant,
) -> Result<String, Error> {
    let at = |a: &Answer| a.sample.sent.saturating_duration_since(t0).as_secs_f64();
    let line = |name: String, pick: &dyn Fn(&Answer) -> bool| Line {
        name,
        points: plot::bucket(
            answers.iter().filter(|a| pick(a)).map(|a| (at(a), true)),
            0.1,
        )
        .into_iter()
        .map(|(t, n, _)| (t, n))
        .collect(),
    };
    let lines = vec![
        line(format!("answered by {OLD}"), &|a: &Answer| a.by(OLD)),
        line(format!("answered by {NEW}"), &|a: &Answer| a.by(NEW)),
        line("failed".into(), &|a: &Answer| !a.sample.ok()),
    ];
    let secs = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    let mut marks: Vec<(f64, String)> = [
        (m.deploy_action, format!("{NEW} created")),
        (m.split_decision, "Route 10/90".to_string()),
        (m.rollback_decision, format!("Route {OLD} 100")),
    ]
    .into_iter()
    .filter_map(|(t, what)| t.map(|t| (secs(t), what)))
    .collect();
    if let Some(e) = log.iter().find(|e| {
        e.kind == "Revision"
            && e.object == NEW
            && e.field == "RoutesReady"
            && e.value.starts_with("True")
    }) {
        marks.push((secs(e.at), format!("{NEW} RoutesReady")));
    }
    plot::timeline(
        "deploy: answers per 100 ms by revision",
        "requests",
        &lines,
        &marks,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::answer;
    use super::*;

    #[test]
    fn an_activator_has_moved_after_its_last_answer_from_the_old_revision() {
        let t0 = Instant::now();
        let entries: Vec<(String, SocketAddr)> = ["a", "b", "c"]
            .iter()
            .map(|n| (n.to_string(), "127.0.0.1:1".parse().unwrap()))
            .collect();
        let answers = vec![
            // a: v2 at 10, a stale v1 at 20, v2 from 30 on.
            answer("a", t0, 10, Some("v2")),
            answer("a", t0, 20, Some("v1")),
            answer("a", t0, 30, Some("v2")),
            answer("a", t0, 40, Some("v2")),
            // b: a failure, then v2 at 15.
            answer("b", t0, 5, None),
            answer("b", t0, 15, Some("v2")),
            // c: v1 only.
            answer("c", t0, 12, Some("v1")),
            // Before the window: not counted.
            answer("c", t0, 0, Some("v2")),
        ];
        let action = t0 + Duration::from_millis(1);
        let decision = t0 + Duration::from_millis(11);
        let rows = per_activator(
            &answers,
            &entries,
            ("v1", "v2"),
            (action, t0 + Duration::from_secs(1)),
            action,
            decision,
            Some(1),
        );
        let a = &rows[0].0;
        assert_eq!(
            a.first_new_ms,
            Some(1.0),
            "v2 answered at 12 ms, decision at 11"
        );
        assert_eq!(
            a.moved_ms,
            Some(21.0),
            "the v2 answer sent at 30, done at 32"
        );
        assert_eq!(a.old_after_decision, 1);
        assert_eq!(a.from_action_ms, Some(31.0));
        let b = &rows[1].0;
        assert_eq!((b.first_new_ms, b.moved_ms), (Some(6.0), Some(6.0)));
        let c = &rows[2].0;
        assert_eq!((c.first_new_ms, c.moved_ms), (None, None));
        assert_eq!(rows[2].1, None);
        // Two answers from v2 after the last from v1 do not prove a move that asks for three:
        // the entry may still be split when the window ends.
        let rows = per_activator(
            &answers,
            &entries,
            ("v1", "v2"),
            (action, t0 + Duration::from_secs(1)),
            action,
            decision,
            Some(3),
        );
        assert_eq!((rows[0].0.moved_ms, rows[0].1), (None, None));
        assert_eq!(rows[0].0.first_new_ms, Some(1.0));
        // A share, not all: the first answer is the move.
        let rows = per_activator(
            &answers,
            &entries,
            ("v1", "v2"),
            (action, t0 + Duration::from_secs(1)),
            action,
            decision,
            None,
        );
        assert_eq!(rows[0].0.moved_ms, None);
        assert_eq!(rows[0].0.from_action_ms, Some(11.0));
    }

    #[test]
    fn the_spread_ranks_activators_that_never_moved_last() {
        let s = Spread::of(&[-3.0, 10.0, 5.0], 0);
        assert_eq!(
            (s.p50_ms, s.p99_ms, s.max_ms),
            (Some(5.0), Some(10.0), Some(10.0))
        );
        let s = Spread::of(&[1.0, 2.0, 3.0], 1);
        assert_eq!((s.activators, s.not_moved), (4, 1));
        assert_eq!((s.p50_ms, s.max_ms), (Some(2.0), None));
        let json = serde_json::to_value(s).unwrap();
        assert!(json["max_ms"].is_null(), "{json}");
        assert_eq!(Spread::of(&[], 0), Spread::default());
    }

    #[test]
    fn the_split_shares_count_failures_apart_and_give_their_interval() {
        let t0 = Instant::now();
        let mut window: Vec<Answer> = (0..900)
            .map(|i| answer("a", t0, i, Some("v2")))
            .chain((0..100).map(|i| answer("a", t0, i, Some("v1"))))
            .collect();
        window.push(answer("a", t0, 0, None));
        let refs: Vec<&Answer> = window.iter().collect();
        let s = SplitFigures::of(&refs, &SPLIT, true);
        assert_eq!((s.requests, s.failed, s.unknown), (1001, 1, 0));
        let v1 = &s.shares[0];
        assert_eq!((v1.revision.as_str(), v1.answered), ("v1", 100));
        assert!((v1.measured_percent - 10.0).abs() < 1e-9, "{v1:?}");
        // 1.96 × sqrt(0.1 × 0.9 / 1000) = 1.86 points.
        assert!((v1.ci95_points - 1.859).abs() < 0.01, "{v1:?}");
        assert!((s.shares[1].off_by_points).abs() < 1e-9);
    }
}
