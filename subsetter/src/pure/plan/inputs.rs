//! What a plan is computed from, and the one eligibility test its steps share: below every
//! step, so none of them imports the plan that runs them.

use crds::{ActivationEndpoints, Revision};
use k8s_openapi::jiff::Timestamp;

use crate::pure::activators::{Activator, Available};
use crate::pure::eligibility::Placement;
use crate::pure::hosts::Conflict;
use crate::pure::load_index::LoadIndex;
use crate::pure::policy::SubsetPolicy;

/// Whether `a`'s node may run the revision's pods (a node without a Node object may).
pub fn eligible(placement: &Placement, a: &Activator) -> bool {
    a.facts.as_ref().is_none_or(|f| placement.allows(f).is_ok())
}

/// Inputs of [`super::subset`].
pub struct SubsetInputs<'a> {
    pub key: &'a str,
    pub revision: &'a Revision,
    pub current: Option<&'a ActivationEndpoints>,
    pub available: &'a Available,
    /// Subsets each node is in now (including this revision's current one).
    pub load: &'a dyn Fn(&str) -> usize,
    /// The available activators by load, when the caller keeps them indexed: the policy then
    /// chooses in O(N log A) instead of from a list of every activator.
    pub loads: Option<&'a LoadIndex>,
    /// A member to move off (rebalancing): planned as if its activator were unavailable.
    pub evict: Option<&'a str>,
    pub policy: &'a dyn SubsetPolicy,
    /// Prefer members whose node holds the revision's images (the policy's choice within its
    /// balance bound; `policy::locality_slack`).
    pub image_locality: bool,
    /// The images the revision's pod pulls (`images::wanted`, from the caller's
    /// `images::WantedCache`: a plan does not parse the template for them); empty when
    /// locality is off or no node reports any image, which leaves `status.imageMembers` out.
    pub images: &'a [u64],
    pub default_n: usize,
    /// The hosts of the revision that a newer revision takes (gives `HostConflict`).
    pub host_conflicts: &'a [Conflict],
    /// The hosts a Route sends to this revision, with its percent of each (`route_plan`).
    pub routes: &'a [crds::HostShare],
    /// Hosts of `spec.hosts` whose hand-over to this revision waits for its pods: their
    /// labels are left off until then (`handover`).
    pub pending_hosts: &'a [String],
    /// Pods to keep started across the members while a hand-over waits (0: none).
    pub warm_pods: i32,
    pub now: Timestamp,
}
