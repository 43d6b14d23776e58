//! The crate's errors: what the protocol refuses, what a backend could not answer, and what a
//! client's exchange with the agent ended in.

use std::io;

/// Why a line is not a valid protocol line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("line too long")]
    TooLong,
    #[error("line not terminated by a newline")]
    Unterminated,
    #[error("empty line")]
    Empty,
    #[error("a byte outside printable ASCII")]
    BadByte,
    #[error("unknown verb")]
    UnknownVerb,
    #[error("not a lowercase textual UUID")]
    BadUid,
    #[error("not a canonical IP address")]
    BadAddress,
    #[error("bad error reason")]
    BadReason,
    #[error("not a valid image reference")]
    BadImage,
    #[error("malformed registry credentials")]
    BadCredentials,
    #[error("not a valid image id or size")]
    BadImageId,
    #[error("an answer that does not match the request")]
    Mismatch,
    #[error("more than one answer line for one request")]
    Unsolicited,
}

/// A backend could not answer. The reason goes on the wire (sanitised), so it is short and
/// says nothing the activator should not learn; details belong in the agent's log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct BackendError {
    pub reason: String,
}

impl BackendError {
    pub fn new(reason: impl Into<String>) -> BackendError {
        BackendError {
            reason: reason.into(),
        }
    }
}

/// What an [`AgentClient`](crate::client::AgentClient) exchange ended in, other than an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to the node agent: {0}")]
    Connect(#[source] io::Error),
    #[error("talking to the node agent: {0}")]
    Io(#[source] io::Error),
    #[error("the node agent closed the connection without answering")]
    Closed,
    #[error("the node agent did not answer in time")]
    Timeout,
    #[error("the node agent broke the protocol: {0}")]
    Protocol(#[source] ProtocolError),
    #[error("the node agent answered: error {0}")]
    Agent(String),
}
