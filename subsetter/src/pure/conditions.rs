//! Status conditions of ActivationEndpoints and Revisions.
//!
//! `lastTransitionTime` changes only when a condition's status does; reason, message and
//! observedGeneration may change without a transition. Keeping the old time when nothing
//! changed is also what makes an unchanged status compare equal, so the reconciler can skip
//! the write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
/// On an ActivationEndpoints whose revision claims a host that a newer revision takes. Absent
/// when there is no conflict (not `False`): most revisions never have one, and an absent
/// condition adds nothing to write to the 100,000 objects of a cluster.
pub const HOST_CONFLICT: &str = "HostConflict";
/// On an ActivationEndpoints whose template names a scheduler other than the default. Absent
/// otherwise.
pub const CUSTOM_SCHEDULER: &str = "CustomScheduler";

/// Reasons (CamelCase, as Kubernetes conditions use).
pub mod reason {
    pub const SUBSET_ASSIGNED: &str = "SubsetAssigned";
    pub const NO_ACTIVATORS: &str = "NoActivators";
    /// Activators are Ready, but none is on a node that can run the template (a taint it does
    /// not tolerate, a nodeSelector or required affinity it does not match, a cordon).
    pub const NO_ELIGIBLE_ACTIVATORS: &str = "NoEligibleActivators";
    pub const INSUFFICIENT_ACTIVATORS: &str = "InsufficientActivators";
    pub const SINGLE_ACTIVATOR: &str = "SingleActivator";
    pub const FULL_SUBSET: &str = "FullSubset";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const HOST_CLAIMED_BY_NEWER_REVISION: &str = "HostClaimedByNewerRevision";
    pub const DEFAULT_FILTERS_APPLIED: &str = "DefaultFiltersApplied";
}

/// A condition without its transition time: what the reconciler decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The conditions `desired`, with each `lastTransitionTime` kept from `existing` when the
/// status is unchanged and set to `now` otherwise.
pub fn merge(
    existing: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let last_transition_time = existing
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: d.type_.to_owned(),
                status: status.to_owned(),
                reason: d.reason.to_owned(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// Why a subset has no member: the reason and message of its `Ready=False`, and of its
/// Revision's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoMembers {
    pub reason: &'static str,
    pub message: String,
}

impl NoMembers {
    /// From the number of Ready activators and why each of the ineligible ones is (the
    /// first reason is quoted: an operator fixes one, usually the same, thing).
    pub fn new(ready: usize, ineligible: &[String]) -> Self {
        match ineligible.first() {
            Some(first) if ready > 0 => Self {
                reason: reason::NO_ELIGIBLE_ACTIVATORS,
                message: format!(
                    "{ready} Ready activator(s), none on a node that can run the template: \
                     {first}{}",
                    match ineligible.len() - 1 {
                        0 => String::new(),
                        more => format!(" (and {more} more node(s) ineligible)"),
                    }
                ),
            },
            _ => Self::default(),
        }
    }
}

impl Default for NoMembers {
    fn default() -> Self {
        Self {
            reason: reason::NO_ACTIVATORS,
            message: "no Ready activator is available".into(),
        }
    }
}

/// Ready with `members`, the same on the ActivationEndpoints and on its Revision (whose spec
/// is valid): `none` says why when there are none.
fn ready(members: usize, none: &NoMembers) -> Desired {
    if members == 0 {
        Desired {
            type_: READY,
            status: false,
            reason: none.reason,
            message: none.message.clone(),
        }
    } else {
        Desired {
            type_: READY,
            status: true,
            reason: reason::SUBSET_ASSIGNED,
            message: format!("{members} activator(s) assigned"),
        }
    }
}

/// Ready and Degraded of an ActivationEndpoints with `members` of a wanted `wanted`; `none`
/// says why when there are no members.
pub fn subset(members: usize, wanted: usize, none: &NoMembers) -> Vec<Desired> {
    let ready = ready(members, none);
    let degraded = if members < wanted {
        Desired {
            type_: DEGRADED,
            status: true,
            reason: reason::INSUFFICIENT_ACTIVATORS,
            message: format!("{members} of {wanted} wanted activators available"),
        }
    } else if wanted <= 1 {
        Desired {
            type_: DEGRADED,
            status: true,
            reason: reason::SINGLE_ACTIVATOR,
            message: "one activator: losing its node interrupts the revision".into(),
        }
    } else {
        Desired {
            type_: DEGRADED,
            status: false,
            reason: reason::FULL_SUBSET,
            message: format!("{members} of {wanted} wanted activators"),
        }
    };
    vec![ready, degraded]
}

/// HostConflict of an ActivationEndpoints whose revision loses `conflicts` (in host order, so
/// the message is stable and an unchanged conflict writes nothing), or None when it loses none.
pub fn host_conflict(conflicts: &[crate::pure::hosts::Conflict]) -> Option<Desired> {
    if conflicts.is_empty() {
        return None;
    }
    let message = conflicts
        .iter()
        .map(|c| format!("host {} is routed to newer revision {}", c.host, c.winner))
        .collect::<Vec<_>>()
        .join("; ");
    Some(Desired {
        type_: HOST_CONFLICT,
        status: true,
        reason: reason::HOST_CLAIMED_BY_NEWER_REVISION,
        message,
    })
}

/// A template that names its own scheduler: that scheduler is not consulted (activators bind
/// pods with `spec.nodeName`); members are chosen by the default scheduler's filters instead.
pub fn custom_scheduler(name: Option<&str>) -> Option<Desired> {
    name.map(|name| Desired {
        type_: CUSTOM_SCHEDULER,
        status: true,
        reason: reason::DEFAULT_FILTERS_APPLIED,
        message: format!(
            "schedulerName {name} is not consulted: activators bind pods to their own node; \
             members are nodes that pass the default filters (taints, nodeSelector, required \
             node affinity)"
        ),
    })
}

/// Ready of a Revision: its subset's readiness, or False/InvalidSpec.
pub fn revision(problems: &[String], members: usize, none: &NoMembers) -> Vec<Desired> {
    let ready = if !problems.is_empty() {
        Desired {
            type_: READY,
            status: false,
            reason: reason::INVALID_SPEC,
            message: problems.join("; "),
        }
    } else {
        ready(members, none)
    };
    vec![ready]
}

/// Whether the ActivationEndpoints conditions say the subset is short of its wanted N: then a
/// new activator should trigger it.
pub fn is_short(conditions: &[Condition]) -> bool {
    conditions.iter().any(|c| {
        c.type_ == DEGRADED && c.status == "True" && c.reason == reason::INSUFFICIENT_ACTIVATORS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let first = merge(&[], &subset(3, 3, &NoMembers::default()), Some(1), t(100));
        let again = merge(
            &first,
            &subset(3, 3, &NoMembers::default()),
            Some(1),
            t(200),
        );
        assert_eq!(first, again);
        assert_eq!(again[0].last_transition_time, Time(t(100)));
    }

    #[test]
    fn transition_time_moves_when_status_flips() {
        let first = merge(&[], &subset(3, 3, &NoMembers::default()), Some(1), t(100));
        let degraded = merge(
            &first,
            &subset(2, 3, &NoMembers::default()),
            Some(1),
            t(200),
        );
        let ready = degraded.iter().find(|c| c.type_ == READY).unwrap();
        let deg = degraded.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(ready.last_transition_time, Time(t(100)));
        assert_eq!(deg.last_transition_time, Time(t(200)));
        assert_eq!(deg.status, "True");
        assert!(is_short(&degraded));
        assert!(!is_short(&first));
    }

    #[test]
    fn reason_change_without_status_change_keeps_time() {
        // N = 1 (SingleActivator) -> 0 of 2 wanted (InsufficientActivators): both Degraded=True.
        let a = merge(&[], &subset(1, 1, &NoMembers::default()), None, t(1));
        let b = merge(&a, &subset(1, 2, &NoMembers::default()), None, t(2));
        let deg = b.iter().find(|c| c.type_ == DEGRADED).unwrap();
        assert_eq!(deg.reason, reason::INSUFFICIENT_ACTIVATORS);
        assert_eq!(deg.last_transition_time, Time(t(1)));
    }

    #[test]
    fn single_activator_is_degraded_and_empty_is_not_ready() {
        let c = subset(1, 1, &NoMembers::default());
        assert!(
            c.iter()
                .any(|d| d.type_ == DEGRADED && d.status && d.reason == reason::SINGLE_ACTIVATOR)
        );
        let c = subset(0, 3, &NoMembers::default());
        assert!(c.iter().any(|d| d.type_ == READY && !d.status));
    }

    #[test]
    fn host_conflict_names_each_host_and_winner() {
        use crate::pure::hosts::Conflict;
        use crate::pure::key::Key;
        assert_eq!(host_conflict(&[]), None);
        let c = host_conflict(&[
            Conflict {
                host: "a.test".into(),
                winner: Key::new("apps", "v2"),
            },
            Conflict {
                host: "b.test".into(),
                winner: Key::new("other", "v9"),
            },
        ])
        .unwrap();
        assert!(c.status);
        assert_eq!(c.type_, HOST_CONFLICT);
        assert_eq!(c.reason, reason::HOST_CLAIMED_BY_NEWER_REVISION);
        assert_eq!(
            c.message,
            "host a.test is routed to newer revision apps/v2; \
             host b.test is routed to newer revision other/v9"
        );
    }

    #[test]
    fn invalid_spec_wins_over_membership() {
        let c = revision(
            &["spec.port 0 is outside 1-65535".into()],
            3,
            &NoMembers::default(),
        );
        assert_eq!(c[0].reason, reason::INVALID_SPEC);
        assert!(!c[0].status);
        assert!(c[0].message.contains("spec.port"));
    }
}
