//! The request path: which revision a request names (`routing`), the transport-neutral core
//! — resolve, route, admit, account ([`core`], by the rules in [`rules`]), with pod retries
//! ([`retries`]) — the members' ranking (`primary`), hops between activators (`hop`,
//! `suspects`), and hyper's adapter (`handler`), which carries out every decision over
//! hyper's connections. The fast lane (`crate::fast`) holds the same [`core::Core`]: what
//! differs between the transports is only how bytes are carried.

pub(crate) mod core;
pub(crate) mod handler;
pub mod hop;
pub mod primary;
pub(crate) mod retries;
/// Which revision a request names: `crate::wire::naming`, under its old name.
pub use crate::wire::naming as routing;
pub(crate) mod rules;
pub(crate) mod suspects;
