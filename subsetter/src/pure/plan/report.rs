//! What a plan says about its subset beside the members: the conditions it wants, why it has
//! no member, whether it just turned Degraded, and the churn against the current members.

use foldhash::HashSet as FastSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::frame::Frame;
use super::inputs::eligible;
use crate::pure::conditions::{self, Desired};

/// Members that joined and left, and why those left did.
pub(super) struct Churn {
    pub(super) joined: usize,
    pub(super) left: usize,
    /// Their activator was gone.
    pub(super) left_lost: usize,
    /// Their node no longer eligible.
    pub(super) left_ineligible: usize,
    /// Moved off by rebalancing.
    pub(super) left_rebalanced: usize,
}

impl Frame<'_, '_> {
    /// With no member: whether no activator is Ready or none is on a node that can run the
    /// template (a scan of every activator, only for such a revision).
    pub(super) fn no_members(&self) -> conditions::NoMembers {
        let available = self.inp.available;
        let ineligible: Vec<String> = available
            .values()
            .filter_map(|a| self.placement.allows(a.facts.as_ref()?).err())
            .map(|why| why.to_string())
            .collect();
        conditions::NoMembers::new(available.len(), &ineligible)
    }

    /// The conditions wanted of `members` of `n`: Ready and Degraded, HostConflict, and the
    /// custom scheduler's.
    pub(super) fn desired_conditions(
        &self,
        members: usize,
        n: usize,
        no_members: Option<&conditions::NoMembers>,
    ) -> Vec<Desired> {
        let mut desired = conditions::subset(members, n, no_members.unwrap_or(&Default::default()));
        desired.extend(conditions::host_conflict(self.inp.host_conflicts));
        desired.extend(conditions::custom_scheduler(
            self.placement.custom_scheduler.as_deref(),
        ));
        desired
    }

    /// Who joined and left between `current` and `chosen`.
    pub(super) fn churn(&self, current: &FastSet<&str>, chosen: &[String]) -> Churn {
        let chosen_set: FastSet<&str> = chosen.iter().map(String::as_str).collect();
        let mut churn = Churn {
            joined: chosen_set.difference(current).count(),
            left: current.difference(&chosen_set).count(),
            left_lost: 0,
            left_ineligible: 0,
            left_rebalanced: 0,
        };
        for node in current.difference(&chosen_set) {
            match self.inp.available.get(node) {
                None => churn.left_lost += 1,
                Some(a) if !eligible(&self.placement, a) => churn.left_ineligible += 1,
                Some(_) if self.evicted(node) => churn.left_rebalanced += 1,
                Some(_) => {}
            }
        }
        churn
    }
}

/// `Degraded` as `now` has it, when it turned True or changed its reason since
/// `existing`: (reason, message), for an Event on the Revision.
pub(super) fn newly_degraded(
    existing: &[Condition],
    now: &[Condition],
) -> Option<(String, String)> {
    let was_degraded = existing
        .iter()
        .find(|c| c.type_ == conditions::DEGRADED && c.status == "True")
        .map(|c| c.reason.as_str());
    now.iter()
        .find(|c| c.type_ == conditions::DEGRADED && c.status == "True")
        .filter(|c| was_degraded != Some(c.reason.as_str()))
        .map(|c| (c.reason.clone(), c.message.clone()))
}
