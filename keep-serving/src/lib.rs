//! What keeps the product's processes serving until they are asked to stop, written once for
//! the activator, the subsetter and the node agent:
//!
//! - [`Locked`] and [`ReadWriteLocked`]: locks taken whether or not a panic elsewhere
//!   poisoned them, so one bug in one task does not take every later holder (and with it the
//!   node's traffic, or the controller) down too;
//! - [`shutdown_signal`]: SIGTERM (what the kubelet sends) or ctrl-c, which cannot fail.
//!
//! A crate of its own rather than a module of one of them: the three binaries share no other
//! crate that is about processes (`crds` is the API, `node-agent` a sidecar the activator
//! links only for its protocol), and the rule is the same in each.

mod locks;
mod signal;

pub use locks::{Locked, ReadWriteLocked};
pub use signal::shutdown_signal;
