//! `bench warm`: the warm path. One app pod made warm first, then the same load against it
//! directly, through nginx (when installed) and through the activator process.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::Error;
use crate::cluster::{BenchCluster, ClusterOptions, NAMESPACE, WorkDir, create_revision};
use crate::http::{get, revision_headers};
use crate::loadgen::{Generator, LoadGen, LoadResult};
use crate::process::activator_binary;
use loadtest::nginx::{self, Nginx};

/// `bench warm`'s knobs.
#[derive(Debug, Clone)]
pub struct WarmOptions {
    pub conns: Vec<usize>,
    pub duration: Duration,
    pub warmup: Duration,
    /// Use the built-in generator even when wrk is installed.
    pub builtin: bool,
    pub activator_bin: Option<PathBuf>,
}

impl Default for WarmOptions {
    fn default() -> Self {
        Self {
            conns: vec![1, 8, 32],
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            builtin: false,
            activator_bin: None,
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub target: &'static str,
    pub conns: usize,
    pub result: LoadResult,
    /// CPU the target's processes used per answered request during the measured run (None
    /// for the app itself, which runs in this process beside the load generator).
    pub cpu_per_request: Option<Duration>,
}

/// What `bench warm` measured.
#[derive(Debug, Clone)]
pub struct WarmReport {
    pub generator: Generator,
    pub node: String,
    pub pod: SocketAddr,
    pub activator: SocketAddr,
    /// The nginx address, or why there was none.
    pub nginx: Result<SocketAddr, String>,
    pub duration: Duration,
    pub warmup: Duration,
    pub rows: Vec<Row>,
}

pub const DIRECT: &str = "direct";
pub const NGINX: &str = "nginx";
pub const ACTIVATOR: &str = "activator";

pub async fn run(opts: &WarmOptions) -> Result<WarmReport, Error> {
    if opts.conns.is_empty() || opts.conns.contains(&0) {
        return Err(Error::Options("--conns needs positive numbers".into()));
    }
    let bin = activator_binary(opts.activator_bin.as_deref())?;
    let loadgen = LoadGen::detect(opts.builtin);
    let cluster = BenchCluster::start(ClusterOptions::default()).await?;
    let ip = cluster.node_ip();
    let data = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let admin = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let name = "warm";
    create_revision(&cluster.client, name, &[cluster.member(data)], |_| {}).await?;
    let mut activator = crate::process::ActivatorProcess::spawn(
        &bin,
        &cluster.kubeconfig,
        cluster.node_name(),
        data,
        admin,
        cluster.dir.path().join("activator.log"),
    )?;
    activator.wait_ready(Duration::from_secs(60)).await?;

    // Make the pod warm: the first request cold-starts it; its answer names the pod IP.
    let headers = revision_headers(NAMESPACE, name);
    let first = get(data, "/", &headers, Duration::from_secs(60)).await?;
    if !first.status.is_success() {
        return Err(Error::Http {
            target: data.to_string(),
            message: format!(
                "the cold start answered {}: {}",
                first.status,
                String::from_utf8_lossy(&first.body)
            ),
        });
    }
    let pod_ip: std::net::Ipv4Addr = first
        .headers
        .get("x-pod-ip")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::Http {
            target: data.to_string(),
            message: "the app's answer has no x-pod-ip header".into(),
        })?;
    let pod = SocketAddr::from((pod_ip, crds::revision::DEFAULT_PORT as u16));

    let nginx_dir = WorkDir::new("nginx")?;
    let nginx = match nginx::find() {
        None => Err("not found, skipped".to_string()),
        Some(bin) => {
            let listen = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
            Nginx::start(&bin, nginx_dir.path(), listen, pod)
                .await
                .map_err(|e| format!("failed to start, skipped: {e}"))
        }
    };
    if let Err(why) = &nginx {
        tracing::warn!("nginx: {why}");
    }

    type Target = (&'static str, SocketAddr, Vec<(String, String)>, Option<u32>);
    let mut targets: Vec<Target> = vec![(DIRECT, pod, Vec::new(), None)];
    if let Ok(n) = &nginx {
        targets.push((NGINX, n.addr, Vec::new(), n.pid()));
    }
    targets.push((ACTIVATOR, data, headers, Some(activator.pid())));

    let mut rows = Vec::new();
    let measured = async {
        for &conns in &opts.conns {
            for (target, addr, headers, pid) in &targets {
                tracing::info!(target, conns, "measuring");
                if !opts.warmup.is_zero() {
                    loadgen
                        .measure(*addr, headers, conns, Duration::ZERO, opts.warmup)
                        .await?;
                }
                let cpu_before = pid.and_then(crate::cpu::of_tree);
                let result = loadgen
                    .measure(*addr, headers, conns, Duration::ZERO, opts.duration)
                    .await?;
                let cpu = cpu_before.zip(pid.and_then(crate::cpu::of_tree));
                let cpu_per_request = cpu
                    .filter(|_| result.requests > 0)
                    .map(|(a, b)| b.saturating_sub(a) / result.requests as u32);
                tracing::info!(
                    target,
                    conns,
                    rps = result.rps() as u64,
                    p50_us = result.p50.as_micros() as u64,
                    "measured"
                );
                rows.push(Row {
                    target,
                    conns,
                    result,
                    cpu_per_request,
                });
            }
            activator.check_alive()?;
        }
        Ok::<(), Error>(())
    }
    .await;

    let nginx_addr = nginx.as_ref().map(|n| n.addr).map_err(Clone::clone);
    if let Ok(n) = nginx {
        n.stop().await;
    }
    activator.stop().await;
    let node = cluster.node_name().to_string();
    cluster.shutdown().await;
    measured?;
    Ok(WarmReport {
        generator: loadgen.generator(),
        node,
        pod,
        activator: data,
        nginx: nginx_addr,
        duration: opts.duration,
        warmup: opts.warmup,
        rows,
    })
}

impl WarmReport {
    fn find(&self, target: &str, conns: usize) -> Option<&LoadResult> {
        self.rows
            .iter()
            .find(|r| r.target == target && r.conns == conns)
            .map(|r| &r.result)
    }

    fn conns(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.rows.iter().map(|r| r.conns).collect();
        c.dedup();
        c
    }

    /// activator throughput / `other`'s, per connection count.
    pub fn throughput_ratio(&self, other: &str, conns: usize) -> Option<f64> {
        let a = self.find(ACTIVATOR, conns)?.rps();
        let o = self.find(other, conns)?.rps();
        (o > 0.0).then(|| a / o)
    }

    /// The activator's CPU per request over nginx's, per connection count (below 1: cheaper).
    pub fn cpu_ratio(&self, conns: usize) -> Option<f64> {
        let cpu = |t: &str| {
            self.rows
                .iter()
                .find(|r| r.target == t && r.conns == conns)?
                .cpu_per_request
        };
        let (a, n) = (cpu(ACTIVATOR)?, cpu(NGINX)?);
        (!n.is_zero()).then(|| a.as_secs_f64() / n.as_secs_f64())
    }

    /// `target`'s p50 minus direct's, at `conns` connections, in ms.
    pub fn added_p50_ms(&self, target: &str, conns: usize) -> Option<f64> {
        let t = self.find(target, conns)?.p50.as_secs_f64();
        let d = self.find(DIRECT, conns)?.p50.as_secs_f64();
        Some((t - d) * 1e3)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

impl fmt::Display for WarmReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "warm path: node {}, app pod {}, activator {}, load {} ({} s per run after a {} s warm-up)",
            self.node,
            self.pod,
            self.activator,
            self.generator,
            self.duration.as_secs_f64(),
            self.warmup.as_secs_f64()
        )?;
        match &self.nginx {
            Ok(a) => writeln!(f, "nginx: {a} (keepalive 64 to the pod)")?,
            Err(why) => writeln!(f, "nginx: {why}")?,
        }
        writeln!(
            f,
            "{:<10} {:>5} {:>10} {:>9} {:>9} {:>7} {:>11}",
            "target", "conns", "req/s", "p50 ms", "p99 ms", "errors", "cpu µs/req"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<10} {:>5} {:>10.0} {:>9.3} {:>9.3} {:>7} {:>11}",
                r.target,
                r.conns,
                r.result.rps(),
                ms(r.result.p50),
                ms(r.result.p99),
                r.result.errors,
                opt(r.cpu_per_request.map(|d| d.as_secs_f64() * 1e6), 1)
            )?;
        }
        writeln!(
            f,
            "throughput ratio  {:>5} {:>16} {:>17} {:>24}",
            "conns", "activator/nginx", "activator/direct", "cpu/req activator/nginx"
        )?;
        for c in self.conns() {
            writeln!(
                f,
                "                  {:>5} {:>16} {:>17} {:>24}",
                c,
                opt(self.throughput_ratio(NGINX, c), 2),
                opt(self.throughput_ratio(DIRECT, c), 2),
                opt(self.cpu_ratio(c), 2)
            )?;
        }
        writeln!(
            f,
            "added p50 latency at 1 connection (over direct): activator {} ms, nginx {} ms",
            opt(self.added_p50_ms(ACTIVATOR, 1), 3),
            opt(self.added_p50_ms(NGINX, 1), 3)
        )
    }
}
