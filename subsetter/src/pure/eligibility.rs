//! Which nodes a revision's pods may run on, so that no member sits where its pod could not
//! (the design's open question about taints and custom scheduling). Pure: the node's facts and
//! the revision's template in, a verdict out.
//!
//! An activator creates pods with `spec.nodeName` set, which bypasses the scheduler: the
//! kubelet would still refuse a pod that does not tolerate a `NoExecute` taint or does not
//! match the node's affinity, and a `NoSchedule` taint is the operator saying "no new pods
//! here". So a member must pass what kube-scheduler's filters would check for the template:
//!
//! - `spec.unschedulable` (cordoned), unless the template tolerates
//!   `node.kubernetes.io/unschedulable:NoSchedule` (the NodeUnschedulable filter);
//! - every `NoSchedule` and `NoExecute` taint tolerated (TaintToleration; `PreferNoSchedule` is
//!   a preference, not a filter);
//! - `nodeSelector`: every label present with that value;
//! - required node affinity: one of its terms matches (`In`, `NotIn`, `Exists`,
//!   `DoesNotExist`, `Gt`, `Lt` on labels; `In`/`NotIn` on `metadata.name` in `matchFields`).
//!
//! Node readiness is decided with the activator pod (`activators.rs`), not here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, Toleration};
use serde_json::Value;

/// The taint a cordoned node carries (and what a pod must tolerate to run there anyway).
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// A taint that filters (`NoSchedule` or `NoExecute`); `timeAdded` is left out so that its
/// updates do not look like a change of the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

/// What eligibility needs of a Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub unschedulable: bool,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// The images the node holds (`status.images`), for image locality (`images.rs`); not a
    /// matter of eligibility.
    pub images: crate::pure::images::ImageSet,
}

impl NodeFacts {
    /// Whether `other` says the same about where pods may run (everything but the images):
    /// a node that only pulled or dropped an image is no news to a short subset.
    pub fn same_placement(&self, other: &NodeFacts) -> bool {
        self.name == other.name
            && self.unschedulable == other.unschedulable
            && self.labels == other.labels
            && self.taints == other.taints
    }

    pub fn of(node: &Node) -> Self {
        let spec = node.spec.as_ref();
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .map(|t| Taint {
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone(),
                })
                .collect(),
            images: crate::pure::images::ImageSet::of_node(node),
        }
    }
}

/// Where a revision's pods may go, read from its template.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    pub tolerations: Vec<Toleration>,
    pub node_selector: BTreeMap<String, String>,
    pub required: Option<NodeSelector>,
    /// `spec.schedulerName` when it is not the default scheduler's.
    pub custom_scheduler: Option<String>,
}

/// Why a node is not eligible.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Ineligible {
    #[error("node {0} is cordoned (unschedulable)")]
    Cordoned(String),
    #[error(
        "node {node} has the taint {key}={value}:{effect}, which the template does not tolerate"
    )]
    Taint {
        node: String,
        key: String,
        value: String,
        effect: String,
    },
    #[error("node {node} lacks the label {key}={value} of the template's nodeSelector")]
    Selector {
        node: String,
        key: String,
        value: String,
    },
    #[error("node {0} matches none of the template's required node affinity terms")]
    Affinity(String),
}

/// The template keys [`Placement::of_template`] reads: a template whose text holds none of
/// them is placed anywhere, and needs no parse.
const PLACEMENT_KEYS: [&str; 4] = [
    "\"tolerations\"",
    "\"nodeSelector\"",
    "\"affinity\"",
    "\"schedulerName\"",
];

impl Placement {
    /// A revision's placement. Every plan asks (each reconcile, each node update), and most
    /// templates constrain nothing: their text (serde_json's, which escapes no letter in a
    /// key) lacks every key read, and they are answered without parsing the template. One
    /// that names a key anywhere, even in a string, is parsed.
    pub fn of(template: &crds::PodTemplate) -> Self {
        let text = template.json();
        if PLACEMENT_KEYS.iter().any(|k| text.contains(k)) {
            Self::of_template(&template.value())
        } else {
            Self::default()
        }
    }

    /// Read from a PodTemplateSpec's JSON. Each part is read on its own, so a malformed part
    /// (refused later, when the activator creates the pod) does not hide the others; a part
    /// that cannot be read places no constraint.
    pub fn of_template(template: &Value) -> Self {
        let spec = &template["spec"];
        let part = |v: &Value| -> Option<Value> { (!v.is_null()).then(|| v.clone()) };
        Self {
            tolerations: part(&spec["tolerations"])
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default(),
            node_selector: part(&spec["nodeSelector"])
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default(),
            required: part(
                &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            )
            .and_then(|v| serde_json::from_value(v).ok()),
            custom_scheduler: spec["schedulerName"]
                .as_str()
                .filter(|s| !s.is_empty() && *s != "default-scheduler")
                .map(str::to_owned),
        }
    }

    /// Whether nothing in the template constrains placement (most revisions): every node
    /// without filtering taints and not cordoned is eligible.
    pub fn is_unconstrained(&self) -> bool {
        self.tolerations.is_empty() && self.node_selector.is_empty() && self.required.is_none()
    }

    /// Whether a pod of this template may run on `node`.
    pub fn allows(&self, node: &NodeFacts) -> Result<(), Ineligible> {
        if node.unschedulable
            && !self.tolerates(&Taint {
                key: UNSCHEDULABLE_TAINT.into(),
                value: String::new(),
                effect: "NoSchedule".into(),
            })
        {
            return Err(Ineligible::Cordoned(node.name.clone()));
        }
        if let Some(t) = node.taints.iter().find(|t| !self.tolerates(t)) {
            return Err(Ineligible::Taint {
                node: node.name.clone(),
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
            });
        }
        if let Some((k, v)) = self
            .node_selector
            .iter()
            .find(|(k, v)| node.labels.get(*k) != Some(*v))
        {
            return Err(Ineligible::Selector {
                node: node.name.clone(),
                key: k.clone(),
                value: v.clone(),
            });
        }
        if let Some(required) = &self.required
            && !required
                .node_selector_terms
                .iter()
                .any(|term| term_matches(term, node))
        {
            return Err(Ineligible::Affinity(node.name.clone()));
        }
        Ok(())
    }

    fn tolerates(&self, taint: &Taint) -> bool {
        self.tolerations.iter().any(|t| tolerates(t, taint))
    }
}

/// `v1helper.ToleratesTaint`: an empty effect matches every effect, an empty key (with
/// `Exists`) every key; `Equal` (the default operator) compares the value.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    if let Some(key) = t.key.as_deref().filter(|k| !k.is_empty())
        && key != taint.key
    {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value,
        _ => false,
    }
}

/// A term matches when all its expressions and fields do; an empty term matches nothing
/// (as the scheduler's `nodeaffinity` reads it).
fn term_matches(term: &k8s_openapi::api::core::v1::NodeSelectorTerm, node: &NodeFacts) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node.name.as_str())))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    let as_int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value.and_then(as_int), values) else {
                return false;
            };
            let Some(bound) = as_int(bound) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn node(name: &str, labels: &[(&str, &str)], taints: &[(&str, &str, &str)]) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            unschedulable: false,
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            taints: taints
                .iter()
                .map(|(k, v, e)| Taint {
                    key: (*k).into(),
                    value: (*v).into(),
                    effect: (*e).into(),
                })
                .collect(),
            images: Default::default(),
        }
    }

    fn placement(spec: Value) -> Placement {
        Placement::of_template(&json!({ "spec": spec }))
    }

    #[test]
    fn an_unconstrained_template_runs_on_untainted_nodes_only() {
        let p = placement(json!({"containers": [{"name": "app"}]}));
        assert!(p.is_unconstrained());
        assert!(p.allows(&node("a", &[], &[])).is_ok());
        let tainted = node("b", &[], &[("gpu", "true", "NoSchedule")]);
        assert!(matches!(p.allows(&tainted), Err(Ineligible::Taint { .. })));
        let mut cordoned = node("c", &[], &[]);
        cordoned.unschedulable = true;
        assert_eq!(p.allows(&cordoned), Err(Ineligible::Cordoned("c".into())));
    }

    #[test]
    fn tolerations_follow_the_scheduler_rules() {
        let taint = [("gpu", "true", "NoSchedule")];
        let n = node("a", &[], &taint);
        let ok = |tol: Value| placement(json!({"tolerations": [tol]})).allows(&n).is_ok();
        assert!(ok(
            json!({"key": "gpu", "value": "true", "effect": "NoSchedule"})
        ));
        assert!(ok(
            json!({"key": "gpu", "operator": "Equal", "value": "true"})
        ));
        assert!(ok(json!({"key": "gpu", "operator": "Exists"})));
        assert!(
            ok(json!({"operator": "Exists"})),
            "empty key + Exists tolerates all"
        );
        assert!(!ok(json!({"key": "gpu", "value": "false"})));
        assert!(!ok(
            json!({"key": "gpu", "operator": "Exists", "effect": "NoExecute"})
        ));
        assert!(!ok(json!({"key": "other", "operator": "Exists"})));
        // NoExecute is filtered as well.
        let n = node(
            "a",
            &[],
            &[("node.kubernetes.io/not-ready", "", "NoExecute")],
        );
        assert!(placement(json!({})).allows(&n).is_err());
        assert!(
            placement(json!({"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]}))
                .allows(&n)
                .is_ok()
        );
    }

    #[test]
    fn a_cordoned_node_takes_a_template_that_tolerates_it() {
        let mut n = node("a", &[], &[]);
        n.unschedulable = true;
        let p = placement(json!({"tolerations": [
            {"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}
        ]}));
        assert!(p.allows(&n).is_ok());
    }

    #[test]
    fn node_selector_needs_every_label() {
        let p = placement(json!({"nodeSelector": {"zone": "a", "disk": "ssd"}}));
        assert!(
            p.allows(&node(
                "n",
                &[("zone", "a"), ("disk", "ssd"), ("x", "y")],
                &[]
            ))
            .is_ok()
        );
        assert!(matches!(
            p.allows(&node("n", &[("zone", "a")], &[])),
            Err(Ineligible::Selector { .. })
        ));
        assert!(
            p.allows(&node("n", &[("zone", "b"), ("disk", "ssd")], &[]))
                .is_err()
        );
    }

    fn affinity(terms: Value) -> Placement {
        placement(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }}}))
    }

    #[test]
    fn required_affinity_operators() {
        let n = node("n1", &[("zone", "a"), ("cores", "16")], &[]);
        let allows = |expr: Value| {
            affinity(json!([{"matchExpressions": [expr]}]))
                .allows(&n)
                .is_ok()
        };
        assert!(allows(
            json!({"key": "zone", "operator": "In", "values": ["a", "b"]})
        ));
        assert!(!allows(
            json!({"key": "zone", "operator": "In", "values": ["b"]})
        ));
        assert!(allows(
            json!({"key": "zone", "operator": "NotIn", "values": ["b"]})
        ));
        assert!(allows(
            json!({"key": "absent", "operator": "NotIn", "values": ["b"]})
        ));
        assert!(!allows(
            json!({"key": "zone", "operator": "NotIn", "values": ["a"]})
        ));
        assert!(allows(json!({"key": "zone", "operator": "Exists"})));
        assert!(!allows(json!({"key": "absent", "operator": "Exists"})));
        assert!(allows(json!({"key": "absent", "operator": "DoesNotExist"})));
        assert!(allows(
            json!({"key": "cores", "operator": "Gt", "values": ["8"]})
        ));
        assert!(!allows(
            json!({"key": "cores", "operator": "Gt", "values": ["16"]})
        ));
        assert!(allows(
            json!({"key": "cores", "operator": "Lt", "values": ["32"]})
        ));
        assert!(
            !allows(json!({"key": "zone", "operator": "Lt", "values": ["32"]})),
            "not a number"
        );
    }

    #[test]
    fn affinity_terms_are_ored_their_parts_anded_and_empty_terms_match_nothing() {
        let n = node("n1", &[("zone", "a")], &[]);
        let terms = json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]);
        assert!(affinity(terms).allows(&n).is_ok());
        let by_name = json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]);
        assert_eq!(
            affinity(by_name).allows(&n),
            Err(Ineligible::Affinity("n1".into()))
        );
        assert!(affinity(json!([{}])).allows(&n).is_err());
    }

    #[test]
    fn a_custom_scheduler_is_noted() {
        assert_eq!(
            placement(json!({"schedulerName": "volcano"}))
                .custom_scheduler
                .as_deref(),
            Some("volcano")
        );
        assert_eq!(
            placement(json!({"schedulerName": "default-scheduler"})).custom_scheduler,
            None
        );
    }

    #[test]
    fn a_malformed_part_does_not_hide_the_others() {
        let p = placement(json!({"tolerations": "nonsense", "nodeSelector": {"zone": "a"}}));
        assert!(p.tolerations.is_empty());
        assert_eq!(p.node_selector.len(), 1);
    }

    // A toleration with an explicit key, value and effect tolerates exactly its own taint.
    proptest! {
        #[test]
        fn an_exact_toleration_tolerates_exactly_its_taint(
            k1 in "[a-c]", v1 in "[x-z]", e1 in prop::sample::select(vec!["NoSchedule", "NoExecute"]),
            k2 in "[a-c]", v2 in "[x-z]", e2 in prop::sample::select(vec!["NoSchedule", "NoExecute"]),
        ) {
            let p = placement(json!({"tolerations": [{"key": k1, "value": v1, "effect": e1}]}));
            let n = node("n", &[], &[(&k2, &v2, e2)]);
            prop_assert_eq!(p.allows(&n).is_ok(), k1 == k2 && v1 == v2 && e1 == e2);
        }

        /// The unparsed answer is the parsed one, whichever placement keys a template holds
        /// (as keys, or only inside a string).
        #[test]
        fn placement_without_a_parse_is_the_parsed_placement(
            tolerate in any::<bool>(), select in any::<bool>(), affinity in any::<bool>(),
            scheduler in prop::sample::select(vec!["", "default-scheduler", "mine"]),
            env in prop::sample::select(vec!["plain", "nodeSelector", "\"affinity\""]),
        ) {
            let mut spec = json!({"containers": [{"name": "app", "image": "i",
                "env": [{"name": "X", "value": env}]}]});
            if tolerate {
                spec["tolerations"] = json!([{"key": "gpu", "operator": "Exists"}]);
            }
            if select {
                spec["nodeSelector"] = json!({"disk": "ssd"});
            }
            if affinity {
                spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}});
            }
            if !scheduler.is_empty() {
                spec["schedulerName"] = json!(scheduler);
            }
            let template: crds::PodTemplate = json!({"spec": spec}).into();
            prop_assert_eq!(Placement::of(&template), Placement::of_template(&template.value()));
        }
    }

    #[test]
    fn a_template_without_placement_keys_is_unconstrained_unparsed() {
        let t: crds::PodTemplate = json!({"spec": {"containers": [{"name": "app"}]}}).into();
        assert!(Placement::of(&t).is_unconstrained());
        let t: crds::PodTemplate = json!({"spec": {"nodeSelector": {"a": "b"}}}).into();
        assert!(!Placement::of(&t).is_unconstrained());
    }
}
