//! A short plain-text body for the answers hyper makes on its own, before any request reaches
//! the handler: `400` for a request head it cannot parse, `431` for headers over its limits,
//! `414` for a URI too long. hyper writes them with an empty body and offers no hook, so this
//! wraps the connection's socket and rewrites them as they are written.
//!
//! How such an answer is told apart from the handler's: it has hyper's exact shape (status
//! line, `connection: close`, `content-length: 0`, `date`, nothing else) and is written while
//! no request of the connection is in the handler or sending its response, and while every
//! response head the handler returned has been seen written. Connections that are HTTP/2 (its
//! preface) or were upgraded (a 101 went out) are never touched: their bytes are not HTTP/1
//! heads. What can go wrong is only ever leaving one of hyper's answers bodiless.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What the server tells the socket wrapper about its connection.
#[derive(Debug, Default)]
pub struct ConnState {
    /// Requests handed to the handler whose response body has not been dropped.
    active: AtomicUsize,
    /// Responses the handler returned whose head has not been seen written: hyper may write
    /// a head after the body was dropped (a short body is buffered with it).
    heads_coming: AtomicUsize,
    /// HTTP/2 or upgraded: pass everything through untouched.
    passthrough: AtomicBool,
}

impl ConnState {
    /// Counts a request as active until the guard (kept with its response body) is dropped.
    pub fn enter(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        ActiveGuard(self.clone())
    }

    /// The handler returned a response: its head is about to be written.
    pub fn head_coming(&self) {
        self.heads_coming.fetch_add(1, Ordering::AcqRel);
    }

    /// From now on the connection's bytes are not HTTP/1 messages (a 101 was answered).
    pub fn set_passthrough(&self) {
        self.passthrough.store(true, Ordering::Release);
    }
}

/// See [`ConnState::enter`].
#[derive(Debug)]
pub struct ActiveGuard(Arc<ConnState>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// The socket of one server connection, rewriting hyper's own error answers.
pub struct ErrorBodies<T> {
    inner: T,
    state: Arc<ConnState>,
    /// Nothing read yet: the first bytes say whether this is HTTP/2.
    first_read: bool,
    /// A rewritten answer not yet written out; once set, everything else hyper writes on this
    /// connection is dropped (it closes the connection after such an answer).
    replacement: Option<Bytes>,
}

impl<T> ErrorBodies<T> {
    pub fn new(inner: T, state: Arc<ConnState>) -> Self {
        Self {
            inner,
            state,
            first_read: true,
            replacement: None,
        }
    }

    /// Called with the first bytes of a write: whether they are one of hyper's own answers,
    /// which is then replaced.
    fn intercept(&mut self, first: &[u8]) -> bool {
        if self.replacement.is_some() {
            return true;
        }
        if self.state.passthrough.load(Ordering::Acquire) || !first.starts_with(b"HTTP/1.") {
            return false;
        }
        let status = first
            .get(9..12)
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u16>().ok());
        let Some(status) = status else { return false };
        if status >= 200 {
            // A final head: if the handler's, it is no longer coming.
            let took =
                self.state
                    .heads_coming
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            if took.is_ok() {
                return false;
            }
        }
        if self.state.active.load(Ordering::Acquire) != 0 {
            return false;
        }
        let Some((reason, body)) = replacement_for(status) else {
            return false;
        };
        if !is_hypers_bare_answer(first, status, reason) {
            return false;
        }
        tracing::debug!(status, "answering a request the server could not parse");
        self.replacement = Some(Bytes::from(format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )));
        true
    }
}

/// The answers hyper makes on its own (`hyper::proto::h1::role::Server::on_error`), with the
/// body each gets here.
fn replacement_for(status: u16) -> Option<(&'static str, &'static str)> {
    Some(match status {
        400 => (
            "Bad Request",
            "malformed request: the request line or headers could not be parsed\n",
        ),
        414 => ("URI Too Long", "the request URI is too long\n"),
        431 => (
            "Request Header Fields Too Large",
            "the request's header fields are too large or too many\n",
        ),
        _ => return None,
    })
}

/// Whether `head` is exactly what hyper writes for its own answers: the status line, then
/// `connection: close`, `content-length: 0` and `date`, and nothing after the head.
fn is_hypers_bare_answer(head: &[u8], status: u16, reason: &str) -> bool {
    let Ok(text) = std::str::from_utf8(head) else {
        return false;
    };
    let Some(rest) = text.strip_prefix(&format!("HTTP/1.1 {status} {reason}\r\n")) else {
        return false;
    };
    let Some(fields) = rest.strip_suffix("\r\n\r\n") else {
        return false;
    };
    let mut names: Vec<&str> = fields
        .split("\r\n")
        .map(|l| l.split_once(':').map_or(l, |(n, _)| n))
        .collect();
    names.sort_unstable();
    names == ["connection", "content-length", "date"]
        && fields.contains("connection: close")
        && fields.contains("content-length: 0")
}

impl<T: AsyncWrite + Unpin> ErrorBodies<T> {
    /// Writes out what is left of the replacement answer.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(r) = self.replacement.as_mut() {
            if r.is_empty() {
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, r))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            r.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ErrorBodies<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        if this.first_read && !read.is_empty() {
            this.first_read = false;
            // A prefix of the preface counts: a first read that short cannot be told apart,
            // and leaving an answer bodiless is the safe side.
            let n = read.len().min(H2_PREFACE.len());
            if read[..n] == H2_PREFACE[..n] {
                this.state.set_passthrough();
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ErrorBodies<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.intercept(buf) {
            ready!(this.poll_replacement(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs.iter().find(|b| !b.is_empty()).map(|b| &b[..]);
        if let Some(first) = first
            && this.intercept(first)
        {
            ready!(this.poll_replacement(cx))?;
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn written(state: Arc<ConnState>, writes: &[&[u8]]) -> String {
        let (a, mut b) = tokio::io::duplex(4096);
        let mut w = ErrorBodies::new(a, state);
        for chunk in writes {
            w.write_all(chunk).await.unwrap();
        }
        w.shutdown().await.unwrap();
        drop(w);
        let mut out = String::new();
        b.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn hypers_bodiless_431_gets_a_body_and_what_follows_is_dropped() {
        let out = written(
            Arc::default(),
            &[
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\
                  content-length: 0\r\ndate: x\r\n\r\n",
                b"anything after it",
            ],
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(
            out.ends_with("\r\n\r\nthe request's header fields are too large or too many\n"),
            "{out}"
        );
        assert!(!out.contains("date:") && !out.contains("anything"), "{out}");
    }

    #[tokio::test]
    async fn an_answer_of_the_handler_is_never_touched() {
        let state = Arc::new(ConnState::default());
        let guard = state.enter();
        let head: &[u8] =
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = written(state.clone(), &[head]).await;
        assert_eq!(out.as_bytes(), head);
        drop(guard);
        // Nor when its head is written after its body was dropped (a short body is buffered
        // with the head).
        state.head_coming();
        assert_eq!(written(state.clone(), &[head]).await.as_bytes(), head);
        // Nor anything on an upgraded connection.
        state.set_passthrough();
        assert_eq!(written(state, &[head]).await.as_bytes(), head);
    }

    #[tokio::test]
    async fn an_http2_connection_is_passed_through() {
        let state = Arc::new(ConnState::default());
        let (a, mut b) = tokio::io::duplex(4096);
        let mut r = ErrorBodies::new(a, state.clone());
        b.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 24];
        r.read_exact(&mut buf).await.unwrap();
        assert!(state.passthrough.load(Ordering::Acquire));
    }
}
