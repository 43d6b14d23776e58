//! The names the activator puts on the wire, for both request paths (hyper's and the fast
//! lane's) and their tests: the response headers it adds, and the status it counts for a
//! client that left. The contract's request headers live in `crds::contract`.

use crds::contract::{
    HEADER_ACTIVATOR_HOP, HEADER_ACTIVATOR_HOP_PROOF, HEADER_ACTIVATOR_HOP_SPILL,
};
use http::HeaderName;

/// On every response the activator answers or relays: the node that served it.
pub const HEADER_SERVED_BY: &str = "x-activator-node";
pub const SERVED_BY: HeaderName = HeaderName::from_static(HEADER_SERVED_BY);
/// On a response that waited for a cold start: `true`.
pub const HEADER_COLD_START: &str = "x-activator-cold-start";
/// Where a cold answer's time went (`crate::node::cold_start` writes the marks).
pub const HEADER_SERVER_TIMING: &str = "server-timing";
pub const SERVER_TIMING: HeaderName = HeaderName::from_static(HEADER_SERVER_TIMING);
/// The status counted for a client that closed its connection before its answer (nginx's).
pub const CLIENT_GONE: u16 = 499;
/// The contract's hop headers between activators (`crate::pipeline::hop` proves them).
pub const HOP: HeaderName = HeaderName::from_static(HEADER_ACTIVATOR_HOP);
pub const PROOF: HeaderName = HeaderName::from_static(HEADER_ACTIVATOR_HOP_PROOF);
pub const SPILL: HeaderName = HeaderName::from_static(HEADER_ACTIVATOR_HOP_SPILL);
