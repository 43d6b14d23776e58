//! The local-activator API (group `local-activator.dev`, version `v1alpha1`).
//!
//! - [`Revision`]: one immutable version of an app that scales to zero.
//! - [`ActivationEndpoints`]: the subset of activators serving a revision, written by the
//!   subsetter (or a replacement) and read by activators.
//! - [`Route`]: where a host's traffic goes (split, tags, gradual rollout), turned by the
//!   subsetter into `status.routes` of the ActivationEndpoints it names.
//! - [`contract`]: the labels, headers, names and hashes shared between the parts
//!   (docs/architecture.md, "The contracts"), so every component derives them the same way.
//! - [`ObjectKey`]: a namespaced object's namespace and name, the one key type of both parts.
//! - [`backoff`]: the retry policy every watch of the activator and the subsetter shares, so
//!   all of them resume within a second or so of the API server answering again.

pub mod activation_endpoints;
pub mod api_route;
pub mod backoff;
pub mod bounded;
pub mod contract;
pub mod crdgen;
pub mod directory;
pub mod key;
pub mod member_stream;
pub mod pod_template;
pub mod revision;
pub mod route;
pub mod unread;

pub use activation_endpoints::{
    ActivationEndpoints, ActivationEndpointsSpec, ActivationEndpointsStatus, ActivatorMember,
    HostShare, ImageMembers,
};
pub use key::ObjectKey;
// Its own crate so that kubesim reads pods the same way without depending on the product;
// re-exported here so the product's parts keep reading it as `crds::pod_ready`.
pub use kube_readings::pod_ready;
pub use revision::{PodTemplate, Revision, RevisionSpec, RevisionStatus};
pub use route::{Route, RouteSpec, RouteStatus, ServedTarget, TrafficTarget};

/// The API group of both kinds.
pub const GROUP: &str = "local-activator.dev";
/// The served (and stored) version of both kinds.
pub const VERSION: &str = "v1alpha1";

/// Errors of this crate's API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("serializing CRD {name} to YAML: {source}")]
    Yaml {
        name: String,
        #[source]
        source: serde_saphyr::ser::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
