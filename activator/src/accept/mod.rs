//! Accepting client connections: the server loop and its graceful drain, the serving threads
//! a connection is placed on and moved between, the write-stall guard, and the answers to
//! bytes hyper cannot parse.

pub mod parse_errors;
pub mod placement;
pub mod server;
pub mod serving_threads;
pub mod write_stall;
