//! Accepting connections (HTTP/1.1 and h2c, with upgrades) until told to stop, then letting
//! in-flight requests finish. Each request carries its client's address ([`ClientAddr`]) for
//! the forwarding headers, and requests hyper cannot parse are answered with a short body
//! ([`crate::http1::parse_errors`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::accept::write_stall::WriteStall;
use crate::fast::FastLane;
use crate::fast::prefixed::Prefixed;
use crate::http1::forwarded::ClientAddr;
use crate::http1::framing::HEADER_READ_TIMEOUT;
use crate::http1::parse_errors::{ActiveGuard, ConnState, ErrorBodies};
use crate::threads::placement::Placed;
use crate::threads::serving_threads::{Threaded, moved_in};
use crate::wire::answer::Body;

/// How long a client of [`serve`] (the admin port) may take no bytes of a response.
const WRITE_STALL: Duration = Duration::from_secs(30);

fn builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    builder
}

/// Serves `handle` on `listener` until `stop` is cancelled, then waits for open connections
/// to finish their in-flight requests — at most `drain` — and closes what is left.
pub async fn serve<H, F>(listener: TcpListener, stop: CancellationToken, drain: Duration, handle: H)
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    serve_with(listener, stop, drain, WRITE_STALL, handle, None, None).await
}

/// [`serve`], with each connection starting in `fast` (the fast lane) when given: hyper
/// serves a connection from the request the fast lane hands over (see [`crate::fast`]).
/// With `threaded`, a connection is served on the thread its [`Placement`] chooses. A client
/// that takes no bytes of a response for `write_stall` is disconnected ([`WriteStall`]).
#[allow(clippy::too_many_arguments)]
pub async fn serve_with<H, F>(
    listener: TcpListener,
    stop: CancellationToken,
    drain: Duration,
    write_stall: Duration,
    handle: H,
    fast: Option<Arc<FastLane>>,
    mut threaded: Option<Threaded>,
) where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let conns = Conns::new(handle, write_stall);
    if let Some(t) = &threaded {
        tokio::spawn(t.mover.clone().measure(stop.clone()));
    }
    while let Some((stream, peer, placed)) = next_connection(&listener, &stop, &mut threaded).await
    {
        match &fast {
            None => conns.spawn_hyper(stream, peer, placed),
            Some(fast) => conns.spawn_fast(fast, stream, peer, placed, threaded.as_ref(), &stop),
        }
    }
    drop(listener);
    // Connections moved here but not taken yet: each gets its request answered (another
    // thread finds this inbox closed from now on and keeps what it would have moved).
    if let Some(t) = &mut threaded {
        conns.answer_moved_in(t);
    }
    conns.drain(drain).await;
}

/// The next connection to serve on this thread, accepted here (and placed, when there are
/// serving threads: one moved to another thread is not served here) or moved here by
/// another thread; None once `stop` is cancelled.
async fn next_connection(
    listener: &TcpListener,
    stop: &CancellationToken,
    threaded: &mut Option<Threaded>,
) -> Option<(TcpStream, SocketAddr, Option<Placed>)> {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return None,
            a = listener.accept() => a.map(|(s, p)| (s, p, None)),
            Some((stream, peer, placed)) = moved_in(threaded) => Ok((stream, peer, Some(placed))),
        };
        match accepted {
            Ok((stream, peer, Some(placed))) => return Some((stream, peer, Some(placed))),
            Ok((stream, peer, None)) => {
                let _ = stream.set_nodelay(true);
                crate::wire::connect::keep_alive(&stream);
                match &threaded {
                    None => return Some((stream, peer, None)),
                    Some(t) => match t.mover.place(stream, peer) {
                        Some((stream, placed)) => return Some((stream, peer, Some(placed))),
                        None => continue,
                    },
                }
            }
            Err(e) => {
                // e.g. EMFILE: keep serving the connections we have, and give them a moment to
                // close before trying again rather than spinning on the error.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
    }
}

/// What every connection of one [`serve_with`] shares: the handler, hyper's two builders,
/// and the graceful shutdown that the drain waits on.
struct Conns<H> {
    handle: Arc<H>,
    full: Arc<auto::Builder<TokioExecutor>>,
    /// For a connection handed over while stopping: hyper serves the request it was given
    /// and closes. (A watched connection told to shut down before hyper read the request
    /// would close without it.)
    last: Arc<auto::Builder<TokioExecutor>>,
    graceful: GracefulShutdown,
    write_stall: Duration,
}

impl<H, F> Conns<H>
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    fn new(handle: H, write_stall: Duration) -> Self {
        let handle = Arc::new(handle);
        let full = Arc::new(builder());
        let last = Arc::new({
            let mut b = builder();
            b.http1().keep_alive(false);
            b
        });
        let graceful = GracefulShutdown::new();
        Self {
            handle,
            full,
            last,
            graceful,
            write_stall,
        }
    }

    /// Without the fast lane: hyper serves the connection from its first byte, watched.
    fn spawn_hyper(&self, stream: TcpStream, peer: SocketAddr, placed: Option<Placed>) {
        let conn = connection(
            &self.full,
            WriteStall::new(stream, self.write_stall),
            peer,
            self.handle.clone(),
        );
        let conn = self.graceful.watch(conn);
        tokio::spawn(async move {
            let _placed = placed;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }

    /// The fast lane serves the connection, and hyper from the request it hands over (if
    /// it does): watched, or answering that one request when the server is stopping.
    fn spawn_fast(
        &self,
        fast: &Arc<FastLane>,
        stream: TcpStream,
        peer: SocketAddr,
        placed: Option<Placed>,
        threaded: Option<&Threaded>,
        stop: &CancellationToken,
    ) {
        // Held until the connection ends, so that the drain waits for it.
        let watcher = self.graceful.watcher();
        let mover = threaded.map(|t| t.mover.clone());
        let (fast, full, last, handle, stop) = (
            fast.clone(),
            self.full.clone(),
            self.last.clone(),
            self.handle.clone(),
            stop.clone(),
        );
        let write_stall = self.write_stall;
        tokio::spawn(async move {
            let _placed = placed;
            let Some((read, stream)) = fast.serve(stream, peer, mover.as_deref()).await else {
                return;
            };
            let io = Prefixed::new(read, stream);
            let served = if stop.is_cancelled() {
                connection(&last, WriteStall::new(io, write_stall), peer, handle).await
            } else {
                watcher
                    .watch(connection(
                        &full,
                        WriteStall::new(io, write_stall),
                        peer,
                        handle,
                    ))
                    .await
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }

    /// Answers the request of each connection moved here but not taken yet, and closes
    /// `threaded`'s inbox.
    fn answer_moved_in(&self, threaded: &mut Threaded) {
        for (stream, peer) in threaded.close() {
            let conn = self.graceful.watch(connection(
                &self.last,
                WriteStall::new(stream, self.write_stall),
                peer,
                self.handle.clone(),
            ));
            tokio::spawn(conn);
        }
    }

    /// Waits for open connections to finish their in-flight requests — at most `drain` —
    /// and closes what is left.
    async fn drain(self, drain: Duration) {
        if tokio::time::timeout(drain, self.graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                ?drain,
                "connections still open after the drain period; closing them"
            );
        }
    }
}

/// One connection: `handle` behind the client's address, upgrades and the bodies for hyper's
/// own error answers.
fn connection<I, H, F>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    peer: SocketAddr,
    handle: Arc<H>,
) -> impl GracefulConnection<Error = Box<dyn std::error::Error + Send + Sync>> + Send + 'static
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let state = Arc::new(ConnState::default());
    let io = TokioIo::new(ErrorBodies::new(io, state.clone()));
    let svc = service_fn(move |mut req: Request<Incoming>| {
        let h = handle.clone();
        // Counted from here until the response body is done, so that the socket wrapper never
        // mistakes this request's answer for one of hyper's own.
        let active = state.enter();
        let state = state.clone();
        req.extensions_mut().insert(ClientAddr(peer));
        async move {
            let resp = h(req).await;
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                state.set_passthrough();
            }
            state.head_coming();
            Ok::<_, Infallible>(resp.map(|body| Tracked {
                body,
                _active: active,
            }))
        }
    });
    builder.serve_connection_with_upgrades(io, svc).into_owned()
}

/// A response body that keeps its request counted as active until it is written out.
struct Tracked {
    body: Body,
    _active: ActiveGuard,
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = crate::wire::answer::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<bytes::Bytes>, crate::wire::answer::BodyError>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::answer::{Refusal, full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client connection accepted has TCP keep-alive on: a client or peer activator gone
    /// without a word (its FIN dropped in a partition) does not hold the drain for ever.
    #[tokio::test]
    async fn an_accepted_connection_probes_a_silent_client() {
        use crate::wire::connect::{KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (stream, _, placed) = next_connection(&l, &CancellationToken::new(), &mut None)
            .await
            .unwrap();
        assert!(placed.is_none());
        let s = socket2::SockRef::from(&stream);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(s.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(s.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
    }

    /// What a client writing `request` on one connection reads back until it is closed.
    async fn exchange(request: &[u8]) -> String {
        let (server, mut client) = tokio::io::duplex(1 << 16);
        let handle = Arc::new(|req: Request<Incoming>| async move {
            match req.uri().path() {
                // An app's bare 400, proxied: not one of hyper's own, however it looks.
                "/bare-400" => {
                    let mut r = Response::new(full(""));
                    *r.status_mut() = StatusCode::BAD_REQUEST;
                    r
                }
                // The same, closing the connection: byte for byte what hyper writes itself.
                "/bare-400-close" => {
                    let mut r = Response::new(full(""));
                    *r.status_mut() = StatusCode::BAD_REQUEST;
                    r.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                    r
                }
                "/refused" => Refusal::bad_request("the handler's reason").into_response(),
                _ => Response::new(full("fine\n")),
            }
        });
        let peer = SocketAddr::from(([127, 0, 0, 9], 4000));
        tokio::spawn(connection(&builder(), server, peer, handle));
        client.write_all(request).await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn garbage_is_answered_400_with_a_body() {
        let out = exchange(b"this is not http\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
        assert!(out.ends_with("could not be parsed\n"), "{out}");
    }

    #[tokio::test]
    async fn a_handler_answer_shaped_like_hypers_own_is_left_alone() {
        let out = exchange(b"GET /bare-400-close HTTP/1.1\r\nhost: a\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\n"), "no body added: {out}");
    }

    #[tokio::test]
    async fn too_many_headers_are_answered_431_with_a_body() {
        let mut req = String::from("GET / HTTP/1.1\r\nhost: a\r\n");
        for i in 0..150 {
            req.push_str(&format!("x-{i}: {i}\r\n"));
        }
        req.push_str("\r\n");
        let out = exchange(req.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(out.ends_with("too large or too many\n"), "{out}");
    }

    #[tokio::test]
    async fn the_handlers_answers_are_never_rewritten_and_garbage_after_them_is() {
        let out = exchange(
            b"GET /bare-400 HTTP/1.1\r\nhost: a\r\n\r\n\
              GET /refused HTTP/1.1\r\nhost: a\r\n\r\n\
              GET /ok HTTP/1.1\r\nhost: a\r\n\r\n\
              nonsense\r\n\r\n",
        )
        .await;
        let answers: Vec<&str> = out.split("HTTP/1.1 ").skip(1).collect();
        assert_eq!(answers.len(), 4, "{out}");
        assert!(answers[0].starts_with("400 "), "{out}");
        assert!(
            answers[0].contains("content-length: 0\r\n"),
            "left bare: {out}"
        );
        assert!(answers[1].ends_with("the handler's reason\n"), "{out}");
        assert!(answers[2].ends_with("fine\n"), "{out}");
        assert!(answers[3].starts_with("400 "), "{out}");
        assert!(answers[3].ends_with("could not be parsed\n"), "{out}");
    }
}
