//! The `Route` custom resource: where a host's traffic goes — a split between revisions by
//! percent, `latest` following the newest revision that claims the route's hosts, tags that
//! give one revision a host of its own, and an optional gradual rollout. The subsetter turns
//! it into `status.routes` on the ActivationEndpoints of the revisions it names, which is all
//! an activator reads (docs/activation-endpoints-contract.md, "Routes").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::contract::normalize_host;

/// Where the traffic of some hosts goes.
///
/// Invalid routes (percents not summing to 100, a target naming no revision or two, a tag
/// used twice) are refused by the CEL rules below, and, should one get through, reported as
/// `Ready=False` by the subsetter, which then keeps routing as before.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "local-activator.dev",
    version = "v1alpha1",
    kind = "Route",
    plural = "routes",
    singular = "route",
    shortname = "lrt",
    namespaced,
    status = "RouteStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Hosts","type":"string","jsonPath":".spec.hosts"}"#,
    printcolumn = r#"{"name":"Traffic","type":"string","jsonPath":".status.summary"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Waiting","type":"string","jsonPath":".status.conditions[?(@.type==\"RoutesReady\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.metadata.name.size() <= 63").message("metadata.name must be no more than 63 characters"),
)]
// The sum is written out over the 16 places `traffic` may have: kube-apiserver 1.28's cost
// estimate cannot bound a list that `map()` builds, and refuses `map(...).sum()` (and any
// iteration over a `filter()`'s result) as over budget by more than 100x.
#[x_kube(validation = Rule::new("(size(self.traffic) > 0 ? self.traffic[0].percent : 0) + (size(self.traffic) > 1 ? self.traffic[1].percent : 0) + (size(self.traffic) > 2 ? self.traffic[2].percent : 0) + (size(self.traffic) > 3 ? self.traffic[3].percent : 0) + (size(self.traffic) > 4 ? self.traffic[4].percent : 0) + (size(self.traffic) > 5 ? self.traffic[5].percent : 0) + (size(self.traffic) > 6 ? self.traffic[6].percent : 0) + (size(self.traffic) > 7 ? self.traffic[7].percent : 0) + (size(self.traffic) > 8 ? self.traffic[8].percent : 0) + (size(self.traffic) > 9 ? self.traffic[9].percent : 0) + (size(self.traffic) > 10 ? self.traffic[10].percent : 0) + (size(self.traffic) > 11 ? self.traffic[11].percent : 0) + (size(self.traffic) > 12 ? self.traffic[12].percent : 0) + (size(self.traffic) > 13 ? self.traffic[13].percent : 0) + (size(self.traffic) > 14 ? self.traffic[14].percent : 0) + (size(self.traffic) > 15 ? self.traffic[15].percent : 0) == 100").message("traffic percents must sum to 100"))]
#[x_kube(validation = Rule::new("self.traffic.all(t, !has(t.tag) || self.traffic.filter(u, has(u.tag) && u.tag == t.tag).size() == 1)").message("a tag may name one target only"))]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// The hosts this route serves. A host a Route names is routed by it, whatever revisions
    /// claim it in `spec.hosts`; one host may be named by one Route only.
    #[schemars(length(min = 1, max = 16))]
    pub hosts: Vec<String>,

    /// Where the traffic goes; the percents sum to 100.
    #[schemars(length(min = 1, max = 16))]
    pub traffic: Vec<TrafficTarget>,

    /// Seconds over which a change of `traffic` moves, in steps, each taken only once the
    /// gaining revisions have the pods for their new share (0: in one step).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 86400))]
    pub rollout_duration_seconds: i64,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// One target of a route.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.revisionName) != (has(self.latestRevision) && self.latestRevision)").message("a target names either revisionName or latestRevision: true"))]
#[serde(rename_all = "camelCase")]
pub struct TrafficTarget {
    /// A Revision in the route's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// Follows the newest Revision of the route's namespace that claims one of its hosts in
    /// `spec.hosts`, once that revision can serve (its pods started first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_revision: Option<bool>,
    /// The percent of the hosts' requests.
    #[schemars(range(min = 0, max = 100))]
    pub percent: i32,
    /// Gives the target a host of its own, `<tag>-<host>` for each host, at 100 percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 30))]
    pub tag: Option<String>,
}

/// What the route serves now.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// The generation `traffic` was last computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The split served now, by revision (moves toward `spec.traffic` as the gaining revisions
    /// become able to serve).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<ServedTarget>,
    /// The split served now, for `kubectl get` (`v1=90% v2=10%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// When the move now under way began (the bound and the rollout's steps count from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_since: Option<Time>,
    /// The split the move now under way started from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moving_from: Vec<ServedTarget>,
    /// `Ready` (the spec is valid and served), `RoutesReady` (False while a move waits for
    /// pods, with why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One revision's share as served.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServedTarget {
    pub revision_name: String,
    #[schemars(range(min = 0, max = 100))]
    pub percent: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

impl RouteSpec {
    /// Problems the API server's rules would refuse, for a Route that got past them (an API
    /// server without CEL). Empty when valid.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.hosts.is_empty() {
            out.push("spec.hosts must not be empty".into());
        }
        if self.traffic.is_empty() {
            out.push("spec.traffic must not be empty".into());
        }
        let sum: i64 = self.traffic.iter().map(|t| i64::from(t.percent)).sum();
        if sum != 100 {
            out.push(format!(
                "traffic percents must sum to 100 (they sum to {sum})"
            ));
        }
        let mut tags = std::collections::BTreeSet::new();
        for (i, t) in self.traffic.iter().enumerate() {
            if !(0..=100).contains(&t.percent) {
                out.push(format!("spec.traffic[{i}].percent must be within 0-100"));
            }
            let latest = t.latest_revision == Some(true);
            if t.revision_name.is_some() == latest {
                out.push(format!(
                    "spec.traffic[{i}] must name either revisionName or latestRevision: true"
                ));
            }
            if let Some(tag) = &t.tag {
                if !tag_is_dns_label(tag) {
                    out.push(format!(
                        "spec.traffic[{i}].tag {tag:?} must be a DNS label (a-z, 0-9, '-')"
                    ));
                }
                if !tags.insert(tag.as_str()) {
                    out.push(format!("tag {tag:?} names two targets"));
                }
            }
        }
        if !(0..=86400).contains(&self.rollout_duration_seconds) {
            out.push("spec.rolloutDurationSeconds must be within 0-86400".into());
        }
        out
    }

    /// The route's hosts, normalized and without repeats.
    pub fn normalized_hosts(&self) -> Vec<String> {
        let mut hosts: Vec<String> = self.hosts.iter().map(|h| normalize_host(h)).collect();
        hosts.sort();
        hosts.dedup();
        hosts
    }
}

/// The host a tag gives a target: `<tag>-<host>` (the host normalized).
pub fn tag_host(tag: &str, host: &str) -> String {
    normalize_host(&format!("{tag}-{host}"))
}

fn tag_is_dns_label(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 30
        && tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !tag.starts_with('-')
        && !tag.ends_with('-')
}

/// `v1=90% v2=10%`: a split for `kubectl get`.
pub fn summary(traffic: &[ServedTarget]) -> String {
    traffic
        .iter()
        .map(|t| format!("{}={}%", t.revision_name, t.percent))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(rev: Option<&str>, latest: bool, percent: i32, tag: Option<&str>) -> TrafficTarget {
        TrafficTarget {
            revision_name: rev.map(Into::into),
            latest_revision: latest.then_some(true),
            percent,
            tag: tag.map(Into::into),
        }
    }

    fn spec(traffic: Vec<TrafficTarget>) -> RouteSpec {
        RouteSpec {
            hosts: vec!["Shop.Example.com:80".into()],
            traffic,
            rollout_duration_seconds: 0,
        }
    }

    #[test]
    fn a_valid_split_has_no_problems() {
        let s = spec(vec![
            target(Some("v1"), false, 90, None),
            target(None, true, 10, Some("canary")),
        ]);
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        assert_eq!(s.normalized_hosts(), vec!["shop.example.com".to_string()]);
    }

    #[test]
    fn percents_not_summing_to_100_are_refused_with_the_sum() {
        let s = spec(vec![
            target(Some("v1"), false, 90, None),
            target(Some("v2"), false, 20, None),
        ]);
        assert_eq!(
            s.problems(),
            vec!["traffic percents must sum to 100 (they sum to 110)".to_string()]
        );
    }

    #[test]
    fn a_target_names_exactly_one_revision() {
        let both = spec(vec![target(Some("v1"), true, 100, None)]);
        let neither = spec(vec![target(None, false, 100, None)]);
        for s in [both, neither] {
            assert!(s.problems()[0].contains("either revisionName or latestRevision"));
        }
    }

    #[test]
    fn tags_are_dns_labels_used_once() {
        let twice = spec(vec![
            target(Some("v1"), false, 50, Some("a")),
            target(Some("v2"), false, 50, Some("a")),
        ]);
        assert_eq!(
            twice.problems(),
            vec!["tag \"a\" names two targets".to_string()]
        );
        let odd = spec(vec![target(Some("v1"), false, 100, Some("Not_OK"))]);
        assert!(odd.problems()[0].contains("must be a DNS label"));
        assert_eq!(
            tag_host("canary", "shop.example.com"),
            "canary-shop.example.com"
        );
    }

    #[test]
    fn summary_lists_each_share() {
        let t = vec![
            ServedTarget {
                revision_name: "v1".into(),
                percent: 90,
                tag: None,
            },
            ServedTarget {
                revision_name: "v2".into(),
                percent: 10,
                tag: Some("canary".into()),
            },
        ];
        assert_eq!(summary(&t), "v1=90% v2=10%");
    }
}
