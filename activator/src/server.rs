//! Accepting connections (HTTP/1.1 and h2c, with upgrades) until told to stop, then letting
//! in-flight requests finish. Each request carries its client's address ([`ClientAddr`]) for
//! the forwarding headers, and requests hyper cannot parse are answered with a short body
//! ([`crate::parse_errors`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::answer::Body;
use crate::fast::FastLane;
use crate::fast::prefixed::Prefixed;
use crate::forwarded::ClientAddr;
use crate::metrics::Metrics;
use crate::parse_errors::{ActiveGuard, ConnState, ErrorBodies};
use crate::placement::{Placed, Placement};

/// How long a client may take to send a request's head before its connection is closed
/// (hyper's default, which needs a timer to be enforced).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

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
    serve_with(listener, stop, drain, handle, None, None).await
}

/// A connection moved to the thread that serves it.
pub type Handoff = (std::net::TcpStream, SocketAddr);

/// How often each serving thread reports how busy it was.
const LOAD_TICK: Duration = Duration::from_millis(100);

/// A serving thread's part in [`Placement`]: which thread it is and every thread's inbox of
/// connections moved to it.
pub struct Mover {
    pub index: usize,
    pub placement: Arc<Placement>,
    inboxes: Vec<mpsc::UnboundedSender<Handoff>>,
    metrics: Arc<Metrics>,
}

/// A serving thread's [`Mover`] and its own inbox.
pub struct Threaded {
    pub mover: Arc<Mover>,
    inbox: mpsc::UnboundedReceiver<Handoff>,
}

impl Threaded {
    /// Every serving thread's part, one each, sharing `placement`.
    pub fn all(placement: &Arc<Placement>, metrics: &Arc<Metrics>) -> Vec<Self> {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..placement.threads())
            .map(|_| mpsc::unbounded_channel())
            .unzip();
        rxs.into_iter()
            .enumerate()
            .map(|(index, inbox)| Self {
                mover: Arc::new(Mover {
                    index,
                    placement: placement.clone(),
                    inboxes: txs.clone(),
                    metrics: metrics.clone(),
                }),
                inbox,
            })
            .collect()
    }

    /// A connection another thread moved here.
    async fn moved_in(&mut self) -> Option<(TcpStream, SocketAddr, Placed)> {
        loop {
            let (std, peer) = self.inbox.recv().await?;
            match TcpStream::from_std(std) {
                Ok(s) => {
                    let placed = self.mover.placement.enter(self.mover.index);
                    return Some((s, peer, placed));
                }
                Err(e) => tracing::debug!(error = %e, "taking a moved connection"),
            }
        }
    }
}

impl Mover {
    /// Where a connection just accepted here is served: None when it was moved to another
    /// thread, else here, counted.
    fn place(&self, stream: TcpStream, peer: SocketAddr) -> Option<(TcpStream, Placed)> {
        let to = self.placement.choose(self.index);
        let stream = if to == self.index {
            stream
        } else {
            match self.send(to, stream, peer) {
                Ok(()) => {
                    self.metrics.moved_on_accept.inc();
                    return None;
                }
                Err(back) => back,
            }
        };
        Some((stream, self.placement.enter(self.index)))
    }

    /// Between two requests: moves `stream` off this thread if it is hot and another is
    /// cool; gives it back when it stays.
    pub fn move_if_hot(&self, stream: TcpStream, peer: SocketAddr) -> Result<(), TcpStream> {
        let Some(to) = self.placement.move_to(self.index) else {
            return Err(stream);
        };
        self.send(to, stream, peer)?;
        self.metrics.moved_off_hot_thread.inc();
        Ok(())
    }

    /// Moves `stream` to thread `to`; gives it back if that thread has stopped.
    fn send(&self, to: usize, stream: TcpStream, peer: SocketAddr) -> Result<(), TcpStream> {
        // Out of this thread's event loop, into that one's when it takes it.
        let std = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "moving a connection to another thread");
                return Ok(());
            }
        };
        match self.inboxes[to].send((std, peer)) {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError((std, _))) => match TcpStream::from_std(std) {
                Ok(s) => Err(s),
                Err(_) => Ok(()),
            },
        }
    }

    /// Reports this thread's busy share to the placement every tick until `stop`.
    pub async fn measure(self: Arc<Self>, stop: CancellationToken) {
        let metrics = tokio::runtime::Handle::current().metrics();
        let mut tick = tokio::time::interval(LOAD_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut busy, mut at) = (metrics.worker_total_busy_duration(0), Instant::now());
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (b, now) = (metrics.worker_total_busy_duration(0), Instant::now());
            let wall = now.duration_since(at).as_secs_f64();
            let share = b.saturating_sub(busy).as_secs_f64() / wall.max(1e-6);
            let share = (share * 1000.0).min(1000.0) as u32;
            self.placement.record(self.index, share);
            tracing::trace!(
                thread = self.index,
                busy = share,
                conns = self.placement.conns(self.index),
                "load"
            );
            (busy, at) = (b, now);
        }
    }
}

/// Never resolves when there is no placement (one serving thread).
async fn moved_in(threaded: &mut Option<Threaded>) -> Option<(TcpStream, SocketAddr, Placed)> {
    match threaded {
        Some(t) => t.moved_in().await,
        None => std::future::pending().await,
    }
}

/// [`serve`], with each connection starting in `fast` (the fast lane) when given: hyper
/// serves a connection from the request the fast lane hands over (see [`crate::fast`]).
/// With `threaded`, a connection is served on the thread its [`Placement`] chooses.
pub async fn serve_with<H, F>(
    listener: TcpListener,
    stop: CancellationToken,
    drain: Duration,
    handle: H,
    fast: Option<Arc<FastLane>>,
    mut threaded: Option<Threaded>,
) where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let handle = Arc::new(handle);
    let full = Arc::new(builder());
    // For a connection handed over while stopping: hyper serves the request it was given and
    // closes. (A watched connection told to shut down before hyper read the request would
    // close without it.)
    let last = Arc::new({
        let mut b = builder();
        b.http1().keep_alive(false);
        b
    });
    let graceful = GracefulShutdown::new();
    if let Some(t) = &threaded {
        tokio::spawn(t.mover.clone().measure(stop.clone()));
    }
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            a = listener.accept() => a.map(|(s, p)| (s, p, None)),
            Some((stream, peer, placed)) = moved_in(&mut threaded) => Ok((stream, peer, Some(placed))),
        };
        let (stream, peer, placed) = match accepted {
            Ok((stream, peer, Some(placed))) => (stream, peer, Some(placed)),
            Ok((stream, peer, None)) => {
                let _ = stream.set_nodelay(true);
                match &threaded {
                    None => (stream, peer, None),
                    Some(t) => match t.mover.place(stream, peer) {
                        Some((stream, placed)) => (stream, peer, Some(placed)),
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
        };
        let Some(fast) = &fast else {
            let conn = connection(&full, stream, peer, handle.clone());
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                let _placed = placed;
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
            continue;
        };
        // Held until the connection ends, so that the drain waits for it.
        let watcher = graceful.watcher();
        let mover = threaded.as_ref().map(|t| t.mover.clone());
        let (fast, full, last, handle, stop) = (
            fast.clone(),
            full.clone(),
            last.clone(),
            handle.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let _placed = placed;
            let Some((read, stream)) = fast.serve(stream, peer, mover.as_deref()).await else {
                return;
            };
            let io = Prefixed::new(read, stream);
            let served = if stop.is_cancelled() {
                connection(&last, io, peer, handle).await
            } else {
                watcher.watch(connection(&full, io, peer, handle)).await
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    // Connections moved here but not taken yet: each gets its request answered (another
    // thread finds this inbox closed from now on and keeps what it would have moved).
    if let Some(t) = &mut threaded {
        t.inbox.close();
        while let Ok((std, peer)) = t.inbox.try_recv() {
            let Ok(stream) = TcpStream::from_std(std) else {
                continue;
            };
            let conn = graceful.watch(connection(&last, stream, peer, handle.clone()));
            tokio::spawn(conn);
        }
    }
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?drain,
            "connections still open after the drain period; closing them"
        );
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
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<bytes::Bytes>, hyper::Error>>> {
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
    use crate::answer::{Refusal, full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    /// Serving threads, each its own runtime, answering with the name of the thread that
    /// served the request; only the last one's listener is reachable (`listen`), so every
    /// connection is accepted there and placed from there.
    fn serving_threads(
        placement: &Arc<Placement>,
        metrics: &Arc<Metrics>,
        listen: SocketAddr,
        stop: &CancellationToken,
    ) -> Vec<std::thread::JoinHandle<()>> {
        let last = placement.threads() - 1;
        Threaded::all(placement, metrics)
            .into_iter()
            .enumerate()
            .map(|(i, threaded)| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("io-{i}"))
                    .spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .unwrap();
                        rt.block_on(async move {
                            let addr = if i == last {
                                listen
                            } else {
                                SocketAddr::from(([127, 0, 0, 1], 0))
                            };
                            let l = TcpListener::bind(addr).await.unwrap();
                            let handle = |_req: Request<Incoming>| async {
                                let name = std::thread::current().name().unwrap_or("").to_string();
                                Response::new(crate::answer::full(name))
                            };
                            serve_with(
                                l,
                                stop,
                                Duration::from_secs(1),
                                handle,
                                None,
                                Some(threaded),
                            )
                            .await;
                        });
                    })
                    .unwrap()
            })
            .collect()
    }

    /// The thread that answers one request on `conn`.
    async fn served_on(conn: &mut tokio::net::TcpStream) -> String {
        conn.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some(body) = text.split("\r\n\r\n").nth(1)
                && body.starts_with("io-")
                && body.len() >= 4
            {
                return body.to_string();
            }
        }
    }

    #[tokio::test]
    async fn connections_are_served_on_the_thread_their_placement_chooses() {
        // Take a free port, then let the last serving thread listen on it.
        let listen = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let placement = Placement::new(3, 2);
        let metrics = Arc::new(Metrics::default());
        let stop = CancellationToken::new();
        let threads = serving_threads(&placement, &metrics, listen, &stop);
        let mut conns = Vec::new();
        let mut on = Vec::new();
        for _ in 0..7 {
            let mut c = loop {
                match tokio::net::TcpStream::connect(listen).await {
                    Ok(c) => break c,
                    Err(_) => tokio::task::yield_now().await,
                }
            };
            on.push(served_on(&mut c).await);
            // The same connection stays where it was placed.
            assert_eq!(served_on(&mut c).await, *on.last().unwrap());
            conns.push(c);
        }
        // Two each (all accepted by io-2, four of them moved), then the fewest (a tie: where
        // it was accepted).
        assert_eq!(on, ["io-0", "io-0", "io-1", "io-1", "io-2", "io-2", "io-2"]);
        assert_eq!(
            (placement.conns(0), placement.conns(1), placement.conns(2)),
            (2, 2, 3)
        );
        // A connection closed is no longer counted: io-0 has room again.
        drop(conns.remove(0));
        let counted = async {
            while placement.conns(0) != 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), counted)
            .await
            .expect("the closed connection is still counted");
        let mut c = tokio::net::TcpStream::connect(listen).await.unwrap();
        assert_eq!(served_on(&mut c).await, "io-0");
        stop.cancel();
        for t in threads {
            t.join().unwrap();
        }
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
