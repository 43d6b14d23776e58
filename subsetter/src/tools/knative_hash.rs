//! Knative's subsetting (`ChooseSubset` in knative.dev/pkg/hash), re-implemented from its
//! published algorithm as a baseline for `subsetter bench` — not a policy the subsetter offers.
//! Each activator is hashed (FNV-1a 64 of `name + target`) into one of 2,048 buckets (collisions
//! rehash with the hash's hex appended); from a start angle derived from the target, every
//! `step` angle picks the next unchosen bucket clockwise. It ignores load and the current
//! members: every revision's subset is recomputed from the whole set, so any change of the set
//! may move members of revisions that never had the changed activator. With more than 2,048
//! activators the buckets run out and Knative's loop never ends; here that is refused.

use std::collections::{BTreeSet, HashMap};

use subsetter::policy::{SubsetPolicy, SubsetRequest};

/// Knative's universe of angles (buckets).
pub const UNIVERSE: u64 = 1 << 11;
const START_SALT: &str = "start-angle-salt";
const STEP_SALT: &str = "step-angle-salt";

/// The policy's name in bench reports.
pub const NAME: &str = "knative-hash";

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `n` of `from` for `target`, as Knative chooses them; None when `from` has more names than
/// buckets (where Knative never returns).
pub fn choose_subset(from: &[&str], n: usize, target: &str) -> Option<Vec<String>> {
    if n >= from.len() {
        return Some(from.iter().map(|s| s.to_string()).collect());
    }
    if from.len() as u64 > UNIVERSE {
        return None;
    }
    let start = fnv1a64(format!("{target}{START_SALT}").as_bytes()) % UNIVERSE;
    let step = fnv1a64(format!("{target}{STEP_SALT}").as_bytes()) % UNIVERSE;
    let mut by_bucket: HashMap<u64, &str> = HashMap::with_capacity(from.len());
    let mut pool = Vec::with_capacity(from.len());
    for f in from {
        let mut buf = format!("{f}{target}");
        let mut h = fnv1a64(buf.as_bytes());
        let mut bucket = h % UNIVERSE;
        while by_bucket.contains_key(&bucket) {
            buf.push_str(&format!("{h:x}"));
            h = fnv1a64(buf.as_bytes());
            bucket = h % UNIVERSE;
        }
        by_bucket.insert(bucket, f);
        pool.push(bucket);
    }
    pool.sort_unstable();
    let mut chosen = BTreeSet::new();
    let mut angle = start;
    while chosen.len() < n {
        let mut root = pool.partition_point(|b| *b < angle);
        if root == pool.len() {
            root = 0;
        }
        while chosen.contains(&root) {
            root = (root + 1) % pool.len();
        }
        chosen.insert(root);
        angle = (angle + step) % UNIVERSE;
    }
    Some(
        chosen
            .into_iter()
            .map(|i| by_bucket[&pool[i]].to_string())
            .collect(),
    )
}

/// [`choose_subset`] as a [`SubsetPolicy`], for the bench.
pub struct KnativeHash;

impl SubsetPolicy for KnativeHash {
    fn name(&self) -> &str {
        NAME
    }

    fn choose(&self, request: &SubsetRequest<'_>) -> Vec<String> {
        // Knative lists its candidates sorted (sets.String.List()).
        let mut from: Vec<&str> = request.available.iter().map(|c| c.node.as_str()).collect();
        from.sort_unstable();
        // The bench refuses more activators than buckets before it gets here.
        choose_subset(&from, request.wanted, request.revision).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("activator-{i}")).collect()
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn chooses_n_distinct_the_same_way_every_time() {
        let all = names(200);
        let from: Vec<&str> = all.iter().map(String::as_str).collect();
        let a = choose_subset(&from, 3, "default/rev-1").unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a.iter().collect::<BTreeSet<_>>().len(), 3);
        assert_eq!(choose_subset(&from, 3, "default/rev-1").unwrap(), a);
        assert_ne!(choose_subset(&from, 3, "default/rev-2").unwrap(), a);
        // All of them when n is not smaller than the set.
        assert_eq!(choose_subset(&from[..2], 3, "x").unwrap().len(), 2);
    }

    #[test]
    fn more_activators_than_buckets_is_refused() {
        let all = names(UNIVERSE as usize + 1);
        let from: Vec<&str> = all.iter().map(String::as_str).collect();
        assert_eq!(choose_subset(&from, 3, "default/rev-1"), None);
        assert!(choose_subset(&from[..UNIVERSE as usize], 3, "default/rev-1").is_some());
    }
}
