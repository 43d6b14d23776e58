//! The bottom of the activator: what both request paths (hyper's, `crate::pipeline::handler`, and the
//! fast lane, `crate::fast`) put on and read off the wire — header names, framing rules, the
//! hop-by-hop set, the forwarding headers, and opening a connection. Nothing here imports
//! the layers above it, so an HTTP rule is written once and both paths keep it.

pub mod answer;
pub(crate) mod connect;
pub(crate) mod forwarded;
pub(crate) mod framing;
pub(crate) mod hop_by_hop;
pub mod names;
pub(crate) mod streaming;
