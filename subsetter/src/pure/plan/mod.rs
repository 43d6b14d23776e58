//! What one reconcile should write, computed without IO from the revision, its current
//! ActivationEndpoints, the available activators and a policy. The reconciler only performs
//! the writes this plan says are needed, so an unchanged world costs no API write.

use std::cell::RefCell;
use std::collections::BTreeMap;

use foldhash::HashSet as FastSet;

use crds::contract::{HOST_LABEL_PREFIX, MEMBER_LABEL_PREFIX, host_label, member_label};
use crds::{
    ActivationEndpoints, ActivationEndpointsStatus, ActivatorMember, ImageMembers, Revision,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::pure::activators::{Activator, Available};
use crate::pure::conditions;
use crate::pure::eligibility::Placement;
use crate::pure::hosts::Conflict;
use crate::pure::load_index::LoadIndex;
use crate::pure::policy::{Candidate, IndexedRequest, SubsetPolicy, SubsetRequest};
use crate::pure::shares;

/// The wanted N of `revision` ([`crate::pure::size::wanted`]).
pub fn wanted(revision: &Revision, max_node_selection: usize) -> usize {
    crate::pure::size::wanted(&revision.spec, max_node_selection)
}

/// Whether `a`'s node may run the revision's pods (a node without a Node object may).
pub fn eligible(placement: &Placement, a: &Activator) -> bool {
    a.facts.as_ref().is_none_or(|f| placement.allows(f).is_ok())
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

/// Inputs of [`subset`].
pub struct SubsetInputs<'a> {
    pub key: &'a str,
    pub revision: &'a Revision,
    pub current: Option<&'a ActivationEndpoints>,
    pub available: &'a Available,
    /// Subsets each node is in now (including this revision's current one).
    pub load: &'a dyn Fn(&str) -> usize,
    /// The available activators by load, when the caller keeps them indexed: the policy then
    /// chooses in O(N log A) instead of from a list of every activator.
    pub loads: Option<&'a LoadIndex>,
    /// A member to move off (rebalancing): planned as if its activator were unavailable.
    pub evict: Option<&'a str>,
    pub policy: &'a dyn SubsetPolicy,
    /// Prefer members whose node holds the revision's images (the policy's choice within its
    /// balance bound; `policy::locality_slack`).
    pub image_locality: bool,
    /// The images the revision's pod pulls (`images::wanted`, from the caller's
    /// `images::WantedCache`: a plan does not parse the template for them); empty when
    /// locality is off or no node reports any image, which leaves `status.imageMembers` out.
    pub images: &'a [u64],
    pub default_n: usize,
    /// The hosts of the revision that a newer revision takes (gives `HostConflict`).
    pub host_conflicts: &'a [Conflict],
    /// The hosts a Route sends to this revision, with its percent of each (`route_plan`).
    pub routes: &'a [crds::HostShare],
    /// Hosts of `spec.hosts` whose hand-over to this revision waits for its pods: their
    /// labels are left off until then (`handover`).
    pub pending_hosts: &'a [String],
    /// Pods to keep started across the members while a hand-over waits (0: none).
    pub warm_pods: i32,
    pub now: Timestamp,
}

pub fn subset(inp: &SubsetInputs<'_>) -> SubsetPlan {
    let n = wanted(inp.revision, inp.default_n);
    let current_status = inp.current.and_then(|ae| ae.status.as_ref());
    let current_nodes: Vec<String> = current_status
        .map(|s| s.activators.iter().map(|m| m.node.clone()).collect())
        .unwrap_or_default();
    let current_set: FastSet<&str> = current_nodes.iter().map(String::as_str).collect();
    // The activators the policy found usable, by node: building the members then does not look
    // each one up again in `available` (a tree of every activator: a dozen string compares).
    let found: RefCell<Vec<(&str, &Activator)>> = RefCell::new(Vec::new());
    // Only activators on nodes where the revision's pod could run are candidates; a member
    // whose node stopped being one (tainted, cordoned, relabelled) loses its slot.
    let placement = Placement::of(&inp.revision.spec.template);
    let evicted = |node: &str| inp.evict == Some(node);
    // The images the pod pulls (empty with locality off): the policy prefers nodes holding
    // them when locality is on, and the status counts the members that do.
    let images = inp.images;
    let locality: &[u64] = if inp.image_locality { images } else { &[] };
    let holds = |a: &Activator| {
        !images.is_empty() && a.facts.as_ref().is_some_and(|f| f.images.holds_all(images))
    };
    let indexed = inp.loads.and_then(|loads| {
        let usable = |node: &str| {
            !evicted(node)
                && match inp.available.get_key_value(node) {
                    Some((k, a)) if eligible(&placement, a) => {
                        found.borrow_mut().push((k, a));
                        true
                    }
                    _ => false,
                }
        };
        // Most templates constrain nothing: their eligible nodes are the clean ones, counted
        // when the index was built. Others are counted here (a scan, for them only).
        let eligible_count = if placement.is_unconstrained() {
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
                .filter(|a| !evicted(&a.node) && eligible(&placement, a))
                .count()
        };
        inp.policy.choose_indexed(&IndexedRequest {
            revision: inp.key,
            index: loads,
            eligible: &usable,
            eligible_count,
            current: &current_nodes,
            wanted: n,
            images: locality,
        })
    });
    let chosen = indexed.unwrap_or_else(|| {
        let candidates: Vec<Candidate> = inp
            .available
            .iter()
            .filter(|(node, a)| !evicted(node) && eligible(&placement, a))
            .map(|(node, a)| Candidate {
                node: node.clone(),
                load: (inp.load)(node)
                    .saturating_sub(usize::from(current_set.contains(node.as_str()))),
                holds: !locality.is_empty() && holds(a),
            })
            .collect();
        inp.policy.choose(&SubsetRequest {
            revision: inp.key,
            available: &candidates,
            current: &current_nodes,
            wanted: n,
        })
    });
    let found = found.into_inner();
    // Few members (the usual N): a scan of those found; many: the tree.
    let activator_of = |node: &str| match found.len() {
        0..=32 => found
            .iter()
            .find(|(k, _)| *k == node)
            .map(|(_, a)| *a)
            .or_else(|| inp.available.get(node)),
        _ => inp.available.get(node),
    };
    let spec = &inp.revision.spec;
    let mut shares = shares::split(spec.max_scale, spec.min_scale, chosen.len());
    // While a hand-over waits, the members keep the pods it waits for started (`minPods`),
    // the primary first: that is where every entry sends the traffic once the host moves.
    shares::add_warm(&mut shares, &warm_order(inp, &chosen), inp.warm_pods);
    let activators: Vec<ActivatorMember> = chosen
        .iter()
        .zip(shares)
        .filter_map(|(node, share)| {
            let a = activator_of(node)?;
            Some(ActivatorMember {
                node: a.node.clone(),
                address: a.address.clone(),
                pod: a.pod.clone(),
                max_pods: share.max_pods,
                min_pods: share.min_pods,
            })
        })
        .collect();
    let existing: &[Condition] = current_status
        .map(|s| s.conditions.as_slice())
        .unwrap_or(&[]);
    let generation = inp.revision.metadata.generation;
    // No member: say whether no activator is Ready or none is on a node that can run the
    // template (a scan of every activator, only for such a revision).
    let no_members = activators.is_empty().then(|| {
        let ineligible: Vec<String> = inp
            .available
            .values()
            .filter_map(|a| placement.allows(a.facts.as_ref()?).err())
            .map(|why| why.to_string())
            .collect();
        conditions::NoMembers::new(inp.available.len(), &ineligible)
    });
    let mut desired = conditions::subset(
        activators.len(),
        n,
        no_members.as_ref().unwrap_or(&Default::default()),
    );
    desired.extend(conditions::host_conflict(inp.host_conflicts));
    desired.extend(conditions::custom_scheduler(
        placement.custom_scheduler.as_deref(),
    ));
    // Known only where a member's node has a Node object (its images).
    let image_members = (!images.is_empty()).then(|| {
        let (mut known, mut holding) = (false, 0);
        for m in &activators {
            if let Some(a) = activator_of(&m.node) {
                known |= a.facts.is_some();
                holding += i32::from(holds(a));
            }
        }
        known.then(|| ImageMembers {
            holding,
            of: i32::try_from(activators.len()).unwrap_or(i32::MAX),
        })
    });
    let status = ActivationEndpointsStatus {
        conditions: conditions::merge(existing, &desired, generation, inp.now),
        image_members: image_members.flatten(),
        routes: inp.routes.to_vec(),
        activators,
        policy: Some(inp.policy.name().to_owned()),
        observed_generation: generation,
    };
    let status_changed = current_status != Some(&status);
    let chosen_set: FastSet<&str> = chosen.iter().map(String::as_str).collect();
    let joined = chosen_set.difference(&current_set).count();
    let left = current_set.difference(&chosen_set).count();
    let (mut left_lost, mut left_ineligible, mut left_rebalanced) = (0, 0, 0);
    for node in current_set.difference(&chosen_set) {
        match inp.available.get(node) {
            None => left_lost += 1,
            Some(a) if !eligible(&placement, a) => left_ineligible += 1,
            Some(_) if evicted(node) => left_rebalanced += 1,
            Some(_) => {}
        }
    }
    let was_degraded = existing
        .iter()
        .find(|c| c.type_ == conditions::DEGRADED && c.status == "True")
        .map(|c| c.reason.as_str());
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::DEGRADED && c.status == "True")
        .filter(|c| was_degraded != Some(c.reason.as_str()))
        .map(|c| (c.reason.clone(), c.message.clone()));
    // A revision keeps the labels of the hosts it loses: readers skip it by its HostConflict
    // condition, and the label is what lets them see that there is a conflict at all.
    // Any string hashes to a valid label key, so an odd host cannot make the write fail.
    // A host whose hand-over waits gets no label yet: no reader finds this revision for it.
    let pending: Option<FastSet<String>> = (!inp.pending_hosts.is_empty()).then(|| {
        inp.pending_hosts
            .iter()
            .map(|h| crate::pure::hosts::label_of_normalized(h))
            .collect()
    });
    let labels: BTreeMap<String, String> = chosen
        .iter()
        .map(|node| member_label(node))
        .chain(
            spec.hosts
                .iter()
                .map(|h| host_label(h))
                .filter(|l| pending.as_ref().is_none_or(|p| !p.contains(l))),
        )
        .chain(
            inp.routes
                .iter()
                .map(|r| crate::pure::hosts::label_of_normalized(&r.host)),
        )
        .map(|k| (k, String::new()))
        .collect();
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
        joined,
        left,
        left_lost,
        left_ineligible,
        left_rebalanced,
        degraded,
        no_members,
    }
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

/// The merge patch that makes the member and host labels of `current` equal to `wanted` (null
/// removes a label), leaving labels outside those prefixes alone; None when nothing differs.
pub fn label_patch(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> Option<Value> {
    let mut patch = Map::new();
    for (k, v) in wanted {
        if current.get(k) != Some(v) {
            patch.insert(k.clone(), Value::String(v.clone()));
        }
    }
    for k in current.keys() {
        let ours = k.starts_with(MEMBER_LABEL_PREFIX) || k.starts_with(HOST_LABEL_PREFIX);
        if ours && !wanted.contains_key(k) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    (!patch.is_empty()).then(|| json!({ "metadata": { "labels": patch } }))
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
    let conds = conditions::merge(existing, &desired, generation, now);
    let same =
        current.is_some_and(|s| s.conditions == conds && s.observed_generation == generation);
    (!same).then_some((generation, conds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pure::policy::LeastLoaded;
    use crds::RevisionSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use proptest::prelude::*;

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
