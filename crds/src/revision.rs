//! The `Revision` custom resource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use crate::pod_template::PodTemplate;

/// One immutable version of an app that scales to zero.
///
/// Invalid specs are refused by the API server (schema ranges and CEL rules below); the
/// subsetter also reports them as a `Ready=False` condition in case they get through (an API
/// server without CEL, or an older CRD).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "local-activator.dev",
    version = "v1alpha1",
    kind = "Revision",
    plural = "revisions",
    singular = "revision",
    shortname = "lrev",
    namespaced,
    status = "RevisionStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Hosts","type":"string","jsonPath":".spec.hosts"}"#,
    printcolumn = r#"{"name":"Min","type":"integer","jsonPath":".spec.minScale"}"#,
    printcolumn = r#"{"name":"Max","type":"integer","jsonPath":".spec.maxScale"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Routed","type":"string","jsonPath":".status.conditions[?(@.type==\"RoutesReady\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("self.metadata.name.size() <= 63").message("metadata.name must be no more than 63 characters"),
)]
#[x_kube(validation = Rule::new("self.maxScale == 0 || self.maxScale >= self.minScale").message("maxScale must be >= minScale when maxScale > 0"))]
#[serde(rename_all = "camelCase")]
pub struct RevisionSpec {
    /// The app's pod template. Kept schemaless (`x-kubernetes-preserve-unknown-fields`, as
    /// Knative does) so the CRD stays far below `kubectl apply`'s 256 KiB annotation limit; the
    /// API server checks it when the pod is created and the activator when it reads it.
    #[schemars(schema_with = "crate::revision::preserve_unknown_object")]
    pub template: PodTemplate,

    /// The container port requests are proxied to.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// Host header values routed to this revision. Where two revisions claim a host, the
    /// newest one (creationTimestamp, then name) wins.
    #[serde(default)]
    pub hosts: Vec<String>,

    /// Maximum concurrent requests per pod (0 = unlimited).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub container_concurrency: i64,

    /// Pods kept even when idle.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_scale: i32,

    /// Most pods at once across the whole cluster (0 = unlimited).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub max_scale: i32,

    /// Spare request capacity to keep before the activator leaves the path (-1 = unlimited).
    #[serde(default = "default_target_burst_capacity")]
    #[schemars(range(min = -1))]
    pub target_burst_capacity: i64,

    /// How many activators serve this revision (overrides the subsetter's default N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub activators: Option<i32>,

    /// Seconds without requests before a pod is removed.
    #[serde(default = "default_idle_timeout_seconds")]
    #[schemars(range(min = 0))]
    pub idle_timeout_seconds: i64,

    /// Request timeout, including a cold start.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i64,

    /// Longest wait, when this revision takes a host another revision serves, for its pods to
    /// be Ready before the host moves anyway (default: `timeoutSeconds`; 0: move at once,
    /// into a cold start). Until then the older revision keeps the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub hand_over_timeout_seconds: Option<i64>,
}

/// What the subsetter reports about a revision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionStatus {
    /// The generation these conditions were computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: the revision has an activator subset (False with a reason when its spec is invalid).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The defaults, written down once so the schema, the Rust type and the docs agree.
pub const DEFAULT_PORT: i32 = 8080;
pub const DEFAULT_TARGET_BURST_CAPACITY: i64 = 200;
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: i64 = 300;
pub const DEFAULT_TIMEOUT_SECONDS: i64 = 300;

fn default_port() -> i32 {
    DEFAULT_PORT
}
fn default_target_burst_capacity() -> i64 {
    DEFAULT_TARGET_BURST_CAPACITY
}
fn default_idle_timeout_seconds() -> i64 {
    DEFAULT_IDLE_TIMEOUT_SECONDS
}
fn default_timeout_seconds() -> i64 {
    DEFAULT_TIMEOUT_SECONDS
}

pub(crate) fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "A PodTemplateSpec, checked when the pod is created.",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

impl RevisionSpec {
    /// Problems the API server's schema would refuse, for callers that read a Revision that
    /// may not have passed through it. Empty when the spec is valid.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(1..=65535).contains(&self.port) {
            out.push(format!("spec.port {} is outside 1-65535", self.port));
        }
        for (name, v) in [
            ("containerConcurrency", self.container_concurrency),
            ("minScale", i64::from(self.min_scale)),
            ("maxScale", i64::from(self.max_scale)),
            ("idleTimeoutSeconds", self.idle_timeout_seconds),
        ] {
            if v < 0 {
                out.push(format!("spec.{name} must not be negative"));
            }
        }
        if self.target_burst_capacity < -1 {
            out.push("spec.targetBurstCapacity must be >= -1".into());
        }
        if self.timeout_seconds < 1 {
            out.push("spec.timeoutSeconds must be >= 1".into());
        }
        if matches!(self.activators, Some(n) if n < 1) {
            out.push("spec.activators must be >= 1".into());
        }
        if self.max_scale > 0 && self.max_scale < self.min_scale {
            out.push("maxScale must be >= minScale when maxScale > 0".into());
        }
        match self.template.parse() {
            Err(e) => out.push(e),
            Ok(t) if t.spec.as_ref().is_none_or(|s| s.containers.is_empty()) => {
                out.push("spec.template.spec.containers must not be empty".into())
            }
            Ok(_) => {}
        }
        if self.timeout_seconds > 3600 {
            out.push("spec.timeoutSeconds must be <= 3600".into());
        }
        if matches!(self.hand_over_timeout_seconds, Some(s) if !(0..=3600).contains(&s)) {
            out.push("spec.handOverTimeoutSeconds must be within 0-3600".into());
        }
        if matches!(self.activators, Some(n) if n > 1000) {
            out.push("spec.activators must be <= 1000".into());
        }
        out
    }
}

impl RevisionSpec {
    /// The bound on a hand-over to this revision (`handOverTimeoutSeconds`, default
    /// `timeoutSeconds`), in seconds.
    pub fn hand_over_bound(&self) -> i64 {
        self.hand_over_timeout_seconds
            .unwrap_or(self.timeout_seconds)
            .max(0)
    }
}

impl Revision {
    /// Problems with the whole object (spec and name), empty when valid.
    pub fn problems(&self) -> Vec<String> {
        let mut out = self.spec.problems();
        if self.metadata.name.as_deref().map(str::len).unwrap_or(0) > 63 {
            out.push("metadata.name must be no more than 63 characters".into());
        }
        out
    }
}
