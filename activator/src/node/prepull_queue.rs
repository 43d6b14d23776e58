//! The pre-pull queue: which images this node's member revisions need pulled, in what order,
//! and what to do after each pull. Pure: no IO, time and jitter are passed in.
//!
//! Keyed by image reference, not by revision: 1,000 revisions sharing an image make one
//! entry and one pull. Its size is bounded by the distinct images of the revisions this node
//! is a member of (an image no member revision names any more is forgotten at once, or when
//! its pull in flight ends), so a burst of new revisions grows it by their new images only,
//! and never drops one.
//!
//! - First pulls go before retries, each in the order they were asked for.
//! - A transient failure (runtime unreachable or slow, the agent busy, a registry error) is
//!   retried after a jittered, doubling back-off ([`RetryPolicy`]).
//! - A final one (bad name, not found, unauthorized) is not retried until the image's
//!   credentials change; a new image is a new entry anyway.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use node_agent::{Credentials, ImageRef, PullFailure};
use tokio::time::Instant;

/// The back-off of transient failures.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// The wait after the first failure.
    pub base: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(5),
            max: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The wait after `failures` failures in a row (1 = the first), scaled by `jitter` in
    /// [0, 1): between half and all of the doubled base, so nodes that failed together (a
    /// registry outage) do not all try again in the same second.
    pub fn delay(&self, failures: u32, jitter: f64) -> Duration {
        let doubled = self
            .base
            .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
        let capped = doubled.min(self.max);
        capped.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
    }
}

/// How one pull ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The runtime already held it: no pull was made.
    Present,
    /// Pulled.
    Pulled,
    Failed(PullFailure),
}

/// A pull to make now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub image: ImageRef,
    pub auth: Option<Credentials>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for a pull slot; `retry`: after a transient failure (goes after first pulls).
    Ready {
        seq: u64,
        retry: bool,
    },
    /// Waiting for its back-off to end.
    Backoff {
        until: Instant,
    },
    InFlight,
    /// Present on the node (pulled or found).
    Done,
    /// A final failure: waits for new credentials.
    Failed(PullFailure),
}

#[derive(Debug)]
struct Entry<R> {
    state: State,
    auth: Option<Credentials>,
    /// Transient failures in a row.
    failures: u32,
    /// The member revisions naming this image.
    revisions: HashSet<R>,
}

/// The queue; `R` is a revision's key.
#[derive(Debug)]
pub struct PullQueue<R> {
    entries: HashMap<ImageRef, Entry<R>>,
    by_revision: HashMap<R, Vec<ImageRef>>,
    /// Ready entries by (retry, seq): first pulls first, then in order of asking.
    ready: BTreeSet<(bool, u64, ImageRef)>,
    next_seq: u64,
    policy: RetryPolicy,
}

impl<R: Clone + Eq + Hash> PullQueue<R> {
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            entries: HashMap::new(),
            by_revision: HashMap::new(),
            ready: BTreeSet::new(),
            next_seq: 0,
            policy,
        }
    }

    /// `rev` (a member revision) needs these images, with these credentials: replaces what it
    /// needed before. Returns the final failures already known for its images, so the caller
    /// can tell this revision too.
    pub fn set_revision(
        &mut self,
        rev: R,
        images: Vec<(ImageRef, Option<Credentials>)>,
    ) -> Vec<(ImageRef, PullFailure)> {
        let old = self.by_revision.remove(&rev).unwrap_or_default();
        let new: HashSet<&ImageRef> = images.iter().map(|(i, _)| i).collect();
        for image in old.iter().filter(|i| !new.contains(i)) {
            self.unref(image, &rev);
        }
        let mut known_failures = Vec::new();
        for (image, auth) in &images {
            if !self.entries.contains_key(image) {
                let seq = self.bump();
                self.entries.insert(
                    image.clone(),
                    Entry {
                        state: State::Ready { seq, retry: false },
                        auth: auth.clone(),
                        failures: 0,
                        revisions: HashSet::new(),
                    },
                );
                self.ready.insert((false, seq, image.clone()));
            }
            let seq = self.next_seq;
            let Some(entry) = self.entries.get_mut(image) else {
                continue;
            };
            let joined = entry.revisions.insert(rev.clone());
            if joined && entry.state == State::Done {
                // Done was true when it was checked: the kubelet's image garbage collection
                // (or anyone with the runtime) may have removed the image since, and this
                // revision's first request is still to come. A re-check is one ImageStatus
                // (the job asks before it pulls); the pull follows only if it is gone.
                entry.state = State::Ready { seq, retry: false };
                self.next_seq += 1;
                self.ready.insert((false, seq, image.clone()));
            }
            if entry.auth != *auth {
                // New credentials: the next pull uses them, and a final failure (most often
                // unauthorized) is worth another try.
                entry.auth = auth.clone();
                if matches!(entry.state, State::Failed(_)) {
                    entry.state = State::Ready { seq, retry: false };
                    entry.failures = 0;
                    self.next_seq += 1;
                    self.ready.insert((false, seq, image.clone()));
                }
            }
            if let State::Failed(f) = &entry.state {
                known_failures.push((image.clone(), f.clone()));
            }
        }
        let mut kept: Vec<ImageRef> = images.into_iter().map(|(i, _)| i).collect();
        kept.sort();
        kept.dedup();
        if !kept.is_empty() {
            self.by_revision.insert(rev, kept);
        }
        known_failures
    }

    fn bump(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// `rev` is no longer a member (or is gone): its images are forgotten unless another
    /// member revision names them.
    pub fn remove_revision(&mut self, rev: &R) {
        for image in self.by_revision.remove(rev).unwrap_or_default() {
            self.unref(&image, rev);
        }
    }

    fn unref(&mut self, image: &ImageRef, rev: &R) {
        let Some(entry) = self.entries.get_mut(image) else {
            return;
        };
        entry.revisions.remove(rev);
        if entry.revisions.is_empty() && entry.state != State::InFlight {
            self.forget(image);
        }
    }

    fn forget(&mut self, image: &ImageRef) {
        if let Some(entry) = self.entries.remove(image)
            && let State::Ready { seq, retry } = entry.state
        {
            self.ready.remove(&(retry, seq, image.clone()));
        }
    }

    /// The next pull to make at `now`, marked in flight; `None` when none is due.
    pub fn next(&mut self, now: Instant) -> Option<Job> {
        self.wake(now);
        let (_, _, image) = self.ready.pop_first()?;
        let entry = self.entries.get_mut(&image)?;
        entry.state = State::InFlight;
        Some(Job {
            image,
            auth: entry.auth.clone(),
        })
    }

    /// Entries whose back-off has ended become ready (as retries).
    fn wake(&mut self, now: Instant) {
        for (image, entry) in &mut self.entries {
            if let State::Backoff { until } = entry.state
                && until <= now
            {
                let seq = self.next_seq;
                self.next_seq += 1;
                entry.state = State::Ready { seq, retry: true };
                self.ready.insert((true, seq, image.clone()));
            }
        }
    }

    /// A pull ended. Returns the member revisions naming the image (to tell them of a final
    /// failure); `jitter` in [0, 1) spreads the retry of a transient one.
    pub fn finished(
        &mut self,
        image: &ImageRef,
        outcome: &Outcome,
        now: Instant,
        jitter: f64,
    ) -> Vec<R> {
        let Some(entry) = self.entries.get_mut(image) else {
            return Vec::new();
        };
        let revisions: Vec<R> = entry.revisions.iter().cloned().collect();
        match outcome {
            Outcome::Present | Outcome::Pulled => {
                entry.state = State::Done;
                entry.failures = 0;
            }
            Outcome::Failed(f) if f.is_transient() => {
                entry.failures = entry.failures.saturating_add(1);
                entry.state = State::Backoff {
                    until: now + self.policy.delay(entry.failures, jitter),
                };
            }
            Outcome::Failed(f) => entry.state = State::Failed(f.clone()),
        }
        if revisions.is_empty() {
            // Its revisions left while it was pulled.
            self.forget(image);
        }
        revisions
    }

    /// When the earliest back-off ends (the caller's next wake-up), if any is pending.
    pub fn next_wake(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| match e.state {
                State::Backoff { until } => Some(until),
                _ => None,
            })
            .min()
    }

    /// Images waiting: for a slot, or for their back-off to end.
    pub fn depth(&self) -> usize {
        self.entries
            .values()
            .filter(|e| matches!(e.state, State::Ready { .. } | State::Backoff { .. }))
            .count()
    }

    /// Images remembered (the queue's memory).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(s: &str) -> ImageRef {
        ImageRef::new(s).unwrap()
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base: Duration::from_secs(5),
            max: Duration::from_secs(60),
        }
    }

    fn drain(q: &mut PullQueue<u32>, now: Instant) -> Vec<String> {
        std::iter::from_fn(|| q.next(now))
            .map(|j| j.image.to_string())
            .collect()
    }

    #[test]
    fn one_pull_per_image_however_many_revisions_name_it() {
        let t = Instant::now();
        let mut q = PullQueue::new(policy());
        for rev in 0..1000 {
            q.set_revision(rev, vec![(img("r.io/shared:v1"), None)]);
        }
        q.set_revision(1000, vec![(img("r.io/other:v1"), None)]);
        assert_eq!(q.len(), 2);
        assert_eq!(q.depth(), 2);
        assert_eq!(drain(&mut q, t), ["r.io/shared:v1", "r.io/other:v1"]);
        assert_eq!(q.depth(), 0);
        // In flight: naming it again starts no second pull.
        q.set_revision(1001, vec![(img("r.io/shared:v1"), None)]);
        assert!(q.next(t).is_none());
        let revs = q.finished(&img("r.io/shared:v1"), &Outcome::Pulled, t, 0.0);
        assert_eq!(revs.len(), 1001);
        // Done: the revisions already counted ask nothing more...
        q.set_revision(1, vec![(img("r.io/shared:v1"), None)]);
        assert!(q.next(t).is_none());
        // ...a new one has it checked again (the image may have been collected since): one
        // job, whatever the number of revisions joining before it runs.
        q.set_revision(2000, vec![(img("r.io/shared:v1"), None)]);
        q.set_revision(2001, vec![(img("r.io/shared:v1"), None)]);
        assert_eq!(drain(&mut q, t), ["r.io/shared:v1"]);
        assert!(q.next(t).is_none());
    }

    #[test]
    fn the_queue_holds_only_images_of_member_revisions() {
        let t = Instant::now();
        let mut q = PullQueue::new(policy());
        q.set_revision(1, vec![(img("a"), None), (img("b"), None)]);
        q.set_revision(2, vec![(img("b"), None)]);
        q.remove_revision(&1);
        assert_eq!(q.len(), 1, "a is forgotten, b is still named by 2");
        assert_eq!(drain(&mut q, t), ["b"]);
        // b leaves while in flight: forgotten when its pull ends.
        q.remove_revision(&2);
        assert_eq!(q.len(), 1);
        assert!(q.finished(&img("b"), &Outcome::Pulled, t, 0.0).is_empty());
        assert!(q.is_empty());
        // A revision's new images replace its old ones.
        q.set_revision(3, vec![(img("c:v1"), None)]);
        q.set_revision(3, vec![(img("c:v2"), None)]);
        assert_eq!(drain(&mut q, t), ["c:v2"]);
        assert_eq!(q.len(), 1);
        // A burst of new revisions queues every new image, none dropped.
        for rev in 10..510 {
            q.set_revision(rev, vec![(img(&format!("app{}", rev % 100)), None)]);
        }
        assert_eq!(q.depth(), 100);
    }

    #[test]
    fn first_pulls_go_before_retries_in_the_order_asked() {
        let t = Instant::now();
        let mut q = PullQueue::new(policy());
        q.set_revision(1, vec![(img("flaky"), None)]);
        assert_eq!(drain(&mut q, t), ["flaky"]);
        q.finished(
            &img("flaky"),
            &Outcome::Failed(PullFailure::RuntimeUnreachable),
            t,
            0.0,
        );
        let later = t + Duration::from_secs(10);
        q.set_revision(2, vec![(img("x"), None)]);
        q.set_revision(3, vec![(img("y"), None), (img("z"), None)]);
        assert_eq!(drain(&mut q, later), ["x", "y", "z", "flaky"]);
    }

    #[test]
    fn transient_failures_back_off_with_jitter_and_doubling() {
        let t = Instant::now();
        let mut q = PullQueue::new(policy());
        q.set_revision(1, vec![(img("a"), None)]);
        let mut now = t;
        let mut waits = Vec::new();
        for _ in 0..6 {
            let job = q.next(now).expect("due");
            q.finished(&job.image, &Outcome::Failed(PullFailure::Busy), now, 0.0);
            let wake = q.next_wake().unwrap();
            waits.push((wake - now).as_secs());
            assert!(q.next(wake - Duration::from_millis(1)).is_none(), "early");
            now = wake;
        }
        // Half the doubled base (jitter 0), capped at half the max.
        assert_eq!(waits, [2, 5, 10, 20, 30, 30]);
        let p = policy();
        assert_eq!(p.delay(1, 0.999_999).as_secs(), 4);
        assert!(p.delay(3, 0.5) > p.delay(3, 0.0) && p.delay(3, 0.5) < p.delay(3, 1.0));
        assert_eq!(p.delay(u32::MAX, 1.0), Duration::from_secs(60));
        // A success resets the count.
        let job = q.next(now).unwrap();
        q.finished(&job.image, &Outcome::Pulled, now, 0.0);
        assert_eq!(q.next_wake(), None);
    }

    #[test]
    fn final_failures_wait_for_new_credentials() {
        let t = Instant::now();
        let mut q = PullQueue::new(policy());
        q.set_revision(1, vec![(img("private"), None)]);
        let job = q.next(t).unwrap();
        let revs = q.finished(
            &job.image,
            &Outcome::Failed(PullFailure::Unauthorized),
            t,
            0.0,
        );
        assert_eq!(revs, [1]);
        assert_eq!(q.next_wake(), None);
        assert!(q.next(t + Duration::from_secs(3600)).is_none());
        // Another revision naming it learns the failure at once, and pulls nothing.
        let known = q.set_revision(2, vec![(img("private"), None)]);
        assert_eq!(known, [(img("private"), PullFailure::Unauthorized)]);
        assert!(q.next(t).is_none());
        // The same credentials again: still nothing.
        q.set_revision(1, vec![(img("private"), None)]);
        assert!(q.next(t).is_none());
        // New credentials: one more try, with them.
        let auth = Credentials::new("robot", "pw").unwrap();
        let known = q.set_revision(1, vec![(img("private"), Some(auth.clone()))]);
        assert!(known.is_empty());
        let job = q.next(t).unwrap();
        assert_eq!(job.auth, Some(auth));
        // Not found is final too.
        q.set_revision(5, vec![(img("gone"), None)]);
        let job = q.next(t).unwrap();
        q.finished(&job.image, &Outcome::Failed(PullFailure::NotFound), t, 0.0);
        assert!(q.next(t + Duration::from_secs(3600)).is_none());
        assert_eq!(q.depth(), 0);
    }

    #[test]
    fn a_revision_that_leaves_while_queued_or_backing_off_is_forgotten() {
        let t = Instant::now();
        let mut q = PullQueue::new(policy());
        q.set_revision(1, vec![(img("a"), None), (img("b"), None)]);
        let job = q.next(t).unwrap();
        q.finished(
            &job.image,
            &Outcome::Failed(PullFailure::RuntimeTimeout),
            t,
            0.5,
        );
        q.remove_revision(&1);
        assert!(q.is_empty());
        assert!(q.next(t + Duration::from_secs(600)).is_none());
        assert_eq!(q.next_wake(), None);
    }
}
