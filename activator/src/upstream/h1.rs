//! HTTP/1.1 to pods and peers: a pool of keep-alive connections per target, on hyper's own
//! connection API.
//!
//! Why not hyper-util's legacy client (used before): its connection is chosen from the
//! request's absolute URI (formatted and parsed per request), and a refused connection
//! consumes the request, so every body-less request had to be copied beforehand in case it
//! must be sent again. It also spawns a task per request to put an HTTP/1 connection back
//! in the pool once it is ready. Here the connection comes first ([`H1Pool::get`]): a refused
//! connect leaves the request untouched for the next pod, and a connection goes back to the
//! pool when its response body ends ([`Returning`]), with no task.
//!
//! Each serving thread has its own pool (see `ActivatorConfig::io_threads`), so the lock is
//! uncontended in production.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{Builder, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::upstream::h2c::UpBody;
use crate::upstream::idle::IdleSet;
use crate::wire::connect::ConnectError;
use keep_serving::Locked;

/// What the pool knows of a connection's socket besides hyper's handle: how many bytes it has
/// read from its target (whether an exchange that failed got any answer: a request the pod
/// answered nothing to may go again if it is idempotent; one it began to answer may not), and
/// the socket itself, shared with hyper's connection, to check before reuse that nothing
/// unasked is waiting on it ([`crate::upstream::conn_check`]).
/// Only hyper's connection owns the socket (the pool's is a weak reference): when hyper
/// drops a connection, its socket closes at once.
#[derive(Clone, Debug)]
pub struct Heard {
    bytes: Arc<AtomicU64>,
    socket: std::sync::Weak<TcpStream>,
}

impl Heard {
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn clean(&self) -> bool {
        self.socket
            .upgrade()
            .is_some_and(|s| crate::upstream::conn_check::clean(&*s))
    }
}

/// A pooled connection: hyper's handle, and what its socket has read.
type Pooled = (SendRequest<UpBody>, Heard);

/// Keep-alive HTTP/1.1 connections by target address.
pub struct H1Pool {
    idle: Mutex<IdleSet<Pooled>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
}

/// A connection taken from the pool (or just opened) for one request.
pub struct H1Conn {
    pub(crate) send: SendRequest<UpBody>,
    pub(crate) heard: Heard,
    /// Whether it came from the pool: a pooled connection the server closed meanwhile is no
    /// fault of the target, and the request goes on a fresh one.
    pub(crate) reused: bool,
}

impl H1Pool {
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(IdleSet::new(idle_timeout)),
            connect_timeout,
            idle_timeout,
        })
    }

    /// An idle connection to `target` that can take a request now, else a new one.
    pub async fn get(&self, target: SocketAddr) -> Result<H1Conn, ConnectError> {
        if let Some((send, heard)) = self.take_idle(target) {
            return Ok(H1Conn {
                send,
                heard,
                reused: true,
            });
        }
        // Boxed: connecting is rare on the warm path, and its state is larger than the rest
        // of a request's (every waiting request would carry it).
        Box::pin(self.connect(target))
            .await
            .map(|(send, heard)| H1Conn {
                send,
                heard,
                reused: false,
            })
    }

    /// A new connection to `target`, not from the pool.
    pub async fn connect(&self, target: SocketAddr) -> Result<Pooled, ConnectError> {
        let stream = crate::wire::connect::connect(target, self.connect_timeout).await?;
        let socket = Arc::new(stream);
        let heard = Heard {
            bytes: Arc::default(),
            socket: Arc::downgrade(&socket),
        };
        let stream = Counted {
            socket,
            bytes: heard.bytes.clone(),
        };
        let (send, conn) = Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ConnectError::Handshake)?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(%target, error = %e, "HTTP/1.1 connection ended with an error");
            }
        });
        Ok((send, heard))
    }

    fn take_idle(&self, target: SocketAddr) -> Option<Pooled> {
        let mut idle = self.idle.locked();
        let now = Instant::now();
        let list = idle.of(target, now, open)?;
        list.retain(|i| open(&i.conn) && now.duration_since(i.since) < self.idle_timeout);
        // Newest first: the most recently used connection is the likeliest to be alive. One
        // whose last response is still being finished is left for later. Each is checked
        // for bytes nobody asked for (or a close) before it is handed out, however recently
        // it was used: hyper's own connection task notices them only once it runs.
        loop {
            let ready = list.iter().rposition(|i| i.conn.0.is_ready())?;
            let conn = list.swap_remove(ready).conn;
            if conn.1.clean() {
                return Some(conn);
            }
        }
    }

    /// Puts a connection whose response has ended back.
    fn put(&self, target: SocketAddr, conn: Pooled) {
        if conn.0.is_closed() {
            return;
        }
        let mut idle = self.idle.locked();
        idle.put(target, conn, Instant::now(), open);
    }
}

/// Whether a pooled connection's task still runs.
fn open(conn: &Pooled) -> bool {
    !conn.0.is_closed()
}

/// A pod connection's socket as hyper's connection uses it: shared with the pool (which
/// peeks at it before reuse), counting the bytes it reads ([`Heard`]). Reads and writes go
/// through tokio's readiness, as `TcpStream`'s own do.
struct Counted {
    socket: Arc<TcpStream>,
    bytes: Arc<AtomicU64>,
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let socket = &self.socket;
        loop {
            std::task::ready!(socket.poll_read_ready(cx))?;
            match socket.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    self.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let socket = &self.socket;
        loop {
            std::task::ready!(socket.poll_write_ready(cx))?;
            match socket.try_write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let socket = &self.socket;
        loop {
            std::task::ready!(socket.poll_write_ready(cx))?;
            match socket.try_write_vectored(bufs) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(socket2::SockRef::from(&*self.socket).shutdown(std::net::Shutdown::Write))
    }
}

/// A response body that gives its connection back to the pool once it has been read to the
/// end. Dropped earlier, the connection is dropped with it (hyper closes it: the rest of the
/// response is still on the wire).
pub struct Returning {
    inner: Incoming,
    back: Option<(Pooled, SocketAddr, Arc<H1Pool>)>,
}

impl Returning {
    pub fn new(inner: Incoming, conn: H1Conn, target: SocketAddr, pool: Arc<H1Pool>) -> Self {
        Self {
            inner,
            back: Some(((conn.send, conn.heard), target, pool)),
        }
    }

    fn give_back(&mut self) {
        if let Some((conn, target, pool)) = self.back.take() {
            pool.put(target, conn);
        }
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        // An empty body (204, HEAD, Content-Length: 0) may never be polled.
        if self.inner.is_end_stream() {
            self.give_back();
        }
    }
}

impl hyper::body::Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::body_timeout::IdleTimeout;
    use crate::wire::answer::full;
    use http::{Request, Response};
    use http_body_util::BodyExt;
    use hyper::service::service_fn;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    /// An app on 127.0.0.1 that counts the connections it accepted; `close` answers with
    /// `Connection: close`.
    async fn app(close: bool) -> (SocketAddr, Arc<AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = service_fn(move |_req: Request<Incoming>| async move {
                        let mut r = Response::new(full("hello"));
                        if close {
                            r.headers_mut()
                                .insert("connection", http::HeaderValue::from_static("close"));
                        }
                        Ok::<_, std::convert::Infallible>(r)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    async fn get(pool: &Arc<H1Pool>, target: SocketAddr) -> String {
        let mut c = pool.get(target).await.unwrap();
        let req = Request::builder()
            .uri("/")
            .header("host", "app")
            .body(IdleTimeout::untimed(full("")))
            .unwrap();
        let resp = c.send.send_request(req).await.unwrap();
        let body = Returning::new(resp.into_body(), c, target, pool.clone());
        let bytes = body.collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_response_has_been_read() {
        let (addr, accepted) = app(false).await;
        let pool = H1Pool::new(Duration::from_secs(1), Duration::from_secs(60));
        for _ in 0..5 {
            assert_eq!(get(&pool, addr).await, "hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_the_app_closes_is_not_reused() {
        let (addr, accepted) = app(true).await;
        let pool = H1Pool::new(Duration::from_secs(1), Duration::from_secs(60));
        for _ in 0..3 {
            assert_eq!(get(&pool, addr).await, "hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let pool = H1Pool::new(Duration::from_secs(1), Duration::from_secs(60));
        assert!(matches!(
            pool.get(addr).await,
            Err(ConnectError::Connect(_))
        ));
    }

    #[tokio::test]
    async fn connections_past_the_idle_timeout_are_not_handed_out() {
        let (addr, accepted) = app(false).await;
        let pool = H1Pool::new(Duration::from_secs(1), Duration::ZERO);
        get(&pool, addr).await;
        get(&pool, addr).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // The first, expired, was dropped when the second was taken: at most one is held.
        assert!(pool.idle.lock().unwrap().len() <= 1);
    }
}
