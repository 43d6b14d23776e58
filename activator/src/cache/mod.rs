//! What the activator keeps in memory: only what its own node needs (DESIGN.md §4).
//!
//! - [`revisions`]: Revisions and the host routing table built from them.
//! - [`endpoints`]: the ActivationEndpoints that list this node (a label-selected watch), plus
//!   short-lived lookups of other revisions' subsets, for forwarding.
//! - [`pods`]: app pods on this node (a `spec.nodeName` field-selected watch).

pub mod endpoints;
pub mod pods;
pub mod revisions;
