//! The conditions as written: what the object says elsewhere is not written again in them.
//!
//! - A condition's `observedGeneration` is left out: the status it sits in carries
//!   `observedGeneration` itself, written in the same patch, so each condition's copy could
//!   only ever repeat it (metav1.Condition makes it optional).
//! - The message of the two conditions every settled subset has, `Ready=True`
//!   (`SubsetAssigned`) and `Degraded=False` (`FullSubset`), is left empty: it said the
//!   member count, which `status.activators` lists. Every other condition keeps its message
//!   (why a subset has no member, is short, loses a host).
//!
//! Activators read no condition (`activator/src/cache/trim.rs` drops them), and the contract
//! (docs/activation-endpoints-contract.md, 6–7) asks for the conditions' type, status and
//! transition time, and for `status.observedGeneration`, all kept. An object written in the
//! older, longer form compares equal to its lean form ([`same`]), so a new subsetter does not
//! rewrite every status of a cluster for the form alone: the old form goes at the object's
//! next real change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::pure::conditions::{self, reason};

/// Whether `c`'s message says nothing its reason and the object's other fields do not.
fn message_is_derived(c: &Condition) -> bool {
    matches!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        (conditions::READY, "True", reason::SUBSET_ASSIGNED)
            | (conditions::DEGRADED, "False", reason::FULL_SUBSET)
    )
}

/// `conds` as written: no per-condition `observedGeneration`, no derived message.
pub(super) fn lean(conds: &mut [Condition]) {
    for c in conds {
        c.observed_generation = None;
        if message_is_derived(c) {
            c.message.clear();
        }
    }
}

/// Whether `current` (as read, in either form) says what `lean` (as planned) says.
pub(super) fn same(current: &[Condition], lean_conds: &[Condition]) -> bool {
    if current == lean_conds {
        return true;
    }
    let mut c = current.to_vec();
    lean(&mut c);
    c == lean_conds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pure::conditions::{NoMembers, merge, subset};
    use k8s_openapi::jiff::Timestamp;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn a_settled_subsets_conditions_keep_type_status_reason_and_time_only() {
        let mut conds = merge(&[], &subset(3, 3, &NoMembers::default()), Some(4), at(100));
        lean(&mut conds);
        for c in &conds {
            assert_eq!(c.observed_generation, None, "{c:?}");
            assert!(c.message.is_empty(), "{c:?}");
            assert!(!c.reason.is_empty() && !c.type_.is_empty() && !c.status.is_empty());
        }
        assert_eq!(conds[0].type_, conditions::READY);
        assert_eq!(conds[1].reason, reason::FULL_SUBSET);
    }

    #[test]
    fn a_message_that_says_why_is_kept() {
        for (members, wanted) in [(0, 3), (2, 3), (1, 1)] {
            let mut conds = merge(
                &[],
                &subset(members, wanted, &NoMembers::default()),
                Some(1),
                at(1),
            );
            lean(&mut conds);
            let kept: Vec<&Condition> = conds
                .iter()
                .filter(|c| {
                    c.status == "False" && c.type_ == conditions::READY
                        || c.status == "True" && c.type_ == conditions::DEGRADED
                })
                .collect();
            assert!(!kept.is_empty());
            for c in kept {
                assert!(!c.message.is_empty(), "{members} of {wanted}: {c:?}");
            }
        }
    }

    #[test]
    fn the_older_form_is_the_same_as_the_lean_one_and_a_real_change_is_not() {
        let old = merge(&[], &subset(3, 3, &NoMembers::default()), Some(2), at(100));
        let mut new = merge(&old, &subset(3, 3, &NoMembers::default()), Some(2), at(200));
        lean(&mut new);
        assert_ne!(old, new, "the forms differ");
        assert!(
            same(&old, &new),
            "but say the same: no rewrite for the form"
        );
        let mut short = merge(&old, &subset(2, 3, &NoMembers::default()), Some(2), at(200));
        lean(&mut short);
        assert!(!same(&old, &short));
        let mut moved = new.clone();
        moved[0].last_transition_time =
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(300));
        assert!(!same(&old, &moved), "a transition is a change");
    }
}
