//! Opening a TCP connection to a pod or a peer, bounded: the one helper the pools of both
//! request paths use (`h1.rs`, `h2c.rs`, `fast/pod_conns.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

/// Why no connection could be had.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Refused, unreachable: worth another attempt for a request that can be replayed.
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("connect: timed out after {0:?}")]
    Timeout(Duration),
    /// The HTTP/1.1 or HTTP/2 handshake on a connection that was made.
    #[error("handshake: {0}")]
    Handshake(#[source] hyper::Error),
}

/// A connection to `target` within `limit`, with Nagle off (requests and heads are small
/// writes that must go at once).
pub async fn connect(target: SocketAddr, limit: Duration) -> Result<TcpStream, ConnectError> {
    let stream = tokio::time::timeout(limit, TcpStream::connect(target))
        .await
        .map_err(|_| ConnectError::Timeout(limit))?
        .map_err(ConnectError::Connect)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}
