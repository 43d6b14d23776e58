//! The activator's side: asks the node agent over its unix socket. Cheap to clone and safe to
//! use from many tasks at once; a few idle connections are kept for reuse, since a cold start
//! asks as soon as it has created a pod and a connect per question would be wasted time.
//!
//! The agent is privileged but not trusted blindly: its answers are parsed strictly and
//! bounded in size and time, and a connection that broke the protocol is never reused.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use crate::error::{ClientError, ProtocolError};
use crate::image::{Credentials, ImageId, ImageInfo, ImageRef};
use crate::line::{LineError, LineReader};
use crate::protocol::{Answer, MAX_ANSWER_LINE, PodUid, Request};

/// Idle connections kept for reuse.
pub const MAX_IDLE_CONNECTIONS: usize = 4;

/// The default bound on one exchange, connecting included.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    timeout: Duration,
    /// Never held across an await.
    idle: Mutex<Vec<Conn>>,
}

type Conn = LineReader<UnixStream>;

/// How one try on one connection ended, when it gave no answer.
enum Failure {
    /// Nothing came back: on a pooled connection, the agent had most likely closed it while
    /// it sat idle (its idle timeout, a restart), so a fresh connection is worth a try.
    NoAnswer(ClientError),
    /// Anything else: final.
    Final(ClientError),
}

impl AgentClient {
    /// A client of the agent listening at `path`. Connects on first use.
    pub fn new(path: impl Into<PathBuf>) -> AgentClient {
        AgentClient {
            inner: Arc::new(Inner {
                path: path.into(),
                timeout: EXCHANGE_TIMEOUT,
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The same client with another bound on each exchange.
    pub fn with_timeout(self, timeout: Duration) -> AgentClient {
        AgentClient {
            inner: Arc::new(Inner {
                path: self.inner.path.clone(),
                timeout,
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The address of the pod with this UID on this node, `None` when it has no ready sandbox
    /// with an address yet.
    pub async fn pod_addr(&self, uid: &PodUid) -> Result<Option<IpAddr>, ClientError> {
        match self.exchange(&Request::Addr(uid.clone())).await? {
            Answer::Addr(ip) => Ok(Some(ip)),
            Answer::None => Ok(None),
            Answer::Error(reason) => Err(ClientError::Agent(reason)),
            _ => Err(ClientError::Protocol(ProtocolError::Mismatch)),
        }
    }

    /// The image with this reference, if the node's runtime holds it (protocol v2).
    pub async fn image_status(&self, image: &ImageRef) -> Result<Option<ImageInfo>, ClientError> {
        match self.exchange(&Request::Image(image.clone())).await? {
            Answer::Present(info) => Ok(Some(info)),
            Answer::None => Ok(None),
            Answer::Error(reason) => Err(ClientError::Agent(reason)),
            _ => Err(ClientError::Protocol(ProtocolError::Mismatch)),
        }
    }

    /// Has the node's runtime pull the image (protocol v2). A pull takes minutes: use a
    /// client of its own, [`AgentClient::with_timeout`] above the agent's pull timeout, so
    /// its connections are not the ones `pod_addr` waits for. An `error` answer's reason is
    /// one of [`crate::protocol::PullFailure`]'s.
    pub async fn pull(
        &self,
        image: &ImageRef,
        auth: Option<&Credentials>,
    ) -> Result<ImageId, ClientError> {
        let request = Request::Pull {
            image: image.clone(),
            auth: auth.cloned(),
        };
        match self.exchange(&request).await? {
            Answer::Pulled(id) => Ok(id),
            Answer::Error(reason) => Err(ClientError::Agent(reason)),
            _ => Err(ClientError::Protocol(ProtocolError::Mismatch)),
        }
    }

    /// Whether the agent is there and answering.
    pub async fn ping(&self) -> Result<(), ClientError> {
        match self.exchange(&Request::Ping).await? {
            Answer::Pong => Ok(()),
            Answer::Error(reason) => Err(ClientError::Agent(reason)),
            _ => Err(ClientError::Protocol(ProtocolError::Mismatch)),
        }
    }

    async fn exchange(&self, request: &Request) -> Result<Answer, ClientError> {
        let line = request.encode();
        // On timeout the future is dropped with the connection it holds: a connection with an
        // answer still owed is never put back.
        tokio::time::timeout(self.inner.timeout, async {
            while let Some(conn) = self.take_idle() {
                match ask(conn, &line).await {
                    Ok((answer, conn)) => return Ok(self.keep(answer, conn)),
                    Err(Failure::NoAnswer(error)) => {
                        tracing::debug!(%error, "a pooled node agent connection was closed; trying another");
                    }
                    Err(Failure::Final(error)) => return Err(error),
                }
            }
            let stream = UnixStream::connect(&self.inner.path)
                .await
                .map_err(ClientError::Connect)?;
            match ask(LineReader::new(stream, MAX_ANSWER_LINE), &line).await {
                Ok((answer, conn)) => Ok(self.keep(answer, conn)),
                Err(Failure::NoAnswer(error) | Failure::Final(error)) => Err(error),
            }
        })
        .await
        .map_err(|_| ClientError::Timeout)?
    }

    fn take_idle(&self) -> Option<Conn> {
        lock(&self.inner.idle).pop()
    }

    fn keep(&self, answer: Answer, conn: Conn) -> Answer {
        let mut idle = lock(&self.inner.idle);
        if idle.len() < MAX_IDLE_CONNECTIONS {
            idle.push(conn);
        }
        answer
    }
}

/// The pool holds no invariant a panicking holder could break (push and pop only), so a
/// poisoned lock is used as it is.
fn lock(m: &Mutex<Vec<Conn>>) -> std::sync::MutexGuard<'_, Vec<Conn>> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One request and its answer on `conn`; the connection comes back only if it is fit for
/// reuse. The caller checks that the answer fits the request.
async fn ask(mut conn: Conn, line: &[u8]) -> Result<(Answer, Conn), Failure> {
    if let Err(error) = conn.get_mut().write_all(line).await {
        return Err(Failure::NoAnswer(ClientError::Io(error)));
    }
    let answer_line = match conn.next_line(None, None).await {
        Ok(Some(l)) => l,
        Ok(None) => return Err(Failure::NoAnswer(ClientError::Closed)),
        Err(LineError::Io(error)) => return Err(Failure::NoAnswer(ClientError::Io(error))),
        Err(LineError::TooLong) => {
            return Err(Failure::Final(ClientError::Protocol(
                ProtocolError::TooLong,
            )));
        }
        Err(LineError::Truncated) => {
            return Err(Failure::Final(ClientError::Protocol(
                ProtocolError::Unterminated,
            )));
        }
        // No timeouts are given to `next_line`: the whole exchange is bounded instead.
        Err(LineError::Idle | LineError::LineTimeout) => {
            return Err(Failure::Final(ClientError::Timeout));
        }
    };
    let answer = Answer::parse(&answer_line)
        .map_err(|error| Failure::Final(ClientError::Protocol(error)))?;
    // One request, one line: more bytes already waiting are not an answer to anything asked,
    // and would be taken for the next request's answer if the connection were reused.
    if conn.buffered() > 0 {
        return Err(Failure::Final(ClientError::Protocol(
            ProtocolError::Unsolicited,
        )));
    }
    let fits = matches!(
        (Request::parse(line), &answer),
        (Ok(Request::Ping), Answer::Pong | Answer::Error(_))
            | (
                Ok(Request::Addr(_)),
                Answer::Addr(_) | Answer::None | Answer::Error(_)
            )
            | (
                Ok(Request::Image(_)),
                Answer::Present(_) | Answer::None | Answer::Error(_)
            )
            | (
                Ok(Request::Pull { .. }),
                Answer::Pulled(_) | Answer::Error(_)
            )
    );
    if !fits {
        return Err(Failure::Final(ClientError::Protocol(
            ProtocolError::Mismatch,
        )));
    }
    Ok((answer, conn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::ServerConfig;
    use crate::testutil::{Server, UID_A, UID_B, UID_ERR, temp_dir};
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncReadExt;
    use tokio::net::UnixListener;

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }

    #[tokio::test]
    async fn asks_addr_none_error_and_ping() {
        let server = Server::start(ServerConfig::default()).await;
        let client = AgentClient::new(&server.path);
        client.ping().await.unwrap();
        assert_eq!(
            client.pod_addr(&uid(UID_A)).await.unwrap(),
            Some("10.244.0.7".parse().unwrap())
        );
        assert_eq!(
            client.pod_addr(&uid(UID_B)).await.unwrap(),
            Some("fd00::17".parse().unwrap())
        );
        assert_eq!(
            client
                .pod_addr(&uid("00000000-0000-0000-0000-000000000000"))
                .await
                .unwrap(),
            None
        );
        match client.pod_addr(&uid(UID_ERR)).await {
            Err(ClientError::Agent(reason)) => assert_eq!(reason, "cri said: no?"),
            other => panic!("{other:?}"),
        }
        // One connection served all of them, error answer included.
        assert_eq!(lock(&client.inner.idle).len(), 1);
        client.ping().await.unwrap();
        server.stop().await;
    }

    #[tokio::test]
    async fn many_tasks_at_once_share_at_most_four_idle_connections() {
        let server = Server::start(ServerConfig::default()).await;
        let client = AgentClient::new(&server.path);
        let mut tasks = Vec::new();
        for i in 0..12 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let which = if i % 2 == 0 { UID_A } else { UID_B };
                client.pod_addr(&uid(which)).await.unwrap().unwrap()
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(lock(&client.inner.idle).len() <= MAX_IDLE_CONNECTIONS);
        assert_eq!(server.backend.calls.load(Ordering::Relaxed), 12);
        server.stop().await;
    }

    #[tokio::test]
    async fn reconnects_after_the_agent_closed_an_idle_connection() {
        let server = Server::start(ServerConfig {
            idle_timeout: Duration::from_millis(100),
            ..ServerConfig::default()
        })
        .await;
        let client = AgentClient::new(&server.path);
        client.ping().await.unwrap();
        // Wait for the agent's idle close on the pooled connection itself (readable at EOF).
        let conn = client.take_idle().expect("a pooled connection");
        conn.get_ref().readable().await.unwrap();
        lock(&client.inner.idle).push(conn);
        assert_eq!(
            client.pod_addr(&uid(UID_A)).await.unwrap(),
            Some("10.244.0.7".parse().unwrap())
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn reconnects_after_the_agent_restarts() {
        let server = Server::start(ServerConfig::default()).await;
        let client = AgentClient::new(&server.path);
        for _ in 0..3 {
            let c = client.clone();
            // Three in parallel: several pooled connections, all of which go stale.
            let (a, b, d) = tokio::join!(c.ping(), c.ping(), c.ping());
            a.unwrap();
            b.unwrap();
            d.unwrap();
        }
        let (dir, path, backend) = server.stop_keeping().await;
        let server = Server::start_at(dir, path, ServerConfig::default(), backend);
        client.ping().await.unwrap();
        server.stop().await;
    }

    #[tokio::test]
    async fn no_agent_is_a_connect_error() {
        let dir = temp_dir();
        let client = AgentClient::new(dir.join("absent.sock"));
        assert!(matches!(client.ping().await, Err(ClientError::Connect(_))));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[derive(Clone, Copy)]
    enum Evil {
        /// Writes the reply once per request read, and keeps the connection.
        Once,
        /// Writes the reply once, then closes.
        OnceThenClose,
        /// Writes the reply over and over until the client goes away.
        Endless,
    }

    /// A fake agent: a raw listener that answers each request with `reply`, bytes as they are.
    fn malicious_agent(reply: &'static [u8], how: Evil) -> (AgentClient, PathBuf) {
        let dir = temp_dir();
        let path = dir.join("evil.sock");
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        loop {
                            if s.write_all(reply).await.is_err() {
                                return;
                            }
                            match how {
                                Evil::Once => break,
                                Evil::OnceThenClose => return,
                                Evil::Endless => {}
                            }
                        }
                    }
                });
            }
        });
        (
            AgentClient::new(&path).with_timeout(Duration::from_secs(5)),
            dir,
        )
    }

    async fn against(reply: &'static [u8], how: Evil) -> Result<Option<IpAddr>, ClientError> {
        let (client, dir) = malicious_agent(reply, how);
        let got = client.pod_addr(&uid(UID_A)).await;
        // A connection that broke the protocol is not kept.
        if got.is_err() {
            assert!(lock(&client.inner.idle).is_empty(), "{reply:?}");
        }
        let _ = std::fs::remove_dir_all(dir);
        got
    }

    #[tokio::test]
    async fn a_malicious_agent_gives_protocol_errors_not_panics_or_hangs() {
        let cases: [(&[u8], Evil, ProtocolError); 14] = [
            (b"addr 999.1.1.1\n", Evil::Once, ProtocolError::BadAddress),
            (b"addr 10.0.0.1 \n", Evil::Once, ProtocolError::BadAddress),
            (b"addr 10.0.0.1\r\n", Evil::Once, ProtocolError::BadByte),
            (b"addr \xff\xff\n", Evil::Once, ProtocolError::BadByte),
            (b"garbage\n", Evil::Once, ProtocolError::UnknownVerb),
            (b"\n", Evil::Once, ProtocolError::Empty),
            (b"pong\n", Evil::Once, ProtocolError::Mismatch),
            (b"none\nnone\n", Evil::Once, ProtocolError::Unsolicited),
            (b"error \n", Evil::Once, ProtocolError::BadReason),
            (b"error bell\x07\n", Evil::Once, ProtocolError::BadByte),
            (
                b"HTTP/1.1 200 OK\r\n\r\n",
                Evil::Once,
                ProtocolError::BadByte,
            ),
            (
                b"no newline",
                Evil::OnceThenClose,
                ProtocolError::Unterminated,
            ),
            (
                b"endless line without a newline ",
                Evil::Endless,
                ProtocolError::TooLong,
            ),
            // Valid answers, but a stream of them (two per write, so the first read holds
            // more than one line whatever the timing).
            (
                b"addr 10.0.0.1\naddr 10.0.0.1\n",
                Evil::Endless,
                ProtocolError::Unsolicited,
            ),
        ];
        for (reply, how, want) in cases {
            match against(reply, how).await {
                Err(ClientError::Protocol(e)) => assert_eq!(e, want, "{reply:?}"),
                other => panic!("{reply:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn an_agent_closing_without_answering_is_closed() {
        match against(b"", Evil::OnceThenClose).await {
            Err(ClientError::Closed) => {}
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_silent_agent_is_a_timeout() {
        let dir = temp_dir();
        let path = dir.join("silent.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let held = tokio::spawn(async move {
            // Accepts and holds the connection, never answering.
            let (s, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(s);
        });
        let client = AgentClient::new(&path).with_timeout(Duration::from_millis(200));
        assert!(matches!(client.ping().await, Err(ClientError::Timeout)));
        assert!(lock(&client.inner.idle).is_empty());
        held.abort();
        let _ = std::fs::remove_dir_all(dir);
    }
}
