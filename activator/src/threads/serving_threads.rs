//! The serving threads' side of [`Placement`]: each thread's inbox of connections moved to
//! it, moving a connection out of one thread's event loop into another's, and the load
//! ticker that tells the placement how busy each thread is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::ops::metrics::Metrics;
use crate::threads::placement::{Placed, Placement};

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
    pub(crate) async fn moved_in(&mut self) -> Option<(TcpStream, SocketAddr, Placed)> {
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

impl Threaded {
    /// Closes the inbox (a thread moving a connection here from now on keeps it) and
    /// returns the connections moved here but not taken yet.
    pub(crate) fn close(&mut self) -> Vec<(TcpStream, SocketAddr)> {
        self.inbox.close();
        let mut left = Vec::new();
        while let Ok((std, peer)) = self.inbox.try_recv() {
            if let Ok(stream) = TcpStream::from_std(std) {
                left.push((stream, peer));
            }
        }
        left
    }
}

impl Mover {
    /// Where a connection just accepted here is served: None when it was moved to another
    /// thread, else here, counted.
    pub(crate) fn place(&self, stream: TcpStream, peer: SocketAddr) -> Option<(TcpStream, Placed)> {
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
pub(crate) async fn moved_in(
    threaded: &mut Option<Threaded>,
) -> Option<(TcpStream, SocketAddr, Placed)> {
    match threaded {
        Some(t) => t.moved_in().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accept::server::serve_with;
    use http::{Request, Response};
    use hyper::body::Incoming;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

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
                                Response::new(crate::wire::answer::full(name))
                            };
                            serve_with(
                                l,
                                stop,
                                Duration::from_secs(1),
                                Duration::from_secs(30),
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
        // No thread is ever hot or cool enough to move: each thread's load ticker reports how
        // busy its thread was, and on a loaded machine a thread descheduled mid-poll reads as
        // hot, which sent connections elsewhere (io-0, io-1, io-1, … once). Where connections
        // go under load is placement.rs's tests' business (pure, with the loads given); here
        // only the counts decide, so the placements do not depend on scheduling.
        let placement = Placement::with_thresholds(3, 2, u32::MAX, u32::MAX);
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
}
