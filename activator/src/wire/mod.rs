//! The bottom of the activator: what both request paths (hyper's and the fast lane's) and the
//! layers above share about a request and a connection, whatever its protocol — the
//! activator's own answers ([`answer`]: `Refusal`, the body type), which revision a request
//! names ([`naming`]), and opening a connection ([`connect`]). The HTTP/1 rules are one
//! floor up, in `crate::http1`. Nothing here imports the layers above it.

pub mod answer;
pub(crate) mod connect;
pub mod naming;
