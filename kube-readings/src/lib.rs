//! What Kubernetes objects mean, read as the real components read them.
//!
//! A crate of its own, depending on nothing but the API types, because two sides need the
//! same reading and must not depend on each other: the product (the activator and the
//! subsetter, through `crds`, which re-exports these modules under the same paths) and the
//! simulator (kubesim), which must not depend on the product it is used to test.
//!
//! - [`pod_ready`]: whether a pod is ready as its kubelet last said, the node lifecycle
//!   controller's unready mark told apart.

pub mod pod_ready;
