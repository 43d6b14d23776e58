//! `bench buffer`: memory per waiting request. M concurrent connections each send one request
//! to one cold revision whose pod takes long to start; the activator's RSS is read idle and
//! with all M waiting; then the pod starts and the answers are counted.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kubesim::node::{Delay, StartDelays};

use crate::Error;
use crate::cluster::{BenchCluster, ClusterOptions, NAMESPACE, create_revision};
use crate::http::{Conn, revision_headers};
use crate::process::{activator_binary, mib, raise_nofile, spawn_activator};
use crate::prom;

/// The queue-depth gauge the activator exposes (when it does).
pub const QUEUE_GAUGE: &str = "activator_queued_requests";
/// The counter of requests that began waiting for a pod (cumulative).
pub const WAITS_COUNTER: &str = "activator_cold_start_waits_total";

/// File descriptors kept free for everything else (API clients, listeners, logs).
const FD_MARGIN: u64 = 512;

/// `bench buffer`'s knobs.
#[derive(Debug, Clone)]
pub struct BufferOptions {
    /// M: concurrent waiting requests.
    pub requests: usize,
    /// The simulated pod's container start delay (the time the requests wait).
    pub start_delay: Delay,
    /// Time given after the waiting signal before RSS is read.
    pub settle: Duration,
    /// Connections being opened at once.
    pub connect_concurrency: usize,
    pub activator_bin: Option<PathBuf>,
}

impl Default for BufferOptions {
    fn default() -> Self {
        Self {
            requests: 10_000,
            start_delay: Delay::Fixed(Duration::from_secs(30)),
            settle: Duration::from_secs(2),
            connect_concurrency: 256,
            activator_bin: None,
        }
    }
}

/// What `bench buffer` measured.
#[derive(Debug, Clone)]
pub struct BufferReport {
    pub asked: usize,
    /// M as run (lowered when the open-file limit could not be raised far enough).
    pub requests: usize,
    pub nofile: u64,
    pub start_delay: Delay,
    pub idle_rss: u64,
    pub waiting_rss: u64,
    /// How "all M are waiting" was established.
    pub signal: String,
    pub all_waiting_after: Duration,
    /// Answers had begun before RSS was read (the pod started too soon).
    pub early_answers: usize,
    pub statuses: BTreeMap<u16, usize>,
    pub errors: BTreeMap<String, usize>,
    /// From reading RSS to the last answer.
    pub drained_after: Duration,
}

impl BufferReport {
    pub fn ok(&self) -> usize {
        self.statuses.get(&200).copied().unwrap_or(0)
    }

    /// (waiting − idle) / M, in KiB.
    pub fn kib_per_request(&self) -> f64 {
        self.waiting_rss.saturating_sub(self.idle_rss) as f64 / 1024.0 / self.requests as f64
    }
}

pub async fn run(opts: &BufferOptions) -> Result<BufferReport, Error> {
    if opts.requests == 0 {
        return Err(Error::Options("--requests must be positive".into()));
    }
    let bin = activator_binary(opts.activator_bin.as_deref())?;
    // While the M wait, the bench holds M client sockets and the activator (which inherits
    // the limit) M accepted ones. Once the pod answers, each may also hold up to M app-side
    // sockets (the app runs in the bench process): ask for 2M, need M.
    let want = 2 * opts.requests as u64 + FD_MARGIN;
    let nofile = raise_nofile(want)?;
    let m = if nofile >= opts.requests as u64 + FD_MARGIN {
        opts.requests
    } else {
        let m = nofile.saturating_sub(FD_MARGIN) as usize;
        tracing::warn!(
            nofile,
            asked = opts.requests,
            running = m,
            "open-file limit too low for M: running fewer"
        );
        m.max(1)
    };
    if nofile < want {
        tracing::warn!(
            nofile,
            want,
            "open-file limit below 2M: when the pod starts, the activator's connections to it \
             may run out of descriptors (counted below as errors)"
        );
    }
    let cluster = BenchCluster::start(ClusterOptions {
        delays: StartDelays {
            container_start: opts.start_delay.clone(),
            ..StartDelays::default()
        },
        ..ClusterOptions::default()
    })
    .await?;
    let ip = cluster.node_ip();
    let data = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let admin = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let name = "buffered";
    let wait_secs = opts.start_delay.sample_now().as_secs() as i64;
    create_revision(&cluster.client, name, &[cluster.member(data)], |r| {
        r.spec.timeout_seconds = (wait_secs + 300).clamp(300, 3600);
    })
    .await?;
    let mut activator = spawn_activator(
        &bin,
        &cluster.kubeconfig,
        cluster.node_name(),
        data,
        admin,
        cluster.dir.path().join("activator.log"),
    )?;
    activator.wait_ready(Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // No figure rather than a wrong one: an unreadable RSS read as 0 would report 0 KiB per
    // request (or a negative growth clamped to 0).
    let idle_rss = activator
        .memory()
        .map(|m| m.rss)
        .ok_or_else(|| rss_unreadable(activator.pid()))?;
    tracing::info!(idle_rss_mib = mib(idle_rss), m, "opening connections");

    let connected = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(opts.connect_concurrency.max(1)));
    let headers = revision_headers(NAMESPACE, name);
    let limit = Duration::from_secs(wait_secs as u64 + 600);
    let began = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..m {
        let (connected, answered, gate, headers) = (
            connected.clone(),
            answered.clone(),
            gate.clone(),
            headers.clone(),
        );
        tasks.spawn(async move {
            let conn = {
                let _permit = gate.acquire().await;
                Conn::connect(data, &headers).await
            };
            let mut conn = conn?;
            connected.fetch_add(1, Ordering::Relaxed);
            let r = tokio::time::timeout(limit, conn.get("/")).await;
            answered.fetch_add(1, Ordering::Relaxed);
            match r {
                Ok(r) => r.map(|reply| reply.status.as_u16()),
                Err(_) => Err(Error::Timeout {
                    what: "the answer".into(),
                    secs: limit.as_secs(),
                }),
            }
        });
    }

    // Wait until all M are waiting.
    let (signal, all_waiting_after) = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        activator.check_alive()?;
        if answered.load(Ordering::Relaxed) > 0 {
            break (
                "answers began before all were waiting (the pod started first): \
                 raise --start-delay"
                    .to_string(),
                began.elapsed(),
            );
        }
        let samples = prom::parse(&activator.metrics().await.unwrap_or_default());
        let n = connected.load(Ordering::Relaxed);
        if let Some(q) = prom::sum(&samples, QUEUE_GAUGE) {
            if q as usize >= m {
                break (
                    format!("the activator's {QUEUE_GAUGE} gauge reached {q}"),
                    began.elapsed(),
                );
            }
        } else if let Some(w) = prom::sum(&samples, WAITS_COUNTER) {
            if w as usize >= m {
                break (
                    format!(
                        "no {QUEUE_GAUGE} gauge; the activator's {WAITS_COUNTER} counter \
                         (requests that began waiting) reached {w}"
                    ),
                    began.elapsed(),
                );
            }
        } else if n >= m && !cluster.node.pods().is_empty() {
            break (
                format!("no {QUEUE_GAUGE} gauge; all {m} connections open and the app pod exists"),
                began.elapsed(),
            );
        }
        if began.elapsed() > limit {
            return Err(Error::Timeout {
                what: format!("{m} requests to be waiting ({n} connected)"),
                secs: limit.as_secs(),
            });
        }
    };
    tokio::time::sleep(opts.settle).await;
    let waiting_rss = activator
        .memory()
        .map(|m| m.rss)
        .ok_or_else(|| rss_unreadable(activator.pid()))?;
    let early_answers = answered.load(Ordering::Relaxed);
    let read_at = Instant::now();
    tracing::info!(
        waiting_rss_mib = mib(waiting_rss),
        %signal,
        "all waiting; letting the pod start"
    );

    let mut statuses = BTreeMap::new();
    let mut errors = BTreeMap::new();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(code)) => *statuses.entry(code).or_insert(0) += 1,
            Ok(Err(e)) => *errors.entry(error_kind(&e)).or_insert(0) += 1,
            Err(e) => *errors.entry(format!("task: {e}")).or_insert(0) += 1,
        }
    }
    let drained_after = read_at.elapsed();
    activator.stop().await;
    cluster.shutdown().await;
    Ok(BufferReport {
        asked: opts.requests,
        requests: m,
        nofile,
        start_delay: opts.start_delay.clone(),
        idle_rss,
        waiting_rss,
        signal: format!("{signal}, then {} s settle", opts.settle.as_secs_f64()),
        all_waiting_after,
        early_answers,
        statuses,
        errors,
        drained_after,
    })
}

/// An error's message without the per-connection address, so equal failures group.
fn error_kind(e: &Error) -> String {
    match e {
        Error::Http { message, .. } => message.clone(),
        e => e.to_string(),
    }
}

impl fmt::Display for BufferReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "buffer: M = {} concurrent requests to one cold revision (pod container start {}); \
             open-file limit {} (bench and activator; 2M + {FD_MARGIN} wanted){}",
            self.requests,
            self.start_delay,
            self.nofile,
            if self.requests < self.asked {
                format!(" (too low for the {} asked)", self.asked)
            } else {
                String::new()
            }
        )?;
        writeln!(
            f,
            "all waiting after {:.1} s: {}",
            self.all_waiting_after.as_secs_f64(),
            self.signal
        )?;
        if self.early_answers > 0 {
            writeln!(
                f,
                "WARNING: {} answers arrived before RSS was read",
                self.early_answers
            )?;
        }
        writeln!(
            f,
            "activator RSS: idle {:.1} MiB, with {} waiting {:.1} MiB: {:.1} MiB above idle, \
             {:.2} KiB per waiting request",
            mib(self.idle_rss),
            self.requests,
            mib(self.waiting_rss),
            mib(self.waiting_rss.saturating_sub(self.idle_rss)),
            self.kib_per_request()
        )?;
        writeln!(
            f,
            "after the pod started: {} of {} answered 200 (all answers within {:.1} s of the \
             RSS reading); statuses {:?}; errors {:?}",
            self.ok(),
            self.requests,
            self.drained_after.as_secs_f64(),
            self.statuses,
            self.errors
        )
    }
}

/// The error when the activator's `VmRSS` cannot be read (no `/proc`, the process gone).
fn rss_unreadable(pid: u32) -> Error {
    Error::Parse {
        what: "the activator's RSS",
        message: format!("no VmRSS line in /proc/{pid}/status (not Linux, or the process is gone)"),
    }
}
