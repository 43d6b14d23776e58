//! Accepting client connections: the server loop and its graceful drain, and the write-stall
//! guard (the answers to bytes hyper cannot parse are HTTP/1 rules: `crate::http1::parse_errors`).

pub mod server;
pub mod write_stall;
