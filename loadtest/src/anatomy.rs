//! Cold-start anatomy: the phases each cold response carries in its `Server-Timing` header
//! (the activator's own clock), split into consecutive segments and summarised. Pure logic.

use activator::node::cold_start::{
    ENTRY, FORWARDED, POD_ADDR, POD_BOUND, POD_POST, POD_READY, WAIT,
};
use serde::Serialize;

use crate::stats::Percentiles;

/// One cold start as its response reported it, in ms from the arrival of the request that
/// found no pod (`wait` from this request's own arrival).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ColdPhases {
    pub pod_post: f64,
    pub pod_bound: f64,
    /// When the pod's address was known (absent from activators older than the mark).
    pub pod_addr: Option<f64>,
    pub pod_ready: f64,
    pub wait: f64,
    /// When an entry forwarded the request: its time from the request's arrival there until
    /// it sent the request on, and until the member's answer came back (see
    /// `activator::node::cold_start::ENTRY`).
    pub entry: Option<f64>,
    pub forwarded: Option<f64>,
}

impl ColdPhases {
    /// Parses the activator's `Server-Timing` value; None unless all four phases are there.
    pub fn parse(header: &str) -> Option<Self> {
        let (mut post, mut bound, mut ready, mut wait) = (None, None, None, None);
        let mut addr = None;
        let (mut entry, mut forwarded) = (None, None);
        for metric in header.split(',') {
            let mut parts = metric.trim().split(';');
            let name = parts.next()?.trim();
            let dur = parts
                .find_map(|p| p.trim().strip_prefix("dur="))
                .and_then(|d| d.parse::<f64>().ok())
                .filter(|d| d.is_finite() && *d >= 0.0);
            let slot = match name {
                POD_POST => &mut post,
                POD_BOUND => &mut bound,
                POD_ADDR => &mut addr,
                POD_READY => &mut ready,
                WAIT => &mut wait,
                ENTRY => &mut entry,
                FORWARDED => &mut forwarded,
                _ => continue,
            };
            *slot = dur;
        }
        Some(Self {
            pod_post: post?,
            pod_bound: bound?,
            pod_addr: addr,
            pod_ready: ready?,
            wait: wait?,
            entry,
            forwarded,
        })
    }

    /// The hop's own cost for a forwarded request: the entry's wait for the member's answer
    /// less the member's own wait (the forward's connection and transfer, both ways).
    pub fn hop(&self) -> Option<f64> {
        Some((self.forwarded? - self.entry? - self.wait).max(0.0))
    }

    /// Consecutive segments: arrival → POST, POST → seen bound, bound → Ready seen,
    /// Ready → first byte (the last from this request's wait, never negative).
    pub fn segments(&self) -> [f64; 4] {
        [
            self.pod_post,
            (self.pod_bound - self.pod_post).max(0.0),
            (self.pod_ready - self.pod_bound).max(0.0),
            (self.wait - self.pod_ready).max(0.0),
        ]
    }
}

/// The segment names, in order (for tables and the stacked bar).
pub const SEGMENTS: [&str; 4] = [
    "arrival→pod POST",
    "POST→seen bound",
    "bound→Ready seen",
    "Ready→first byte",
];

/// Percentiles of each segment over many cold starts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Anatomy {
    /// Cold responses that carried all phases.
    pub count: usize,
    pub arrival_to_post_ms: Percentiles,
    pub post_to_bound_ms: Percentiles,
    pub bound_to_ready_ms: Percentiles,
    pub ready_to_first_byte_ms: Percentiles,
    /// The whole wait of each request, arrival to first byte.
    pub total_ms: Percentiles,
    /// Of `count`, the requests an entry forwarded to a member; for them, the entry's time
    /// before the hop (its lookups), the hop's own cost ([`ColdPhases::hop`]), and the entry's
    /// whole time, arrival there to the member's answer back.
    pub forwarded: usize,
    pub entry_ms: Percentiles,
    pub hop_ms: Percentiles,
    pub forwarded_total_ms: Percentiles,
}

impl Anatomy {
    pub fn of(phases: &[ColdPhases]) -> Self {
        let col = |f: &dyn Fn(&ColdPhases) -> f64| Percentiles::of_ms(phases.iter().map(f));
        let ms = |v: Vec<f64>| Percentiles::of_ms(v);
        let hopped: Vec<&ColdPhases> = phases.iter().filter(|p| p.hop().is_some()).collect();
        Self {
            forwarded: hopped.len(),
            entry_ms: ms(hopped.iter().filter_map(|p| p.entry).collect()),
            hop_ms: ms(hopped.iter().filter_map(|p| p.hop()).collect()),
            forwarded_total_ms: ms(hopped.iter().filter_map(|p| p.forwarded).collect()),
            count: phases.len(),
            arrival_to_post_ms: col(&|p| p.segments()[0]),
            post_to_bound_ms: col(&|p| p.segments()[1]),
            bound_to_ready_ms: col(&|p| p.segments()[2]),
            ready_to_first_byte_ms: col(&|p| p.segments()[3]),
            total_ms: col(&|p| p.wait),
        }
    }

    /// The segments' percentiles in [`SEGMENTS`] order.
    pub fn segments(&self) -> [&Percentiles; 4] {
        [
            &self.arrival_to_post_ms,
            &self.post_to_bound_ms,
            &self.bound_to_ready_ms,
            &self.ready_to_first_byte_ms,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parses_what_the_activator_writes() {
        let t = activator::node::cold_start::ColdTimings {
            post: Duration::from_micros(1_500),
            bound: Duration::from_millis(8),
            addr: Duration::from_millis(140),
            ready: Duration::from_millis(305),
        };
        let p = ColdPhases::parse(&t.server_timing(Duration::from_millis(307))).unwrap();
        assert_eq!(
            p,
            ColdPhases {
                pod_post: 1.5,
                pod_bound: 8.0,
                pod_addr: Some(140.0),
                pod_ready: 305.0,
                wait: 307.0,
                entry: None,
                forwarded: None,
            }
        );
        assert_eq!(p.segments(), [1.5, 6.5, 297.0, 2.0]);
        assert_eq!(p.hop(), None, "not forwarded");
        // An entry's two marks, appended to the member's (a second header value, joined).
        let with_entry = format!(
            "{}, {}",
            t.server_timing(Duration::from_millis(307)),
            activator::node::cold_start::entry_timing(
                Duration::from_millis(4),
                Duration::from_millis(315)
            )
        );
        let p = ColdPhases::parse(&with_entry).unwrap();
        assert_eq!((p.entry, p.forwarded), (Some(4.0), Some(315.0)));
        assert_eq!(
            p.hop(),
            Some(4.0),
            "315 - 4 before the hop - 307 at the member"
        );
    }

    #[test]
    fn incomplete_or_foreign_headers_are_not_phases() {
        assert_eq!(ColdPhases::parse("db;dur=53, app;dur=47.2"), None);
        assert_eq!(
            ColdPhases::parse("pod-post;dur=1, pod-bound;dur=2, pod-ready;dur=x, wait;dur=4"),
            None
        );
        // Unknown metrics and extra parameters are skipped.
        let p = ColdPhases::parse(
            "cache;desc=\"x\", pod-post;desc=a;dur=1, pod-bound;dur=2, pod-ready;dur=3, wait;dur=2",
        )
        .unwrap();
        assert_eq!(p.segments(), [1.0, 1.0, 1.0, 0.0], "never negative");
    }

    #[test]
    fn anatomy_takes_percentiles_per_segment() {
        let ps: Vec<ColdPhases> = (1..=100)
            .map(|i| ColdPhases {
                pod_post: 1.0,
                pod_bound: 1.0 + i as f64,
                pod_ready: 301.0 + i as f64,
                wait: 302.0 + i as f64,
                ..ColdPhases::default()
            })
            .collect();
        let a = Anatomy::of(&ps);
        assert_eq!(a.count, 100);
        assert_eq!(a.post_to_bound_ms.p50, 50.0);
        assert_eq!(a.bound_to_ready_ms.p99, 300.0);
        assert_eq!(a.total_ms.max, 402.0);
    }
}
