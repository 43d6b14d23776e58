//! `subsetter bench`: the subset policy on a synthetic cluster, driven the way the reconciler
//! drives it (`plan::subset` with the membership index), with no API server and no IO. It
//! measures what decides whether the subsetter holds 5,000 nodes × 100,000 revisions: the
//! time to assign every revision, the time to repair after losing one activator and how many
//! revisions that touches, the balance (max / mean members per activator) and the churn
//! (members changed) against the least possible.

use std::collections::BTreeMap;
use std::time::Instant;

use crds::{ActivationEndpoints, Revision};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use subsetter::activators::{Activator, Available};
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
    /// The process's peak resident memory (VmHWM), when /proc tells it.
    pub peak_rss_mib: Option<f64>,
}

fn activator(i: usize) -> (String, Activator) {
    let node = format!("node-{i:05}");
    let a = Activator {
        node: node.clone(),
        address: format!("10.{}.{}.{}:8080", i >> 16 & 255, i >> 8 & 255, i & 255),
        pod: format!("activator-{i:05}"),
        facts: None,
    };
    (node, a)
}

fn revision(members: usize) -> Result<Revision, String> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "local-activator.dev/v1alpha1",
        "kind": "Revision",
        "metadata": {"name": "bench", "namespace": "bench", "generation": 1},
        "spec": {
            "template": {"spec": {"containers": [{"name": "app", "image": "app"}]}},
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
    rev: Revision,
    /// The ActivationEndpoints as the controller keeps them (`store.rs`).
    store: AeStore,
    ix: MembershipIndex,
    available: Available,
    policy: Box<dyn SubsetPolicy>,
    default_n: usize,
    now: Timestamp,
}

impl World {
    /// Plans `keys` again (in order), as the reconciler does, updating the index and the
    /// current subsets; the members that joined, in all.
    fn plan_all(&mut self, keys: &[usize]) -> usize {
        let mut joined = 0;
        for &i in keys {
            let name = format!("rev-{i:06}");
            let key = Key::new("bench", name.clone());
            // What a reconcile plans from: the object rebuilt from the store.
            let current = self.store.current(&key);
            let p = plan::subset(&SubsetInputs {
                key: &self.names[i],
                revision: &self.rev,
                current: current.as_ref(),
                available: &self.available,
                load: &|n| self.ix.load(n),
                loads: Some(self.ix.loads()),
                evict: None,
                policy: self.policy.as_ref(),
                default_n: self.default_n,
                host_conflicts: &[],
                now: self.now,
            });
            joined += p.joined;
            let nodes = p.status.activators.iter().map(|m| &m.node);
            self.ix.set(&key, nodes, p.short);
            // What the watch then shows, and the store keeps.
            let mut ae = ActivationEndpoints::new(&name, Default::default());
            ae.metadata.namespace = Some(key.namespace);
            ae.metadata.labels = Some(p.labels);
            ae.status = Some(p.status);
            self.store.apply(&ae);
        }
        joined
    }

    /// The revisions of index keys `keys`, as numbers.
    fn numbers(keys: impl IntoIterator<Item = Key>) -> Vec<usize> {
        keys.into_iter()
            .filter_map(|k| k.name.strip_prefix("rev-")?.parse().ok())
            .collect()
    }

    /// The activator set changed: the controller rebuilds the load index.
    fn set_available(&mut self) {
        self.ix.set_available(&self.available);
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

pub fn run(opts: &BenchOptions) -> Result<BenchReport, String> {
    if opts.activators < 2 || opts.revisions == 0 || opts.members == 0 {
        return Err("--activators must be at least 2, --revisions and --members at least 1".into());
    }
    let policy: Box<dyn SubsetPolicy> = match opts.policy.as_str() {
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
    };
    // Knative's subsets are recomputed from the whole activator set: any change may move
    // any revision's members, so every revision is planned again (and its churn counted).
    let stateless = opts.policy == knative_hash::NAME;
    let mut w = World {
        names: (0..opts.revisions)
            .map(|i| format!("bench/rev-{i:06}"))
            .collect(),
        rev: revision(opts.members)?,
        store: AeStore::default(),
        ix: MembershipIndex::default(),
        available: (0..opts.activators).map(activator).collect(),
        policy,
        default_n: opts.members,
        now: Timestamp::now(),
    };
    w.set_available();
    let all: Vec<usize> = (0..opts.revisions).collect();

    let t = Instant::now();
    w.plan_all(&all);
    let assign_ms = ms(t);
    let (max_over_mean, max_members, min_members) = balance(&w.ix, &w.available);

    // Lose the activator in the middle of the list: the controller rebuilds the load index
    // and plans the revisions that had it, nothing else.
    let victim = activator(opts.activators / 2).0;
    let t = Instant::now();
    w.available.remove(&victim);
    w.set_available();
    let touched = World::numbers(w.ix.revisions_on(&victim));
    let churn_on_remove = w.plan_all(if stateless { &all } else { &touched });
    let repair_ms = ms(t);

    // A new activator: only short subsets are planned again (none, with enough activators);
    // nothing moves to it until new revisions arrive.
    let (node, a) = activator(opts.activators);
    let t = Instant::now();
    w.available.insert(node, a);
    w.set_available();
    let short = World::numbers(w.ix.short());
    let churn_on_add = w.plan_all(if stateless { &all } else { &short });
    let add_ms = ms(t);
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
        repair_ms,
        revisions_touched_on_remove: touched.len(),
        churn_on_remove,
        // Each subset that had the lost activator must take one new member.
        min_churn_on_remove: touched.len(),
        add_ms,
        churn_on_add,
        min_churn_on_add: 0,
        max_over_mean_after,
        peak_rss_mib: peak_rss_mib(),
    })
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
        }
    }

    #[test]
    fn least_loaded_balances_and_repairs_with_the_least_churn() {
        let r = run(&opts("least-loaded")).unwrap();
        // 6,000 memberships over 50 activators: 120 each.
        assert_eq!((r.max_members, r.min_members), (120, 120));
        assert!((r.max_over_mean - 1.0).abs() < 1e-9);
        assert_eq!(r.revisions_touched_on_remove, 120);
        assert_eq!(r.churn_on_remove, r.min_churn_on_remove);
        assert_eq!(r.churn_on_add, 0);
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
