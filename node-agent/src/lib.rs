//! The node agent: a small privileged sidecar of the activator pod that answers the
//! internet-facing activator container's questions from the container runtime (CRI): "what IP
//! address does the pod with UID `<uid>` have on this node", as soon as the pod's sandbox
//! exists (about a second before the kubelet reports it to the API server), and, since
//! protocol v2, "does this node hold image X" and "pull image X" (a revision's members pull
//! its image before its first request).
//!
//! The activator never holds the runtime socket: it speaks a tiny line protocol
//! ([`protocol`]) over a unix socket on a shared emptyDir, through [`client::AgentClient`].
//! The agent ([`server`]) treats every byte it receives as hostile. See docs/node-agent.md.
//!
//! `protocol`, `client` and `server` build without the default `cri` feature, so the activator
//! links no gRPC stack and no runtime client.

pub mod client;
pub mod error;
pub mod image;
pub mod protocol;
pub mod server;

#[cfg(feature = "cri")]
pub mod cri;

mod line;

#[cfg(test)]
mod testutil;

pub use client::AgentClient;
pub use error::{BackendError, ClientError, ProtocolError};
pub use image::{Credentials, ImageId, ImageInfo, ImageRef};
pub use protocol::{Answer, PodUid, PullFailure, Request};
pub use server::{Backend, BackendFuture, ImageFuture, PullFuture, ServerConfig, serve};
