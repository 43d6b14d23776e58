//! What a plan derives from its inputs once, and the first step: the members the policy
//! chooses, from the load index when the caller keeps one, else from a list of candidates.

use std::cell::RefCell;

use foldhash::HashSet as FastSet;

use super::inputs::{SubsetInputs, eligible};
use crate::pure::activators::{Activator, Available};
use crate::pure::eligibility::Placement;
use crate::pure::load_index::LoadIndex;
use crate::pure::policy::{Candidate, IndexedRequest, SubsetRequest};

/// One plan's inputs with what every step asks of them: where the revision's pod could run,
/// which member is evicted, which images count.
pub(super) struct Frame<'i, 'a> {
    pub(super) inp: &'i SubsetInputs<'a>,
    /// Only activators on nodes where the revision's pod could run are candidates; a member
    /// whose node stopped being one (tainted, cordoned, relabelled) loses its slot.
    pub(super) placement: Placement,
    /// The images the policy prefers nodes holding (empty with locality off); the status
    /// counts the members holding `inp.images` either way.
    pub(super) locality: &'a [u64],
}

/// The activators the policy found usable, by node: building the members then does not look
/// each one up again in `available` (a tree of every activator: a dozen string compares).
pub(super) struct Found<'a> {
    found: Vec<(&'a str, &'a Activator)>,
    available: &'a Available,
}

impl<'a> Found<'a> {
    /// `node`'s activator. Few members (the usual N): a scan of those found; many: the tree.
    pub(super) fn activator_of(&self, node: &str) -> Option<&'a Activator> {
        match self.found.len() {
            0..=32 => self
                .found
                .iter()
                .find(|(k, _)| *k == node)
                .map(|(_, a)| *a)
                .or_else(|| self.available.get(node)),
            _ => self.available.get(node),
        }
    }
}

impl<'i, 'a> Frame<'i, 'a> {
    pub(super) fn new(inp: &'i SubsetInputs<'a>) -> Self {
        Self {
            inp,
            placement: Placement::of(&inp.revision.spec.template),
            locality: if inp.image_locality { inp.images } else { &[] },
        }
    }

    /// Whether `node`'s member is the one to move off (rebalancing).
    pub(super) fn evicted(&self, node: &str) -> bool {
        self.inp.evict == Some(node)
    }

    /// Whether `a`'s node holds every image the pod pulls (false when none is known).
    pub(super) fn holds(&self, a: &Activator) -> bool {
        let images = self.inp.images;
        !images.is_empty() && a.facts.as_ref().is_some_and(|f| f.images.holds_all(images))
    }

    /// The members the policy chooses (`n` wanted, `current` now), and the activators it
    /// found on the way.
    pub(super) fn choose(
        &self,
        n: usize,
        current: &[String],
        current_set: &FastSet<&str>,
    ) -> (Vec<String>, Found<'a>) {
        let found: RefCell<Vec<(&'a str, &'a Activator)>> = RefCell::new(Vec::new());
        let indexed = self
            .inp
            .loads
            .and_then(|loads| self.choose_indexed(loads, n, current, &found));
        let chosen = indexed.unwrap_or_else(|| self.choose_listed(n, current, current_set));
        let found = Found {
            found: found.into_inner(),
            available: self.inp.available,
        };
        (chosen, found)
    }

    /// From the load index: the policy asks about the nodes it considers (each one found is
    /// kept in `found`). None when the policy cannot choose from an index.
    fn choose_indexed(
        &self,
        loads: &LoadIndex,
        n: usize,
        current: &[String],
        found: &RefCell<Vec<(&'a str, &'a Activator)>>,
    ) -> Option<Vec<String>> {
        let inp = self.inp;
        let available: &'a Available = inp.available;
        let usable = |node: &str| {
            !self.evicted(node)
                && match available.get_key_value(node) {
                    Some((k, a)) if eligible(&self.placement, a) => {
                        found.borrow_mut().push((k, a));
                        true
                    }
                    _ => false,
                }
        };
        inp.policy.choose_indexed(&IndexedRequest {
            revision: inp.key,
            index: loads,
            eligible: &usable,
            eligible_count: self.eligible_count(loads),
            current,
            wanted: n,
            images: self.locality,
        })
    }

    /// How many nodes could take a member. Most templates constrain nothing: their eligible
    /// nodes are the clean ones, counted when the index was built. Others are counted here (a
    /// scan, for them only).
    fn eligible_count(&self, loads: &LoadIndex) -> usize {
        let inp = self.inp;
        if self.placement.is_unconstrained() {
            let evicted_clean = inp
                .evict
                .and_then(|n| inp.available.get(n))
                .is_some_and(|a| {
                    a.facts
                        .as_ref()
                        .is_none_or(|f| !f.unschedulable && f.taints.is_empty())
                });
            loads.clean - usize::from(evicted_clean && loads.clean > 0)
        } else {
            inp.available
                .values()
                .filter(|a| !self.evicted(&a.node) && eligible(&self.placement, a))
                .count()
        }
    }

    /// From a list of every eligible activator with its load (this revision's own membership
    /// not counted).
    fn choose_listed(
        &self,
        n: usize,
        current: &[String],
        current_set: &FastSet<&str>,
    ) -> Vec<String> {
        let inp = self.inp;
        let candidates: Vec<Candidate> = inp
            .available
            .iter()
            .filter(|(node, a)| !self.evicted(node) && eligible(&self.placement, a))
            .map(|(node, a)| Candidate {
                node: node.clone(),
                load: (inp.load)(node)
                    .saturating_sub(usize::from(current_set.contains(node.as_str()))),
                holds: !self.locality.is_empty() && self.holds(a),
            })
            .collect();
        inp.policy.choose(&SubsetRequest {
            revision: inp.key,
            available: &candidates,
            current,
            wanted: n,
        })
    }
}
