//! Opening a TCP connection to a pod or a peer, bounded: the one helper the pools of both
//! request paths use (`h1.rs`, `h2c.rs`, `fast/pod_conns.rs`).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// When a second attempt goes out while the first has no answer, then each next one after
/// twice the previous wait. A pod on this node, or a peer in the cluster, answers a SYN
/// within a millisecond or so; one unanswered after 100 ms was dropped (an app whose accept
/// queue is full drops SYNs without a word: its accept loop starved of CPU, by an image pull
/// for one), and the kernel sends it again only after its initial retransmission timeout,
/// one second. Each attempt is a new socket raced against those still pending: the first to
/// connect wins, the others are closed.
pub const RESEND_AFTER: Duration = Duration::from_millis(100);

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
/// writes that must go at once) and [`keep_alive`] on.
pub async fn connect(target: SocketAddr, limit: Duration) -> Result<TcpStream, ConnectError> {
    let stream = race(limit, RESEND_AFTER, || TcpStream::connect(target)).await?;
    let _ = stream.set_nodelay(true);
    keep_alive(&stream);
    Ok(stream)
}

/// How long a connection may be silent before the kernel probes its peer, how often it probes
/// then, and how many unanswered probes end the connection: a peer gone without a word is
/// found within 15 s + 3 × 5 s of silence.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
pub const KEEPALIVE_PROBES: u32 = 3;

/// TCP keep-alive on `stream`. A peer that vanished without a FIN or a reset (a pod whose
/// network namespace was removed while its packets were dropped, a peer activator that gave
/// up during a partition) leaves the connection open for ever otherwise: a request waiting
/// for an app's answer that will never come held an activator's drain for its full 90 s on
/// the repo's cluster, and with it the DaemonSet's rolling update. A live peer's kernel
/// answers the probes, however long its app takes, so a slow app is not cut short (that is
/// the revision's `timeoutSeconds`).
pub fn keep_alive(stream: &TcpStream) {
    let params = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&params) {
        tracing::debug!(error = %e, "TCP keep-alive");
    }
}

/// Attempts from `dial`: one now, another `resend` later if none has connected, the next
/// after twice that wait, and so on, all pending at once, until one connects or `limit` is
/// over. An attempt that fails (refused, unreachable) ends the race with its error: only
/// silence is resent.
pub(crate) async fn race<T, F, Fut>(
    limit: Duration,
    resend: Duration,
    mut dial: F,
) -> Result<T, ConnectError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<T>>,
{
    let deadline = Instant::now() + limit;
    let mut pending = FuturesUnordered::new();
    pending.push(dial());
    let mut wait = resend;
    let mut next = Instant::now() + wait;
    loop {
        tokio::select! {
            Some(done) = pending.next() => return done.map_err(ConnectError::Connect),
            _ = tokio::time::sleep_until(deadline) => return Err(ConnectError::Timeout(limit)),
            _ = tokio::time::sleep_until(next), if next < deadline => {
                pending.push(dial());
                wait *= 2;
                next = Instant::now() + wait;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The first attempt never gets an answer (its SYN was dropped); the second, sent after
    /// `resend`, connects: the race returns the second's connection without waiting for the
    /// first.
    #[tokio::test(start_paused = true)]
    async fn a_silent_attempt_is_raced_by_a_second_one() {
        let n = Arc::new(AtomicUsize::new(0));
        let dial = || {
            let i = n.fetch_add(1, Ordering::SeqCst);
            async move {
                if i == 0 {
                    std::future::pending::<()>().await;
                }
                Ok(i)
            }
        };
        let t0 = Instant::now();
        let got = race(Duration::from_secs(2), Duration::from_millis(100), dial).await;
        assert_eq!(got.unwrap(), 1, "the second attempt's connection");
        assert_eq!(n.load(Ordering::SeqCst), 2, "no third attempt");
        assert_eq!(t0.elapsed(), Duration::from_millis(100));
    }

    /// Silence all along: attempts at 0, 100, 300, 700, 1500 ms, then the limit.
    #[tokio::test(start_paused = true)]
    async fn silence_is_resent_with_doubling_waits_until_the_limit() {
        let n = Arc::new(AtomicUsize::new(0));
        let dial = || {
            n.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<std::io::Result<()>>()
        };
        let got = race(Duration::from_secs(2), Duration::from_millis(100), dial).await;
        assert!(matches!(got, Err(ConnectError::Timeout(_))), "{got:?}");
        assert_eq!(n.load(Ordering::SeqCst), 5);
    }

    /// Every connection made has TCP keep-alive on, with the probes' timing set (the kernel's
    /// default waits two hours before its first probe).
    #[tokio::test]
    async fn a_connection_made_probes_a_silent_peer() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = connect(l.local_addr().unwrap(), Duration::from_secs(2))
            .await
            .unwrap();
        let s = socket2::SockRef::from(&c);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(s.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(s.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        assert!(c.nodelay().unwrap());
    }

    /// A refusal is an answer: it ends the race at once, with no further attempt.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_not_resent() {
        let n = Arc::new(AtomicUsize::new(0));
        let dial = || {
            n.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) }
        };
        let got = race(Duration::from_secs(2), Duration::from_millis(100), dial).await;
        assert!(matches!(got, Err(ConnectError::Connect(_))), "{got:?}");
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    /// On real sockets: a listener whose accept queue is full drops the SYN of a new
    /// connection; once one queued connection is accepted, the next attempt gets in, and the
    /// connection made is a working one.
    #[tokio::test]
    async fn a_full_accept_queue_is_got_through_once_it_drains() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = sock.listen(1).unwrap();
        let addr = l.local_addr().unwrap();
        // Fill the queue (backlog 1 holds two on Linux), accepting none.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"hold").await.unwrap();
            held.push(c);
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            // Drain once the client is trying, then serve whatever connects.
            rx.await.unwrap();
            let mut out = Vec::new();
            loop {
                let (mut c, _) = l.accept().await.unwrap();
                let mut b = [0u8; 4];
                if c.read_exact(&mut b).await.is_ok() && &b == b"ping" {
                    c.write_all(b"pong").await.unwrap();
                    return out;
                }
                out.push(c);
            }
        });
        let client = tokio::spawn(connect(addr, Duration::from_secs(10)));
        tokio::task::yield_now().await;
        tx.send(()).unwrap();
        let mut c = client
            .await
            .unwrap()
            .expect("connected once the queue drained");
        c.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
        drop(server.await.unwrap());
    }
}
