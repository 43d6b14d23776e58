//! `bench`: prints the figures of the warm path, the control path, memory per waiting request
//! and memory per revision. See docs/benchmarks.md.
// The reports are the program's output.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bench::buffer::BufferOptions;
use bench::control::ControlOptions;
use bench::revisions::RevisionsOptions;
use bench::warm::WarmOptions;
use clap::{Args, Parser, Subcommand};
use kubesim::node::Delay;
use kubesim::node::config::parse_duration;

#[derive(Parser, Debug)]
#[command(
    about = "local-activator benchmarks: the activator binary (built next to this one) against \
             an embedded kubesim API server and a simulated node"
)]
struct Cli {
    /// The activator binary (default: `activator` next to this executable).
    #[arg(long, global = true)]
    activator_bin: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Warm path: req/s and latency direct to the pod, through nginx, through the activator.
    Warm(WarmArgs),
    /// Control path: request arrival to pod POST, bound, ready, first byte, over K cold starts.
    Control(ControlArgs),
    /// Memory per waiting request: activator RSS with M requests buffered for one cold pod.
    Buffer(BufferArgs),
    /// Activator RSS with R revisions in the cluster, O of them listing its node.
    Revisions(RevisionsArgs),
    /// All four in order, with smaller defaults (a few minutes).
    All {
        /// Use the built-in load generator even when wrk is installed.
        #[arg(long)]
        builtin: bool,
    },
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).ok_or_else(|| format!("invalid duration {s:?} (e.g. 10s, 500ms)"))
}

#[derive(Args, Debug)]
struct WarmArgs {
    /// Connection counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    conns: Vec<usize>,
    /// Measured time per target, connection count and round.
    #[arg(long, default_value = "4s", value_parser = duration)]
    duration: Duration,
    /// Warm-up before each measurement (discarded).
    #[arg(long, default_value = "1s", value_parser = duration)]
    warmup: Duration,
    /// Rounds: each target measured this many times per connection count, nginx and the
    /// activator in alternating order (even: each order equally often); ratios are taken
    /// within a round.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Use the built-in load generator even when wrk is installed.
    #[arg(long)]
    builtin: bool,
    /// A second activator binary (e.g. the build before a change), started as the first is on
    /// its own address and measured as `baseline` in every round beside it; the report adds
    /// the activator/baseline ratios.
    #[arg(long)]
    baseline_bin: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ControlArgs {
    /// K: cold revisions, one request each (at most 253, the pods of one simulated node).
    #[arg(long, default_value_t = 200)]
    revisions: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// The API server's write-latency model: `0ms` (off), `6ms`, `lognormal:6ms,0.5` (the
    /// load test's calibrated model).
    #[arg(long, default_value = "0ms")]
    api_write_latency: Delay,
}

#[derive(Args, Debug)]
struct BufferArgs {
    /// M: concurrent requests waiting for the one cold pod.
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    /// The pod's simulated container start delay: how long the requests wait.
    #[arg(long, default_value = "30s")]
    start_delay: Delay,
    /// Time after all are waiting before RSS is read.
    #[arg(long, default_value = "2s", value_parser = duration)]
    settle: Duration,
}

#[derive(Args, Debug)]
struct RevisionsArgs {
    /// R: revisions (each with its ActivationEndpoints) in the cluster.
    #[arg(long, default_value_t = 100_000)]
    revisions: usize,
    /// O: revisions whose ActivationEndpoints list this activator's node.
    #[arg(long, default_value_t = 300)]
    own: usize,
    /// Members per subset.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 64)]
    create_concurrency: usize,
    /// Requests afterwards, one each to this many of its own revisions.
    #[arg(long, default_value_t = 5)]
    requests: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,kubesim=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: a log saved to a file stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let bin = cli.activator_bin;
    println!("{}", machine());
    match cli.command {
        Command::Warm(a) => {
            let o = WarmOptions {
                conns: a.conns,
                duration: a.duration,
                warmup: a.warmup,
                rounds: a.rounds,
                builtin: a.builtin,
                activator_bin: bin,
                baseline_bin: a.baseline_bin,
            };
            print!("{}", bench::warm::run(&o).await.context("bench warm")?);
        }
        Command::Control(a) => {
            let o = ControlOptions {
                revisions: a.revisions,
                concurrency: a.concurrency,
                write_latency: a.api_write_latency,
                activator_bin: bin,
            };
            print!(
                "{}",
                bench::control::run(&o).await.context("bench control")?
            );
        }
        Command::Buffer(a) => {
            let o = BufferOptions {
                requests: a.requests,
                start_delay: a.start_delay,
                settle: a.settle,
                activator_bin: bin,
                ..BufferOptions::default()
            };
            print!("{}", bench::buffer::run(&o).await.context("bench buffer")?);
        }
        Command::Revisions(a) => {
            let o = RevisionsOptions {
                revisions: a.revisions,
                own: a.own,
                members: a.members,
                create_concurrency: a.create_concurrency,
                requests: a.requests,
                activator_bin: bin,
            };
            print!(
                "{}",
                bench::revisions::run(&o).await.context("bench revisions")?
            );
        }
        Command::All { builtin } => {
            let warm = WarmOptions {
                conns: vec![1, 8, 32],
                duration: Duration::from_secs(3),
                warmup: Duration::from_secs(1),
                rounds: 1,
                builtin,
                activator_bin: bin.clone(),
                baseline_bin: None,
            };
            println!("== bench warm --conns 1,8,32 --duration 3s --warmup 1s --rounds 1");
            print!("{}", bench::warm::run(&warm).await.context("bench warm")?);
            let control = ControlOptions {
                revisions: 50,
                activator_bin: bin.clone(),
                ..ControlOptions::default()
            };
            println!("\n== bench control --revisions 50");
            print!(
                "{}",
                bench::control::run(&control)
                    .await
                    .context("bench control")?
            );
            let buffer = BufferOptions {
                requests: 2_000,
                start_delay: Delay::Fixed(Duration::from_secs(15)),
                activator_bin: bin.clone(),
                ..BufferOptions::default()
            };
            println!("\n== bench buffer --requests 2000 --start-delay 15s");
            print!(
                "{}",
                bench::buffer::run(&buffer).await.context("bench buffer")?
            );
            let revisions = RevisionsOptions {
                revisions: 10_000,
                activator_bin: bin,
                ..RevisionsOptions::default()
            };
            println!("\n== bench revisions --revisions 10000 --own 300");
            print!(
                "{}",
                bench::revisions::run(&revisions)
                    .await
                    .context("bench revisions")?
            );
        }
    }
    Ok(())
}

/// The machine the figures come from: cores and memory.
fn machine() -> String {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kib| kib as f64 / (1024.0 * 1024.0))
        .unwrap_or(0.0);
    format!("machine: {cores} cores, {mem_gib:.1} GiB memory")
}
