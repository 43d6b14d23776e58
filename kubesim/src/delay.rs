//! Simulated latencies (pod start phases, API writes): a fixed value or a distribution, and
//! the `300ms` / `uniform:..` / `lognormal:..` syntax the command lines share.

use std::str::FromStr;
use std::time::Duration;

use rand::{Rng, RngExt};

use crate::error::Error;

/// A simulated latency: fixed, or drawn from a distribution each time it is used.
#[derive(Clone, Debug, PartialEq)]
pub enum Delay {
    Fixed(Duration),
    /// Uniform in `[min, max]`.
    Uniform {
        min: Duration,
        max: Duration,
    },
    /// Log-normal with the given median and shape `sigma` (the standard deviation of the
    /// underlying normal): a long right tail, the usual shape of image pulls and app starts.
    LogNormal {
        median: Duration,
        sigma: f64,
    },
}

/// Log-normal samples are capped at this many medians so one unlucky draw cannot stall a test.
const LOG_NORMAL_CAP_MEDIANS: f64 = 50.0;

impl Delay {
    pub const ZERO: Delay = Delay::Fixed(Duration::ZERO);

    pub fn fixed_ms(ms: u64) -> Self {
        Delay::Fixed(Duration::from_millis(ms))
    }

    pub fn is_zero(&self) -> bool {
        match self {
            Delay::Fixed(d) => d.is_zero(),
            Delay::Uniform { min, max } => min.is_zero() && max.is_zero(),
            Delay::LogNormal { median, .. } => median.is_zero(),
        }
    }

    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        match *self {
            Delay::Fixed(d) => d,
            Delay::Uniform { min, max } => {
                if max <= min {
                    min
                } else {
                    let nanos = rng.random_range(min.as_nanos() as u64..=max.as_nanos() as u64);
                    Duration::from_nanos(nanos)
                }
            }
            Delay::LogNormal { median, sigma } => {
                // Box-Muller: u1 in (0, 1] so ln(u1) is finite.
                let u1: f64 = 1.0 - rng.random::<f64>();
                let u2: f64 = rng.random::<f64>();
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let factor = (sigma * z).exp().min(LOG_NORMAL_CAP_MEDIANS);
                Duration::try_from_secs_f64(median.as_secs_f64() * factor).unwrap_or(median)
            }
        }
    }

    pub fn sample_now(&self) -> Duration {
        self.sample(&mut rand::rng())
    }
}

impl Default for Delay {
    fn default() -> Self {
        Delay::ZERO
    }
}

/// The same syntax `FromStr` reads: `6ms`, `uniform:3ms..9ms`, `lognormal:6ms,0.5`.
impl std::fmt::Display for Delay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn ms(d: Duration) -> String {
            let v = d.as_secs_f64() * 1e3;
            let s = format!("{v:.3}");
            format!("{}ms", s.trim_end_matches('0').trim_end_matches('.'))
        }
        match self {
            Delay::Fixed(d) => write!(f, "{}", ms(*d)),
            Delay::Uniform { min, max } => write!(f, "uniform:{}..{}", ms(*min), ms(*max)),
            Delay::LogNormal { median, sigma } => write!(f, "lognormal:{},{sigma}", ms(*median)),
        }
    }
}

/// Parses `300ms`, `2s`, `uniform:100ms..500ms`, `lognormal:300ms,0.5`.
impl FromStr for Delay {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || Error::InvalidConfig(format!("invalid delay {s:?}"));
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("uniform:") {
            let (a, b) = rest.split_once("..").ok_or_else(bad)?;
            let (min, max) = (
                parse_duration(a).ok_or_else(bad)?,
                parse_duration(b).ok_or_else(bad)?,
            );
            if max < min {
                return Err(bad());
            }
            Ok(Delay::Uniform { min, max })
        } else if let Some(rest) = s.strip_prefix("lognormal:") {
            let (a, b) = rest.split_once(',').ok_or_else(bad)?;
            let median = parse_duration(a).ok_or_else(bad)?;
            let sigma: f64 = b.trim().parse().map_err(|_| bad())?;
            if !sigma.is_finite() || sigma < 0.0 {
                return Err(bad());
            }
            Ok(Delay::LogNormal { median, sigma })
        } else {
            parse_duration(s).map(Delay::Fixed).ok_or_else(bad)
        }
    }
}

/// `150ms`, `2s`, `1.5s`, `3m`, or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "ms"),
    };
    let value: f64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "us" | "µs" => value / 1_000_000.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_delays() {
        assert_eq!("300ms".parse::<Delay>().unwrap(), Delay::fixed_ms(300));
        assert_eq!("250".parse::<Delay>().unwrap(), Delay::fixed_ms(250));
        assert_eq!("1.5s".parse::<Delay>().unwrap(), Delay::fixed_ms(1500));
        assert_eq!(
            "uniform:100ms..2s".parse::<Delay>().unwrap(),
            Delay::Uniform {
                min: Duration::from_millis(100),
                max: Duration::from_secs(2)
            }
        );
        assert_eq!(
            "lognormal:300ms,0.5".parse::<Delay>().unwrap(),
            Delay::LogNormal {
                median: Duration::from_millis(300),
                sigma: 0.5
            }
        );
        for bad in [
            "",
            "abc",
            "10parsecs",
            "uniform:2s..1s",
            "lognormal:1s",
            "lognormal:1s,-1",
        ] {
            assert!(bad.parse::<Delay>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn displays_what_it_parses() {
        for s in [
            "6ms",
            "0ms",
            "0.5ms",
            "uniform:3ms..9ms",
            "lognormal:6ms,0.5",
            "1500ms",
        ] {
            let d: Delay = s.parse().unwrap();
            assert_eq!(d.to_string(), s);
            assert_eq!(d.to_string().parse::<Delay>().unwrap(), d);
        }
    }

    #[test]
    fn uniform_samples_stay_in_range() {
        let d = Delay::Uniform {
            min: Duration::from_millis(10),
            max: Duration::from_millis(20),
        };
        let mut rng = rand::rng();
        let samples: Vec<_> = (0..1000).map(|_| d.sample(&mut rng)).collect();
        assert!(
            samples
                .iter()
                .all(|s| (Duration::from_millis(10)..=Duration::from_millis(20)).contains(s))
        );
        // Not degenerate: both halves of the range are hit.
        assert!(samples.iter().any(|s| *s < Duration::from_millis(15)));
        assert!(samples.iter().any(|s| *s > Duration::from_millis(15)));
    }

    #[test]
    fn log_normal_median_is_close_and_capped() {
        let median = Duration::from_millis(100);
        let d = Delay::LogNormal { median, sigma: 1.0 };
        let mut rng = rand::rng();
        let mut samples: Vec<_> = (0..4001).map(|_| d.sample(&mut rng)).collect();
        samples.sort();
        let m = samples[2000].as_secs_f64();
        assert!((0.08..0.125).contains(&m), "sample median {m}");
        assert!(
            samples
                .iter()
                .all(|s| s.as_secs_f64() <= 0.1 * LOG_NORMAL_CAP_MEDIANS + 1e-9)
        );
        assert!(samples[0] < median && samples[4000] > median);
    }
}
