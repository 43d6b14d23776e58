//! Subset policies: which activators serve a revision.
//!
//! A policy is pure (no IO) and replaceable: the reconciler hands it the revision key, the
//! activators available now (with how many subsets each is already in), the current members and
//! the wanted N, and writes back whatever it returns. Every membership change costs the app a
//! cold start on the new member, so both built-in policies keep every current member that is
//! still available *in its slot* and only fill the vacated slots (then append, if N grew).
//! Keeping slots stable also keeps the per-member shares of maxScale stable (see `shares`).

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;

use foldhash::HashSet as FastSet;
use rand::rngs::StdRng;

use crate::pure::load_index::LoadIndex;
use crate::pure::ring::{ring_distance, ring_hash};
use keep_serving::Locked;
use rand::{RngExt, SeedableRng};

/// One activator the policy may choose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Node name: the identity of a member (one activator per node).
    pub node: String,
    /// How many subsets this activator is in now (not counting this revision's).
    pub load: usize,
    /// Whether its node holds every image of the revision (image locality; false when
    /// locality is off or nothing is known of the node's images).
    pub holds: bool,
}

/// What a policy decides from.
#[derive(Clone, Copy, Debug)]
pub struct SubsetRequest<'a> {
    /// `namespace/name` of the revision.
    pub revision: &'a str,
    /// The activators available now (Ready, on a Ready node), one per node.
    pub available: &'a [Candidate],
    /// The current members' nodes, in slot order (may include nodes no longer available).
    pub current: &'a [String],
    /// The wanted N (`spec.activators` or the default).
    pub wanted: usize,
}

/// What a policy decides from when the subsetter keeps an index of the available activators
/// by load ([`LoadIndex`]): the same question as [`SubsetRequest`], without a candidate list
/// that costs O(activators) to build for every revision.
#[derive(Clone, Copy)]
pub struct IndexedRequest<'a> {
    pub revision: &'a str,
    /// The available activators, by load.
    pub index: &'a LoadIndex,
    /// Whether the revision's pod could run on a node (eligibility).
    pub eligible: &'a dyn Fn(&str) -> bool,
    /// How many available nodes are eligible.
    pub eligible_count: usize,
    pub current: &'a [String],
    pub wanted: usize,
    /// The revision's images (fingerprints, `images::wanted`) when image locality is on;
    /// empty: no preference.
    pub images: &'a [u64],
}

/// How many subsets busier than the least-loaded candidate a node holding the revision's
/// images may be and still be chosen over it: 2 % of the least load, rounded down (0 below
/// 50). Every pick is then at most `least + least / 50`, so no activator passes about
/// 1.02 × the least load + 1 — max/mean stays within 1.05 from a mean of 34 up, and below
/// that locality only breaks ties between equally loaded activators.
pub fn locality_slack(least: usize) -> usize {
    least / 50
}

/// A replaceable subset policy.
pub trait SubsetPolicy: Send + Sync {
    /// The name written to `status.policy`.
    fn name(&self) -> &str;
    /// The members' nodes, in slot order: no duplicates, only available nodes, exactly
    /// `min(wanted, available)` of them.
    fn choose(&self, request: &SubsetRequest<'_>) -> Vec<String>;
    /// The same choice from an index, in O(N log A) per revision; `None` (the default) makes
    /// the caller build the candidate list and call [`SubsetPolicy::choose`]. A policy that
    /// answers must answer as `choose` would for the same loads.
    fn choose_indexed(&self, _request: &IndexedRequest<'_>) -> Option<Vec<String>> {
        None
    }
}

/// [`keep_and_fill`] over an index: keep available, eligible current members in their slots,
/// then `pick` a node `skip` does not refuse for each vacated and each new slot.
pub fn keep_and_fill_indexed(
    request: &IndexedRequest<'_>,
    mut pick: impl FnMut(&dyn Fn(&str) -> bool) -> Option<String>,
) -> Vec<String> {
    let usable = |n: &str| request.index.contains(n) && (request.eligible)(n);
    let n = request.wanted.min(request.eligible_count);
    let mut seen = FastSet::default();
    let mut slots: Vec<Option<String>> = request
        .current
        .iter()
        .map(|node| (usable(node) && seen.insert(node.as_str())).then(|| node.clone()))
        .collect();
    let mut kept = slots.iter().flatten().count();
    for slot in slots.iter_mut().rev() {
        if kept <= n {
            break;
        }
        if slot.take().is_some() {
            kept -= 1;
        }
    }
    // The nodes in the slots: for the usual few, a scan of the slots themselves; for many, a
    // set (a copy of each name).
    let few = slots.len().max(n) <= 8;
    let mut taken: FastSet<String> = if few {
        FastSet::default()
    } else {
        slots.iter().flatten().cloned().collect()
    };
    let mut missing = n - kept;
    let mut next = |slots: &[Option<String>], taken: &FastSet<String>| {
        pick(&|x: &str| {
            let is_taken = if few {
                slots.iter().flatten().any(|s| s == x)
            } else {
                taken.contains(x)
            };
            is_taken || !(request.eligible)(x)
        })
    };
    for i in 0..slots.len() {
        if missing == 0 {
            break;
        }
        if slots[i].is_some() {
            continue;
        }
        let Some(node) = next(&slots, &taken) else {
            break;
        };
        if !few {
            taken.insert(node.clone());
        }
        slots[i] = Some(node);
        missing -= 1;
    }
    while missing > 0 {
        let Some(node) = next(&slots, &taken) else {
            break;
        };
        if !few {
            taken.insert(node.clone());
        }
        slots.push(Some(node));
        missing -= 1;
    }
    slots.into_iter().flatten().collect()
}

/// The slot logic both built-in policies share: keep available current members in their
/// slots, then let `pick` choose from the remaining candidates for each vacated slot and for
/// each new slot at the end.
pub fn keep_and_fill(
    request: &SubsetRequest<'_>,
    mut pick: impl FnMut(&[&Candidate]) -> usize,
) -> Vec<String> {
    let available: HashSet<&str> = request.available.iter().map(|c| c.node.as_str()).collect();
    let n = request.wanted.min(available.len());
    let mut seen = HashSet::new();
    // Slots of the current subset; None = vacated (gone, or a duplicate entry).
    let mut slots: Vec<Option<&str>> = request
        .current
        .iter()
        .map(|node| {
            let node = node.as_str();
            (available.contains(node) && seen.insert(node)).then_some(node)
        })
        .collect();
    // N shrank (or availability did): drop kept members from the end, so the earliest slots
    // (and their shares) stay put.
    let mut kept = slots.iter().flatten().count();
    for slot in slots.iter_mut().rev() {
        if kept <= n {
            break;
        }
        if slot.take().is_some() {
            kept -= 1;
        }
    }
    let kept_nodes: HashSet<&str> = slots.iter().flatten().copied().collect();
    let mut pool: Vec<&Candidate> = request
        .available
        .iter()
        .filter(|c| !kept_nodes.contains(c.node.as_str()))
        .collect();
    // Deterministic pool order, whatever order the caller listed the activators in.
    pool.sort_by(|a, b| a.node.cmp(&b.node));
    pool.dedup_by(|a, b| a.node == b.node);
    let mut missing = n - kept;
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        if missing == 0 || pool.is_empty() {
            break;
        }
        let chosen = pool.remove(pick(&pool).min(pool.len() - 1));
        *slot = Some(chosen.node.as_str());
        missing -= 1;
    }
    while missing > 0 && !pool.is_empty() {
        let chosen = pool.remove(pick(&pool).min(pool.len() - 1));
        slots.push(Some(chosen.node.as_str()));
        missing -= 1;
    }
    slots.into_iter().flatten().map(str::to_owned).collect()
}

/// Uniformly random replacements. The rng is injectable so tests are reproducible.
pub struct Random {
    rng: Mutex<StdRng>,
}

impl Random {
    pub fn new() -> Self {
        Self::seeded(rand::rng().random())
    }
    pub fn seeded(seed: u64) -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }
}

impl Default for Random {
    fn default() -> Self {
        Self::new()
    }
}

impl SubsetPolicy for Random {
    fn name(&self) -> &str {
        "random"
    }
    fn choose(&self, request: &SubsetRequest<'_>) -> Vec<String> {
        let mut rng = self.rng.locked();
        keep_and_fill(request, |pool| rng.random_range(0..pool.len()))
    }

    fn choose_indexed(&self, request: &IndexedRequest<'_>) -> Option<Vec<String>> {
        let mut rng = self.rng.locked();
        let nodes = request.index.nodes();
        Some(keep_and_fill_indexed(request, |skip| {
            // Uniform over the nodes not skipped: rejection while that is cheap (few are
            // skipped), then a scan of the rest.
            for _ in 0..64 {
                if nodes.is_empty() {
                    return None;
                }
                let n = &nodes[rng.random_range(0..nodes.len())];
                if !skip(n) {
                    return Some(n.to_string());
                }
            }
            let rest: Vec<&str> = nodes.iter().map(|n| &**n).filter(|n| !skip(n)).collect();
            (!rest.is_empty()).then(|| rest[rng.random_range(0..rest.len())].to_owned())
        }))
    }
}

/// Replacements are the activators in the fewest subsets. Ties are broken by a hash of
/// (revision, node), so revisions created together spread over equally loaded activators
/// instead of all landing on the alphabetically first one.
#[derive(Default)]
pub struct LeastLoaded;

impl SubsetPolicy for LeastLoaded {
    fn name(&self) -> &str {
        "least-loaded"
    }
    fn choose(&self, request: &SubsetRequest<'_>) -> Vec<String> {
        let rh = ring_hash(request.revision);
        keep_and_fill(request, |pool| {
            let order = |c: &Candidate| (c.load, ring_distance(rh, ring_hash(&c.node)));
            let least = |within: &dyn Fn(&Candidate) -> bool| {
                pool.iter()
                    .enumerate()
                    .filter(|(_, c)| within(c))
                    .min_by_key(|(_, c)| order(c))
                    .map(|(i, _)| i)
            };
            let Some(best) = least(&|_| true) else {
                return 0;
            };
            if pool[best].holds {
                return best;
            }
            // Image locality: the least-loaded holder, if it is within the slack.
            let most = pool[best].load + locality_slack(pool[best].load);
            least(&|c| c.holds && c.load <= most).unwrap_or(best)
        })
    }

    fn choose_indexed(&self, request: &IndexedRequest<'_>) -> Option<Vec<String>> {
        let rh = ring_hash(request.revision);
        Some(keep_and_fill_indexed(request, |skip| {
            request
                .index
                .least_loaded_holding(rh, skip, request.images, locality_slack)
                .map(str::to_owned)
        }))
    }
}

/// The policy named on the command line.
pub fn by_name(name: &str) -> Option<Box<dyn SubsetPolicy>> {
    match name {
        "random" => Some(Box::new(Random::new())),
        "least-loaded" => Some(Box::new(LeastLoaded)),
        _ => None,
    }
}

/// Nodes in `a` and not in `b`: the members a change adds (used for churn metrics).
pub fn added<'a>(new: &'a [String], old: &[String]) -> BTreeSet<&'a str> {
    let old: HashSet<&str> = old.iter().map(String::as_str).collect();
    new.iter()
        .map(String::as_str)
        .filter(|n| !old.contains(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(nodes: &[(&str, usize)]) -> Vec<Candidate> {
        nodes
            .iter()
            .map(|(n, l)| Candidate {
                node: (*n).to_owned(),
                load: *l,
                holds: false,
            })
            .collect()
    }
    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn fresh_subset_has_n_distinct_available_members() {
        let avail = cands(&[("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 0)]);
        let out = Random::seeded(1).choose(&SubsetRequest {
            revision: "ns/r",
            available: &avail,
            current: &[],
            wanted: 3,
        });
        assert_eq!(out.len(), 3);
        let set: HashSet<_> = out.iter().collect();
        assert_eq!(set.len(), 3);
        assert!(out.iter().all(|n| avail.iter().any(|c| &c.node == n)));
    }

    #[test]
    fn lost_member_is_replaced_in_its_slot_and_others_stay() {
        let avail = cands(&[("a", 0), ("c", 0), ("d", 5), ("e", 1)]);
        let current = strings(&["a", "b", "c"]);
        let out = LeastLoaded.choose(&SubsetRequest {
            revision: "ns/r",
            available: &avail,
            current: &current,
            wanted: 3,
        });
        assert_eq!(out, strings(&["a", "e", "c"]));
    }

    #[test]
    fn n_is_capped_by_availability() {
        let avail = cands(&[("a", 0), ("b", 0)]);
        let out = Random::seeded(7).choose(&SubsetRequest {
            revision: "ns/r",
            available: &avail,
            current: &[],
            wanted: 5,
        });
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn shrinking_n_drops_members_from_the_end() {
        let avail = cands(&[("a", 0), ("b", 0), ("c", 0)]);
        let current = strings(&["c", "a", "b"]);
        let out = Random::seeded(3).choose(&SubsetRequest {
            revision: "ns/r",
            available: &avail,
            current: &current,
            wanted: 2,
        });
        assert_eq!(out, strings(&["c", "a"]));
    }

    #[test]
    fn duplicate_current_entries_are_collapsed() {
        let avail = cands(&[("a", 0), ("b", 0), ("c", 9)]);
        let current = strings(&["a", "a"]);
        let out = LeastLoaded.choose(&SubsetRequest {
            revision: "ns/r",
            available: &avail,
            current: &current,
            wanted: 2,
        });
        assert_eq!(out, strings(&["a", "b"]));
    }

    #[test]
    fn least_loaded_prefers_idle_activators() {
        let avail = cands(&[("a", 10), ("b", 2), ("c", 0), ("d", 1), ("e", 7)]);
        let mut out = LeastLoaded.choose(&SubsetRequest {
            revision: "ns/r",
            available: &avail,
            current: &[],
            wanted: 3,
        });
        out.sort();
        assert_eq!(out, strings(&["b", "c", "d"]));
    }

    #[test]
    fn least_loaded_spreads_ties_across_revisions() {
        let avail: Vec<_> = (0..20)
            .map(|i| Candidate {
                node: format!("n{i}"),
                load: 0,
                holds: false,
            })
            .collect();
        let firsts: HashSet<String> = (0..50)
            .map(|r| {
                LeastLoaded.choose(&SubsetRequest {
                    revision: &format!("ns/r{r}"),
                    available: &avail,
                    current: &[],
                    wanted: 1,
                })[0]
                    .clone()
            })
            .collect();
        assert!(firsts.len() > 5, "ties all went to {firsts:?}");
    }

    #[test]
    fn random_with_same_seed_is_reproducible() {
        let avail = cands(&[("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 0), ("f", 0)]);
        let req = SubsetRequest {
            revision: "ns/r",
            available: &avail,
            current: &[],
            wanted: 3,
        };
        assert_eq!(
            Random::seeded(42).choose(&req),
            Random::seeded(42).choose(&req)
        );
    }

    /// Property: for random clusters, current subsets and N, both policies return distinct,
    /// available nodes, exactly min(N, available) of them, and keep every available current
    /// member in its slot unless N shrank below the kept count.
    #[test]
    fn property_invariants_hold_for_random_inputs() {
        let mut rng = StdRng::seed_from_u64(0x5eed);
        let policies: [Box<dyn SubsetPolicy>; 2] =
            [Box::new(Random::seeded(9)), Box::new(LeastLoaded)];
        for _ in 0..2000 {
            let nodes = rng.random_range(0..12usize);
            let mut avail = Vec::new();
            for i in 0..nodes {
                if rng.random_bool(0.8) {
                    avail.push(Candidate {
                        node: format!("n{i}"),
                        load: rng.random_range(0..5),
                        holds: false,
                    });
                }
            }
            let current: Vec<String> = (0..rng.random_range(0..6usize))
                .map(|_| format!("n{}", rng.random_range(0..12usize)))
                .collect();
            let wanted = rng.random_range(1..7usize);
            let req = SubsetRequest {
                revision: "ns/p",
                available: &avail,
                current: &current,
                wanted,
            };
            for policy in &policies {
                let out = policy.choose(&req);
                let distinct: HashSet<&String> = out.iter().collect();
                assert_eq!(distinct.len(), out.len(), "duplicates in {out:?}");
                assert_eq!(out.len(), wanted.min(avail.len()));
                assert!(out.iter().all(|n| avail.iter().any(|c| &c.node == n)));
                let mut seen = HashSet::new();
                let still: Vec<&String> = current
                    .iter()
                    .filter(|n| avail.iter().any(|c| &c.node == *n) && seen.insert(*n))
                    .collect();
                let keepable = still.len().min(out.len());
                for n in &still[..keepable] {
                    assert!(
                        out.contains(n),
                        "{} dropped {n}: {current:?} -> {out:?}",
                        policy.name()
                    );
                }
                if still.len() <= out.len() {
                    let churn = added(&out, &current).len();
                    assert_eq!(churn, out.len() - still.len(), "needless churn");
                }
            }
        }
    }

    #[test]
    fn property_least_loaded_new_members_are_no_busier_than_skipped_ones() {
        let mut rng = StdRng::seed_from_u64(77);
        for _ in 0..1000 {
            let avail: Vec<Candidate> = (0..rng.random_range(1..15usize))
                .map(|i| Candidate {
                    node: format!("n{i}"),
                    load: rng.random_range(0..10),
                    holds: false,
                })
                .collect();
            let wanted = rng.random_range(1..6usize);
            let out = LeastLoaded.choose(&SubsetRequest {
                revision: "ns/q",
                available: &avail,
                current: &[],
                wanted,
            });
            let max_chosen = out
                .iter()
                .map(|n| avail.iter().find(|c| &c.node == n).unwrap().load)
                .max()
                .unwrap();
            let min_skipped = avail
                .iter()
                .filter(|c| !out.contains(&c.node))
                .map(|c| c.load)
                .min();
            if let Some(min_skipped) = min_skipped {
                assert!(max_chosen <= min_skipped);
            }
        }
    }

    proptest::proptest! {
        // The index answers as the list does, with few slots (a scan of the slots for the
        // nodes taken) and with many (a set).
        #[test]
        fn least_loaded_from_the_index_is_least_loaded_from_the_list(
            loads in proptest::collection::vec(0usize..4, 2..30),
            current in proptest::collection::vec(0usize..40, 0..5),
            extra in 0usize..12,
            ineligible in proptest::collection::vec(proptest::prelude::any::<bool>(), 30),
        ) {
            let nodes: Vec<String> = (0..40).map(|i| format!("node-{i}")).collect();
            let current: Vec<String> = current.iter().map(|i| nodes[*i].clone()).collect();
            let wanted = current.len() + extra;
            let eligible = |n: &str| {
                let i = nodes.iter().position(|x| x == n).unwrap();
                i < loads.len() && !ineligible[i]
            };
            // The index counts this revision's current subset; the list does not.
            let in_current = |n: &str| usize::from(current.iter().any(|c| c == n));
            let available: Vec<Candidate> = nodes[..loads.len()]
                .iter()
                .zip(&loads)
                .filter(|(n, _)| eligible(n))
                .map(|(n, l)| Candidate { node: n.clone(), load: *l, holds: false })
                .collect();
            let index = LoadIndex::new(nodes[..loads.len()].iter().map(String::as_str), |n| {
                let i = nodes.iter().position(|x| x == n).unwrap();
                loads[i] + in_current(n)
            });
            let listed = LeastLoaded.choose(&SubsetRequest {
                revision: "ns/r",
                available: &available,
                current: &current,
                wanted,
            });
            let indexed = LeastLoaded.choose_indexed(&IndexedRequest {
                revision: "ns/r",
                index: &index,
                eligible: &eligible,
                eligible_count: available.len(),
                current: &current,
                wanted, images: &[]
            });
            proptest::prop_assert_eq!(Some(listed), indexed);
        }
    }

    /// One synthetic cluster assigned from scratch through the index, as the reconciler
    /// does: `images` images, each on a random `share` of `nodes` nodes; revision `r` runs
    /// image `r % images`. Returns max/mean load and the share of members holding their
    /// revision's image.
    fn assign(
        nodes: usize,
        revisions: usize,
        images: usize,
        share: f64,
        seed: u64,
        locality: bool,
    ) -> (f64, f64) {
        use crate::pure::images::{ImageSet, fingerprint};
        let mut rng = StdRng::seed_from_u64(seed);
        let image = |i: usize| fingerprint(&format!("registry:5000/app-{i}:v1"));
        let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
        let mut index = LoadIndex::default();
        for n in &names {
            let held: Vec<u64> = (0..images)
                .filter(|_| rng.random_bool(share))
                .map(image)
                .collect();
            index.insert_holding(n, 0, &ImageSet::from_fingerprints(held));
        }
        let mut holding = 0usize;
        for r in 0..revisions {
            let wanted = [image(r % images)];
            let out = LeastLoaded
                .choose_indexed(&IndexedRequest {
                    revision: &format!("ns/r{r}"),
                    index: &index,
                    eligible: &|_| true,
                    eligible_count: nodes,
                    current: &[],
                    wanted: 3,
                    images: if locality { &wanted } else { &[] },
                })
                .unwrap();
            for n in &out {
                holding += usize::from(index.holds(n, &wanted));
                index.adjust(n, true);
            }
        }
        let loads: Vec<usize> = names.iter().map(|n| index.load(n).unwrap()).collect();
        let mean = loads.iter().sum::<usize>() as f64 / nodes as f64;
        let max = *loads.iter().max().unwrap() as f64;
        (max / mean, holding as f64 / (revisions * 3) as f64)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(8))]
        // With locality on, balance stays within the goal (max/mean <= 1.05 at a mean of
        // 60) for any image spread, and members hold their image at least as often as
        // with it off.
        #[test]
        fn locality_keeps_the_balance_goal_and_never_holds_less(
            seed in proptest::prelude::any::<u64>(),
            images in 1usize..80,
            share in 0.01f64..0.6,
        ) {
            let (off_balance, off_share) = assign(200, 4_000, images, share, seed, false);
            let (on_balance, on_share) = assign(200, 4_000, images, share, seed, true);
            proptest::prop_assert!(on_balance <= 1.05, "max/mean {on_balance} (off: {off_balance})");
            proptest::prop_assert!(
                on_share >= off_share,
                "held with locality {on_share}, without {off_share}"
            );
        }

        // The index and the list decide alike with images too: the same holder within the
        // slack, the same fallback without one (loads around 50, where the slack turns 1;
        // up to 300 nodes, past the index's scan of the holders).
        #[test]
        fn locality_from_the_index_is_locality_from_the_list(
            loads in proptest::collection::vec(45usize..60, 2..300),
            holders in proptest::collection::vec(proptest::prelude::any::<bool>(), 300),
            current in proptest::collection::vec(0usize..300, 0..4),
            extra in 0usize..4,
        ) {
            use crate::pure::images::ImageSet;
            let wanted = [42u64];
            let nodes: Vec<String> = (0..loads.len()).map(|i| format!("node-{i}")).collect();
            let current: Vec<String> = current
                .iter()
                .filter(|i| **i < nodes.len())
                .map(|i| nodes[*i].clone())
                .collect();
            let in_current = |n: &str| usize::from(current.iter().any(|c| c == n));
            let mut index = LoadIndex::default();
            for (i, n) in nodes.iter().enumerate() {
                let set = ImageSet::from_fingerprints(if holders[i] { vec![42, 7] } else { vec![7] });
                index.insert_holding(n, loads[i] + in_current(n), &set);
            }
            let available: Vec<Candidate> = nodes
                .iter()
                .zip(&loads)
                .enumerate()
                .map(|(i, (n, l))| Candidate { node: n.clone(), load: *l, holds: holders[i] })
                .collect();
            let wanted_n = current.len() + extra;
            let listed = LeastLoaded.choose(&SubsetRequest {
                revision: "ns/r",
                available: &available,
                current: &current,
                wanted: wanted_n,
            });
            let indexed = LeastLoaded.choose_indexed(&IndexedRequest {
                revision: "ns/r",
                index: &index,
                eligible: &|_| true,
                eligible_count: nodes.len(),
                current: &current,
                wanted: wanted_n,
                images: &wanted,
            });
            proptest::prop_assert_eq!(Some(listed), indexed);
        }
    }

    #[test]
    fn a_holder_wins_a_tie_and_within_the_slack_but_not_beyond() {
        let c = |n: &str, load, holds| Candidate {
            node: n.into(),
            load,
            holds,
        };
        let pick = |avail: &[Candidate]| {
            LeastLoaded.choose(&SubsetRequest {
                revision: "ns/r",
                available: avail,
                current: &[],
                wanted: 1,
            })
        };
        // Equal loads: the holder, wherever the ring would have gone.
        for other in ["a", "b", "c", "d", "e"] {
            assert_eq!(
                pick(&[c(other, 3, false), c("h", 3, true)]),
                strings(&["h"])
            );
        }
        // At a least load of 100 the slack is 2: 102 is allowed, 103 is not.
        assert_eq!(
            pick(&[c("a", 100, false), c("h", 102, true)]),
            strings(&["h"])
        );
        assert_eq!(
            pick(&[c("a", 100, false), c("h", 103, true)]),
            strings(&["a"])
        );
        // Below 50 no slack: one more subset is too many.
        assert_eq!(
            pick(&[c("a", 49, false), c("h", 50, true)]),
            strings(&["a"])
        );
    }
}
