//! The one key of the subsetter's maps: a revision (and its ActivationEndpoints) by namespace
//! and name. Its own module so that every index can name it without importing another index.

/// A revision (and its ActivationEndpoints): namespace and name. The name the subsetter has
/// always used for the one key type of `crds`.
pub use crds::ObjectKey as Key;
