//! Keep-alive connections to pods for the fast lane: plain TCP streams by pod address, each
//! owned by one request at a time. No task per connection (hyper's client needs one): the
//! request's own task writes the head and reads the answer.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::upstream::idle::IdleSet;
use crate::wire::connect::ConnectError;
use keep_serving::Locked;

/// Idle connections by pod address.
pub struct PodConns {
    idle: Mutex<IdleSet<TcpStream>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
}

/// A connection for one request.
pub struct PodConn {
    pub stream: TcpStream,
    /// From the pool: if it turns out closed before any answer, the request may go again on a
    /// fresh one.
    pub reused: bool,
}

impl PodConns {
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::new(IdleSet::new(idle_timeout)),
            connect_timeout,
            idle_timeout,
        })
    }

    /// An idle connection to `target`, else a new one.
    pub async fn get(&self, target: SocketAddr) -> Result<PodConn, ConnectError> {
        if let Some(stream) = self.take_idle(target) {
            return Ok(PodConn {
                stream,
                reused: true,
            });
        }
        // Boxed: rare on the warm path, and a waiting request should not carry its room.
        Box::pin(self.connect(target)).await.map(|stream| PodConn {
            stream,
            reused: false,
        })
    }

    /// A new connection to `target`.
    pub async fn connect(&self, target: SocketAddr) -> Result<TcpStream, ConnectError> {
        let stream = crate::wire::connect::connect(target, self.connect_timeout).await?;
        Ok(stream)
    }

    fn take_idle(&self, target: SocketAddr) -> Option<TcpStream> {
        let mut idle = self.idle.locked();
        let now = Instant::now();
        // A sweep drops only expired ones: checking every idle connection is a syscall each.
        let list = idle.of(target, now, |_| true)?;
        // Newest first: the most recently used connection is the likeliest to be alive.
        // Every one is checked before it is handed out, however recently it was used (as
        // hyper's pool does): bytes the app wrote after its response — a second answer to
        // one request — would otherwise be read as the next client's response.
        while let Some(i) = list.pop() {
            let age = now.duration_since(i.since);
            if age >= self.idle_timeout || !crate::upstream::conn_check::clean(&i.conn) {
                continue;
            }
            return Some(i.conn);
        }
        None
    }

    /// Puts a connection whose response has been read to its end back.
    pub fn put(&self, target: SocketAddr, stream: TcpStream) {
        let mut idle = self.idle.locked();
        idle.put(target, stream, Instant::now(), |_| true);
    }

    /// Idle connections held (for tests).
    pub fn idle(&self) -> usize {
        self.idle.locked().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_connection_goes_back_and_a_closed_one_is_not_reused() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = l.local_addr().unwrap();
        let pool = PodConns::new(Duration::from_secs(1), Duration::from_secs(60));
        let c = pool.get(target).await.unwrap();
        assert!(!c.reused);
        let (server_side, _) = l.accept().await.unwrap();
        pool.put(target, c.stream);
        assert_eq!(pool.idle(), 1);
        let c = pool.get(target).await.unwrap();
        assert!(c.reused);
        // The app closes it while idle: once checked, it is not handed out.
        drop(server_side);
        let closed = c.stream;
        closed.readable().await.unwrap();
        assert!(!crate::upstream::conn_check::clean(&closed));
        // Put back just now: checked all the same.
        pool.put(target, closed);
        let c = pool.get(target).await.unwrap();
        assert!(!c.reused, "a closed connection was handed out");
    }

    #[tokio::test]
    async fn a_connection_with_unrequested_bytes_waiting_is_not_reused() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = l.local_addr().unwrap();
        let pool = PodConns::new(Duration::from_secs(1), Duration::from_secs(60));
        let c = pool.get(target).await.unwrap();
        let (mut server_side, _) = l.accept().await.unwrap();
        // The app writes an answer nobody asked for while the connection is idle.
        tokio::io::AsyncWriteExt::write_all(&mut server_side, b"HTTP/1.1 200 OK\r\n\r\n")
            .await
            .unwrap();
        // Put back at once: the check must see bytes the reactor has not reported yet.
        pool.put(target, c.stream);
        let next = pool.get(target).await.unwrap();
        assert!(!next.reused, "a connection with stray bytes was handed out");
        assert_eq!(pool.idle(), 0);
    }
}
