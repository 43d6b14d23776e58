//! A request body that stops arriving must not hold the client's connection and the app's
//! forever: [`IdleTimeout`] fails the body when no frame arrives for a while, which makes the
//! upstream client abort its request (and close that connection), and tells the proxy to answer
//! `408 Request Timeout`.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The error an idle body ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no request body data for {0:?}")]
pub struct BodyIdle(pub Duration);

/// Wraps a body so that it fails with [`BodyIdle`] when it has been polled but produced no
/// frame for `timeout`. The clock starts at the first poll, so time spent before the upstream
/// reads the body (a cold start) does not count.
pub struct IdleTimeout<B> {
    inner: B,
    timeout: Duration,
    /// Armed while the inner body is pending; `None` after each frame.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Told when the timeout fires: the upstream client may report the aborted request in a
    /// way that no longer carries [`BodyIdle`] (HTTP/2 resets the stream), or not at all.
    fired: Option<oneshot::Sender<BodyIdle>>,
    /// Never times out (a body with nothing to send).
    untimed: bool,
    done: bool,
}

impl<B> IdleTimeout<B> {
    /// The wrapped body, and a receiver that resolves if (and only if) the timeout fires.
    pub fn new(inner: B, timeout: Duration) -> (Self, oneshot::Receiver<BodyIdle>) {
        let (tx, rx) = oneshot::channel();
        let body = Self {
            inner,
            timeout,
            sleep: None,
            fired: Some(tx),
            untimed: false,
            done: false,
        };
        (body, rx)
    }

    /// The same type without a timer: for a body that is already complete (no timer, no
    /// channel on the warm path of a body-less request).
    pub fn untimed(inner: B) -> Self {
        Self {
            inner,
            timeout: Duration::ZERO,
            sleep: None,
            fired: None,
            untimed: true,
            done: false,
        }
    }
}

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.sleep = None;
                if frame.is_none() {
                    this.done = true;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending if this.untimed => Poll::Pending,
            Poll::Pending => {
                let timeout = this.timeout;
                let sleep = this.sleep.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(Instant::now() + timeout))
                });
                ready!(sleep.as_mut().poll(cx));
                this.done = true;
                this.sleep = None;
                let err = BodyIdle(timeout);
                if let Some(tx) = this.fired.take() {
                    let _ = tx.send(err);
                }
                Poll::Ready(Some(Err(Box::new(err))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    const IDLE: Duration = Duration::from_millis(400);

    #[tokio::test]
    async fn a_stalled_body_fails_after_the_timeout_and_says_so() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let stream = tokio_stream_of(rx);
        let (mut body, fired) = IdleTimeout::new(StreamBody::new(stream), IDLE);
        tx.send(Ok(Frame::data(Bytes::from_static(b"abc"))))
            .await
            .unwrap();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "abc");
        let started = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.downcast_ref::<BodyIdle>().is_some(), "{err}");
        assert!(started.elapsed() >= IDLE, "not before the timeout");
        assert_eq!(fired.await.unwrap(), BodyIdle(IDLE));
        assert!(body.frame().await.is_none(), "ends after the error");
        drop(tx);
    }

    #[tokio::test]
    async fn frames_reset_the_clock_and_a_finished_body_never_fires() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let (body, fired) = IdleTimeout::new(StreamBody::new(tokio_stream_of(rx)), IDLE);
        let sender = tokio::spawn(async move {
            for _ in 0..4 {
                // Pacing the body, each gap well within the timeout.
                tokio::time::sleep(IDLE / 4).await;
                tx.send(Ok(Frame::data(Bytes::from_static(b"x"))))
                    .await
                    .unwrap();
            }
        });
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all, "xxxx", "a slow body is not an idle one");
        sender.await.unwrap();
        assert!(fired.await.is_err(), "the sender is dropped without firing");
    }

    fn tokio_stream_of<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures::Stream<Item = T> + Unpin {
        Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
