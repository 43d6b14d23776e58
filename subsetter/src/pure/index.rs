//! The membership index: who is in which subset, kept from the ActivationEndpoints watch (and
//! from the subsetter's own writes, which the watch confirms a moment later).
//!
//! It answers the two questions that keep the subsetter's work proportional to what changed:
//! which revisions had a lost activator (node -> revisions), and which revisions are short of
//! their wanted N (a new activator triggers only those). It also gives each activator's load
//! (the number of subsets it is in) to the least-loaded policy.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use foldhash::HashSet as FastSet;
use hashbrown::hash_map::{EntryRef, RawEntryMut};

use crate::pure::activators::Activator;
use crate::pure::load_index::LoadIndex;

/// The images `a`'s node holds (none without a Node object).
fn images_of(a: &Activator) -> crate::pure::images::ImageSet {
    a.facts
        .as_ref()
        .map(|f| f.images.clone())
        .unwrap_or_default()
}

pub use crate::pure::key::Key;

/// What the index records of an ActivationEndpoints: member nodes, and whether it is short.
pub fn entry_of(ae: &crds::ActivationEndpoints) -> (Vec<String>, bool) {
    let status = ae.status.as_ref();
    (
        status
            .map(|s| s.activators.iter().map(|m| m.node.clone()).collect())
            .unwrap_or_default(),
        status.is_some_and(|s| crate::pure::conditions::is_short(&s.conditions)),
    )
}

/// A revision's shared key, hashed and compared by address: the index holds one `Arc<Key>` per
/// revision (the key of `members`), so its node sets and the short set need not hash the names.
#[derive(Clone, Debug)]
struct Shared(Arc<Key>);

impl PartialEq for Shared {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Shared {}

impl std::hash::Hash for Shared {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state);
    }
}

type ByNode = hashbrown::HashMap<Arc<str>, FastSet<Shared>, foldhash::fast::RandomState>;

/// `key`'s subset no longer has the nodes `old`: out of their sets, and off their load.
fn unlink(by_node: &mut ByNode, loads: &mut LoadIndex, key: &Shared, old: &[Arc<str>]) {
    for n in old {
        if let Some(set) = by_node.get_mut(&**n) {
            if set.remove(key) {
                loads.adjust(n, false);
            }
            if set.is_empty() {
                by_node.remove(&**n);
            }
        }
    }
}

/// 300,000 memberships at 100,000 revisions: each revision's key is allocated once and shared
/// by its entries (`Arc<Key>`, hashed by address outside `members`), and each node's name once,
/// shared by the subsets it is in (the keys of `by_node` are the interned names: a node in no
/// subset has no entry, and then no subset names it either).
#[derive(Default, Debug)]
pub struct MembershipIndex {
    members: hashbrown::HashMap<Arc<Key>, Box<[Arc<str>]>, foldhash::fast::RandomState>,
    by_node: ByNode,
    short: FastSet<Shared>,
    /// The available activators by load, kept in step with every `set` and `remove`.
    loads: LoadIndex,
}

impl MembershipIndex {
    /// Records the subset of `key`: its member nodes, and whether it is short of its N.
    pub fn set<S: AsRef<str>>(
        &mut self,
        key: &Key,
        nodes: impl IntoIterator<Item = S>,
        short: bool,
    ) {
        let Self {
            members,
            by_node,
            short: short_set,
            loads,
        } = self;
        // One lookup of the key: an entry there is unlinked and keeps its shared key.
        let (shared, slot) = match members.raw_entry_mut().from_key(key) {
            RawEntryMut::Occupied(o) => {
                let (k, old) = o.into_key_value();
                let shared = Shared(Arc::clone(k));
                unlink(by_node, loads, &shared, old);
                (shared, old)
            }
            RawEntryMut::Vacant(v) => {
                let (k, slot) = v.insert(Arc::new(key.clone()), Box::default());
                (Shared(Arc::clone(k)), slot)
            }
        };
        let nodes = nodes.into_iter();
        let mut names: Vec<Arc<str>> = Vec::with_capacity(nodes.size_hint().0);
        for n in nodes {
            let (name, set) = match by_node.entry_ref(n.as_ref()) {
                EntryRef::Occupied(o) => {
                    let name = Arc::clone(o.key());
                    (name, o.into_mut())
                }
                EntryRef::Vacant(v) => {
                    let o = v.insert_entry(FastSet::default());
                    let name = Arc::clone(o.key());
                    (name, o.into_mut())
                }
            };
            if set.insert(shared.clone()) {
                loads.adjust(&name, true);
            }
            names.push(name);
        }
        *slot = names.into_boxed_slice();
        if short {
            short_set.insert(shared);
        } else {
            short_set.remove(&shared);
        }
    }

    pub fn remove(&mut self, key: &Key) {
        let Some((k, _)) = self.members.get_key_value(key) else {
            return;
        };
        let shared = Shared(Arc::clone(k));
        if let Some(old) = self.members.remove(key) {
            unlink(&mut self.by_node, &mut self.loads, &shared, &old);
        }
        self.short.remove(&shared);
    }

    /// Keeps only `keys` (after a relist, drop what the relist no longer shows).
    pub fn retain(&mut self, keys: &HashSet<Key>) {
        let gone: Vec<Key> = self
            .members
            .keys()
            .filter(|k| !keys.contains(&***k))
            .map(|k| (**k).clone())
            .collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// The revisions whose subset includes `node`.
    pub fn revisions_on(&self, node: &str) -> BTreeSet<Key> {
        self.by_node
            .get(node)
            .map(|s| s.iter().map(|k| (*k.0).clone()).collect())
            .unwrap_or_default()
    }

    /// The revisions with fewer members than they want.
    pub fn short(&self) -> BTreeSet<Key> {
        self.short.iter().map(|k| (*k.0).clone()).collect()
    }

    /// How many revisions have fewer members than they want (O(1), for the gauge).
    pub fn short_len(&self) -> usize {
        self.short.len()
    }

    /// The activators available now (after every change of the set): the load index is
    /// rebuilt from them, O(A log A).
    pub fn set_available(&mut self, available: &BTreeMap<String, Activator>) {
        let by_node = &self.by_node;
        let images: Vec<_> = available.values().map(images_of).collect();
        let mut loads = LoadIndex::build(available.keys().zip(&images).map(|(n, i)| {
            let load = by_node.get(n.as_str()).map(FastSet::len).unwrap_or(0);
            (n.as_str(), load, i)
        }));
        loads.clean = available
            .values()
            .filter(|a| {
                a.facts
                    .as_ref()
                    .is_none_or(|f| !f.unschedulable && f.taints.is_empty())
            })
            .count();
        self.loads = loads;
    }

    /// One node's activator changed from `old` to `new` (either may be None: it came or
    /// went): the load index follows in O(log A), where [`Self::set_available`] rebuilds it.
    pub fn update_available(
        &mut self,
        node: &str,
        old: Option<&Activator>,
        new: Option<&Activator>,
    ) {
        let clean = |a: &Activator| {
            a.facts
                .as_ref()
                .is_none_or(|f| !f.unschedulable && f.taints.is_empty())
        };
        match (old, new) {
            (None, Some(a)) => self
                .loads
                .insert_holding(node, self.load(node), &images_of(a)),
            (Some(_), None) => self.loads.remove(node),
            (Some(_), Some(a)) => self.loads.set_images(node, &images_of(a)),
            (None, None) => {}
        }
        if old.is_some_and(clean) {
            self.loads.clean = self.loads.clean.saturating_sub(1);
        }
        if new.is_some_and(clean) {
            self.loads.clean += 1;
        }
    }

    /// The available activators by load.
    pub fn loads(&self) -> &LoadIndex {
        &self.loads
    }

    /// In how many subsets `node` is.
    pub fn load(&self, node: &str) -> usize {
        self.by_node.get(node).map(FastSet::len).unwrap_or(0)
    }

    /// Whether the index has an entry for `key`.
    pub fn contains(&self, key: &Key) -> bool {
        self.members.contains_key(key)
    }

    /// The member nodes of `key`, if the index has it.
    pub fn members(&self, key: &Key) -> Option<Vec<&str>> {
        self.members
            .get(key)
            .map(|m| m.iter().map(|n| &**n).collect())
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn reverse_index_follows_updates() {
        let mut ix = MembershipIndex::default();
        let r1 = Key::new("ns", "r1");
        let r2 = Key::new("ns", "r2");
        ix.set(&r1, nodes(&["a", "b"]), false);
        ix.set(&r2, nodes(&["b", "c"]), true);
        assert_eq!(
            ix.revisions_on("b"),
            BTreeSet::from([r1.clone(), r2.clone()])
        );
        assert_eq!(ix.load("b"), 2);
        assert_eq!(ix.short(), BTreeSet::from([r2.clone()]));
        assert_eq!(ix.short_len(), 1);

        ix.set(&r1, nodes(&["a", "c"]), false);
        assert_eq!(ix.revisions_on("b"), BTreeSet::from([r2.clone()]));
        assert_eq!(ix.load("c"), 2);

        ix.set(&r2, nodes(&["b", "c", "d"]), false);
        assert!(ix.short().is_empty());
        assert_eq!(ix.short_len(), 0);

        ix.remove(&r1);
        assert_eq!(ix.load("a"), 0);
        assert!(ix.revisions_on("a").is_empty());
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn updating_one_activator_at_a_time_is_rebuilding_the_load_index() {
        use crate::pure::eligibility::NodeFacts;
        use std::sync::Arc;
        let act = |n: &str, tainted: bool| Activator {
            node: n.into(),
            address: format!("{n}:8080"),
            pod: format!("p-{n}"),
            facts: tainted.then(|| {
                Arc::new(NodeFacts {
                    unschedulable: true,
                    ..NodeFacts::default()
                })
            }),
        };
        let mut ix = MembershipIndex::default();
        ix.set(&Key::new("ns", "r1"), nodes(&["a", "b"]), false);
        ix.set(&Key::new("ns", "r2"), nodes(&["b", "c"]), false);
        let mut available = BTreeMap::new();
        ix.set_available(&available);
        let steps: Vec<(&str, Option<Activator>)> = vec![
            ("a", Some(act("a", false))),
            ("b", Some(act("b", true))),
            ("c", Some(act("c", false))),
            ("b", Some(act("b", false))),
            ("a", None),
            ("d", Some(act("d", true))),
            ("c", None),
        ];
        for (node, new) in steps {
            let old = match &new {
                Some(a) => available.insert(node.to_owned(), a.clone()),
                None => available.remove(node),
            };
            ix.update_available(node, old.as_ref(), new.as_ref());
            let mut rebuilt = MembershipIndex::default();
            rebuilt.set(&Key::new("ns", "r1"), nodes(&["a", "b"]), false);
            rebuilt.set(&Key::new("ns", "r2"), nodes(&["b", "c"]), false);
            rebuilt.set_available(&available);
            let mut got = ix.loads().nodes().to_vec();
            got.sort();
            assert_eq!(got, rebuilt.loads().nodes(), "after {node}");
            assert_eq!(ix.loads().clean, rebuilt.loads().clean, "after {node}");
            for n in ["a", "b", "c", "d"] {
                assert_eq!(
                    ix.loads().load(n),
                    rebuilt.loads().load(n),
                    "{n} after {node}"
                );
            }
        }
    }

    #[test]
    fn retain_drops_what_a_relist_no_longer_shows() {
        let mut ix = MembershipIndex::default();
        let r1 = Key::new("ns", "r1");
        let r2 = Key::new("ns", "r2");
        ix.set(&r1, nodes(&["a"]), true);
        ix.set(&r2, nodes(&["a"]), false);
        ix.retain(&HashSet::from([r2.clone()]));
        assert_eq!(ix.revisions_on("a"), BTreeSet::from([r2]));
        assert!(ix.short().is_empty());
    }
}
