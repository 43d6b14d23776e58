//! The serving threads: which thread a new connection is placed on, and moving a connection
//! between threads between two requests when one is hot. Below both the server (`accept`) and
//! the fast lane (`fast`), which each use it.

pub mod placement;
pub mod serving_threads;
