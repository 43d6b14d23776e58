//! The agent's side of the socket: reads requests from a client it does not trust, asks a
//! [`Backend`], answers. Everything a peer can make it spend is bounded: connections
//! (`max_connections`), memory per connection (one request line), time per line and per idle
//! connection, and time per backend call.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::error::BackendError;
use crate::image::{Credentials, ImageId, ImageInfo, ImageRef};
use crate::line::{LineError, LineReader};
use crate::protocol::{Answer, BAD_REQUEST, MAX_ANY_REQUEST_LINE, PodUid, PullFailure, Request};

/// What [`Backend::pod_addr`] returns: a boxed future, so the trait stays object-safe without
/// async-trait.
pub type BackendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<IpAddr>, BackendError>> + Send + 'a>>;

/// What [`Backend::image_status`] returns.
pub type ImageFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<ImageInfo>, BackendError>> + Send + 'a>>;

/// What [`Backend::pull_image`] returns. A failure's reason should be one of
/// [`PullFailure`]'s, so the activator can tell a transient failure from a final one.
pub type PullFuture<'a> = Pin<Box<dyn Future<Output = Result<ImageId, BackendError>> + Send + 'a>>;

/// Where answers come from: the CRI in production, a fake in tests and in kubesim.
pub trait Backend: Send + Sync {
    /// The address of the newest ready sandbox of the pod with this UID, `None` when there is
    /// none (yet) or it has no address.
    fn pod_addr<'a>(&'a self, uid: &'a PodUid) -> BackendFuture<'a>;

    /// The image with this reference, if the runtime holds it. A backend without images (the
    /// simulated nodes) answers `error unsupported`.
    fn image_status<'a>(&'a self, _image: &'a ImageRef) -> ImageFuture<'a> {
        Box::pin(async { Err(BackendError::new(UNSUPPORTED)) })
    }

    /// Pulls the image, with the credentials given.
    fn pull_image<'a>(
        &'a self,
        _image: &'a ImageRef,
        _auth: Option<&'a Credentials>,
    ) -> PullFuture<'a> {
        Box::pin(async { Err(BackendError::new(UNSUPPORTED)) })
    }
}

/// The reason a backend without images gives.
pub const UNSUPPORTED: &str = "unsupported";

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Connections served at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// From the first byte of a request line to its "\n".
    pub line_timeout: Duration,
    /// From an answer (or the connection's start) to the first byte of the next request.
    pub idle_timeout: Duration,
    /// One backend call; past it the answer is `error backend timeout`.
    pub backend_timeout: Duration,
    /// The only peer uid served (the activator container's `runAsUser`); `None` serves any.
    pub allowed_uid: Option<u32>,
    /// One image pull; past it the answer is `error runtime timeout`. Pulls of large images
    /// from a slow registry take minutes.
    pub pull_timeout: Duration,
    /// Pulls in flight at once, over all connections; one more is answered `error busy`.
    pub max_pulls: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 16,
            line_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            backend_timeout: Duration::from_secs(3),
            allowed_uid: None,
            pull_timeout: Duration::from_secs(600),
            max_pulls: 2,
        }
    }
}

/// How long to wait after a failed accept (out of file descriptors, say) before the next: a
/// loop that retried at once would spin on the same error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `listener` until `stop` is cancelled; then closes every open connection and returns
/// once all of them have ended.
pub async fn serve(
    listener: UnixListener,
    backend: Arc<dyn Backend>,
    cfg: ServerConfig,
    stop: CancellationToken,
) {
    let max = cfg.max_connections.min(Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    let pulls = Arc::new(Semaphore::new(cfg.max_pulls.min(Semaphore::MAX_PERMITS)));
    let cfg = Arc::new(cfg);
    let mut refused: u64 = 0;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accepting a connection failed");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            tracing::debug!(
                refused_total = refused,
                max_connections = max,
                "connection limit reached: closed a new connection"
            );
            drop(stream);
            continue;
        };
        let (backend, cfg, stop, pulls) =
            (backend.clone(), cfg.clone(), stop.clone(), pulls.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = connection(stream, backend.as_ref(), &cfg, &pulls) => {}
            }
            drop(slot);
        });
    }
    // Every connection task holds one permit until it ends.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    if let Ok(permits) = slots.acquire_many(all).await {
        drop(permits);
    }
}

async fn connection(
    stream: UnixStream,
    backend: &dyn Backend,
    cfg: &ServerConfig,
    pulls: &Semaphore,
) {
    if let Some(allowed) = cfg.allowed_uid {
        // Checked before reading a byte: another process on the node that can reach the
        // emptyDir (a compromised neighbour) gets nothing, not even a parse error.
        match stream.peer_cred() {
            Ok(cred) if cred.uid() == allowed => {}
            Ok(cred) => {
                tracing::warn!(
                    peer_uid = cred.uid(),
                    peer_pid = ?cred.pid(),
                    allowed_uid = allowed,
                    "closed a connection from a uid that is not the activator's"
                );
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "closed a connection whose peer credentials are unreadable");
                return;
            }
        }
    }
    // Up to the longest verb's bound (a pull with credentials); each verb's own bound is
    // checked by the parser.
    let mut lines = LineReader::new(stream, MAX_ANY_REQUEST_LINE);
    loop {
        let line = match lines
            .next_line(Some(cfg.idle_timeout), Some(cfg.line_timeout))
            .await
        {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(error @ (LineError::TooLong | LineError::Truncated)) => {
                tracing::debug!(?error, "malformed request: closing");
                reply(&mut lines, &Answer::error(BAD_REQUEST), cfg).await;
                return;
            }
            Err(error) => {
                tracing::debug!(?error, "closing a connection");
                return;
            }
        };
        let answer = match Request::parse(&line) {
            Ok(Request::Ping) => Answer::Pong,
            Ok(Request::Addr(uid)) => lookup(backend, &uid, cfg).await,
            Ok(Request::Image(image)) => image_status(backend, &image, cfg).await,
            Ok(Request::Pull { image, auth }) => {
                pull(backend, &image, auth.as_ref(), cfg, pulls).await
            }
            Err(error) => {
                // Debug, not warn: a hostile client could otherwise fill the node's logs.
                tracing::debug!(%error, "malformed request: closing");
                reply(&mut lines, &Answer::error(BAD_REQUEST), cfg).await;
                return;
            }
        };
        if !reply(&mut lines, &answer, cfg).await {
            return;
        }
    }
}

async fn lookup(backend: &dyn Backend, uid: &PodUid, cfg: &ServerConfig) -> Answer {
    match tokio::time::timeout(cfg.backend_timeout, backend.pod_addr(uid)).await {
        Ok(Ok(Some(ip))) => Answer::Addr(ip),
        Ok(Ok(None)) => Answer::None,
        Ok(Err(error)) => {
            tracing::debug!(%uid, %error, "backend error");
            Answer::error(&error.reason)
        }
        Err(_) => {
            tracing::debug!(%uid, "backend timeout");
            Answer::error("backend timeout")
        }
    }
}

async fn image_status(backend: &dyn Backend, image: &ImageRef, cfg: &ServerConfig) -> Answer {
    match tokio::time::timeout(cfg.backend_timeout, backend.image_status(image)).await {
        Ok(Ok(Some(info))) => Answer::Present(info),
        Ok(Ok(None)) => Answer::None,
        Ok(Err(error)) => {
            tracing::debug!(%image, %error, "backend error");
            Answer::error(&error.reason)
        }
        Err(_) => Answer::error("backend timeout"),
    }
}

/// One pull, if a pull slot is free; the slot is held until the runtime answers or the pull
/// timeout passes.
async fn pull(
    backend: &dyn Backend,
    image: &ImageRef,
    auth: Option<&Credentials>,
    cfg: &ServerConfig,
    pulls: &Semaphore,
) -> Answer {
    let Ok(_slot) = pulls.try_acquire() else {
        tracing::debug!(%image, "pull refused: every pull slot is taken");
        return Answer::error(PullFailure::BUSY);
    };
    let started = tokio::time::Instant::now();
    // Never the credentials in a log line: the username at most.
    let user = auth.map(Credentials::username);
    tracing::info!(%image, ?user, "pulling");
    match tokio::time::timeout(cfg.pull_timeout, backend.pull_image(image, auth)).await {
        Ok(Ok(id)) => {
            tracing::info!(%image, %id, took = ?started.elapsed(), "pulled");
            Answer::Pulled(id)
        }
        Ok(Err(error)) => {
            tracing::info!(%image, %error, took = ?started.elapsed(), "pull failed");
            Answer::error(&error.reason)
        }
        Err(_) => {
            tracing::warn!(%image, timeout = ?cfg.pull_timeout, "pull timed out");
            Answer::error(PullFailure::RUNTIME_TIMEOUT)
        }
    }
}

/// Writes one answer; false when the connection is no longer usable. Bounded by the line
/// timeout: a client that pipelines requests without ever reading its answers would otherwise
/// park this task once the socket buffer is full.
async fn reply(lines: &mut LineReader<UnixStream>, answer: &Answer, cfg: &ServerConfig) -> bool {
    let bytes = answer.encode();
    matches!(
        tokio::time::timeout(cfg.line_timeout, lines.get_mut().write_all(&bytes)).await,
        Ok(Ok(()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{FakeBackend, Server, UID_A, UID_B, UID_ERR, UID_SLOW, current_uid};
    use tokio::io::AsyncReadExt;

    /// Reads until the agent closes, with a bound so a bug fails the test instead of hanging.
    async fn read_to_close(s: &mut UnixStream) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .expect("the agent did not close the connection")
            {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                // Closing with our unread bytes in its buffer can reset the connection.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    async fn ask(s: &mut UnixStream, line: &str) -> String {
        s.write_all(line.as_bytes()).await.unwrap();
        read_line(s).await
    }

    async fn read_line(s: &mut UnixStream) -> String {
        let mut out = Vec::new();
        let mut b = [0u8; 1];
        while !out.ends_with(b"\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
                .await
                .expect("no answer")
                .unwrap();
            assert_ne!(n, 0, "closed after {:?}", String::from_utf8_lossy(&out));
            out.push(b[0]);
        }
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn answers_ping_addr_and_none() {
        let server = Server::start(ServerConfig::default()).await;
        let mut s = server.connect().await;
        assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
        assert_eq!(
            ask(&mut s, &format!("addr {UID_A}\n")).await,
            "addr 10.244.0.7\n"
        );
        assert_eq!(
            ask(&mut s, &format!("addr {UID_B}\n")).await,
            "addr fd00::17\n"
        );
        let unknown = "00000000-0000-0000-0000-000000000000";
        assert_eq!(ask(&mut s, &format!("addr {unknown}\n")).await, "none\n");
        server.stop().await;
    }

    #[tokio::test]
    async fn an_overlong_line_is_refused_without_reading_it_all() {
        let server = Server::start(ServerConfig::default()).await;
        let s = server.connect().await;
        let (mut rd, mut wr) = s.into_split();
        // Far more than the socket buffers hold: if the agent read it all, every write would
        // succeed; since it stops after 64 bytes and closes, the writes fail.
        let writer = tokio::spawn(async move {
            let chunk = vec![b'a'; 64 * 1024];
            for _ in 0..256 {
                if wr.write_all(&chunk).await.is_err() {
                    return false;
                }
            }
            true
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), rd.read(&mut buf))
                .await
                .expect("no close")
            {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        assert_eq!(got, b"error bad request\n");
        assert!(!writer.await.unwrap(), "the agent took 16 MiB of one line");
        server.stop().await;
    }

    #[tokio::test]
    async fn a_10k_line_gets_bad_request_and_close() {
        let server = Server::start(ServerConfig::default()).await;
        let mut s = server.connect().await;
        s.write_all(&[b'x'; 10 * 1024]).await.unwrap();
        assert_eq!(read_to_close(&mut s).await, b"error bad request\n");
        server.stop().await;
    }

    #[tokio::test]
    async fn slowloris_is_closed_after_the_line_timeout() {
        let line_timeout = Duration::from_millis(300);
        let server = Server::start(ServerConfig {
            line_timeout,
            ..ServerConfig::default()
        })
        .await;
        let mut s = server.connect().await;
        // Served before the half line: the clock below starts with a known-open connection.
        assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
        let started = tokio::time::Instant::now();
        s.write_all(b"addr 0f1e2d3c").await.unwrap();
        let got = read_to_close(&mut s).await;
        assert!(got.is_empty(), "{got:?}");
        assert!(started.elapsed() >= line_timeout, "{:?}", started.elapsed());
        server.stop().await;
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_after_the_idle_timeout() {
        let idle_timeout = Duration::from_millis(300);
        let server = Server::start(ServerConfig {
            idle_timeout,
            ..ServerConfig::default()
        })
        .await;
        let mut s = server.connect().await;
        assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
        let started = tokio::time::Instant::now();
        assert!(read_to_close(&mut s).await.is_empty());
        assert!(started.elapsed() >= idle_timeout);
        server.stop().await;
    }

    #[tokio::test]
    async fn the_17th_connection_is_refused_while_16_are_open() {
        let server = Server::start(ServerConfig::default()).await;
        let mut open = Vec::new();
        for _ in 0..16 {
            let mut s = server.connect().await;
            // Answered: the agent has accepted it and holds a slot for it.
            assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
            open.push(s);
        }
        let mut extra = server.connect().await;
        // The write may fail if the agent has already closed it; the close is what matters.
        let _ = extra.write_all(b"ping\n").await;
        assert!(read_to_close(&mut extra).await.is_empty());
        // The 16 are still served.
        for s in &mut open {
            assert_eq!(ask(s, "ping\n").await, "pong\n");
        }
        // A slot frees when one of them ends; the agent notices the close asynchronously, so
        // poll (bounded) until a new connection is served.
        let mut last = open.pop().unwrap();
        last.shutdown().await.unwrap();
        assert!(read_to_close(&mut last).await.is_empty());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut s = server.connect().await;
            let _ = s.write_all(b"ping\n").await;
            let _ = s.shutdown().await;
            // Refused: closed at once, so this read ends with nothing.
            if read_to_close(&mut s).await == b"pong\n" {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "no slot freed");
            tokio::task::yield_now().await;
        }
        server.stop().await;
    }

    #[tokio::test]
    async fn crlf_is_refused() {
        let server = Server::start(ServerConfig::default()).await;
        let mut s = server.connect().await;
        s.write_all(b"ping\r\n").await.unwrap();
        assert_eq!(read_to_close(&mut s).await, b"error bad request\n");
        server.stop().await;
    }

    #[tokio::test]
    async fn binary_garbage_and_other_malformed_lines_are_refused() {
        let server = Server::start(ServerConfig::default()).await;
        let garbage: Vec<&[u8]> = vec![
            b"\x00\x01\x02\xff\xfe\n",
            b"\n",
            b"PING\n",
            b"ping \n",
            b"addr 0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0\n",
            b"addr\t0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n",
            b"GET / HTTP/1.1\r\n\r\n",
            "pïng\n".as_bytes(),
        ];
        for bytes in garbage {
            let mut s = server.connect().await;
            s.write_all(bytes).await.unwrap();
            assert_eq!(
                read_to_close(&mut s).await,
                b"error bad request\n",
                "{bytes:?}"
            );
        }
        // EOF in the middle of a line.
        let mut s = server.connect().await;
        s.write_all(b"pin").await.unwrap();
        s.shutdown().await.unwrap();
        assert_eq!(read_to_close(&mut s).await, b"error bad request\n");
        // The agent is still serving.
        let mut s = server.connect().await;
        assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
        server.stop().await;
    }

    #[tokio::test]
    async fn a_bad_line_after_good_ones_closes_after_answering_them() {
        let server = Server::start(ServerConfig::default()).await;
        let mut s = server.connect().await;
        s.write_all(b"ping\nping\nbogus\nping\n").await.unwrap();
        assert_eq!(
            read_to_close(&mut s).await,
            b"pong\npong\nerror bad request\n"
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order() {
        let server = Server::start(ServerConfig::default()).await;
        let mut s = server.connect().await;
        // The slow lookup comes first: its answer must still come first.
        let batch =
            format!("addr {UID_SLOW}\nping\naddr {UID_A}\naddr {UID_ERR}\naddr {UID_B}\nping\n");
        s.write_all(batch.as_bytes()).await.unwrap();
        let mut answers = Vec::new();
        for _ in 0..6 {
            answers.push(read_line(&mut s).await);
        }
        assert_eq!(
            answers,
            [
                "addr 10.244.0.99\n",
                "pong\n",
                "addr 10.244.0.7\n",
                "error cri said: no?\n",
                "addr fd00::17\n",
                "pong\n",
            ]
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn a_backend_error_is_answered_and_the_connection_stays_usable() {
        let server = Server::start(ServerConfig::default()).await;
        let mut s = server.connect().await;
        let answer = ask(&mut s, &format!("addr {UID_ERR}\n")).await;
        // The backend's reason had a newline in it: sanitised, still one line.
        assert_eq!(answer, "error cri said: no?\n");
        assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
        assert_eq!(
            ask(&mut s, &format!("addr {UID_A}\n")).await,
            "addr 10.244.0.7\n"
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn a_hung_backend_is_cut_by_the_backend_timeout() {
        let server = Server::start_with(
            ServerConfig {
                backend_timeout: Duration::from_millis(100),
                ..ServerConfig::default()
            },
            FakeBackend::hanging(),
        )
        .await;
        let mut s = server.connect().await;
        assert_eq!(
            ask(&mut s, &format!("addr {UID_A}\n")).await,
            "error backend timeout\n"
        );
        assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
        server.stop().await;
    }

    #[tokio::test]
    async fn a_peer_with_another_uid_is_closed_without_an_answer() {
        let me = current_uid();
        let server = Server::start(ServerConfig {
            allowed_uid: Some(me.wrapping_add(1)),
            ..ServerConfig::default()
        })
        .await;
        let mut s = server.connect().await;
        let _ = s.write_all(b"ping\n").await;
        assert!(read_to_close(&mut s).await.is_empty());
        server.stop().await;

        // And the right uid is served.
        let server = Server::start(ServerConfig {
            allowed_uid: Some(me),
            ..ServerConfig::default()
        })
        .await;
        let mut s = server.connect().await;
        assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
        server.stop().await;
    }

    #[tokio::test]
    async fn stop_closes_open_connections_and_returns() {
        let server = Server::start(ServerConfig::default()).await;
        let mut s = server.connect().await;
        assert_eq!(ask(&mut s, "ping\n").await, "pong\n");
        // `stop` awaits serve's return, which waits for every connection to end.
        server.stop().await;
        assert!(read_to_close(&mut s).await.is_empty());
    }
}

#[cfg(test)]
mod image_tests;
