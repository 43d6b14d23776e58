//! The load: `wrk` when installed, else a built-in generator of the same shape (one thread,
//! N keep-alive HTTP/1.1 connections, each a loop of GETs), latencies in an HDR histogram.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::Error;
use crate::http::Conn;

/// Which generator produced a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generator {
    Wrk,
    Builtin,
}

impl std::fmt::Display for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Generator::Wrk => "wrk -t1",
            Generator::Builtin => "built-in (1 thread, hyper HTTP/1.1 keep-alive)",
        })
    }
}

/// One measured run.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadResult {
    pub generator: Generator,
    /// 2xx answers: the only ones counted as throughput (a fast 503 is not work done).
    pub requests: u64,
    /// Answers with any other status (wrk: 4xx and 5xx, which is what it counts).
    pub non_2xx: u64,
    /// Non-2xx answers and connection errors.
    pub errors: u64,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

impl LoadResult {
    pub fn rps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.requests as f64 / secs
        } else {
            0.0
        }
    }
}

/// The load generator a run uses.
#[derive(Debug, Clone)]
pub enum LoadGen {
    Wrk(PathBuf),
    Builtin,
}

impl LoadGen {
    /// `wrk` when it is on PATH (unless `builtin` is asked for), else the built-in one.
    pub fn detect(builtin: bool) -> Self {
        match crate::wrk::find_program("wrk", &[]) {
            Some(p) if !builtin => LoadGen::Wrk(p),
            _ => LoadGen::Builtin,
        }
    }

    pub fn generator(&self) -> Generator {
        match self {
            LoadGen::Wrk(_) => Generator::Wrk,
            LoadGen::Builtin => Generator::Builtin,
        }
    }

    /// Warms up for `warmup` (result discarded), then measures for `duration`.
    pub async fn measure(
        &self,
        target: SocketAddr,
        headers: &[(String, String)],
        conns: usize,
        warmup: Duration,
        duration: Duration,
    ) -> Result<LoadResult, Error> {
        if !warmup.is_zero() {
            self.run(target, headers, conns, warmup).await?;
        }
        self.run(target, headers, conns, duration).await
    }

    async fn run(
        &self,
        target: SocketAddr,
        headers: &[(String, String)],
        conns: usize,
        duration: Duration,
    ) -> Result<LoadResult, Error> {
        match self {
            LoadGen::Wrk(path) => crate::wrk::run(path, target, headers, conns, duration).await,
            LoadGen::Builtin => builtin(target, headers.to_vec(), conns, duration).await,
        }
    }
}

/// The built-in generator, on its own thread with a single-threaded runtime (as `wrk -t1`).
pub async fn builtin(
    target: SocketAddr,
    headers: Vec<(String, String)>,
    conns: usize,
    duration: Duration,
) -> Result<LoadResult, Error> {
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(builtin_on_this_thread(target, headers, conns, duration))
    })
    .await
    .map_err(|e| Error::Start {
        what: "the built-in load generator".into(),
        message: e.to_string(),
    })?
}

async fn builtin_on_this_thread(
    target: SocketAddr,
    headers: Vec<(String, String)>,
    conns: usize,
    duration: Duration,
) -> Result<LoadResult, Error> {
    let began = Instant::now();
    let end = began + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns.max(1) {
        let headers = headers.clone();
        tasks.spawn(async move { one_connection(target, &headers, end).await });
    }
    let mut hist = new_histogram();
    let (mut requests, mut non_2xx, mut errors) = (0u64, 0u64, 0u64);
    while let Some(r) = tasks.join_next().await {
        let (h, n, bad, e) = r.map_err(|e| Error::Start {
            what: "a load connection".into(),
            message: e.to_string(),
        })?;
        hist.add(&h).map_err(|e| Error::Parse {
            what: "latency histogram",
            message: e.to_string(),
        })?;
        requests += n;
        non_2xx += bad;
        errors += e;
    }
    let elapsed = began.elapsed();
    Ok(LoadResult {
        generator: Generator::Builtin,
        requests,
        non_2xx,
        errors,
        elapsed,
        p50: Duration::from_micros(hist.value_at_quantile(0.5)),
        p99: Duration::from_micros(hist.value_at_quantile(0.99)),
    })
}

fn new_histogram() -> Histogram<u64> {
    // 1 µs to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid")
}

/// GETs on one connection until `end`; reconnects after an error. Returns the latencies (µs),
/// 2xx answers, other answers, and errors (the other answers and failed requests).
async fn one_connection(
    target: SocketAddr,
    headers: &[(String, String)],
    end: Instant,
) -> (Histogram<u64>, u64, u64, u64) {
    let mut hist = new_histogram();
    let (mut answers, mut non_2xx, mut errors) = (0u64, 0u64, 0u64);
    let mut conn: Option<Conn> = None;
    while Instant::now() < end {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::connect(target, headers).await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    errors += 1;
                    tracing::debug!(error = %e, "load connection");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let t = Instant::now();
        match c.get("/").await {
            Ok(reply) => {
                hist.saturating_record(t.elapsed().as_micros() as u64);
                if reply.status.is_success() {
                    answers += 1;
                } else {
                    non_2xx += 1;
                    errors += 1;
                }
            }
            Err(e) => {
                errors += 1;
                tracing::debug!(error = %e, "load request");
                conn = None;
            }
        }
    }
    (hist, answers, non_2xx, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on loopback whose every answer is a 503 (as a full buffer would give).
    async fn always_503() -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        let Ok(n) = s.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nfull";
                            if s.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_that_are_not_2xx_are_not_throughput() {
        let addr = always_503().await;
        let r = builtin(addr, Vec::new(), 2, Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(r.requests, 0, "{r:?}");
        assert!(r.non_2xx > 0, "{r:?}");
        assert_eq!(r.errors, r.non_2xx, "{r:?}");
        assert_eq!(r.rps(), 0.0);
    }
}
