//! The simulated nodes report errors with the crate's one error type; the name is kept for
//! readability at call sites.

pub use crate::Error as NodeError;
