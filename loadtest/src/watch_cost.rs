//! `loadtest watch-cost`: what a real API server pays per subset write for the activators'
//! watches, in one run, three ways (docs/membership-watch-cost.md):
//!
//! - `none`: no activator watches; each subset write is the subsetter's two (the
//!   ActivationEndpoints create with its member labels, then its status);
//! - `label`: `watchers` activators each watching `labelSelector=member…/<h>` across
//!   namespaces (DESIGN's contract), the same writes;
//! - `name`: the same activators each watching its own per-node object by name
//!   (`fieldSelector=metadata.name=<node>`), and each subset write also writes its members'
//!   objects (the proposal: 2 + members writes);
//! - `stream`: the same activators each holding a membership stream
//!   (`crds::member_stream`) from the directory replica, the same writes: the harness's CPU
//!   carries the replica's fan-out.
//!
//! A directory replica runs in this process in every phase (the subsetter's caches and
//! directory port, as a replica runs them): its one watch of every subset is what the
//! product's subsetter costs whatever the activators do, so each phase's figures differ from
//! `none`'s only by what the activators add.
//! The objects are ActivationEndpoints in a namespace of its own (the per-node objects too:
//! what the API server pays depends on how watchers are scoped, not on the kind). Run it with
//! the product's subsetter stopped: it would take these objects for orphans.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crds::{ActivationEndpoints, ActivationEndpointsStatus, ActivatorMember};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, Client, ResourceExt};
use rand::RngExt;
use tokio_util::sync::CancellationToken;

use crate::apiserver_metrics::{Snapshot, local_process};
use crate::error::Error;
use crate::stats::Percentiles;

#[derive(Debug, Clone)]
pub struct Options {
    /// Activators watching (one per simulated node).
    pub watchers: usize,
    /// Subsets written in each phase.
    pub subsets: usize,
    /// Members per subset.
    pub members: usize,
    /// Subset writes in flight.
    pub concurrency: usize,
    /// The phases, in order.
    pub ways: Vec<Watches>,
}

/// How the activators watch in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watches {
    None,
    Label,
    Name,
    Stream,
}

impl Watches {
    pub const ALL: [Watches; 4] = [
        Watches::None,
        Watches::Label,
        Watches::Name,
        Watches::Stream,
    ];

    /// The phase named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Watches::None => "none",
            Watches::Label => "label",
            Watches::Name => "name",
            Watches::Stream => "stream",
        }
    }
}

/// One phase's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseFigures {
    pub watches: &'static str,
    pub subsets: usize,
    /// API writes made (each subset's two, plus its members' objects in `name`).
    pub writes: usize,
    pub failed: usize,
    pub secs: f64,
    /// One subset's writes, end to end; a failed one ranks last, as infinitely slow.
    pub subset_ms_p50: f64,
    pub subset_ms_p99: f64,
    /// kube-apiserver's CPU seconds in the phase (from /proc here, else its /metrics).
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: Option<f64>,
    pub apiserver_rss_mib: f64,
    /// Watches the API server closed for falling behind (`apiserver_terminated_watchers_total`).
    pub terminated_watchers: f64,
    /// Watch events the activators received, and what their memberships should have sent.
    pub events_received: u64,
    pub events_expected: u64,
    /// This process's CPU seconds in the phase: the writer, and in `stream` the replica.
    pub harness_cpu_s: f64,
}

impl PhaseFigures {
    /// kube-apiserver CPU milliseconds per subset written.
    pub fn cpu_ms_per_subset(&self) -> f64 {
        if self.subsets == 0 {
            return 0.0;
        }
        self.apiserver_cpu_s * 1000.0 / self.subsets as f64
    }

    pub fn line(&self) -> String {
        format!(
            "{:<6} {} subsets ({} writes, {} failed) in {:.1} s ({:.0}/s): per subset p50 {:.1} / p99 {:.1} ms; kube-apiserver {:.1} s CPU ({:.2} ms per subset), RSS {:.0} MiB; etcd {}; watches closed by the server {}; events received {} of {}; harness {:.1} s CPU",
            self.watches,
            self.subsets,
            self.writes,
            self.failed,
            self.secs,
            self.subsets as f64 / self.secs.max(1e-9),
            self.subset_ms_p50,
            self.subset_ms_p99,
            self.apiserver_cpu_s,
            self.cpu_ms_per_subset(),
            self.apiserver_rss_mib,
            self.etcd_cpu_s
                .map(|c| format!("{c:.1} s CPU"))
                .unwrap_or_else(|| "not on this machine".into()),
            self.terminated_watchers,
            self.events_received,
            self.events_expected,
            self.harness_cpu_s,
        )
    }
}

/// `n` distinct indices below `of`.
fn pick(n: usize, of: usize) -> Vec<usize> {
    let mut rng = rand::rng();
    let mut out: Vec<usize> = Vec::with_capacity(n);
    while out.len() < n.min(of) {
        let i = rng.random_range(0..of);
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

fn node(i: usize) -> String {
    format!("wc-node-{i:05}")
}

fn status_of(members: &[usize]) -> ActivationEndpointsStatus {
    ActivationEndpointsStatus {
        activators: members
            .iter()
            .map(|&i| ActivatorMember {
                node: node(i),
                address: format!("10.0.{}.{}:8080", i / 250, i % 250 + 1),
                pod: format!("activator-{i}"),
                max_pods: 1,
                min_pods: 0,
            })
            .collect(),
        ..Default::default()
    }
}

/// Runs the three phases in namespace `la-watch-cost-<pid>` and deletes it after.
pub async fn run(client: Client, opts: &Options) -> Result<Vec<PhaseFigures>, Error> {
    if opts.watchers == 0 || opts.members == 0 || opts.members > opts.watchers {
        return Err(Error::Options(
            "--watchers must be at least --members, and --members at least 1".into(),
        ));
    }
    let ns = format!("la-watch-cost-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut n = Namespace::default();
    n.metadata.name = Some(ns.clone());
    namespaces.create(&PostParams::default(), &n).await?;
    let result = phases(&client, &ns, opts).await;
    let _ = namespaces.delete(&ns, &DeleteParams::background()).await;
    result
}

async fn phases(client: &Client, ns: &str, opts: &Options) -> Result<Vec<PhaseFigures>, Error> {
    let api: Api<ActivationEndpoints> = Api::namespaced(client.clone(), ns);
    // The per-node objects of the `name` phase exist before any phase, so that creating them
    // is in none.
    let named = if opts.ways.contains(&Watches::Name) {
        opts.watchers
    } else {
        0
    };
    for i in 0..named {
        let o = ActivationEndpoints::new(&node(i), Default::default());
        api.create(&PostParams::default(), &o).await?;
    }
    // A directory replica watches every subset in every phase, as the product's subsetter
    // does whatever the activators do: the phases differ only in what the activators add.
    let replica = Replica::start(client).await?;
    let mut out = Vec::new();
    for (k, watches) in opts.ways.iter().copied().enumerate() {
        let f = phase(client, &api, &replica, watches, k, opts).await?;
        tracing::info!(target: "loadtest::figures", "{}", f.line());
        out.push(f);
    }
    Ok(out)
}

/// Opens the phase's watches (each from now), writes its subsets, waits a little for the
/// events still on their way, and closes the watches.
async fn phase(
    client: &Client,
    api: &Api<ActivationEndpoints>,
    replica: &Replica,
    watches: Watches,
    k: usize,
    opts: &Options,
) -> Result<PhaseFigures, Error> {
    let stop = CancellationToken::new();
    let received = Arc::new(AtomicU64::new(0));
    if watches == Watches::Stream {
        open_streams(replica.addr, opts.watchers, &received, &stop).await?;
    }
    if matches!(watches, Watches::Label | Watches::Name) {
        let rv = api
            .list_metadata(&ListParams::default().limit(1))
            .await?
            .metadata
            .resource_version
            .unwrap_or_default();
        let opened = futures::stream::iter(0..opts.watchers)
            .map(|i| open_watch(client, api, watches, i, &rv, &received, &stop))
            .buffer_unordered(64)
            .try_collect::<Vec<()>>()
            .await;
        if let Err(e) = opened {
            stop.cancel();
            return Err(e);
        }
    }
    let before = Snapshot::fetch(client).await?;
    let (ap0, etcd0) = (local_process("kube-apiserver"), local_process("etcd"));
    let me0 = own_cpu_secs();
    let t = Instant::now();
    let pp = PatchParams::default();
    let results: Vec<Result<Duration, kube::Error>> = futures::stream::iter(0..opts.subsets)
        .map(|s| {
            let (api, pp) = (api.clone(), pp.clone());
            async move {
                let members = pick(opts.members, opts.watchers);
                let started = Instant::now();
                let mut ae = ActivationEndpoints::new(&format!("s{k}-{s:06}"), Default::default());
                if watches != Watches::Name {
                    ae.metadata.labels = Some(
                        members
                            .iter()
                            .map(|&i| (crds::contract::member_label(&node(i)), String::new()))
                            .collect(),
                    );
                }
                let name = ae.name_any();
                api.create(&PostParams::default(), &ae).await?;
                let status = serde_json::json!({ "status": status_of(&members) });
                api.patch_status(&name, &pp, &Patch::Merge(&status)).await?;
                if watches == Watches::Name {
                    for &i in &members {
                        let mark = serde_json::json!({ "status": { "policy": name } });
                        api.patch_status(&node(i), &pp, &Patch::Merge(&mark))
                            .await?;
                    }
                }
                Ok(started.elapsed())
            }
        })
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    let secs = t.elapsed().as_secs_f64();
    let after = Snapshot::fetch(client).await?;
    let (ap1, etcd1) = (local_process("kube-apiserver"), local_process("etcd"));
    let events_expected = match watches {
        Watches::None => 0,
        // Each member's watch (or stream) sees the create (labels) and the status write.
        Watches::Label | Watches::Stream => (opts.subsets * opts.members * 2) as u64,
        Watches::Name => (opts.subsets * opts.members) as u64,
    };
    // Events still on their way: up to 10 s, ended by the count, not by the clock.
    let settle = Instant::now();
    while received.load(Ordering::Relaxed) < events_expected
        && settle.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let answered: Vec<Duration> = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .copied()
        .collect();
    let failed = results.len() - answered.len();
    let latency = Percentiles::with_failed(&answered, failed);
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        tracing::warn!(error = %e, failed, "subset writes failed");
    }
    let per_subset = 2 + if watches == Watches::Name {
        opts.members
    } else {
        0
    };
    Ok(PhaseFigures {
        watches: watches.name(),
        subsets: opts.subsets,
        writes: opts.subsets * per_subset,
        failed,
        secs,
        subset_ms_p50: latency.p50,
        subset_ms_p99: latency.p99,
        apiserver_cpu_s: match (ap0, ap1) {
            (Some(a), Some(b)) => b.1 - a.1,
            _ => (after.cpu_secs - before.cpu_secs).max(0.0),
        },
        etcd_cpu_s: etcd0.zip(etcd1).map(|(a, b)| b.1 - a.1),
        apiserver_rss_mib: ap1.map(|p| p.0 as f64).unwrap_or(after.rss_bytes) / (1024.0 * 1024.0),
        terminated_watchers: after.terminated_watchers - before.terminated_watchers,
        events_received: received.load(Ordering::Relaxed),
        events_expected,
        harness_cpu_s: own_cpu_secs() - me0,
    })
}

/// This process's CPU seconds (user and system), from /proc.
fn own_cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// A directory replica run here (the subsetter's caches and its directory port on
/// loopback), dropped with the phase.
struct Replica {
    caches: Arc<subsetter::Caches>,
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Replica {
    /// The subsetter's caches (its one watch of every subset) and its directory port.
    async fn start(client: &Client) -> Result<Self, Error> {
        let s = subsetter::Subsetter::new(
            client.clone(),
            subsetter::Config::default(),
            Arc::new(subsetter::Random::seeded(1)),
        );
        let caches = Arc::new(s.start_caches());
        caches.wait_synced().await;
        let (addr, task) = subsetter::directory::serve_streams(
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            Arc::clone(&caches),
            subsetter::member_stream::StreamAccess::default(),
        )
        .await
        .map_err(|e| Error::Options(format!("binding the directory: {e}")))?;
        Ok(Self { caches, addr, task })
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
        self.caches.hub.close_all();
        self.caches.stop();
    }
}

/// Opens `watchers` streams from the replica at `addr`, each counting its `APPLY` and `LEFT`
/// frames into `received` until `stop`; returns once every stream has its first state.
async fn open_streams(
    addr: std::net::SocketAddr,
    watchers: usize,
    received: &Arc<AtomicU64>,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let synced = Arc::new(AtomicU64::new(0));
    for i in 0..watchers {
        let (received, synced, stop) = (received.clone(), synced.clone(), stop.clone());
        tokio::spawn(async move {
            if let Err(e) = stream(addr, &node(i), &received, &synced, &stop).await {
                tracing::warn!(node = %node(i), error = %e, "membership stream");
            }
        });
    }
    let t = Instant::now();
    while synced.load(Ordering::Relaxed) < watchers as u64 {
        if t.elapsed() > Duration::from_secs(120) {
            return Err(Error::Options(format!(
                "{} of {watchers} streams had their first state after 120 s",
                synced.load(Ordering::Relaxed)
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// One activator's stream: counts its first state, then each change frame.
async fn stream(
    addr: std::net::SocketAddr,
    node: &str,
    received: &AtomicU64,
    synced: &AtomicU64,
    stop: &CancellationToken,
) -> Result<(), String> {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get(crds::member_stream::stream_path(node, None))
        .header(http::header::HOST, "directory")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("answered {}", resp.status()));
    }
    let mut body = resp.into_body();
    let mut first = true;
    loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            f = body.frame() => f,
        };
        let Some(Ok(frame)) = frame else {
            return Err("the stream ended".into());
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if first {
                first = false;
                synced.fetch_add(1, Ordering::Relaxed);
            } else if line.starts_with(br#"{"type":"APPLY""#)
                || line.starts_with(br#"{"type":"LEFT""#)
            {
                received.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One activator's watch, counting what it receives until `stop`; one the server closes is
/// opened again from the last version seen, as an activator's would be.
async fn open_watch(
    client: &Client,
    api: &Api<ActivationEndpoints>,
    watches: Watches,
    i: usize,
    rv: &str,
    received: &Arc<AtomicU64>,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let (wp, api) = match watches {
        Watches::Label => (
            WatchParams::default().labels(&crds::contract::member_selector(&node(i))),
            Api::<ActivationEndpoints>::all(client.clone()),
        ),
        _ => (
            WatchParams::default().fields(&format!("metadata.name={}", node(i))),
            api.clone(),
        ),
    };
    let wp = wp.timeout(290);
    let first = api.watch(&wp, rv).await?.boxed();
    let (received, stop) = (received.clone(), stop.clone());
    let mut rv = rv.to_string();
    tokio::spawn(async move {
        let mut events = first;
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                e = events.next() => e,
            };
            match next {
                Some(Ok(
                    WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o),
                )) => {
                    received.fetch_add(1, Ordering::Relaxed);
                    rv = o.resource_version().unwrap_or(rv);
                }
                Some(Ok(WatchEvent::Bookmark(b))) => rv = b.metadata.resource_version,
                Some(Ok(WatchEvent::Error(_)) | Err(_)) | None => {
                    events = match api.watch(&wp, &rv).await {
                        Ok(s) => s.boxed(),
                        Err(_) => return,
                    };
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_distinct_and_within_the_watchers() {
        for _ in 0..200 {
            let m = pick(3, 5);
            assert_eq!(m.len(), 3);
            assert!(m.iter().all(|&i| i < 5));
            let mut d = m.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), 3, "{m:?}");
        }
        assert_eq!(pick(3, 2).len(), 2, "never more than there are");
    }

    #[test]
    fn the_cpu_per_subset_is_the_phases_cpu_over_its_subsets() {
        let f = PhaseFigures {
            watches: "label",
            subsets: 2000,
            writes: 4000,
            failed: 0,
            secs: 10.0,
            subset_ms_p50: 1.0,
            subset_ms_p99: 2.0,
            apiserver_cpu_s: 30.0,
            etcd_cpu_s: None,
            apiserver_rss_mib: 500.0,
            terminated_watchers: 0.0,
            events_received: 12_000,
            events_expected: 12_000,
            harness_cpu_s: 1.0,
        };
        assert_eq!(f.cpu_ms_per_subset(), 15.0);
        assert!(f.line().contains("15.00 ms per subset"), "{}", f.line());
        assert!(f.line().contains("etcd not on this machine"));
    }
}
