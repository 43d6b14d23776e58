//! `subsetter verify-contract`: every breach of docs/activation-endpoints-contract.md in a
//! cluster's ActivationEndpoints, so a platform can test its own subsetter. [`check`] is pure
//! (objects in, breaches out); [`read_cluster`] lists what it needs from the API server.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crds::contract::{
    ACTIVATOR_SELECTOR, HOST_LABEL_PREFIX, MEMBER_LABEL_PREFIX, host_label, member_label,
    normalize_host,
};
use crds::{ActivationEndpoints, Revision};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::pure::activators::{self, Activator};
use crate::pure::eligibility::{NodeFacts, Placement};

/// One way an object breaks the contract.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Breach {
    /// `namespace/name` of the ActivationEndpoints (or of the Revision that lacks one).
    pub object: String,
    /// The contract's rule, as its doc names it.
    pub rule: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.rule, self.detail)
    }
}

/// What [`check`] reads: the cluster's Revisions and ActivationEndpoints, and its usable
/// activators (Ready pods on Ready nodes, with their nodes' facts).
pub struct Cluster {
    pub revisions: Vec<Revision>,
    pub endpoints: Vec<ActivationEndpoints>,
    pub activators: BTreeMap<String, Activator>,
}

fn key(ns: Option<&str>, name: &str) -> String {
    format!("{}/{name}", ns.unwrap_or_default())
}

/// Every breach in `cluster`, sorted.
pub fn check(cluster: &Cluster) -> Vec<Breach> {
    let mut out = Vec::new();
    let revisions: HashMap<String, &Revision> = cluster
        .revisions
        .iter()
        .map(|r| (key(r.metadata.namespace.as_deref(), &r.name_any()), r))
        .collect();
    let endpoints: HashMap<String, &ActivationEndpoints> = cluster
        .endpoints
        .iter()
        .map(|a| (key(a.metadata.namespace.as_deref(), &a.name_any()), a))
        .collect();
    for (k, rev) in &revisions {
        if rev.problems().is_empty() && !endpoints.contains_key(k) {
            out.push(Breach {
                object: k.clone(),
                rule: "one ActivationEndpoints per Revision",
                detail: "the Revision has none".into(),
            });
        }
    }
    for (k, ae) in &endpoints {
        let mut breach = |rule: &'static str, detail: String| {
            out.push(Breach {
                object: k.clone(),
                rule,
                detail,
            })
        };
        let Some(rev) = revisions.get(k) else {
            breach(
                "one ActivationEndpoints per Revision",
                "no Revision of this name and namespace".into(),
            );
            continue;
        };
        check_owner(ae, rev, &mut breach);
        let Some(status) = ae.status.as_ref() else {
            breach("status", "no status".into());
            continue;
        };
        check_members(ae, rev, &cluster.activators, &mut breach);
        check_shares(rev, status, &mut breach);
        check_labels(ae, rev, &mut breach);
        if status.observed_generation != rev.metadata.generation {
            breach(
                "observedGeneration",
                format!(
                    "{:?}, the Revision is at {:?}",
                    status.observed_generation, rev.metadata.generation
                ),
            );
        }
        let cond = |t: &str| status.conditions.iter().find(|c| c.type_ == t);
        let members = status.activators.len();
        match cond("Ready") {
            None => breach("conditions", "no Ready condition".into()),
            Some(c) if (c.status == "True") != (members > 0) => breach(
                "conditions",
                format!("Ready is {} with {members} member(s)", c.status),
            ),
            Some(_) => {}
        }
        match cond("Degraded") {
            None => breach("conditions", "no Degraded condition".into()),
            Some(c) if members == 1 && c.status != "True" => breach(
                "conditions",
                "Degraded must be True with a single member".into(),
            ),
            Some(_) => {}
        }
    }
    check_host_conflicts(&cluster.revisions, &endpoints, &mut out);
    out.sort();
    out
}

fn check_owner(
    ae: &ActivationEndpoints,
    rev: &Revision,
    breach: &mut impl FnMut(&'static str, String),
) {
    let owner = ae
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    match owner {
        None => breach("controller ownerReference", "none".into()),
        Some(o)
            if o.kind != "Revision"
                || o.api_version != "local-activator.dev/v1alpha1"
                || o.name != rev.name_any()
                || Some(&o.uid) != rev.metadata.uid.as_ref() =>
        {
            breach(
                "controller ownerReference",
                format!(
                    "points at {} {} {} (uid {}), not this Revision",
                    o.api_version, o.kind, o.name, o.uid
                ),
            )
        }
        Some(_) => {}
    }
}

fn check_members(
    ae: &ActivationEndpoints,
    rev: &Revision,
    activators: &BTreeMap<String, Activator>,
    breach: &mut impl FnMut(&'static str, String),
) {
    let Some(status) = ae.status.as_ref() else {
        return;
    };
    let placement = Placement::of(&rev.spec.template);
    let mut seen = BTreeSet::new();
    for m in &status.activators {
        if !seen.insert(m.node.as_str()) {
            breach("members", format!("node {} is listed twice", m.node));
        }
        let Some(a) = activators.get(&m.node) else {
            breach(
                "members",
                format!("node {} has no Ready activator on a Ready node", m.node),
            );
            continue;
        };
        if a.address != m.address || a.pod != m.pod {
            breach(
                "members",
                format!(
                    "node {}: listed as {} ({}), its activator is {} ({})",
                    m.node, m.address, m.pod, a.address, a.pod
                ),
            );
        }
        if let Some(f) = &a.facts
            && let Err(why) = placement.allows(f)
        {
            breach("members", format!("not eligible: {why}"));
        }
    }
}

fn check_shares(
    rev: &Revision,
    status: &crds::ActivationEndpointsStatus,
    breach: &mut impl FnMut(&'static str, String),
) {
    let spec = &rev.spec;
    let max: i64 = status
        .activators
        .iter()
        .map(|m| i64::from(m.max_pods))
        .sum();
    let min: i64 = status
        .activators
        .iter()
        .map(|m| i64::from(m.min_pods))
        .sum();
    if spec.max_scale > 0 && max > i64::from(spec.max_scale) {
        breach(
            "maxPods",
            format!("shares sum to {max}, above maxScale {}", spec.max_scale),
        );
    }
    if spec.max_scale == 0 && max != 0 {
        breach(
            "maxPods",
            format!("maxScale is 0 (unlimited) but shares sum to {max}"),
        );
    }
    if !status.activators.is_empty() && min != i64::from(spec.min_scale) {
        breach(
            "minPods",
            format!("shares sum to {min}, not minScale {}", spec.min_scale),
        );
    }
}

fn check_labels(
    ae: &ActivationEndpoints,
    rev: &Revision,
    breach: &mut impl FnMut(&'static str, String),
) {
    let labels = ae.labels();
    let with = |prefix: &str| -> BTreeSet<String> {
        labels
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    };
    let members: BTreeSet<String> = ae
        .status
        .iter()
        .flat_map(|s| &s.activators)
        .map(|m| member_label(&m.node))
        .collect();
    let have = with(MEMBER_LABEL_PREFIX);
    if have != members {
        breach(
            "member labels",
            format!(
                "missing {:?}, extra {:?}",
                members.difference(&have).collect::<Vec<_>>(),
                have.difference(&members).collect::<Vec<_>>()
            ),
        );
    }
    let hosts: BTreeSet<String> = rev.spec.hosts.iter().map(|h| host_label(h)).collect();
    let have = with(HOST_LABEL_PREFIX);
    if have != hosts {
        breach(
            "host labels",
            format!(
                "missing {:?}, extra {:?}",
                hosts.difference(&have).collect::<Vec<_>>(),
                have.difference(&hosts).collect::<Vec<_>>()
            ),
        );
    }
}

/// Rule 10: of the claimants of a host whose object carries its label, the newest
/// (creationTimestamp in seconds, name, namespace) has no `HostConflict=True`; every other has.
fn check_host_conflicts(
    revisions: &[Revision],
    endpoints: &HashMap<String, &ActivationEndpoints>,
    out: &mut Vec<Breach>,
) {
    let mut claimants: BTreeMap<String, Vec<&Revision>> = BTreeMap::new();
    for r in revisions {
        let k = key(r.metadata.namespace.as_deref(), &r.name_any());
        let Some(ae) = endpoints.get(&k) else {
            continue;
        };
        let hosts: BTreeSet<String> = r.spec.hosts.iter().map(|h| normalize_host(h)).collect();
        for h in hosts {
            if ae.labels().contains_key(&host_label(&h)) {
                claimants.entry(h).or_default().push(r);
            }
        }
    }
    for (host, mut revs) in claimants {
        if revs.len() < 2 {
            continue;
        }
        let order = |r: &&Revision| {
            (
                r.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second()),
                r.name_any(),
                r.metadata.namespace.clone(),
            )
        };
        revs.sort_by_key(order);
        let winner = revs.pop().expect("two or more");
        let conflicted = |r: &Revision| {
            let k = key(r.metadata.namespace.as_deref(), &r.name_any());
            endpoints
                .get(&k)
                .and_then(|ae| ae.status.as_ref())
                .is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "HostConflict" && c.status == "True")
                })
        };
        let name = |r: &Revision| key(r.metadata.namespace.as_deref(), &r.name_any());
        if conflicted(winner) {
            out.push(Breach {
                object: name(winner),
                rule: "HostConflict",
                detail: format!("newest claimant of {host}, yet marked HostConflict"),
            });
        }
        for r in revs {
            if !conflicted(r) {
                out.push(Breach {
                    object: name(r),
                    rule: "HostConflict",
                    detail: format!(
                        "host {host} is claimed by newer revision {}, but HostConflict is not True",
                        name(winner)
                    ),
                });
            }
        }
    }
}

/// Reads what [`check`] needs from a live cluster: all Revisions and ActivationEndpoints, the
/// activator pods (by the DaemonSet's labels) and the Nodes.
pub async fn read_cluster(client: &Client) -> Result<Cluster, kube::Error> {
    let lp = ListParams::default();
    let revisions = Api::<Revision>::all(client.clone()).list(&lp).await?.items;
    let endpoints = Api::<ActivationEndpoints>::all(client.clone())
        .list(&lp)
        .await?
        .items;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().labels(ACTIVATOR_SELECTOR))
        .await?
        .items;
    let nodes = Api::<Node>::all(client.clone()).list(&lp).await?.items;
    let ready: HashMap<String, bool> = nodes
        .iter()
        .map(|n| (n.name_any(), activators::node_ready(n)))
        .collect();
    let facts: HashMap<String, Arc<NodeFacts>> = nodes
        .iter()
        .map(|n| (n.name_any(), Arc::new(NodeFacts::of(n))))
        .collect();
    let mut activators = activators::available(&pods, &ready);
    for a in activators.values_mut() {
        a.facts = facts.get(&a.node).cloned();
    }
    Ok(Cluster {
        revisions,
        endpoints,
        activators,
    })
}
