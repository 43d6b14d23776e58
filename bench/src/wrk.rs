//! `wrk` as the load generator when it is installed: one thread (`-t1`), N connections,
//! `--latency`, its output parsed into a [`LoadResult`].

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::Error;
use crate::loadgen::{Generator, LoadResult};

pub use loadtest::nginx::find_program;

/// Runs `wrk -t1 -c<conns> -d<secs>s --latency` against `http://target/` with `headers`.
pub async fn run(
    wrk: &Path,
    target: SocketAddr,
    headers: &[(String, String)],
    conns: usize,
    duration: Duration,
) -> Result<LoadResult, Error> {
    let secs = duration.as_secs().max(1);
    let mut cmd = tokio::process::Command::new(wrk);
    cmd.arg("-t1")
        .arg(format!("-c{conns}"))
        .arg(format!("-d{secs}s"))
        .arg("--latency");
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    cmd.arg(format!("http://{target}/"));
    cmd.kill_on_drop(true);
    let out = cmd.output().await?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::Start {
            what: "wrk".into(),
            message: format!(
                "{}: {}{}",
                out.status,
                text,
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    parse_output(&text)
}

/// Parses wrk's `--latency` report.
pub fn parse_output(text: &str) -> Result<LoadResult, Error> {
    let bad = |m: &str| Error::Parse {
        what: "wrk output",
        message: format!("{m} in:\n{text}"),
    };
    let mut requests = None;
    let mut elapsed = None;
    let mut p50 = None;
    let mut p99 = None;
    let mut errors = 0u64;
    let mut non_2xx = 0u64;
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", v] => p50 = parse_time(v),
            ["99%", v] => p99 = parse_time(v),
            [n, "requests", "in", t, ..] => {
                requests = n.parse::<u64>().ok();
                elapsed = parse_time(t.trim_end_matches(','));
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => {
                non_2xx = n
                    .parse::<u64>()
                    .map_err(|_| bad("an unreadable Non-2xx count"))?;
                errors += non_2xx;
            }
            ["Socket", "errors:", rest @ ..] => {
                // connect 0, read 0, write 0, timeout 0
                errors += rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>();
            }
            _ => {}
        }
    }
    // wrk's "N requests" counts every answer, whatever its status: only 2xx are throughput.
    let answers = requests.ok_or_else(|| bad("no 'N requests in T' line"))?;
    Ok(LoadResult {
        generator: Generator::Wrk,
        requests: answers.saturating_sub(non_2xx),
        non_2xx,
        elapsed: elapsed.ok_or_else(|| bad("no elapsed time"))?,
        errors,
        p50: p50.ok_or_else(|| bad("no 50% line (was --latency given?)"))?,
        p99: p99.ok_or_else(|| bad("no 99% line"))?,
    })
}

/// wrk's time format: `212.00us`, `1.50ms`, `10.00s`, `1.00m`, `1.00h`.
fn parse_time(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    let secs = match unit {
        "us" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "Running 10s test @ http://127.0.10.1:8080/
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   235.25us  110.54us   3.33ms   89.36%
    Req/Sec    33.18k     2.27k   37.09k    73.00%
  Latency Distribution
     50%  212.00us
     75%  262.00us
     90%  325.00us
     99%    1.64ms
  330170 requests in 10.00s, 40.30MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:  33014.66
Transfer/sec:      4.03MB
";

    #[test]
    fn parses_latency_report() {
        let r = parse_output(OUTPUT).unwrap();
        // 330,170 answers, of which 5 were not 2xx: only the 2xx ones are throughput.
        assert_eq!((r.requests, r.non_2xx), (330_165, 5));
        assert_eq!(r.elapsed, Duration::from_secs(10));
        assert_eq!(r.p50, Duration::from_micros(212));
        assert_eq!(r.p99, Duration::from_micros(1640));
        assert_eq!(r.errors, 8);
        assert!((r.rps() - 33_016.5).abs() < 0.1);
    }

    #[test]
    fn refuses_output_without_latency_distribution() {
        let text = "  10 requests in 1.00s, 1KB read\nRequests/sec: 10\n";
        assert!(parse_output(text).is_err());
        assert_eq!(parse_time("2.00s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_time("1.00m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_time("7"), None);
    }
}
