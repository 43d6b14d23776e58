//! The available activators ordered by load (how many subsets each is in), so that a policy
//! picks a member in O(log A) instead of scanning every activator for every revision (at
//! 5,000 activators × 100,000 revisions the scan is what made assignment take minutes).
//! Pure; kept in step by [`crate::index::MembershipIndex`].
//!
//! Ties between equally loaded activators are broken on a hash ring: the first activator at
//! or after the revision's hash ([`ring_hash`]) — the same order
//! [`crate::policy::LeastLoaded`] uses without an index, so both give the same members.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::images::ImageSet;

/// How many holders of an image [`LoadIndex::least_loaded_holding`] looks through one by one;
/// an image on more nodes is found by walking the load classes instead (about
/// nodes / holders steps).
const SCAN_HOLDERS: usize = 256;
/// Steps a walk of the load classes may take before it looks through the holders instead
/// (when most holders are too loaded to be picked, the walk would pass every other node).
const WALK_STEPS: usize = 1024;

/// A position on the ring: FNV-1a 64 (stable across processes, unlike std's seeded hasher),
/// then MurmurHash3's 64-bit finalizer, because names that differ only in their last
/// characters (`r1`, `r2`…) would otherwise sit next to each other and all pick one node.
pub fn ring_hash(s: &str) -> u64 {
    let mut h = s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// How far clockwise `node_hash` lies from `revision_hash` on the ring.
pub fn ring_distance(revision_hash: u64, node_hash: u64) -> u64 {
    node_hash.wrapping_sub(revision_hash)
}

/// One available node: its load, its place on the ring, and its name (shared with its entry in
/// `by_load`, so a change of load allocates nothing).
#[derive(Clone, Debug)]
struct Slot {
    load: usize,
    hash: u64,
    name: Arc<str>,
    /// The images the node holds (shared with its facts).
    images: ImageSet,
}

#[derive(Clone, Debug, Default)]
pub struct LoadIndex {
    load: foldhash::HashMap<Arc<str>, Slot>,
    by_load: BTreeMap<usize, BTreeSet<(u64, Arc<str>)>>,
    /// The nodes in a fixed order, for uniform random picks.
    nodes: Vec<Arc<str>>,
    /// How many of the nodes any template may use (no filtering taint, not cordoned): the
    /// eligible count of an unconstrained revision, without a scan. Set by the builder.
    pub clean: usize,
    /// The empty name: with a ring position, the least entry at that position.
    origin: Arc<str>,
    /// Image fingerprint → the available nodes holding it (image locality).
    holders: foldhash::HashMap<u64, foldhash::HashSet<Arc<str>>>,
}

impl LoadIndex {
    /// The index of `available` nodes, each with its `load`.
    pub fn new<'a>(
        available: impl IntoIterator<Item = &'a str>,
        load: impl Fn(&str) -> usize,
    ) -> Self {
        let mut ix = Self::default();
        for node in available {
            ix.insert(node, load(node));
        }
        ix
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn contains(&self, node: &str) -> bool {
        self.load.contains_key(node)
    }

    pub fn load(&self, node: &str) -> Option<usize> {
        self.load.get(node).map(|s| s.load)
    }

    pub fn nodes(&self) -> &[Arc<str>] {
        &self.nodes
    }

    /// `node` became available, in `load` subsets. O(log A); a node already in is left as it is.
    pub fn insert(&mut self, node: &str, load: usize) {
        self.insert_holding(node, load, &ImageSet::default());
    }

    /// [`Self::insert`] of a node holding `images`.
    pub fn insert_holding(&mut self, node: &str, load: usize, images: &ImageSet) {
        if self.load.contains_key(node) {
            return;
        }
        let name: Arc<str> = Arc::from(node);
        let hash = ring_hash(node);
        self.by_load
            .entry(load)
            .or_default()
            .insert((hash, Arc::clone(&name)));
        self.nodes.push(Arc::clone(&name));
        self.link_images(&name, images);
        self.load.insert(
            Arc::clone(&name),
            Slot {
                load,
                hash,
                name,
                images: images.clone(),
            },
        );
    }

    fn link_images(&mut self, name: &Arc<str>, images: &ImageSet) {
        for f in images.fingerprints() {
            self.holders.entry(*f).or_default().insert(Arc::clone(name));
        }
    }

    fn unlink_images(&mut self, name: &str, images: &ImageSet) {
        for f in images.fingerprints() {
            if let Some(set) = self.holders.get_mut(f) {
                set.remove(name);
                if set.is_empty() {
                    self.holders.remove(f);
                }
            }
        }
    }

    /// `node` now holds `images` (an image pulled or removed). O(images); an unchanged set
    /// costs a comparison.
    pub fn set_images(&mut self, node: &str, images: &ImageSet) {
        let Some(slot) = self.load.get(node) else {
            return;
        };
        if slot.images == *images {
            return;
        }
        let (name, old) = (Arc::clone(&slot.name), slot.images.clone());
        self.unlink_images(node, &old);
        self.link_images(&name, images);
        if let Some(slot) = self.load.get_mut(node) {
            slot.images = images.clone();
        }
    }

    /// Whether `node` is available and holds every image of `wanted`.
    pub fn holds(&self, node: &str, wanted: &[u64]) -> bool {
        self.load
            .get(node)
            .is_some_and(|s| s.images.holds_all(wanted))
    }

    /// Whether any available node reports an image.
    pub fn has_images(&self) -> bool {
        !self.holders.is_empty()
    }

    /// Image fingerprints known and (node, fingerprint) pairs: the size of the locality index.
    pub fn image_entries(&self) -> (usize, usize) {
        (
            self.holders.len(),
            self.holders.values().map(|s| s.len()).sum(),
        )
    }

    /// `node` is no longer available. O(log A) plus a scan of `nodes` for its position (a
    /// memcmp per node; removals are rare: a lost activator).
    pub fn remove(&mut self, node: &str) {
        let Some(slot) = self.load.remove(node) else {
            return;
        };
        self.unlink_images(node, &slot.images);
        let entry = (slot.hash, slot.name);
        if let Some(set) = self.by_load.get_mut(&slot.load) {
            set.remove(&entry);
            if set.is_empty() {
                self.by_load.remove(&slot.load);
            }
        }
        if let Some(i) = self.nodes.iter().position(|n| **n == *node) {
            self.nodes.swap_remove(i);
        }
    }

    /// `node` joined (`+1`) or left (`-1`) a subset. Nodes not in the index are ignored.
    pub fn adjust(&mut self, node: &str, joined: bool) {
        let Some(slot) = self.load.get_mut(node) else {
            return;
        };
        let old = slot.load;
        let new = if joined {
            old + 1
        } else {
            old.saturating_sub(1)
        };
        if new == old {
            return;
        }
        slot.load = new;
        let entry = (slot.hash, Arc::clone(&slot.name));
        if let Some(set) = self.by_load.get_mut(&old) {
            set.remove(&entry);
            if set.is_empty() {
                self.by_load.remove(&old);
            }
        }
        self.by_load.entry(new).or_default().insert(entry);
    }

    /// The least-loaded node that `skip` does not refuse; among equals, the first at or after
    /// `revision_hash` on the ring. O(log A) plus one step per skipped node.
    pub fn least_loaded(&self, revision_hash: u64, skip: impl Fn(&str) -> bool) -> Option<&str> {
        let start = (revision_hash, Arc::clone(&self.origin));
        for set in self.by_load.values() {
            // The part of the ring before the revision's position is only looked at when
            // every node after it is refused.
            let found = set
                .range(&start..)
                .find(|(_, n)| !skip(n))
                .or_else(|| set.range(..&start).find(|(_, n)| !skip(n)));
            if let Some((_, node)) = found {
                return Some(node);
            }
        }
        None
    }
}

impl LoadIndex {
    /// Image locality ([`crate::policy::LeastLoaded`]): the least-loaded node that `skip`
    /// does not refuse, unless a node holding every image of `wanted` is at most
    /// `slack(least load)` subsets busier — then the least-loaded such holder. Ties as in
    /// [`Self::least_loaded`]. `wanted` empty: [`Self::least_loaded`].
    pub fn least_loaded_holding(
        &self,
        revision_hash: u64,
        skip: impl Fn(&str) -> bool,
        wanted: &[u64],
        slack: impl Fn(usize) -> usize,
    ) -> Option<&str> {
        let best = self.least_loaded(revision_hash, &skip)?;
        if wanted.is_empty() || self.holds(best, wanted) {
            return Some(best);
        }
        let least = self.load.get(best).map_or(0, |s| s.load);
        let most = least + slack(least);
        let Some(rarest) = wanted
            .iter()
            .map(|w| self.holders.get(w))
            .min_by_key(|h| h.map_or(0, |h| h.len()))
            .flatten()
        else {
            return Some(best);
        };
        // A node's images are looked at before `skip` is asked: most nodes walked past do not
        // hold the image, and `skip` is the caller's eligibility check (a lookup in its tree
        // of activators, a dozen string compares), which made the walk most of the
        // assignment time when it came first.
        let usable = |n: &str| {
            rarest.contains(n) && (wanted.len() == 1 || self.holds(n, wanted)) && !skip(n)
        };
        // Few holders: each is looked at. Many: the load classes are walked in the order
        // `least_loaded` uses until a holder turns up. Holders spread evenly turn up about
        // every nodes / holders steps; a walk longer than the holders are many costs more than
        // looking through them, so it stops there (holders all too busy, or bunched).
        let scan = || {
            rarest
                .iter()
                .filter_map(|n| self.load.get(&**n))
                .filter(|s| s.load <= most && usable(&s.name))
                .min_by_key(|s| {
                    (
                        s.load,
                        ring_distance(revision_hash, s.hash),
                        Arc::clone(&s.name),
                    )
                })
                .map(|s| &*s.name)
        };
        let found = if rarest.len() <= SCAN_HOLDERS {
            scan()
        } else {
            match self.walk(revision_hash, most, rarest.len(), &usable) {
                Ok(found) => found,
                Err(()) => scan(),
            }
        };
        Some(found.unwrap_or(best))
    }

    /// The first node `usable` accepts, by load (up to `most`) then ring order; `Err` after
    /// `bound` refusals (at most [`WALK_STEPS`]).
    fn walk(
        &self,
        revision_hash: u64,
        most: usize,
        bound: usize,
        usable: &dyn Fn(&str) -> bool,
    ) -> Result<Option<&str>, ()> {
        let start = (revision_hash, Arc::clone(&self.origin));
        let mut steps = 0;
        for (_, set) in self.by_load.range(..=most) {
            for (_, n) in set.range(&start..).chain(set.range(..&start)) {
                if usable(n) {
                    return Ok(Some(n));
                }
                steps += 1;
                if steps > bound.min(WALK_STEPS) {
                    return Err(());
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn picks_the_least_loaded_and_follows_adjustments() {
        let loads = std::collections::HashMap::from([("a", 2), ("b", 0), ("c", 1)]);
        let mut ix = LoadIndex::new(["a", "b", "c"], |n| loads[n]);
        assert_eq!(ix.least_loaded(0, |_| false), Some("b"));
        assert_eq!(ix.least_loaded(0, |n| n == "b"), Some("c"));
        ix.adjust("b", true);
        ix.adjust("b", true);
        assert_eq!(ix.load("b"), Some(2));
        assert_eq!(ix.least_loaded(0, |_| false), Some("c"));
        ix.adjust("a", false);
        ix.adjust("a", false);
        assert_eq!(ix.least_loaded(7, |_| false), Some("a"));
        ix.adjust("zzz", true);
        assert!(!ix.contains("zzz"));
        assert_eq!(ix.least_loaded(0, |_| true), None);
    }

    proptest! {
        // Nodes inserted and removed one at a time give the index built from what is left.
        #[test]
        fn insert_and_remove_keep_the_index_of_what_is_left(
            ops in prop::collection::vec((0usize..12, any::<bool>(), 0usize..4), 1..60),
            revision in "[a-z]{1,8}",
        ) {
            let mut ix = LoadIndex::default();
            let mut present: BTreeMap<String, usize> = BTreeMap::new();
            for (n, add, load) in ops {
                let node = format!("node-{n}");
                if add {
                    ix.insert(&node, load);
                    present.entry(node).or_insert(load);
                } else {
                    ix.remove(&node);
                    present.remove(&node);
                }
            }
            let built = LoadIndex::new(present.keys().map(String::as_str), |n| present[n]);
            let mut nodes = ix.nodes().to_vec();
            nodes.sort();
            prop_assert_eq!(nodes, built.nodes().to_vec());
            for n in present.keys() {
                prop_assert_eq!(ix.load(n), built.load(n));
            }
            prop_assert_eq!(&ix.by_load, &built.by_load);
            let rh = ring_hash(&revision);
            prop_assert_eq!(ix.least_loaded(rh, |_| false), built.least_loaded(rh, |_| false));
        }

        // The index's pick is the scan's: least load, then least ring distance.
        #[test]
        fn the_index_picks_what_a_scan_picks(
            loads in prop::collection::vec(0usize..4, 1..40),
            revision in "[a-z]{1,8}",
            skipped in prop::collection::vec(any::<bool>(), 40),
        ) {
            let nodes: Vec<String> = (0..loads.len()).map(|i| format!("node-{i}")).collect();
            let load = |n: &str| loads[nodes.iter().position(|x| x == n).unwrap()];
            let ix = LoadIndex::new(nodes.iter().map(String::as_str), load);
            let skip = |n: &str| skipped[nodes.iter().position(|x| x == n).unwrap()];
            let rh = ring_hash(&revision);
            let scan = nodes
                .iter()
                .filter(|n| !skip(n))
                .min_by_key(|n| (load(n), ring_distance(rh, ring_hash(n))))
                .map(String::as_str);
            prop_assert_eq!(ix.least_loaded(rh, skip), scan);
        }
    }
}
