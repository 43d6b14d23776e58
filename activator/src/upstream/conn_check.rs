//! Whether a pooled connection to a pod can carry the next request: checked before every
//! reuse, on both request paths, whatever the connection's age (as hyper's client pool does
//! for its own): an app sends nothing unasked, so any byte waiting is an answer nobody asked
//! for — a second response to one request — which the next client would otherwise be given
//! as its own. End of stream or an error: the app closed it.
//!
//! A `MSG_PEEK` with the socket non-blocking (tokio sets it so): one syscall, nothing consumed.
//! Not tokio's `try_read`/`poll_peek`: those answer from tokio's cached readiness, which says
//! "nothing to read" until the reactor has seen the event for bytes that have just arrived —
//! the very bytes this check exists for.

use std::mem::MaybeUninit;
use std::os::fd::AsFd;

use socket2::SockRef;

/// True when nothing is waiting to be read and the connection is open.
pub fn clean<S: AsFd>(socket: &S) -> bool {
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    matches!(
        SockRef::from(socket).peek(&mut byte),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    #[tokio::test]
    async fn bytes_just_written_by_the_peer_are_seen_at_once_and_not_consumed() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (mut app, _) = l.accept().await.unwrap();
        assert!(clean(&c));
        // No await between the write and the check: tokio's reactor has not seen the event.
        app.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        assert!(!clean(&c), "stray bytes not seen");
        let mut b = [0u8; 4];
        c.try_read(&mut b).ok();
        assert!(!clean(&c), "the peek consumed the bytes");
        drop(app);
    }

    #[tokio::test]
    async fn a_connection_the_peer_closed_is_not_clean() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (app, _) = l.accept().await.unwrap();
        drop(app);
        // The FIN is on its way through loopback: wait for it as an event, not by time.
        c.readable().await.unwrap();
        assert!(!clean(&c));
    }
}
