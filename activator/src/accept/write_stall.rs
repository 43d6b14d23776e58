//! A client connection on hyper's path that stops reading is closed after a while: hyper
//! waits on a socket that cannot take more without a timer of its own, and while it waits it
//! polls nothing else — not the response body, whose own timers ([`crate::pipeline::handler`]'s `Held`)
//! would otherwise end the exchange. The fast lane bounds the same writes itself
//! (`fast/exchange.rs`, `send`).
//!
//! The clock starts when a write (or flush) cannot proceed and stops at the first progress:
//! a slow reader that keeps taking bytes is never cut, only one that takes none for `limit`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

pub struct WriteStall<I> {
    inner: I,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<I> WriteStall<I> {
    pub fn new(inner: I, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After the inner write returned Pending: Pending until `limit` has passed since the
    /// first of these in a row, then an error.
    fn stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no bytes for {} ms", limit.as_millis()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => self.stall(cx),
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteStall<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteStall<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_peer_that_takes_no_bytes_is_an_error_after_the_limit_and_progress_resets_it() {
        // A pipe with room for 8 bytes and nobody reading the far end.
        let (near, mut far) = tokio::io::duplex(8);
        let mut w = WriteStall::new(near, Duration::from_millis(100));
        w.write_all(b"12345678").await.unwrap();
        let err = w.write_all(b"more").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // Bytes taken: the clock starts again.
        let mut b = [0u8; 8];
        tokio::io::AsyncReadExt::read_exact(&mut far, &mut b)
            .await
            .unwrap();
        w.write_all(b"again").await.unwrap();
    }
}
