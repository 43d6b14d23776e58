//! The names the activator puts on the wire, for both request paths (hyper's and the fast
//! lane's) and their tests: the response headers it adds, and the status it counts for a
//! client that left. The contract's request headers live in `crds::contract`.

use crds::contract::{
    HEADER_ACTIVATOR_HOP, HEADER_ACTIVATOR_HOP_PROOF, HEADER_ACTIVATOR_HOP_REVISION,
    HEADER_ACTIVATOR_HOP_SPILL, HEADER_ACTIVATOR_HOST_STALE, HEADER_ACTIVATOR_SUBSET_VERSION,
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
/// The contract's hints between an entry and a member about a host answer's age
/// (`crate::pipeline::hop`): on a forward, the version of the picked revision's subset the
/// entry's host answer was read at; on the member's answer, that its own copy is newer.
pub const SUBSET_VERSION: HeaderName = HeaderName::from_static(HEADER_ACTIVATOR_SUBSET_VERSION);
pub const HOST_STALE: HeaderName = HeaderName::from_static(HEADER_ACTIVATOR_HOST_STALE);
/// The revision an entry picked for a request it resolved by its Host
/// (`crds::contract::HEADER_ACTIVATOR_HOP_REVISION`).
pub const HOP_REVISION: HeaderName = HeaderName::from_static(HEADER_ACTIVATOR_HOP_REVISION);
