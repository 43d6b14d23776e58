//! The HTTP/1 rules, in one place, for both request paths (hyper's adapter and the fast lane)
//! and for both sides of the proxy:
//!
//! - headers: the names the activator puts on the wire ([`names`]), the hop-by-hop set
//!   ([`hop_by_hop`]), the forwarding headers ([`forwarded`]);
//! - framing and bodies: `Content-Length`, duplicate Host, chunked twice ([`framing`]), where
//!   a chunked body ends ([`chunked`]) and where a response body ends by its framing
//!   ([`body_end`]), which responses stream by design ([`streaming`]);
//! - heads as bytes, for the fast lane: which requests it may carry and the request head it
//!   sends ([`request_head`], the server side), the response head it reads and sends back
//!   ([`response_head`], the client side);
//!   and the activator's own answer as bytes ([`refusal`]);
//! - server side on hyper's path: a short body for the answers hyper makes to what it cannot
//!   parse ([`parse_errors`]).
//!
//! Pure rules, no IO of their own (bar [`parse_errors`], a wrapper of the client socket):
//! what carries the bytes is `crate::fast` (the fast lane's control flow), `crate::upstream`
//! (hyper's client side) and `crate::accept` (hyper's server side). Imports only `crate::wire`
//! below it.

pub mod body_end;
pub mod chunked;
pub mod forwarded;
pub mod framing;
pub mod hop_by_hop;
pub mod names;
pub mod parse_errors;
pub mod refusal;
pub mod request_head;
pub mod response_head;
pub mod streaming;
