//! `bench warm`: the warm path. One app pod made warm first, then the same load against it
//! directly, through nginx (when installed) and through the activator process. nginx runs
//! twice: as a bare keep-alive reverse proxy (`nginx`), and doing what the activator does to
//! a request (`nginx-fwd`): the client's Host passed on and the forwarding headers
//! (`X-Forwarded-*`, `Forwarded`) added, so that the app parses the same request from both.
//! Every target is sent the same request (with the revision headers an ingress sets).
//!
//! On a shared machine one run of each says little: a neighbour's build takes a core for a
//! few seconds and one target loses 20 %. So the targets are measured in rounds, nginx and
//! the activator back to back and in alternating order, and the ratios are taken within each
//! round; the summary is their median and range. An even number of rounds runs each order
//! equally often (the proxy measured second in a round was the slower one in five of six
//! rounds of one run, and in fewer of another: an order effect comes and goes).
//!
//! With `--baseline-bin` a second activator process (another build: the one before a change)
//! serves the same revision from its own address, started as the first is and sent to the
//! same pod, and is measured as `baseline` in every round right beside the activator (the two
//! swap places each round). The activator/baseline ratios are taken within each round like
//! the others, so a before/after comparison is made in one run on one machine state rather
//! than between two runs that the machine's noise alone sets 10–15 % and more apart.

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
    /// How many times each target is measured at each connection count.
    pub rounds: usize,
    /// Use the built-in generator even when wrk is installed.
    pub builtin: bool,
    pub activator_bin: Option<PathBuf>,
    /// A second activator binary measured beside the first as [`BASELINE`].
    pub baseline_bin: Option<PathBuf>,
}

impl Default for WarmOptions {
    fn default() -> Self {
        Self {
            conns: vec![1, 8, 32],
            duration: Duration::from_secs(4),
            warmup: Duration::from_secs(1),
            rounds: 4,
            builtin: false,
            activator_bin: None,
            baseline_bin: None,
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub target: &'static str,
    pub conns: usize,
    /// Which round (from 0) this run belongs to.
    pub round: usize,
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
    /// The baseline activator's address and binary, when `--baseline-bin` was given.
    pub baseline: Option<(SocketAddr, PathBuf)>,
    /// The nginx address, or why there was none.
    pub nginx: Result<SocketAddr, String>,
    /// The address of the nginx that adds the forwarding headers, when it started.
    pub nginx_fwd: Option<SocketAddr>,
    pub duration: Duration,
    pub warmup: Duration,
    pub rounds: usize,
    pub rows: Vec<Row>,
}

pub const DIRECT: &str = "direct";
pub const NGINX: &str = "nginx";
pub const NGINX_FWD: &str = "nginx-fwd";
pub const ACTIVATOR: &str = "activator";
pub const BASELINE: &str = "baseline";

pub async fn run(opts: &WarmOptions) -> Result<WarmReport, Error> {
    if opts.conns.is_empty() || opts.conns.contains(&0) {
        return Err(Error::Options("--conns needs positive numbers".into()));
    }
    if opts.rounds == 0 {
        return Err(Error::Options("--rounds needs a positive number".into()));
    }
    let bin = activator_binary(opts.activator_bin.as_deref())?;
    let baseline_bin = match &opts.baseline_bin {
        Some(p) if !p.is_file() => {
            return Err(Error::Options(format!(
                "--baseline-bin {}: no such file",
                p.display()
            )));
        }
        other => other.clone(),
    };
    let loadgen = LoadGen::detect(opts.builtin);
    let cluster = BenchCluster::start(ClusterOptions::default()).await?;
    let ip = cluster.node_ip();
    let data = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let admin = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let name = "warm";
    create_revision(&cluster.client, name, &[cluster.member(data)], |_| {}).await?;
    let mut activator = crate::process::spawn_activator(
        &bin,
        &cluster.kubeconfig,
        cluster.node_name(),
        data,
        admin,
        cluster.dir.path().join("activator.log"),
    )?;
    // The baseline: the same arguments and kubeconfig, the same node name (so the same
    // member of the revision's subset, using the node's pods), its own loopback address (one
    // of the cluster's reservation that no node or pod uses) and ports.
    let mut baseline = match &baseline_bin {
        None => None,
        Some(b) => {
            let ip = cluster.spare_ip();
            let data = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
            let admin = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
            Some(crate::process::spawn_activator(
                b,
                &cluster.kubeconfig,
                cluster.node_name(),
                data,
                admin,
                cluster.dir.path().join("baseline.log"),
            )?)
        }
    };
    activator.wait_ready(Duration::from_secs(60)).await?;
    if let Some(b) = &mut baseline {
        b.wait_ready(Duration::from_secs(60)).await?;
    }

    // Make the pod warm: the first request cold-starts it; its answer names the pod IP.
    let headers = revision_headers(NAMESPACE, name);
    let pod_ip = answering_pod(data, &headers, "the cold start").await?;
    let pod = SocketAddr::from((pod_ip, crds::revision::DEFAULT_PORT as u16));
    // The baseline must be measured on the same pod, not on one it started for itself.
    if let Some(b) = &baseline {
        let via_baseline =
            answering_pod(b.data(), &headers, "the baseline's first request").await?;
        if via_baseline != pod_ip {
            return Err(Error::Http {
                target: format!("{BASELINE} at {}", b.data()),
                message: format!(
                    "answered from pod {via_baseline}, not the warm pod {pod_ip}: the two \
                     builds would not be measured on the same pod"
                ),
            });
        }
    }

    let (nginx_dir, fwd_dir) = (WorkDir::new("nginx")?, WorkDir::new("nginx-fwd")?);
    let start_nginx = async |dir: &WorkDir, forwarding: bool| match nginx::find() {
        None => Err("not found, skipped".to_string()),
        Some(bin) => {
            let port = crate::cluster::free_port(ip).map_err(|e| e.to_string())?;
            let listen = SocketAddr::from((ip, port));
            Nginx::start(&bin, dir.path(), listen, pod, forwarding)
                .await
                .map_err(|e| format!("failed to start, skipped: {e}"))
        }
    };
    let nginx = start_nginx(&nginx_dir, false).await;
    if let Err(why) = &nginx {
        tracing::warn!("nginx: {why}");
    }
    let nginx_fwd = match &nginx {
        Ok(_) => start_nginx(&fwd_dir, true)
            .await
            .inspect_err(|why| tracing::warn!("nginx with forwarding headers: {why}"))
            .ok(),
        Err(_) => None,
    };

    // Every target is sent the same request (`headers`: the revision headers an ingress would
    // set): only the address differs, so a proxy is not measured on a smaller request than
    // another.
    type Target = (&'static str, SocketAddr, Option<u32>);
    let mut targets: Vec<Target> = vec![(DIRECT, pod, None)];
    if let Ok(n) = &nginx {
        targets.push((NGINX, n.addr, n.pid()));
    }
    if let Some(n) = &nginx_fwd {
        targets.push((NGINX_FWD, n.addr, n.pid()));
    }
    targets.push((ACTIVATOR, data, Some(activator.pid())));
    // Last, so that it sits beside the activator in every round and the two swap places.
    if let Some(b) = &baseline {
        targets.push((BASELINE, b.data(), Some(b.pid())));
    }

    let mut rows = Vec::new();
    let measured = async {
        for &conns in &opts.conns {
            for round in 0..opts.rounds {
                for (target, addr, pid) in in_round_order(&targets, round) {
                    tracing::info!(target, conns, round, "measuring");
                    if !opts.warmup.is_zero() {
                        let warm = loadgen
                            .measure(*addr, &headers, conns, Duration::ZERO, opts.warmup)
                            .await?;
                        only_2xx(target, *addr, &warm)?;
                    }
                    let cpu_before = pid.and_then(crate::cpu::of_tree);
                    let result = loadgen
                        .measure(*addr, &headers, conns, Duration::ZERO, opts.duration)
                        .await?;
                    only_2xx(target, *addr, &result)?;
                    let cpu = cpu_before.zip(pid.and_then(crate::cpu::of_tree));
                    let cpu_per_request = cpu
                        .filter(|_| result.requests > 0)
                        .map(|(a, b)| b.saturating_sub(a) / result.requests as u32);
                    tracing::info!(
                        target,
                        conns,
                        round,
                        rps = result.rps() as u64,
                        p50_us = result.p50.as_micros() as u64,
                        "measured"
                    );
                    rows.push(Row {
                        target,
                        conns,
                        round,
                        result,
                        cpu_per_request,
                    });
                }
                activator.check_alive()?;
                if let Some(b) = &mut baseline {
                    b.check_alive()?;
                }
            }
        }
        Ok::<(), Error>(())
    }
    .await;

    let nginx_addr = nginx.as_ref().map(|n| n.addr).map_err(Clone::clone);
    let nginx_fwd_addr = nginx_fwd.as_ref().map(|n| n.addr);
    for n in nginx.into_iter().chain(nginx_fwd) {
        n.stop().await;
    }
    activator.stop().await;
    let baseline = match baseline {
        Some(b) => {
            let data = b.data();
            b.stop().await;
            baseline_bin.map(|bin| (data, bin))
        }
        None => None,
    };
    let node = cluster.node_name().to_string();
    cluster.shutdown().await;
    measured?;
    Ok(WarmReport {
        generator: loadgen.generator(),
        node,
        pod,
        activator: data,
        baseline,
        nginx: nginx_addr,
        nginx_fwd: nginx_fwd_addr,
        duration: opts.duration,
        warmup: opts.warmup,
        rounds: opts.rounds,
        rows,
    })
}

/// Sends one request to `addr` and returns the pod that answered it (the app's `x-pod-ip`);
/// an answer that is not 2xx is an error naming `what`.
async fn answering_pod(
    addr: SocketAddr,
    headers: &[(String, String)],
    what: &str,
) -> Result<std::net::Ipv4Addr, Error> {
    let answer = get(addr, "/", headers, Duration::from_secs(60)).await?;
    if !answer.status.is_success() {
        return Err(Error::Http {
            target: addr.to_string(),
            message: format!(
                "{what} answered {}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ),
        });
    }
    answer
        .headers
        .get("x-pod-ip")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::Http {
            target: addr.to_string(),
            message: "the app's answer has no x-pod-ip header".into(),
        })
}

/// Refuses a run with any answer that is not 2xx: a target answering 503 fast would look
/// faster than one doing the work, so such a bench measures nothing.
fn only_2xx(target: &str, addr: SocketAddr, result: &LoadResult) -> Result<(), Error> {
    if result.non_2xx == 0 {
        return Ok(());
    }
    Err(Error::Http {
        target: format!("{target} at {addr}"),
        message: format!(
            "{} answers were not 2xx (beside {} that were): the warm path is not being measured",
            result.non_2xx, result.requests
        ),
    })
}

/// The targets in the order round `round` measures them: direct first, then the rest
/// forwards in even rounds and backwards in odd ones, so neither proxy always runs second
/// (and alone inherits a warmer or a busier machine).
fn in_round_order<T>(targets: &[T], round: usize) -> Vec<&T> {
    let Some((first, rest)) = targets.split_first() else {
        return Vec::new();
    };
    let mut order = vec![first];
    if round.is_multiple_of(2) {
        order.extend(rest);
    } else {
        order.extend(rest.iter().rev());
    }
    order
}

/// The median of `xs` (the mean of the middle two when even); None when empty.
fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    Some(if !n.is_multiple_of(2) {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    })
}

/// A summary of per-round figures: median, least and most.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    fn of(xs: Vec<f64>) -> Option<Self> {
        let min = xs.iter().copied().reduce(f64::min)?;
        let max = xs.iter().copied().reduce(f64::max)?;
        Some(Self {
            median: median(xs)?,
            min,
            max,
        })
    }
}

impl WarmReport {
    /// A run with no error: a ratio is taken only between two of those (one whose socket
    /// errors cut requests short would be compared on fewer, or faster, answers).
    fn row(&self, target: &str, conns: usize, round: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.target == target && r.conns == conns && r.round == round)
            .filter(|r| r.result.errors == 0)
    }

    /// Runs at `conns` connections with errors: the rounds they are in give no ratio.
    fn runs_with_errors(&self, conns: usize) -> usize {
        self.runs_of_with_errors(&[], conns)
    }

    /// Runs of `targets` (all when empty) at `conns` connections with errors.
    fn runs_of_with_errors(&self, targets: &[&str], conns: usize) -> usize {
        self.rows
            .iter()
            .filter(|r| targets.is_empty() || targets.contains(&r.target))
            .filter(|r| r.conns == conns && r.result.errors > 0)
            .count()
    }

    fn conns(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.rows.iter().map(|r| r.conns).collect();
        c.dedup();
        c
    }

    /// A figure of each round that has it, summarised.
    fn per_round(&self, figure: impl Fn(usize) -> Option<f64>) -> Option<Spread> {
        Spread::of((0..self.rounds).filter_map(figure).collect())
    }

    /// activator throughput / `other`'s, within each round, per connection count.
    pub fn throughput_ratio(&self, other: &str, conns: usize) -> Option<Spread> {
        self.per_round(|round| {
            let a = self.row(ACTIVATOR, conns, round)?.result.rps();
            let o = self.row(other, conns, round)?.result.rps();
            (o > 0.0).then(|| a / o)
        })
    }

    /// The activator's CPU per request over `other`'s, within each round (below 1: cheaper).
    pub fn cpu_ratio(&self, other: &str, conns: usize) -> Option<Spread> {
        self.per_round(|round| {
            let a = self.row(ACTIVATOR, conns, round)?.cpu_per_request?;
            let n = self.row(other, conns, round)?.cpu_per_request?;
            (!n.is_zero()).then(|| a.as_secs_f64() / n.as_secs_f64())
        })
    }

    /// `target`'s p50 minus direct's, at `conns` connections, in ms, within each round.
    pub fn added_p50_ms(&self, target: &str, conns: usize) -> Option<Spread> {
        self.per_round(|round| {
            let t = self.row(target, conns, round)?.result.p50.as_secs_f64();
            let d = self.row(DIRECT, conns, round)?.result.p50.as_secs_f64();
            Some((t - d) * 1e3)
        })
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// "median (min–max)", or just the figure when there was one round.
fn spread(s: Option<Spread>, digits: usize) -> String {
    match s {
        None => "-".into(),
        Some(s) if s.min == s.max => format!("{:.digits$}", s.median),
        Some(s) => format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            s.median, s.min, s.max
        ),
    }
}

impl fmt::Display for WarmReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "warm path: node {}, app pod {}, activator {}, load {} ({} s per run after a {} s warm-up, {} round(s); every target sent the same GET with x-revision-namespace and x-revision-name)",
            self.node,
            self.pod,
            self.activator,
            self.generator,
            self.duration.as_secs_f64(),
            self.warmup.as_secs_f64(),
            self.rounds
        )?;
        match &self.nginx {
            Ok(a) => writeln!(f, "nginx: {a} (keepalive 64 to the pod)")?,
            Err(why) => writeln!(f, "nginx: {why}")?,
        }
        if let Some(a) = &self.nginx_fwd {
            writeln!(
                f,
                "nginx-fwd: {a} (the same, passing Host on and adding the forwarding headers as \
                 the activator does)"
            )?;
        }
        writeln!(
            f,
            "{:<10} {:>5} {:>5} {:>10} {:>9} {:>9} {:>7} {:>11}",
            "target", "conns", "round", "req/s", "p50 ms", "p99 ms", "errors", "cpu µs/req"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<10} {:>5} {:>5} {:>10.0} {:>9.3} {:>9.3} {:>7} {:>11}",
                r.target,
                r.conns,
                r.round + 1,
                r.result.rps(),
                ms(r.result.p50),
                ms(r.result.p99),
                r.result.errors,
                opt(r.cpu_per_request.map(|d| d.as_secs_f64() * 1e6), 1)
            )?;
        }
        writeln!(
            f,
            "ratios within a round, median (least–most) of {} round(s):",
            self.rounds
        )?;
        writeln!(
            f,
            "{:>5} {:>18} {:>18} {:>18} {:>18} {:>18}",
            "conns",
            "act/nginx",
            "act/nginx-fwd",
            "act/direct",
            "cpu/req act/nginx",
            "act/nginx-fwd"
        )?;
        for c in self.conns() {
            writeln!(
                f,
                "{:>5} {:>18} {:>18} {:>18} {:>18} {:>18}",
                c,
                spread(self.throughput_ratio(NGINX, c), 2),
                spread(self.throughput_ratio(NGINX_FWD, c), 2),
                spread(self.throughput_ratio(DIRECT, c), 2),
                spread(self.cpu_ratio(NGINX, c), 2),
                spread(self.cpu_ratio(NGINX_FWD, c), 2)
            )?;
            let bad = self.runs_with_errors(c);
            if bad > 0 {
                writeln!(
                    f,
                    "{c:>5} {bad} run(s) had errors (see the table): their rounds give no ratio"
                )?;
            }
        }
        writeln!(
            f,
            "added p50 latency at 1 connection (over direct): activator {} ms, nginx {} ms, \
             nginx-fwd {} ms",
            spread(self.added_p50_ms(ACTIVATOR, 1), 3),
            spread(self.added_p50_ms(NGINX, 1), 3),
            spread(self.added_p50_ms(NGINX_FWD, 1), 3)
        )?;
        if let Some((addr, bin)) = &self.baseline {
            self.fmt_baseline(f, *addr, bin)?;
        }
        Ok(())
    }
}

impl WarmReport {
    /// The activator against the baseline build, within each round.
    fn fmt_baseline(
        &self,
        f: &mut fmt::Formatter<'_>,
        addr: SocketAddr,
        bin: &std::path::Path,
    ) -> fmt::Result {
        writeln!(
            f,
            "activator against the baseline {} at {addr} (same node, same pod), within a round, \
             median (least–most) of {} round(s):",
            bin.display(),
            self.rounds
        )?;
        writeln!(
            f,
            "{:>5} {:>18} {:>22}",
            "conns", "act/baseline", "cpu/req act/baseline"
        )?;
        for c in self.conns() {
            writeln!(
                f,
                "{:>5} {:>18} {:>22}",
                c,
                spread(self.throughput_ratio(BASELINE, c), 2),
                spread(self.cpu_ratio(BASELINE, c), 2)
            )?;
            let bad = self.runs_of_with_errors(&[ACTIVATOR, BASELINE], c);
            if bad > 0 {
                writeln!(
                    f,
                    "{c:>5} {bad} activator or baseline run(s) had errors (see the table): \
                     their rounds give no act/baseline ratio"
                )?;
            }
        }
        writeln!(
            f,
            "added p50 latency at 1 connection (over direct): baseline {} ms",
            spread(self.added_p50_ms(BASELINE, 1), 3)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn spread_is_median_least_and_most() {
        let s = Spread::of(vec![0.9, 1.2, 1.05]).unwrap();
        assert_eq!((s.median, s.min, s.max), (1.05, 0.9, 1.2));
        assert_eq!(spread(Some(s), 2), "1.05 (0.90–1.20)");
        assert_eq!(spread(Spread::of(vec![1.0]), 2), "1.00");
        assert_eq!(spread(None, 2), "-");
    }

    #[test]
    fn rounds_alternate_the_proxies_after_direct() {
        let t = ["direct", "nginx", "activator"];
        assert_eq!(in_round_order(&t, 0), [&"direct", &"nginx", &"activator"]);
        assert_eq!(in_round_order(&t, 1), [&"direct", &"activator", &"nginx"]);
        assert_eq!(in_round_order(&t, 2), [&"direct", &"nginx", &"activator"]);
        assert!(in_round_order::<&str>(&[], 0).is_empty());
    }

    #[test]
    fn the_baseline_sits_beside_the_activator_and_they_swap_each_round() {
        let t = [DIRECT, NGINX, NGINX_FWD, ACTIVATOR, BASELINE];
        assert_eq!(
            in_round_order(&t, 0),
            [&DIRECT, &NGINX, &NGINX_FWD, &ACTIVATOR, &BASELINE]
        );
        assert_eq!(
            in_round_order(&t, 1),
            [&DIRECT, &BASELINE, &ACTIVATOR, &NGINX_FWD, &NGINX]
        );
    }

    fn row(target: &'static str, conns: usize, round: usize, requests: u64) -> Row {
        Row {
            target,
            conns,
            round,
            result: LoadResult {
                generator: Generator::Builtin,
                requests,
                non_2xx: 0,
                errors: 0,
                elapsed: Duration::from_secs(1),
                p50: Duration::ZERO,
                p99: Duration::ZERO,
            },
            cpu_per_request: None,
        }
    }

    fn report(rows: Vec<Row>) -> WarmReport {
        WarmReport {
            generator: Generator::Builtin,
            node: "n".into(),
            pod: "127.0.0.1:1".parse().unwrap(),
            activator: "127.0.0.1:2".parse().unwrap(),
            baseline: None,
            nginx: Err("none".into()),
            nginx_fwd: None,
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            rounds: 2,
            rows,
        }
    }

    #[test]
    fn ratios_are_taken_within_each_round() {
        // Round 1 is twice as fast for both: per-round ratios are 0.9 and 1.1, not the
        // 0.97 or 1.03 a mix of rounds would give.
        let report = report(vec![
            row(NGINX, 8, 0, 1000),
            row(ACTIVATOR, 8, 0, 900),
            row(NGINX, 8, 1, 2000),
            row(ACTIVATOR, 8, 1, 2200),
        ]);
        let r = report.throughput_ratio(NGINX, 8).unwrap();
        assert!((r.min - 0.9).abs() < 1e-9 && (r.max - 1.1).abs() < 1e-9);
        assert!((r.median - 1.0).abs() < 1e-9);
        assert!(report.throughput_ratio(NGINX, 32).is_none());
        // A run with a socket error gives its round no ratio, and the report says so.
        let mut with_errors = report.clone();
        with_errors.rows[3].result.errors = 2;
        let r = with_errors.throughput_ratio(NGINX, 8).unwrap();
        assert_eq!((r.min, r.max), (0.9, 0.9), "round 1 left out");
        assert!(with_errors.to_string().contains("1 run(s) had errors"));
    }

    fn with_cpu(mut r: Row, micros: u64) -> Row {
        r.cpu_per_request = Some(Duration::from_micros(micros));
        r
    }

    #[test]
    fn act_over_baseline_is_taken_within_each_round_and_its_errors_counted() {
        let mut report = report(vec![
            with_cpu(row(ACTIVATOR, 8, 0, 1100), 40),
            with_cpu(row(BASELINE, 8, 0, 1000), 50),
            with_cpu(row(BASELINE, 8, 1, 2000), 50),
            with_cpu(row(ACTIVATOR, 8, 1, 2600), 30),
        ]);
        let r = report.throughput_ratio(BASELINE, 8).unwrap();
        assert!((r.min - 1.1).abs() < 1e-9 && (r.max - 1.3).abs() < 1e-9);
        let c = report.cpu_ratio(BASELINE, 8).unwrap();
        assert!((c.min - 0.6).abs() < 1e-9 && (c.max - 0.8).abs() < 1e-9);
        // Without a baseline address (no `--baseline-bin`) no act/baseline section.
        assert!(!report.to_string().contains("act/baseline"));
        report.baseline = Some(("127.0.0.1:3".parse().unwrap(), PathBuf::from("/tmp/before")));
        let text = report.to_string();
        assert!(text.contains("act/baseline"), "{text}");
        assert!(text.contains("1.20 (1.10–1.30)"), "{text}");
        assert!(text.contains("0.70 (0.60–0.80)"), "{text}");
        assert!(!text.contains("had errors"), "{text}");
        // A baseline run with a socket error: its round gives no act/baseline, and both the
        // overall count and the baseline's own say so.
        report.rows[2].result.errors = 3;
        let r = report.throughput_ratio(BASELINE, 8).unwrap();
        assert_eq!((r.min, r.max), (1.1, 1.1), "round 1 left out");
        let text = report.to_string();
        assert!(text.contains("1 run(s) had errors"), "{text}");
        assert!(
            text.contains("1 activator or baseline run(s) had errors"),
            "{text}"
        );
    }

    #[test]
    fn a_run_with_any_answer_not_2xx_is_refused() {
        let addr = "127.0.0.1:1".parse().unwrap();
        let mut r = row(ACTIVATOR, 8, 0, 1000).result;
        assert!(only_2xx(ACTIVATOR, addr, &r).is_ok());
        r.non_2xx = 1;
        let e = only_2xx(ACTIVATOR, addr, &r).unwrap_err().to_string();
        assert!(e.contains("1 answers were not 2xx"), "{e}");
    }
}
