//! One cold start's phases, as the activator saw them, for the response's `Server-Timing`
//! header: a load test (or a person with `curl -v`) reads where the time of *this* cold start
//! went without scraping histograms, which only give bucketed percentiles per node.
//! Pure logic, no IO.

use std::fmt::Write as _;
use std::time::Duration;

use tokio::time::Instant;

/// The metric names in the header, in phase order. Each `dur` is in milliseconds from the
/// arrival of the request that found no pod (the cold start's first request); `wait` is this
/// request's own time from its arrival to its pod's response headers.
pub const POD_POST: &str = "pod-post";
pub const POD_BOUND: &str = "pod-bound";
/// When the cold start's pod had an address the activator knew (from the node agent, or the
/// pod watch without one): its own readiness check can run from then on.
pub const POD_ADDR: &str = "pod-addr";
pub const POD_READY: &str = "pod-ready";
pub const WAIT: &str = "wait";
/// Added by an entry that forwarded a cold request to a member, each from the request's
/// arrival at the entry: `entry` until it sent the request on (its lookups of the Revision and
/// the subset), `forwarded` until the member's response headers came back.
pub const ENTRY: &str = "entry";
pub const FORWARDED: &str = "forwarded";

/// The entry's `Server-Timing` metrics (see [`ENTRY`]), appended to the member's.
pub fn entry_timing(sent_on: Duration, answered: Duration) -> String {
    format!(
        "{ENTRY};dur={:.3}, {FORWARDED};dur={:.3}",
        sent_on.as_secs_f64() * 1e3,
        answered.as_secs_f64() * 1e3
    )
}

/// A cold start in progress: its clock and the phases reached so far.
#[derive(Debug, Clone, Copy)]
pub struct ColdStart {
    pub since: Instant,
    post: Option<Duration>,
    bound: Option<Duration>,
    addr: Option<Duration>,
}

impl ColdStart {
    pub fn new(since: Instant) -> Self {
        Self {
            since,
            post: None,
            bound: None,
            addr: None,
        }
    }

    /// A pod of this cold start has an address the activator knows (the first one counts).
    pub fn addressed(&mut self, at: Instant) {
        self.addr
            .get_or_insert(at.saturating_duration_since(self.since));
    }

    /// The pod's create request is being sent (the first one counts).
    pub fn posted(&mut self, at: Instant) {
        self.post
            .get_or_insert(at.saturating_duration_since(self.since));
    }

    /// The API server answered the create: the pod exists, bound to this node.
    pub fn bound(&mut self, at: Instant) {
        self.bound
            .get_or_insert(at.saturating_duration_since(self.since));
    }

    /// This cold start sent a pod create.
    pub fn created(&self) -> bool {
        self.post.is_some()
    }

    /// A pod became usable: the cold start is over. A pod already created when the first
    /// request arrived (a replacement the scaler had started, say) was posted and bound
    /// before the clock started: those phases are 0, so every cold start has all phases.
    pub fn ready(self, at: Instant) -> ColdTimings {
        let ready = at.saturating_duration_since(self.since);
        let post = self.post.unwrap_or_default().min(ready);
        let bound = self.bound.unwrap_or(post).clamp(post, ready);
        ColdTimings {
            post,
            bound,
            // A pod usable is a pod with an address: at the latest then.
            addr: self.addr.unwrap_or(ready).clamp(bound, ready),
            ready,
        }
    }
}

/// A finished cold start's phases, each from its first request's arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColdTimings {
    pub post: Duration,
    pub bound: Duration,
    pub addr: Duration,
    pub ready: Duration,
}

impl ColdTimings {
    /// The `Server-Timing` value for a request that waited `wait` for its pod's answer.
    pub fn server_timing(&self, wait: Duration) -> String {
        let mut s = String::with_capacity(96);
        for (name, d) in [
            (POD_POST, self.post),
            (POD_BOUND, self.bound),
            (POD_ADDR, self.addr),
            (POD_READY, self.ready),
            (WAIT, wait),
        ] {
            if !s.is_empty() {
                s.push_str(", ");
            }
            let _ = write!(s, "{name};dur={:.3}", d.as_secs_f64() * 1e3);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entrys_timing_names_its_two_marks_in_ms() {
        assert_eq!(
            entry_timing(Duration::from_micros(1500), Duration::from_millis(320)),
            "entry;dur=1.500, forwarded;dur=320.000"
        );
    }

    #[test]
    fn phases_count_from_the_first_arrival_and_keep_the_first_mark() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = ColdStart::new(t0);
        c.posted(t0 + ms(2));
        c.posted(t0 + ms(50));
        c.bound(t0 + ms(9));
        c.addressed(t0 + ms(150));
        c.addressed(t0 + ms(300));
        let t = c.ready(t0 + ms(310));
        assert_eq!(
            t,
            ColdTimings {
                post: ms(2),
                bound: ms(9),
                addr: ms(150),
                ready: ms(310)
            }
        );
        assert_eq!(
            t.server_timing(ms(312)),
            "pod-post;dur=2.000, pod-bound;dur=9.000, pod-addr;dur=150.000, \
             pod-ready;dur=310.000, wait;dur=312.000"
        );
    }

    #[test]
    fn a_pod_created_before_the_first_arrival_has_its_create_phases_at_zero() {
        // A replacement the scaler started before the request came: posted and bound
        // already, so only the wait for Ready is this cold start's.
        let t0 = Instant::now();
        let c = ColdStart::new(t0);
        assert!(!c.created());
        let t = c.ready(t0 + Duration::from_millis(5));
        assert_eq!((t.post, t.bound), (Duration::ZERO, Duration::ZERO));
        assert_eq!(t.ready, Duration::from_millis(5));
        assert_eq!(
            t.addr, t.ready,
            "no address mark: at the latest when usable"
        );
    }

    #[test]
    fn a_pod_ready_before_its_create_answered_shows_no_phase_past_ready() {
        // Another pod (made earlier) became usable while this create was in flight.
        let t0 = Instant::now();
        let mut c = ColdStart::new(t0);
        c.posted(t0 + Duration::from_millis(2));
        assert!(c.created());
        let t = c.ready(t0 + Duration::from_millis(5));
        assert_eq!(t.post, Duration::from_millis(2));
        assert_eq!(t.bound, Duration::from_millis(2));
    }
}
