//! The watches that fill the caches (a standby runs them too), one file each beyond the
//! smallest.

pub(crate) mod app_pods;
pub(crate) mod endpoints;
pub(crate) mod revisions;
pub(crate) mod settings;
