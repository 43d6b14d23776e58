//! `subsetter bench`: the subset policy on a synthetic cluster, driven the way the reconciler
//! drives it (`plan::subset` with the membership index), with no API server and no IO. It
//! measures what decides whether the subsetter holds 5,000 nodes × 100,000 revisions: the
//! time to assign every revision, the time to repair after losing one activator and how many
//! revisions that touches, the balance (max / mean members per activator) and the churn
//! (members changed) against the least possible.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crds::{ActivationEndpoints, Revision};
use k8s_openapi::jiff::Timestamp;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use subsetter::activators::{Activator, Available};
use subsetter::eligibility::NodeFacts;
use subsetter::images::{self, ImageSet};
use subsetter::index::{Key, MembershipIndex};
use subsetter::plan::{self, SubsetInputs};
use subsetter::policy::{self, SubsetPolicy};
use subsetter::store::AeStore;

use super::knative_hash;

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub revisions: usize,
    pub activators: usize,
    pub members: usize,
    pub policy: String,
    pub seed: u64,
    /// Distinct images; revision `i` runs image `i % images`.
    pub images: usize,
    /// The share of nodes each image is on (each node's images drawn independently).
    pub image_share: f64,
    /// Least-loaded prefers nodes holding the revision's image.
    pub image_locality: bool,
}

/// What it measured (the JSON `--json` writes).
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub policy: String,
    pub revisions: usize,
    pub activators: usize,
    pub members: usize,
    /// All revisions assigned from scratch.
    pub assign_ms: f64,
    pub assign_us_per_revision: f64,
    /// Members per activator after assignment: max / mean, and max and min.
    pub max_over_mean: f64,
    pub max_members: usize,
    pub min_members: usize,
    /// One activator removed: the subsets that had it planned again.
    pub repair_ms: f64,
    pub revisions_touched_on_remove: usize,
    pub churn_on_remove: usize,
    pub min_churn_on_remove: usize,
    /// One activator added: what the subsetter plans again (short subsets only).
    pub add_ms: f64,
    pub churn_on_add: usize,
    pub min_churn_on_add: usize,
    /// Balance after the removal and the addition.
    pub max_over_mean_after: f64,
    /// Image locality: whether it was on, the images and their spread, and the share of
    /// members whose node holds their revision's image after assignment.
    pub image_locality: bool,
    pub images: usize,
    pub image_share: f64,
    pub members_holding_image: f64,
    /// After the repair: the share among the members that replaced the lost activator.
    pub replacements_holding_image: f64,
    /// What the subsetter keeps of the nodes' images: the per-node fingerprint sets
    /// (`images::ImageSet`, 8 bytes a name) and the load index's image → holders entries.
    pub node_image_fingerprints: usize,
    pub node_image_bytes: usize,
    pub holder_entries: usize,
    /// A node's memberships as the directory answers them (`GET /v1/members/<node>`), over
    /// every activator after assignment: the mean and the slowest answer, from the store's
    /// member-label index.
    pub directory_answer_us: f64,
    pub directory_answer_max_us: f64,
    /// The memberships the answers held between them (every membership once: revisions ×
    /// members).
    pub directory_memberships: usize,
    /// The same, found by a scan of every subset for the label, as the API server's own
    /// label-selected list finds it (each answer the same; the mean over at most 100 nodes).
    pub directory_scan_us: f64,
    /// The process's peak resident memory (VmHWM), when /proc tells it.
    pub peak_rss_mib: Option<f64>,
}

fn activator(i: usize, images: &ImageSet) -> (String, Activator) {
    let node = format!("node-{i:05}");
    let a = Activator {
        node: node.clone(),
        address: format!("10.{}.{}.{}:8080", i >> 16 & 255, i >> 8 & 255, i & 255),
        pod: format!("activator-{i:05}"),
        facts: Some(Arc::new(NodeFacts {
            name: node.clone(),
            images: images.clone(),
            ..NodeFacts::default()
        })),
    };
    (node, a)
}

/// Image `i` by tag and by digest, as containerd names a pulled image.
fn image_names(i: usize) -> [String; 2] {
    [
        format!("registry:5000/app-{i}:v1"),
        format!("registry:5000/app-{i}@sha256:{i:064x}"),
    ]
}

/// Each node's images: every image independently with probability `share`.
fn node_images(opts: &BenchOptions, rng: &mut StdRng) -> ImageSet {
    let names: Vec<String> = (0..opts.images)
        .filter(|_| rng.random_bool(opts.image_share))
        .flat_map(image_names)
        .collect();
    ImageSet::from_names(names.iter().map(String::as_str))
}

fn revision(members: usize, image: usize) -> Result<Revision, String> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "local-activator.dev/v1alpha1",
        "kind": "Revision",
        "metadata": {"name": "bench", "namespace": "bench", "generation": 1},
        "spec": {
            "template": {"spec": {"containers": [
                {"name": "app", "image": format!("registry:5000/app-{image}:v1")}
            ]}},
            "activators": members,
        },
    }))
    .map_err(|e| format!("building the synthetic revision: {e}"))
}

/// Max / mean members per activator over `available`, with the max and min.
fn balance(ix: &MembershipIndex, available: &BTreeMap<String, Activator>) -> (f64, usize, usize) {
    let loads: Vec<usize> = available.keys().map(|n| ix.load(n)).collect();
    let total: usize = loads.iter().sum();
    let max = loads.iter().copied().max().unwrap_or(0);
    let min = loads.iter().copied().min().unwrap_or(0);
    let mean = total as f64 / loads.len().max(1) as f64;
    (if mean > 0.0 { max as f64 / mean } else { 0.0 }, max, min)
}

/// The synthetic cluster and the subsetter's state over it.
struct World {
    names: Vec<String>,
    /// One Revision per image: revision `i` is planned from `revs[i % revs.len()]`.
    revs: Vec<Revision>,
    /// The ActivationEndpoints as the controller keeps them (`store.rs`).
    store: AeStore,
    ix: MembershipIndex,
    available: Available,
    policy: Box<dyn SubsetPolicy>,
    image_locality: bool,
    /// Each revision's images, as the reconciler caches them (by uid: here its name).
    wanted: images::WantedCache,
    default_n: usize,
    now: Timestamp,
    /// The resourceVersion of the next object the "watch" shows (the directory answers only
    /// numeric versions).
    version: u64,
}

impl World {
    /// The synthetic cluster of `opts`: its revisions (none assigned yet) and its activators,
    /// each on a node holding the images of `sets`.
    fn new(
        opts: &BenchOptions,
        policy: Box<dyn SubsetPolicy>,
        sets: &[ImageSet],
    ) -> Result<Self, String> {
        Ok(World {
            names: (0..opts.revisions)
                .map(|i| format!("bench/rev-{i:06}"))
                .collect(),
            revs: (0..opts.images.min(opts.revisions))
                .map(|i| revision(opts.members, i))
                .collect::<Result<_, _>>()?,
            store: AeStore::default(),
            ix: MembershipIndex::default(),
            available: (0..opts.activators)
                .map(|i| activator(i, &sets[i]))
                .collect(),
            policy,
            image_locality: opts.image_locality,
            wanted: images::WantedCache::default(),
            default_n: opts.members,
            now: Timestamp::now(),
            version: 0,
        })
    }

    /// Plans `keys` again (in order), as the reconciler does, updating the index and the
    /// current subsets; the members that joined, in all.
    fn plan_all(&mut self, keys: &[usize]) -> usize {
        let mut joined = 0;
        for &i in keys {
            let name = format!("rev-{i:06}");
            let key = Key::new("bench", name.clone());
            // What a reconcile plans from: the object rebuilt from the store.
            let current = self.store.current(&key);
            let rev = &self.revs[i % self.revs.len()];
            // Every revision has its own entry, parsed on its first plan, as in the reconciler.
            let wanted = if self.image_locality && self.ix.loads().has_images() {
                self.wanted.get(
                    Some(&self.names[i]),
                    rev.metadata.generation,
                    &rev.spec.template,
                )
            } else {
                Arc::from([])
            };
            let p = plan::subset(&SubsetInputs {
                key: &self.names[i],
                revision: rev,
                current: current.as_ref(),
                available: &self.available,
                load: &|n| self.ix.load(n),
                loads: Some(self.ix.loads()),
                evict: None,
                policy: self.policy.as_ref(),
                image_locality: self.image_locality,
                images: &wanted,
                default_n: self.default_n,
                host_conflicts: &[],
                routes: &[],
                pending_hosts: &[],
                warm_pods: 0,
                now: self.now,
            });
            joined += p.joined;
            let nodes = p.status.activators.iter().map(|m| &m.node);
            self.ix.set(&key, nodes, p.short);
            // What the watch then shows, and the store keeps.
            let mut ae = ActivationEndpoints::new(&name, Default::default());
            ae.metadata.namespace = Some(key.namespace);
            ae.metadata.labels = Some(p.labels);
            self.version += 1;
            ae.metadata.resource_version = Some(self.version.to_string());
            ae.status = Some(p.status);
            self.store.apply(&ae);
        }
        joined
    }

    /// How many of `nodes` hold every image of revision `i` (counted here rather than from
    /// the plans' `status.imageMembers`, which locality off leaves out).
    fn holding(&self, i: usize, nodes: &[String]) -> usize {
        let wanted = images::wanted(&self.revs[i % self.revs.len()].spec.template.value());
        nodes
            .iter()
            .filter(|n| {
                self.available
                    .get(n.as_str())
                    .and_then(|a| a.facts.as_ref())
                    .is_some_and(|f| f.images.holds_all(&wanted))
            })
            .count()
    }

    /// The revisions of index keys `keys`, as numbers.
    fn numbers(keys: impl IntoIterator<Item = Key>) -> Vec<usize> {
        keys.into_iter()
            .filter_map(|k| k.name.strip_prefix("rev-")?.parse().ok())
            .collect()
    }

    /// The member nodes of revision `i`, as the store has them.
    fn members(&self, i: usize) -> Vec<String> {
        let key = Key::new("bench", format!("rev-{i:06}"));
        self.store
            .current(&key)
            .and_then(|ae| ae.status)
            .map(|s| s.activators.into_iter().map(|m| m.node).collect())
            .unwrap_or_default()
    }

    /// The first activator set: the controller builds the load index from it.
    fn set_available(&mut self) {
        self.ix.set_available(&self.available);
    }

    /// One node's activator came (`Some`) or went (`None`): the controller's activator watch
    /// changes the set and the load index for that node alone (`update_available`).
    fn change_available(&mut self, node: &str, new: Option<Activator>) {
        let old = match new.clone() {
            Some(a) => self.available.insert(node.to_owned(), a),
            None => self.available.remove(node),
        };
        self.ix.update_available(node, old.as_ref(), new.as_ref());
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// VmHWM of this process, in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Builds the synthetic cluster, assigns every revision, then loses an activator and adds
/// one, timing each and counting what moved.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, String> {
    check(opts)?;
    let policy = policy_of(opts)?;
    // Knative's subsets are recomputed from the whole activator set: any change may move
    // any revision's members, so every revision is planned again (and its churn counted).
    let stateless = opts.policy == knative_hash::NAME;
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let sets: Vec<ImageSet> = (0..=opts.activators)
        .map(|_| node_images(opts, &mut rng))
        .collect();
    let mut w = World::new(opts, policy, &sets)?;
    w.set_available();
    let all: Vec<usize> = (0..opts.revisions).collect();

    let t = Instant::now();
    w.plan_all(&all);
    let assign_ms = ms(t);
    let holding: usize = all.iter().map(|&i| w.holding(i, &w.members(i))).sum();
    let (max_over_mean, max_members, min_members) = balance(&w.ix, &w.available);
    let (directory_answer_us, directory_answer_max_us, directory_memberships, directory_scan_us) =
        directory(&w);
    let removal = remove_one(&mut w, opts, stateless, &all);
    let addition = add_one(&mut w, opts, stateless, &all, &sets);
    let (max_over_mean_after, _, _) = balance(&w.ix, &w.available);

    Ok(BenchReport {
        policy: w.policy.name().to_owned(),
        revisions: opts.revisions,
        activators: opts.activators,
        members: opts.members,
        assign_ms,
        assign_us_per_revision: assign_ms * 1e3 / opts.revisions as f64,
        max_over_mean,
        max_members,
        min_members,
        repair_ms: removal.ms,
        revisions_touched_on_remove: removal.touched,
        churn_on_remove: removal.churn,
        // Each subset that had the lost activator must take one new member.
        min_churn_on_remove: removal.touched,
        add_ms: addition.ms,
        churn_on_add: addition.churn,
        min_churn_on_add: 0,
        max_over_mean_after,
        image_locality: opts.image_locality,
        images: opts.images,
        image_share: opts.image_share,
        members_holding_image: holding as f64 / (opts.revisions * opts.members) as f64,
        replacements_holding_image: removal.replaced.1 as f64 / removal.replaced.0.max(1) as f64,
        node_image_fingerprints: sets.iter().map(|s| s.fingerprints().len()).sum(),
        node_image_bytes: sets.iter().map(ImageSet::heap_bytes).sum(),
        holder_entries: w.ix.loads().image_entries().1,
        directory_answer_us,
        directory_answer_max_us,
        directory_memberships,
        directory_scan_us,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// The options a run refuses.
fn check(opts: &BenchOptions) -> Result<(), String> {
    if opts.activators < 2 || opts.revisions == 0 || opts.members == 0 || opts.images == 0 {
        return Err(
            "--activators must be at least 2, --revisions, --members and --images at least 1"
                .into(),
        );
    }
    if !(0.0..=1.0).contains(&opts.image_share) {
        return Err("--image-share must be within 0-1".into());
    }
    Ok(())
}

/// The policy named by `--policy`, Knative's hash included.
fn policy_of(opts: &BenchOptions) -> Result<Box<dyn SubsetPolicy>, String> {
    Ok(match opts.policy.as_str() {
        "random" => Box::new(policy::Random::seeded(opts.seed)),
        knative_hash::NAME if opts.activators + 1 > knative_hash::UNIVERSE as usize => {
            return Err(format!(
                "knative-hash places at most {} activators (its buckets); with more, Knative's \
                 own loop never returns",
                knative_hash::UNIVERSE
            ));
        }
        knative_hash::NAME => Box::new(knative_hash::KnativeHash),
        other => policy::by_name(other).ok_or_else(|| {
            format!("unknown policy {other:?} (random, least-loaded, knative-hash)")
        })?,
    })
}

/// What losing one activator cost: the time, the revisions it touched, the members that
/// moved, and of those that replaced it (how many, how many hold their revision's image).
struct Removal {
    ms: f64,
    touched: usize,
    churn: usize,
    replaced: (usize, usize),
}

/// Lose the activator in the middle of the list: the controller takes it out of the set and
/// the load index, and plans the revisions that had it, nothing else. Timed: that work alone
/// (the members before and after are read outside it, for the figures).
fn remove_one(w: &mut World, opts: &BenchOptions, stateless: bool, all: &[usize]) -> Removal {
    let victim = format!("node-{:05}", opts.activators / 2);
    let before: Vec<Vec<String>> = World::numbers(w.ix.revisions_on(&victim))
        .iter()
        .map(|&i| w.members(i))
        .collect();
    let t = Instant::now();
    w.change_available(&victim, None);
    let touched = World::numbers(w.ix.revisions_on(&victim));
    let churn = w.plan_all(if stateless { all } else { &touched });
    let elapsed = ms(t);
    // Of the members that replaced the lost one: how many hold their revision's image.
    let mut replaced = (0usize, 0usize);
    for (&i, old) in touched.iter().zip(&before) {
        let new: Vec<String> = w
            .members(i)
            .into_iter()
            .filter(|n| !old.contains(n))
            .collect();
        replaced.0 += new.len();
        replaced.1 += w.holding(i, &new);
    }
    Removal {
        ms: elapsed,
        touched: touched.len(),
        churn,
        replaced,
    }
}

/// What adding one activator cost: the time and the members that moved.
struct Addition {
    ms: f64,
    churn: usize,
}

/// A new activator: only short subsets are planned again (none, with enough activators);
/// nothing moves to it until new revisions arrive.
fn add_one(
    w: &mut World,
    opts: &BenchOptions,
    stateless: bool,
    all: &[usize],
    sets: &[ImageSet],
) -> Addition {
    let (node, a) = activator(opts.activators, &sets[opts.activators]);
    let t = Instant::now();
    w.change_available(&node, Some(a));
    let short = World::numbers(w.ix.short());
    let churn = w.plan_all(if stateless { all } else { &short });
    Addition { ms: ms(t), churn }
}

/// Every activator's memberships as the directory answers them (mean, max, in microseconds;
/// the memberships answered), and for at most 100 of them as a scan of every subset finds them
/// (mean).
fn directory(w: &World) -> (f64, f64, usize, f64) {
    let labels: Vec<String> = w
        .available
        .keys()
        .map(|n| crds::contract::member_label(n))
        .collect();
    let (mut sum, mut max, mut answered) = (0.0f64, 0.0f64, 0);
    for label in &labels {
        let t = Instant::now();
        let found = w.store.members(label).map_or(0, |m| m.items.len());
        let us = t.elapsed().as_secs_f64() * 1e6;
        answered += std::hint::black_box(found);
        sum += us;
        max = max.max(us);
    }
    let scanned = labels.len().min(100);
    let t = Instant::now();
    for label in &labels[..scanned] {
        std::hint::black_box(w.store.members_scanned(label));
    }
    let scan_us = t.elapsed().as_secs_f64() * 1e6 / scanned.max(1) as f64;
    (sum / labels.len().max(1) as f64, max, answered, scan_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(policy: &str) -> BenchOptions {
        BenchOptions {
            revisions: 2_000,
            activators: 50,
            members: 3,
            policy: policy.into(),
            seed: 7,
            images: 100,
            image_share: 0.1,
            image_locality: true,
        }
    }

    #[test]
    fn least_loaded_balances_and_repairs_with_the_least_churn() {
        let r = run(&BenchOptions {
            image_locality: false,
            ..opts("least-loaded")
        })
        .unwrap();
        // 6,000 memberships over 50 activators: 120 each.
        assert_eq!((r.max_members, r.min_members), (120, 120));
        assert!((r.max_over_mean - 1.0).abs() < 1e-9);
        assert_eq!(r.revisions_touched_on_remove, 120);
        assert_eq!(r.churn_on_remove, r.min_churn_on_remove);
        assert_eq!(r.churn_on_add, 0);
        // Every membership is in its node's answer from the directory, once.
        assert_eq!(r.directory_memberships, 6_000, "{r:?}");
        assert!(
            r.directory_answer_us > 0.0 && r.directory_scan_us > 0.0,
            "{r:?}"
        );
        assert!(r.directory_answer_max_us >= r.directory_answer_us, "{r:?}");
    }

    #[test]
    fn image_locality_keeps_balance_and_churn_and_holds_the_image_more_often() {
        let off = run(&BenchOptions {
            image_locality: false,
            ..opts("least-loaded")
        })
        .unwrap();
        let on = run(&opts("least-loaded")).unwrap();
        assert!(on.max_over_mean <= 1.05, "{on:?}");
        assert_eq!(on.churn_on_remove, on.min_churn_on_remove);
        assert_eq!(on.churn_on_add, 0);
        // Each image on a tenth of the nodes: about a tenth of the members hold it by chance.
        assert!(off.members_holding_image < 0.2, "{off:?}");
        assert!(
            on.members_holding_image > 2.0 * off.members_holding_image,
            "on {} off {}",
            on.members_holding_image,
            off.members_holding_image
        );
        assert!(on.node_image_fingerprints > 0 && on.holder_entries > 0);
    }

    #[test]
    fn random_touches_only_the_lost_activators_revisions() {
        let r = run(&opts("random")).unwrap();
        assert!(r.max_over_mean >= 1.0);
        assert_eq!(r.churn_on_remove, r.min_churn_on_remove);
        assert_eq!(r.churn_on_add, 0);
    }

    #[test]
    fn knative_hash_is_measured_beside_ours_and_refused_past_its_buckets() {
        let r = run(&opts("knative-hash")).unwrap();
        assert_eq!(r.policy, "knative-hash");
        // Load-blind: less even than least-loaded's exact 1.0.
        assert!(r.max_over_mean > 1.0, "{r:?}");
        // Every revision is recomputed; at least the lost activator's subsets change.
        assert!(r.churn_on_remove >= r.min_churn_on_remove, "{r:?}");
        let e = run(&BenchOptions {
            activators: knative_hash::UNIVERSE as usize,
            ..opts("knative-hash")
        })
        .unwrap_err();
        assert!(e.contains("never returns"), "{e}");
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(
            run(&BenchOptions {
                activators: 1,
                ..opts("random")
            })
            .is_err()
        );
        assert!(run(&opts("nearest")).is_err());
    }
}
