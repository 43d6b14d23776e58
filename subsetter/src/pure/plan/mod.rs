//! What one reconcile should write, computed without IO from the revision, its current
//! ActivationEndpoints, the available activators and a policy. The reconciler only performs
//! the writes this plan says are needed, so an unchanged world costs no API write.
//!
//! [`subset`] runs its steps in order: choose the members (`frame.rs`), give them their
//! shares (`members.rs`), say what the subset's conditions are and what changed
//! (`report.rs`), and label it (`labels.rs`).

mod frame;
mod inputs;
mod labels;
mod lean;
mod members;
mod report;

use std::collections::BTreeMap;

use foldhash::HashSet as FastSet;

use crds::{ActivationEndpointsStatus, Revision};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::pure::conditions;
use frame::Frame;
pub use inputs::{SubsetInputs, eligible};
pub use labels::label_patch;
use labels::labels;
use members::members;
use report::newly_degraded;

/// The wanted N of `revision` ([`crate::pure::size::wanted`]).
pub fn wanted(revision: &Revision, max_node_selection: usize) -> usize {
    crate::pure::size::wanted(&revision.spec, max_node_selection)
}

/// The subset part of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct SubsetPlan {
    /// The status to write (compare with the current one to skip the write).
    pub status: ActivationEndpointsStatus,
    /// A JSON merge patch of `metadata.labels`, or None when the labels are right.
    pub label_patch: Option<Value>,
    /// All labels the object should carry (for a create): one per member, one per host.
    pub labels: BTreeMap<String, String>,
    /// Whether the status differs from the current one.
    pub status_changed: bool,
    /// Members that joined and left (churn).
    pub joined: usize,
    pub left: usize,
    /// Of those that left: their activator was gone, or its node no longer eligible.
    pub left_lost: usize,
    pub left_ineligible: usize,
    /// Of those that left: moved off by rebalancing.
    pub left_rebalanced: usize,
    /// `Degraded` turned True (or its reason changed) with this plan: (reason, message), for
    /// an Event on the Revision.
    pub degraded: Option<(String, String)>,
    /// Fewer members than wanted.
    pub short: bool,
    /// Why there are no members (None when there are).
    pub no_members: Option<conditions::NoMembers>,
}

/// What one reconcile should write for `inp`'s subset: the members the policy chooses, their
/// shares, the conditions, the labels, and what changed against the current object.
pub fn subset(inp: &SubsetInputs<'_>) -> SubsetPlan {
    let n = wanted(inp.revision, inp.default_n);
    let current_status = inp.current.and_then(|ae| ae.status.as_ref());
    let current_nodes: Vec<String> = current_status
        .map(|s| s.activators.iter().map(|m| m.node.clone()).collect())
        .unwrap_or_default();
    let current_set: FastSet<&str> = current_nodes.iter().map(String::as_str).collect();
    let frame = Frame::new(inp);
    let (chosen, found) = frame.choose(n, &current_nodes, &current_set);
    let activators = members(inp, &chosen, &found);
    let existing: &[Condition] = current_status
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let generation = inp.revision.metadata.generation;
    let no_members = activators.is_empty().then(|| frame.no_members());
    let desired = frame.desired_conditions(activators.len(), n, no_members.as_ref());
    let mut conds = conditions::merge(existing, &desired, generation, inp.now);
    lean::lean(&mut conds);
    let status = ActivationEndpointsStatus {
        conditions: conds,
        image_members: frame.image_members(&activators, &found),
        routes: inp.routes.to_vec(),
        activators,
        policy: Some(inp.policy.name().to_owned()),
        observed_generation: generation,
    };
    let status_changed = !current_status.is_some_and(|c| same_status(c, &status));
    let churn = frame.churn(&current_set, &chosen);
    let degraded = newly_degraded(existing, &status.conditions);
    let labels = labels(inp, &chosen);
    let label_patch = inp.current.and_then(|ae| {
        label_patch(
            ae.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
            &labels,
        )
    });
    SubsetPlan {
        short: status.activators.len() < n,
        status,
        label_patch,
        labels,
        status_changed,
        joined: churn.joined,
        left: churn.left,
        left_lost: churn.left_lost,
        left_ineligible: churn.left_ineligible,
        left_rebalanced: churn.left_rebalanced,
        degraded,
        no_members,
    }
}

/// Whether the `current` status says what the planned one does, its conditions in either form
/// (`lean.rs`).
fn same_status(current: &ActivationEndpointsStatus, planned: &ActivationEndpointsStatus) -> bool {
    current == planned
        || (lean::same(&current.conditions, &planned.conditions) && {
            let mut c = current.clone();
            c.conditions = planned.conditions.clone();
            &c == planned
        })
}

/// The Revision status conditions to write, or None when the current ones already say it.
pub fn revision_conditions(
    revision: &Revision,
    problems: &[String],
    members: usize,
    none: &conditions::NoMembers,
    routes_ready: Option<conditions::Desired>,
    now: Timestamp,
) -> Option<(Option<i64>, Vec<Condition>)> {
    let current = revision.status.as_ref();
    let existing = current.map(|s| s.conditions.as_slice()).unwrap_or(&[]);
    let generation = revision.metadata.generation;
    let mut desired = conditions::revision(problems, members, none);
    desired.extend(routes_ready);
    let mut conds = conditions::merge(existing, &desired, generation, now);
    lean::lean(&mut conds);
    let same = current
        .is_some_and(|s| s.observed_generation == generation && lean::same(&s.conditions, &conds));
    (!same).then_some((generation, conds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pure::activators::{Activator, Available};
    use crate::pure::eligibility::Placement;
    use crate::pure::hosts::Conflict;
    use crate::pure::policy::LeastLoaded;
    use crate::pure::policy::SubsetPolicy;
    use crds::ActivationEndpoints;
    use crds::ActivatorMember;
    use crds::RevisionSpec;
    use crds::contract::{HOST_LABEL_PREFIX, host_label, member_label};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use proptest::prelude::*;
    use serde_json::json;

    fn revision(max: i32, min: i32, n: Option<i32>) -> Revision {
        let mut r = Revision::new(
            "r",
            RevisionSpec {
                template: PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "app".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }
                .into(),
                port: 8080,
                hosts: vec![],
                container_concurrency: 0,
                min_scale: min,
                max_scale: max,
                target_burst_capacity: 200,
                activators: n,
                idle_timeout_seconds: 300,
                timeout_seconds: 300,
                hand_over_timeout_seconds: None,
            },
        );
        r.metadata.namespace = Some("ns".into());
        r.metadata.generation = Some(1);
        r
    }

    fn acts(nodes: &[&str]) -> BTreeMap<String, Activator> {
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    (*n).to_owned(),
                    Activator {
                        node: (*n).to_owned(),
                        address: format!("10.0.0.{i}:8080"),
                        pod: format!("act-{n}"),
                        facts: None,
                    },
                )
            })
            .collect()
    }

    fn plan(
        rev: &Revision,
        cur: Option<&ActivationEndpoints>,
        av: &BTreeMap<String, Activator>,
        now: i64,
    ) -> SubsetPlan {
        plan_with(rev, cur, av, now, &[])
    }

    fn plan_with(
        rev: &Revision,
        cur: Option<&ActivationEndpoints>,
        av: &BTreeMap<String, Activator>,
        now: i64,
        host_conflicts: &[Conflict],
    ) -> SubsetPlan {
        subset(&SubsetInputs {
            key: "ns/r",
            revision: rev,
            current: cur,
            available: &Available::from(av.clone()),
            load: &|_| 0,
            loads: None,
            evict: None,
            policy: &LeastLoaded,
            image_locality: true,
            images: &crate::pure::images::wanted(&rev.spec.template.value()),
            default_n: 3,
            host_conflicts,
            routes: &[],
            pending_hosts: &[],
            warm_pods: 0,
            now: Timestamp::from_second(now).unwrap(),
        })
    }

    fn applied(plan: &SubsetPlan) -> ActivationEndpoints {
        let mut ae = ActivationEndpoints::new("r", Default::default());
        ae.metadata.labels = Some(plan.labels.clone());
        ae.status = Some(plan.status.clone());
        ae
    }

    #[test]
    fn first_plan_has_members_labels_shares_and_conditions() {
        let rev = revision(5, 2, None);
        let av = acts(&["a", "b", "c", "d"]);
        let p = plan(&rev, None, &av, 1);
        assert_eq!(p.status.activators.len(), 3);
        assert_eq!(p.labels.len(), 3);
        assert!(
            p.status
                .activators
                .iter()
                .all(|m| p.labels.contains_key(&member_label(&m.node)))
        );
        assert_eq!(
            p.status.activators.iter().map(|m| m.max_pods).sum::<i32>(),
            5
        );
        assert_eq!(
            p.status.activators.iter().map(|m| m.min_pods).sum::<i32>(),
            2
        );
        assert_eq!(p.status.observed_generation, Some(1));
        assert_eq!(p.status.policy.as_deref(), Some("least-loaded"));
        assert!(p.status_changed && !p.short);
        assert_eq!((p.joined, p.left), (3, 0));
    }

    #[test]
    fn unchanged_world_plans_no_write() {
        let rev = revision(0, 0, None);
        let av = acts(&["a", "b", "c", "d"]);
        let first = applied(&plan(&rev, None, &av, 1));
        let again = plan(&rev, Some(&first), &av, 99);
        assert!(!again.status_changed);
        assert!(again.label_patch.is_none());
    }

    #[test]
    fn lost_member_is_replaced_and_its_label_removed() {
        let rev = revision(0, 0, None);
        let av = acts(&["a", "b", "c", "d"]);
        let first = applied(&plan(&rev, None, &av, 1));
        let gone = first.status.as_ref().unwrap().activators[1].node.clone();
        let mut av2 = av.clone();
        av2.remove(&gone);
        let p = plan(&rev, Some(&first), &av2, 2);
        assert_eq!((p.joined, p.left), (1, 1));
        let patch = p.label_patch.unwrap();
        assert_eq!(
            patch["metadata"]["labels"][member_label(&gone)],
            Value::Null
        );
        let before = &first.status.as_ref().unwrap().activators;
        assert_eq!(p.status.activators[0], before[0]);
        assert_eq!(p.status.activators[2], before[2]);
    }

    #[test]
    fn fewer_activators_than_wanted_is_short_and_degraded() {
        let rev = revision(0, 0, Some(5));
        let p = plan(&rev, None, &acts(&["a", "b"]), 1);
        assert!(p.short);
        assert!(conditions::is_short(&p.status.conditions));
    }

    #[test]
    fn label_patch_leaves_foreign_labels_alone() {
        let current = BTreeMap::from([
            ("team".to_string(), "x".to_string()),
            (member_label("a"), String::new()),
        ]);
        let wanted = BTreeMap::from([(member_label("a"), String::new())]);
        assert!(label_patch(&current, &wanted).is_none());
    }

    fn host_labels(labels: &BTreeMap<String, String>) -> Vec<String> {
        labels
            .keys()
            .filter(|k| k.starts_with(HOST_LABEL_PREFIX))
            .cloned()
            .collect()
    }

    #[test]
    fn one_label_per_host_whatever_its_spelling() {
        let mut rev = revision(0, 0, None);
        rev.spec.hosts = vec![
            "App.Example.com:8080".into(),
            "app.example.com".into(),
            "not a valid host!".into(),
        ];
        let p = plan(&rev, None, &acts(&["a", "b", "c"]), 1);
        let mut want = vec![
            host_label("app.example.com"),
            host_label("not a valid host!"),
        ];
        want.sort();
        assert_eq!(host_labels(&p.labels), want);
        assert!(p.labels.values().all(String::is_empty));
        assert_eq!(p.labels.len(), 3 + 2, "members and hosts");
    }

    #[test]
    fn dropped_host_label_is_removed_and_added_one_set() {
        let mut rev = revision(0, 0, None);
        rev.spec.hosts = vec!["x.test".into(), "y.test".into()];
        let av = acts(&["a", "b", "c"]);
        let first = applied(&plan(&rev, None, &av, 1));
        rev.spec.hosts = vec!["y.test".into(), "z.test".into()];
        let p = plan(&rev, Some(&first), &av, 2);
        let patch = &p.label_patch.unwrap()["metadata"]["labels"];
        assert_eq!(patch[host_label("x.test")], Value::Null);
        assert_eq!(patch[host_label("z.test")], Value::String(String::new()));
        assert_eq!(patch.as_object().unwrap().len(), 2, "{patch}");
        assert!(!p.status_changed, "hosts are labels, not status");
    }

    #[test]
    fn host_conflict_is_set_then_cleared() {
        let mut rev = revision(0, 0, None);
        rev.spec.hosts = vec!["x.test".into()];
        let av = acts(&["a", "b", "c"]);
        let conflict = [Conflict {
            host: "x.test".into(),
            winner: crate::pure::key::Key::new("ns", "newer"),
        }];
        let first = applied(&plan(&rev, None, &av, 1));
        assert!(
            !first
                .status
                .as_ref()
                .unwrap()
                .conditions
                .iter()
                .any(|c| c.type_ == conditions::HOST_CONFLICT)
        );
        let lost = plan_with(&rev, Some(&first), &av, 2, &conflict);
        assert!(lost.status_changed);
        assert!(lost.label_patch.is_none(), "the loser keeps its host label");
        let c = lost
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::HOST_CONFLICT)
            .unwrap();
        assert_eq!(c.status, "True");
        assert_eq!(c.reason, "HostClaimedByNewerRevision");
        assert!(c.message.contains("x.test") && c.message.contains("ns/newer"));
        let lost = applied(&lost);
        assert!(!plan_with(&rev, Some(&lost), &av, 3, &conflict).status_changed);
        let cleared = plan(&rev, Some(&lost), &av, 4);
        assert!(cleared.status_changed);
        assert_eq!(
            cleared.status.conditions,
            first.status.as_ref().unwrap().conditions,
            "no HostConflict left, the other conditions untouched"
        );
    }

    #[test]
    fn label_patch_removes_a_stale_host_label_only() {
        let current = BTreeMap::from([
            ("team".to_string(), "x".to_string()),
            (host_label("old.test"), String::new()),
        ]);
        let patch = label_patch(&current, &BTreeMap::new()).unwrap();
        let labels = patch["metadata"]["labels"].as_object().unwrap();
        assert_eq!(labels.len(), 1, "{patch}");
        assert_eq!(labels[&host_label("old.test")], Value::Null);
    }

    #[test]
    fn revision_conditions_skip_when_unchanged() {
        let mut rev = revision(0, 0, None);
        let (generation, conds) = revision_conditions(
            &rev,
            &[],
            3,
            &Default::default(),
            None,
            Timestamp::from_second(1).unwrap(),
        )
        .unwrap();
        rev.status = Some(crds::RevisionStatus {
            observed_generation: generation,
            conditions: conds,
        });
        assert!(
            revision_conditions(
                &rev,
                &[],
                3,
                &Default::default(),
                None,
                Timestamp::from_second(2).unwrap()
            )
            .is_none()
        );
        assert!(
            revision_conditions(
                &rev,
                &["bad".into()],
                3,
                &Default::default(),
                None,
                Timestamp::from_second(2).unwrap()
            )
            .is_some()
        );
    }

    /// What the subsetter wrote before `lean.rs`: each condition with its generation and its
    /// message.
    fn longer_form(conds: &[Condition]) -> Vec<Condition> {
        conds
            .iter()
            .cloned()
            .map(|mut c| {
                c.observed_generation = Some(1);
                if c.message.is_empty() {
                    c.message = "3 activator(s) assigned".into();
                }
                c
            })
            .collect()
    }

    #[test]
    fn a_subsets_conditions_are_written_lean_and_the_longer_form_is_not_rewritten() {
        let rev = revision(0, 0, None);
        let av = acts(&["a", "b", "c"]);
        let p = plan(&rev, None, &av, 1);
        assert!(
            p.status
                .conditions
                .iter()
                .all(|c| c.observed_generation.is_none() && c.message.is_empty())
        );
        assert_eq!(
            p.status.observed_generation,
            Some(1),
            "the status keeps its own"
        );
        let mut old = applied(&p);
        let s = old.status.as_mut().unwrap();
        s.conditions = longer_form(&s.conditions);
        let again = plan(&rev, Some(&old), &av, 2);
        assert!(!again.status_changed, "no write for the form alone");
        assert!(again.label_patch.is_none());
        // A real change is written, lean.
        let fewer = acts(&["a", "b"]);
        let changed = plan(&rev, Some(&old), &fewer, 3);
        assert!(changed.status_changed);
        assert!(
            changed
                .status
                .conditions
                .iter()
                .all(|c| c.observed_generation.is_none())
        );
    }

    #[test]
    fn a_revisions_conditions_are_written_lean_and_the_longer_form_is_not_rewritten() {
        let mut rev = revision(0, 0, None);
        let at = |s| Timestamp::from_second(s).unwrap();
        let (generation, conds) =
            revision_conditions(&rev, &[], 3, &Default::default(), None, at(1)).unwrap();
        assert!(
            conds
                .iter()
                .all(|c| c.observed_generation.is_none() && c.message.is_empty())
        );
        rev.status = Some(crds::RevisionStatus {
            observed_generation: generation,
            conditions: longer_form(&conds),
        });
        assert!(revision_conditions(&rev, &[], 3, &Default::default(), None, at(2)).is_none());
        let (_, invalid) =
            revision_conditions(&rev, &["bad".into()], 3, &Default::default(), None, at(2))
                .unwrap();
        assert_eq!(invalid[0].message, "bad", "a message that says why is kept");
    }

    mod eligible_members {
        use super::*;
        use crate::pure::eligibility::{NodeFacts, Taint};
        use crate::pure::policy::Random;
        use std::sync::Arc;

        const KEYS: [&str; 3] = ["gpu", "spot", "zone-drain"];

        fn cluster(taints: &[Vec<usize>], labels: &[bool]) -> BTreeMap<String, Activator> {
            taints
                .iter()
                .zip(labels)
                .enumerate()
                .map(|(i, (ts, ssd))| {
                    let node = format!("n{i}");
                    let facts = NodeFacts {
                        name: node.clone(),
                        unschedulable: false,
                        labels: ssd
                            .then(|| ("disk".to_string(), "ssd".to_string()))
                            .into_iter()
                            .collect(),
                        taints: ts
                            .iter()
                            .map(|k| Taint {
                                key: KEYS[*k].into(),
                                value: String::new(),
                                effect: "NoSchedule".into(),
                            })
                            .collect(),
                        images: Default::default(),
                    };
                    let a = Activator {
                        node: node.clone(),
                        address: format!("10.0.0.{i}:8080"),
                        pod: format!("act-{i}"),
                        facts: Some(Arc::new(facts)),
                    };
                    (node, a)
                })
                .collect()
        }

        proptest! {
            #[test]
            fn no_plan_has_a_member_where_the_pod_could_not_run(
                taints in prop::collection::vec(prop::collection::vec(0usize..3, 0..2), 1..12),
                ssd in prop::collection::vec(any::<bool>(), 12),
                tolerated in prop::collection::vec(0usize..3, 0..3),
                want_ssd in any::<bool>(),
                n in 1i32..6,
                seed in any::<u64>(),
                random in any::<bool>(),
                indexed in any::<bool>(),
            ) {
                let av = cluster(&taints, &ssd[..taints.len()]);
                let mut rev = revision(0, 0, Some(n));
                let tols: Vec<Value> = tolerated
                    .iter()
                    .map(|k| json!({"key": KEYS[*k], "operator": "Exists"}))
                    .collect();
                let mut template = rev.spec.template.value();
                template["spec"]["tolerations"] = Value::Array(tols);
                if want_ssd {
                    template["spec"]["nodeSelector"] = json!({"disk": "ssd"});
                }
                rev.spec.template = template.into();
                let placement = Placement::of(&rev.spec.template);
                let policy: Box<dyn SubsetPolicy> = if random {
                    Box::new(Random::seeded(seed))
                } else {
                    Box::new(LeastLoaded)
                };
                // A current subset on every node, eligible or not: the plan must drop the
                // ineligible ones.
                let mut current = ActivationEndpoints::new("r", Default::default());
                current.status = Some(ActivationEndpointsStatus {
                    activators: av
                        .values()
                        .map(|a| ActivatorMember {
                            node: a.node.clone(),
                            address: a.address.clone(),
                            pod: a.pod.clone(),
                            max_pods: 0,
                            min_pods: 0,
                        })
                        .collect(),
                    ..Default::default()
                });
                let mut ix = crate::pure::index::MembershipIndex::default();
                ix.set_available(&av);
                let p = subset(&SubsetInputs {
                    key: "ns/r",
                    revision: &rev,
                    current: Some(&current),
                    available: &Available::from(av.clone()),
                    load: &|_| 0,
                    loads: indexed.then(|| ix.loads()),
                    evict: None,
                    policy: policy.as_ref(),
                    image_locality: true,
                    images: &crate::pure::images::wanted(&rev.spec.template.value()),
                    default_n: 3,
                    host_conflicts: &[],
                    routes: &[],
                    pending_hosts: &[],
                    warm_pods: 0,
                    now: Timestamp::from_second(1).unwrap(),
                });
                let eligible_count = av.values().filter(|a| eligible(&placement, a)).count();
                for m in &p.status.activators {
                    prop_assert!(eligible(&placement, &av[&m.node]), "{} is not eligible", m.node);
                }
                prop_assert_eq!(p.status.activators.len(), (n as usize).min(eligible_count));
            }
        }
    }
}
