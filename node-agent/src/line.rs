//! Reading protocol lines from a stream with a hard bound on what is held: never more than
//! `max` bytes per connection, whatever the peer sends, so a hostile peer costs the other side
//! a fixed, tiny amount of memory.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

/// Why no line came.
#[derive(Debug)]
pub(crate) enum LineError {
    /// `max` bytes arrived without a "\n".
    TooLong,
    /// The stream ended in the middle of a line.
    Truncated,
    /// No byte of a new line came within the idle timeout.
    Idle,
    /// A started line did not end within the line timeout.
    LineTimeout,
    Io(io::Error),
}

pub(crate) struct LineReader<R> {
    inner: R,
    /// Bytes read but not yet returned: the start of the next line(s). Never longer than `max`.
    buf: Vec<u8>,
    max: usize,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::with_capacity(max),
            max,
        }
    }

    pub(crate) fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    #[cfg(test)]
    pub(crate) fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Bytes received beyond the lines returned so far.
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next line, "\n" included, at most `max` bytes; `Ok(None)` when the stream ends
    /// between lines. `idle` bounds the wait for the first byte of a line, `line` the time from
    /// its first byte to its "\n" (a peer trickling bytes cannot hold the connection longer).
    pub(crate) async fn next_line(
        &mut self,
        idle: Option<Duration>,
        line: Option<Duration>,
    ) -> Result<Option<Vec<u8>>, LineError> {
        let idle_deadline = idle.map(|d| Instant::now() + d);
        let mut line_deadline = None;
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                return Ok(Some(self.buf.drain(..=end).collect()));
            }
            if self.buf.len() >= self.max {
                return Err(LineError::TooLong);
            }
            let between_lines = self.buf.is_empty();
            let deadline = if between_lines {
                idle_deadline
            } else {
                *line_deadline.get_or_insert_with(|| line.map(|d| Instant::now() + d))
            };
            // Read no more than fits under `max`: the peer's excess stays in the kernel's
            // socket buffer, and is dropped with the connection.
            let have = self.buf.len();
            self.buf.resize(self.max, 0);
            let read = self.inner.read(&mut self.buf[have..]);
            let result = match deadline {
                Some(at) => match tokio::time::timeout_at(at, read).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.buf.truncate(have);
                        return Err(if between_lines {
                            LineError::Idle
                        } else {
                            LineError::LineTimeout
                        });
                    }
                },
                None => read.await,
            };
            match result {
                Ok(0) => {
                    self.buf.truncate(have);
                    return if have == 0 {
                        Ok(None)
                    } else {
                        Err(LineError::Truncated)
                    };
                }
                Ok(n) => self.buf.truncate(have + n),
                Err(e) => {
                    self.buf.truncate(have);
                    return Err(LineError::Io(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::ReadBuf;

    /// Counts the bytes taken from the source: what the reader asked the kernel for.
    struct Counting<R> {
        inner: R,
        taken: usize,
    }

    impl<R: AsyncRead + Unpin> AsyncRead for Counting<R> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let before = buf.filled().len();
            let r = Pin::new(&mut self.inner).poll_read(cx, buf);
            self.taken += buf.filled().len() - before;
            r
        }
    }

    #[tokio::test]
    async fn splits_pipelined_lines() {
        let mut r = LineReader::new(&b"ping\naddr x\nping\n"[..], 64);
        assert_eq!(r.next_line(None, None).await.unwrap().unwrap(), b"ping\n");
        assert_eq!(r.next_line(None, None).await.unwrap().unwrap(), b"addr x\n");
        assert_eq!(r.next_line(None, None).await.unwrap().unwrap(), b"ping\n");
        assert!(r.next_line(None, None).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn an_overlong_line_is_refused_after_max_bytes() {
        let data = vec![b'a'; 10_000];
        let mut r = LineReader::new(
            Counting {
                inner: &data[..],
                taken: 0,
            },
            64,
        );
        assert!(matches!(
            r.next_line(None, None).await,
            Err(LineError::TooLong)
        ));
        assert_eq!(r.get_ref().taken, 64, "read past the limit");
    }

    #[tokio::test]
    async fn a_line_of_exactly_max_bytes_is_a_line() {
        let mut data = vec![b'a'; 63];
        data.push(b'\n');
        data.extend_from_slice(b"ping\n");
        let mut r = LineReader::new(&data[..], 64);
        assert_eq!(r.next_line(None, None).await.unwrap().unwrap().len(), 64);
        assert_eq!(r.next_line(None, None).await.unwrap().unwrap(), b"ping\n");
    }

    #[tokio::test]
    async fn eof_mid_line_is_truncated() {
        let mut r = LineReader::new(&b"ping\npi"[..], 64);
        r.next_line(None, None).await.unwrap();
        assert!(matches!(
            r.next_line(None, None).await,
            Err(LineError::Truncated)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_tell_idle_from_a_stalled_line() {
        let (mut tx, rx) = tokio::io::duplex(256);
        let mut r = LineReader::new(rx, 64);
        let t = Some(Duration::from_secs(1));
        assert!(matches!(r.next_line(t, t).await, Err(LineError::Idle)));
        tokio::io::AsyncWriteExt::write_all(&mut tx, b"pin")
            .await
            .unwrap();
        assert!(matches!(
            r.next_line(Some(Duration::from_secs(3600)), t).await,
            Err(LineError::LineTimeout)
        ));
    }
}
