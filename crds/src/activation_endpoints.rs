//! The `ActivationEndpoints` custom resource: 1:1 with a Revision (same name and namespace,
//! controller ownerReference to it), written by the subsetter.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The activators that serve one revision. Everything of interest is in `status`, written
/// by the subsetter; `spec` is empty so a replacement subsetter owns the whole object.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "local-activator.dev",
    version = "v1alpha1",
    kind = "ActivationEndpoints",
    plural = "activationendpoints",
    singular = "activationendpoints",
    shortname = "actep",
    namespaced,
    status = "ActivationEndpointsStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Policy","type":"string","jsonPath":".status.policy"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.activators[*].node"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Degraded","type":"string","jsonPath":".status.conditions[?(@.type==\"Degraded\")].status"}"#,
    printcolumn = r#"{"name":"Images","type":"integer","priority":1,"description":"members whose node holds the revision's images","jsonPath":".status.imageMembers.holding"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct ActivationEndpointsSpec {}

/// The subset itself.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActivationEndpointsStatus {
    /// The members. Their `maxPods` shares sum to at most the revision's maxScale, so members
    /// never need to coordinate to respect it.
    #[serde(default)]
    pub activators: Vec<ActivatorMember>,
    /// The policy that chose the members (e.g. `random`, `least-loaded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The Revision generation this subset was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`; `Degraded` when fewer than the wanted N members exist, or N = 1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How many members' nodes already hold every image of the revision's template (their
    /// `Node.status.images`): a cold start there needs no image pull. Absent when the template
    /// names no image or no member's node has a Node object. Informational: readers must not
    /// require it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_members: Option<ImageMembers>,
    /// The hosts whose traffic a Route splits, and this revision's percent of each (tags'
    /// hosts at 100). Where any ActivationEndpoints carrying a host's label lists the host
    /// here, the host's traffic goes by these percents to the objects that list it, and the
    /// others carrying the label take none; where none lists it, the newest claimant without
    /// `HostConflict` takes all of it (docs/activation-endpoints-contract.md, "Routes").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<HostShare>,
}

/// One host's share routed to a revision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostShare {
    /// The host, normalized (lower case, no port, no trailing dot).
    pub host: String,
    /// The percent of the host's requests this revision takes.
    #[schemars(range(min = 0, max = 100))]
    pub percent: i32,
}

/// `holding` of `of` members hold the revision's images.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ImageMembers {
    /// Members whose node reports every image of the template.
    #[schemars(range(min = 0))]
    pub holding: i32,
    /// Members.
    #[schemars(range(min = 0))]
    pub of: i32,
}

/// One activator of a revision's subset.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActivatorMember {
    /// The member's node name.
    pub node: String,
    /// `ip:port` of the member activator's data port.
    pub address: String,
    /// The member activator's pod name.
    pub pod: String,
    /// This member's share of maxScale (0 = unlimited, when maxScale is 0).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub max_pods: i32,
    /// This member's share of minScale.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_pods: i32,
}

impl ActivationEndpointsStatus {
    /// The member entry for `node`, if that node is in the subset.
    pub fn member(&self, node: &str) -> Option<&ActivatorMember> {
        self.activators.iter().find(|m| m.node == node)
    }
}
