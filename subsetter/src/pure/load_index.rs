//! The available activators ordered by load (how many subsets each is in), so that a policy
//! picks a member in O(log A) instead of scanning every activator for every revision (at
//! 5,000 activators × 100,000 revisions the scan is what made assignment take minutes).
//! Pure; kept in step by [`crate::pure::index::MembershipIndex`].
//!
//! Ties between equally loaded activators are broken on a hash ring: the first activator at
//! or after the revision's hash ([`ring_hash`]) — the same order
//! [`crate::pure::policy::LeastLoaded`] uses without an index, so both give the same members.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::pure::images::ImageSet;
pub use crate::pure::ring::{ring_distance, ring_hash};

/// [`LoadIndex::least_loaded_holding`] walks the load classes instead of the image's holders
/// when the nodes within the slack are fewer than the holders by this factor (a step of the
/// walk is a binary search of the holders; a step along the holders is one read).
const WALK_FEWER: usize = 8;

/// One available node: its load, its place on the ring, and its name (shared with its entry in
/// `by_load`, so a change of load allocates nothing).
#[derive(Clone, Debug)]
struct Slot {
    load: usize,
    hash: u64,
    name: Arc<str>,
    /// The images the node holds (shared with its facts).
    images: ImageSet,
    /// Its place in [`LoadIndex::mirror`].
    id: u32,
}

/// Each node's load, ring position and name by a small number (its `Slot::id`), in dense
/// arrays: looking through an image's holders reads the loads (4 bytes a node, 20 KB at 5,000
/// nodes) without hashing a name or following a pointer (the scan of
/// [`LoadIndex::least_loaded_holding`]). A removed node's place is reused.
#[derive(Clone, Debug, Default)]
struct Mirror {
    load: Vec<u32>,
    hash: Vec<u64>,
    name: Vec<Arc<str>>,
    images: Vec<ImageSet>,
    free: Vec<u32>,
}

impl Mirror {
    fn add(&mut self, load: usize, hash: u64, name: Arc<str>, images: &ImageSet) -> u32 {
        let load = clamp(load);
        match self.free.pop() {
            Some(id) => {
                let i = id as usize;
                (self.load[i], self.hash[i], self.name[i]) = (load, hash, name);
                self.images[i] = images.clone();
                id
            }
            None => {
                self.load.push(load);
                self.hash.push(hash);
                self.name.push(name);
                self.images.push(images.clone());
                u32::try_from(self.load.len() - 1).expect("fewer than 2^32 nodes")
            }
        }
    }
}

/// A load in the mirror: loads past 2^32 − 1 subsets read as that (never reached: 100,000
/// revisions × 3 members is 300,000 in all).
fn clamp(load: usize) -> u32 {
    u32::try_from(load).unwrap_or(u32::MAX)
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
    /// Image fingerprint → the available nodes holding it: (ring position, place in
    /// `mirror`), in ring order (position, then name) — the order a pick looks at them in.
    holders: foldhash::HashMap<u64, Vec<(u64, u32)>>,
    /// Each node's load and ring position, kept in step with `load`.
    mirror: Mirror,
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

    /// The index of `nodes` (name, load, images) at once: each image's holders are put in
    /// ring order once at the end rather than each at its place (at 5,000 nodes × 100 names
    /// the places were most of a rebuild).
    pub fn build<'a>(nodes: impl IntoIterator<Item = (&'a str, usize, &'a ImageSet)>) -> Self {
        let mut ix = Self::default();
        for (node, load, images) in nodes {
            ix.insert_with(node, load, images, false);
        }
        let m = &ix.mirror;
        for list in ix.holders.values_mut() {
            list.sort_unstable_by(|&(a, i), &(b, j)| {
                (a, &m.name[i as usize]).cmp(&(b, &m.name[j as usize]))
            });
        }
        ix
    }

    /// [`Self::insert`] of a node holding `images`.
    pub fn insert_holding(&mut self, node: &str, load: usize, images: &ImageSet) {
        self.insert_with(node, load, images, true);
    }

    /// `in_place`: each holder list kept in ring order as it goes (else [`Self::build`]
    /// sorts them after).
    fn insert_with(&mut self, node: &str, load: usize, images: &ImageSet, in_place: bool) {
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
        let id = self.mirror.add(load, hash, Arc::clone(&name), images);
        self.link_images(id, images, in_place);
        self.load.insert(
            Arc::clone(&name),
            Slot {
                load,
                hash,
                name,
                images: images.clone(),
                id,
            },
        );
    }

    fn link_images(&mut self, id: u32, images: &ImageSet, in_place: bool) {
        let m = &self.mirror;
        let key = (m.hash[id as usize], &*m.name[id as usize]);
        for f in images.fingerprints() {
            let list = self.holders.entry(*f).or_default();
            let at = if in_place {
                list.partition_point(|&(h, j)| (h, &*m.name[j as usize]) < key)
            } else {
                list.len()
            };
            list.insert(at, (key.0, id));
        }
    }

    fn unlink_images(&mut self, id: u32, images: &ImageSet) {
        for f in images.fingerprints() {
            if let Some(set) = self.holders.get_mut(f) {
                // Kept in ring order.
                if let Some(i) = set.iter().position(|x| x.1 == id) {
                    set.remove(i);
                }
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
        let (id, old) = (slot.id, slot.images.clone());
        self.unlink_images(id, &old);
        self.mirror.images[id as usize] = images.clone();
        self.link_images(id, images, true);
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
        self.unlink_images(slot.id, &slot.images);
        // The place keeps its (stale) entry until reused; no holder set names it any more.
        self.mirror.images[slot.id as usize] = ImageSet::default();
        self.mirror.free.push(slot.id);
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
        self.mirror.load[slot.id as usize] = clamp(new);
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
    /// Image locality ([`crate::pure::policy::LeastLoaded`]): the least-loaded node that `skip`
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
        let (least32, most32) = (clamp(least), clamp(most));
        let m = &self.mirror;
        // The other images (the rarest is known held) before `skip`, the caller's eligibility
        // check (a lookup in its tree of activators).
        let usable =
            |i: usize| (wanted.len() == 1 || m.images[i].holds_all(wanted)) && !skip(&m.name[i]);
        // Few nodes within the slack beside the holders: walk them in the order `least_loaded`
        // uses, finding each among the holders by its ring position.
        let within: usize = self.by_load.range(..=most).map(|(_, s)| s.len()).sum();
        if within.saturating_mul(WALK_FEWER) < rarest.len() {
            let start = (revision_hash, Arc::clone(&self.origin));
            for (_, set) in self.by_load.range(..=most) {
                for (h, n) in set.range(&start..).chain(set.range(..&start)) {
                    let at = ring_position(rarest, *h);
                    let held = rarest[at..]
                        .iter()
                        .take_while(|(x, _)| x == h)
                        .find(|(_, id)| *m.name[*id as usize] == **n);
                    if let Some(&(_, id)) = held
                        && usable(id as usize)
                    {
                        return Some(n);
                    }
                }
            }
            return Some(best);
        }
        // Else along the holders in ring order from the revision's position: the first usable
        // one at each load is the nearest at that load, and one at the least load (a holder
        // less loaded would have been `best`) ends the search — about nodes / (holders at the
        // least load) steps, each a read of a dense array.
        let start = ring_position(rarest, revision_hash);
        let mut found: Option<(u32, usize)> = None;
        for &(_, id) in rarest[start..].iter().chain(&rarest[..start]) {
            let i = id as usize;
            let load = m.load[i];
            if load > most32 || found.is_some_and(|(l, _)| load >= l) {
                continue;
            }
            if usable(i) {
                found = Some((load, i));
                if load <= least32 {
                    break;
                }
            }
        }
        Some(found.map_or(best, |(_, i)| &*m.name[i]))
    }
}

/// Where `hash` goes in `list` (sorted by ring position): the number of entries before it,
/// exactly `list.partition_point(|e| e.0 < hash)`. Ring positions are spread evenly over
/// the u64s, so the place is first guessed from `hash` itself, then bracketed by steps that
/// double, then searched within the bracket: a few neighbouring reads where a binary search
/// of a holder list (500 entries at 5,000 nodes, a tenth of them holding an image) made nine
/// scattered ones, which were most of a locality pick's time (`subsetter bench`).
fn ring_position(list: &[(u64, u32)], hash: u64) -> usize {
    let n = list.len();
    if n == 0 {
        return 0;
    }
    let guess = ((u128::from(hash) * n as u128) >> 64) as usize;
    let (mut lo, mut hi) = if list[guess].0 < hash {
        // The place is after `guess`: step right until an entry is not before `hash`.
        let (mut lo, mut step) = (guess + 1, 1);
        loop {
            let probe = guess + step;
            if probe >= n {
                break (lo, n);
            }
            if list[probe].0 >= hash {
                break (lo, probe);
            }
            lo = probe + 1;
            step *= 2;
        }
    } else {
        // At or before `guess`: step left until an entry is before `hash`.
        let (mut hi, mut step) = (guess, 1);
        loop {
            let Some(probe) = guess.checked_sub(step) else {
                break (0, hi);
            };
            if list[probe].0 < hash {
                break (probe + 1, hi);
            }
            hi = probe;
            step *= 2;
        }
    };
    // Every entry before `lo` is before `hash`; none from `hi` on is.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if list[mid].0 < hash {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The guessed-then-bracketed place is the binary search's, for lists of any spread:
        /// even (ring positions), bunched, repeated, empty.
        #[test]
        fn the_ring_position_is_the_partition_point(
            mut list in prop_oneof![
                prop::collection::vec((any::<u64>(), any::<u32>()), 0..600),
                prop::collection::vec((0u64..50, any::<u32>()), 0..200),
                prop::collection::vec((u64::MAX - 30..=u64::MAX, any::<u32>()), 0..100),
            ],
            hash in prop_oneof![any::<u64>(), 0u64..60, u64::MAX - 40..=u64::MAX],
        ) {
            list.sort_unstable();
            let want = list.partition_point(|e| e.0 < hash);
            prop_assert_eq!(ring_position(&list, hash), want);
            // Each present position too.
            for &(h, _) in list.iter().take(50) {
                prop_assert_eq!(ring_position(&list, h), list.partition_point(|e| e.0 < h));
            }
        }
    }

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
        // Nodes inserted and removed one at a time (with images, some changed on the way)
        // give the index built from what is left, holders in the same ring order.
        #[test]
        fn insert_and_remove_keep_the_index_of_what_is_left(
            ops in prop::collection::vec((0usize..12, any::<bool>(), 0usize..4, 0u64..8), 1..60),
            revision in "[a-z]{1,8}",
        ) {
            // Node n's images: fingerprints 0..3 picked by the bits of `bits`.
            let set = |bits: u64| ImageSet::from_fingerprints((0..3).filter(|b| bits >> b & 1 == 1).collect());
            let mut ix = LoadIndex::default();
            let mut present: BTreeMap<String, (usize, ImageSet)> = BTreeMap::new();
            for (n, add, load, bits) in ops {
                let node = format!("node-{n}");
                if add && present.contains_key(&node) {
                    ix.set_images(&node, &set(bits));
                    present.get_mut(&node).unwrap().1 = set(bits);
                } else if add {
                    ix.insert_holding(&node, load, &set(bits));
                    present.insert(node, (load, set(bits)));
                } else {
                    ix.remove(&node);
                    present.remove(&node);
                }
            }
            let built = LoadIndex::build(present.iter().map(|(n, (l, i))| (n.as_str(), *l, i)));
            let ring = |x: &LoadIndex| -> BTreeMap<u64, Vec<(u64, String)>> {
                x.holders
                    .iter()
                    .map(|(f, l)| (*f, l.iter().map(|(h, i)| (*h, x.mirror.name[*i as usize].to_string())).collect()))
                    .collect()
            };
            prop_assert_eq!(ring(&ix), ring(&built));
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
