//! The request path: which revision a request names (`routing`), the transport-neutral
//! decision — resolve, then route ([`decide`]) by the rules in [`rules`] — the members'
//! ranking (`primary`), hops between activators (`hop`, `suspects`), the activator's own
//! answers (`answer`), and hyper's adapter (`handler`), which carries out every decision.
//! Admission (`Handler::admit`, `Handler::no_slot`) and pod retries ([`retries`]) are shared
//! with the fast lane (`crate::fast`); what differs between the transports is only how bytes
//! are carried.

pub(crate) mod decide;
pub(crate) mod handler;
pub mod hop;
pub mod primary;
pub(crate) mod retries;
pub mod routing;
pub(crate) mod rules;
pub(crate) mod suspects;
