//! HTTP/2 with prior knowledge (h2c) to pods and peers, for revisions whose port is named `h2c`
//! (gRPC needs HTTP/2 end to end: its status travels in trailers).
//!
//! Why not the pooled legacy client with `http2_only`: it takes the connection's address from
//! the request URI, so `:authority` would be the pod's IP where the app expects the host the
//! client asked for (RFC 9113 §8.3.1 asks an intermediary to keep it). Here one multiplexed
//! connection per target is kept, and the URI carries the original authority.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Instant;

use crate::upstream::body_timeout::IdleTimeout;
use crate::wire::answer::Body;
use crate::wire::connect::{ConnectError, connect};
use keep_serving::Locked;

/// The request body type sent upstream.
pub type UpBody = IdleTimeout<Body>;

struct Entry {
    send: SendRequest<UpBody>,
    last_used: Instant,
}

/// One HTTP/2 connection per target, opened on first use, replaced when closed, and dropped
/// (closing once its streams are done) after `idle` unused.
pub struct H2Pool {
    conns: Mutex<HashMap<SocketAddr, Entry>>,
    builder: Builder<TokioExecutor>,
    connect_timeout: Duration,
    idle: Duration,
}

impl H2Pool {
    pub fn new(connect_timeout: Duration, idle: Duration) -> Self {
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            // Notices a peer that vanished without a FIN (a killed node) on an idle
            // connection, which would otherwise stay in the pool and fail the next request.
            .keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10))
            .adaptive_window(true);
        Self {
            conns: Mutex::new(HashMap::new()),
            builder,
            connect_timeout,
            idle,
        }
    }

    /// A sender on an open connection to `target`. Concurrent first requests may each open
    /// one; the last one stays pooled and the others close when their requests are done.
    pub async fn get(&self, target: SocketAddr) -> Result<SendRequest<UpBody>, ConnectError> {
        let now = Instant::now();
        {
            let mut conns = self.conns.locked();
            let idle = self.idle;
            conns.retain(|_, e| !e.send.is_closed() && now.duration_since(e.last_used) < idle);
            if let Some(e) = conns.get_mut(&target) {
                e.last_used = now;
                return Ok(e.send.clone());
            }
        }
        // Boxed: opening a connection is rare, and its state would make every request's larger.
        Box::pin(self.open(target, now)).await
    }

    /// A new connection to `target`, pooled.
    async fn open(
        &self,
        target: SocketAddr,
        now: Instant,
    ) -> Result<SendRequest<UpBody>, ConnectError> {
        let stream = connect(target, self.connect_timeout).await?;
        let (send, conn) = self
            .builder
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ConnectError::Handshake)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%target, error = %e, "HTTP/2 connection ended with an error");
            }
        });
        let mut conns = self.conns.locked();
        conns.insert(
            target,
            Entry {
                send: send.clone(),
                last_used: now,
            },
        );
        Ok(send)
    }
}
