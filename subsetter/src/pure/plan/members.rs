//! The members a plan writes: the chosen activators with their shares of maxScale and
//! minScale (and of the pods a waiting hand-over keeps started), and how many hold the
//! revision's images.

use crds::{ActivatorMember, ImageMembers};

use super::frame::{Found, Frame};
use super::inputs::SubsetInputs;
use crate::pure::shares;

/// The members for `chosen`, in its order, each with its share.
pub(super) fn members(
    inp: &SubsetInputs<'_>,
    chosen: &[String],
    found: &Found<'_>,
) -> Vec<ActivatorMember> {
    let spec = &inp.revision.spec;
    let mut shares = shares::split(spec.max_scale, spec.min_scale, chosen.len());
    // While a hand-over waits, the members keep the pods it waits for started (`minPods`),
    // the primary first: that is where every entry sends the traffic once the host moves.
    shares::add_warm(&mut shares, &warm_order(inp, chosen), inp.warm_pods);
    chosen
        .iter()
        .zip(shares)
        .filter_map(|(node, share)| {
            let a = found.activator_of(node)?;
            Some(ActivatorMember {
                node: a.node.clone(),
                address: a.address.clone(),
                pod: a.pod.clone(),
                max_pods: share.max_pods,
                min_pods: share.min_pods,
            })
        })
        .collect()
}

/// The slots of `chosen` in the order entries try them for this revision (the primary first,
/// `crds::contract::member_weight`).
fn warm_order(inp: &SubsetInputs<'_>, chosen: &[String]) -> Vec<usize> {
    if inp.warm_pods <= 0 {
        return Vec::new();
    }
    let ns = inp
        .revision
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default();
    let name = inp.revision.metadata.name.as_deref().unwrap_or_default();
    let mut order: Vec<usize> = (0..chosen.len()).collect();
    order.sort_by_cached_key(|&i| {
        (
            std::cmp::Reverse(crds::contract::member_weight(ns, name, &chosen[i])),
            chosen[i].clone(),
        )
    });
    order
}

impl Frame<'_, '_> {
    /// `status.imageMembers`: how many members hold the pod's images, when it pulls any and a
    /// member's node has a Node object (its images) to tell.
    pub(super) fn image_members(
        &self,
        activators: &[ActivatorMember],
        found: &Found<'_>,
    ) -> Option<ImageMembers> {
        if self.inp.images.is_empty() {
            return None;
        }
        let (mut known, mut holding) = (false, 0);
        for m in activators {
            if let Some(a) = found.activator_of(&m.node) {
                known |= a.facts.is_some();
                holding += i32::from(self.holds(a));
            }
        }
        known.then(|| ImageMembers {
            holding,
            of: i32::try_from(activators.len()).unwrap_or(i32::MAX),
        })
    }
}
