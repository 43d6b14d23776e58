//! Accepting client connections: the server loop and its graceful drain, the write-stall
//! guard, and the answers to bytes hyper cannot parse.

pub mod parse_errors;
pub mod server;
pub mod write_stall;
