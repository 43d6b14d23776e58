//! What a Host's lookup answers (`cache::hosts` keeps one per host): the revisions that serve
//! the host, each with its weight and the version of the ActivationEndpoints it was read
//! from. Pure: no IO.
//!
//! The rule, read from the ActivationEndpoints carrying the host's label (the contract,
//! `crds::ActivationEndpointsStatus::routes`):
//! - where any of them lists the host in `status.routes`, the host's traffic is split by those
//!   percents among the objects that list it (percent > 0 only; the others carrying the label
//!   take none). Percents that do not sum to 100 — the moment between two of the subsetter's
//!   writes — weigh as they are; a sum of 0 falls back to the rule below;
//! - otherwise (the legacy rule, before Routes): the newest claimant without a True
//!   `HostConflict` condition takes all of it.
//!
//! A request picks one target by weight with a random number ([`HostRoute::pick`]), per
//! request as Knative does: the same client may land on either revision of a split.

use std::sync::Arc;

use crds::contract::normalize_host;
use crds::{ActivationEndpoints, ObjectKey as RevisionKey};
use kube::ResourceExt;

/// The condition a subsetter sets on revisions that lost a host to a newer one.
pub const HOST_CONFLICT: &str = "HostConflict";

/// One revision serving a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub key: RevisionKey,
    /// Its share of the host's requests: a route's percent, 1 for a legacy answer's only
    /// target (only the ratio between targets counts).
    pub weight: u32,
    /// The resourceVersion of the revision's ActivationEndpoints as the lookup listed it; a
    /// member whose own copy is newer says so (`x-activator-host-stale`). None when the answer
    /// came from elsewhere (the directory).
    pub version: Option<Arc<str>>,
}

/// Where a host's requests go: one target or more, never none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoute {
    /// Ordered by revision (namespace, then name), so two answers from the same objects pick
    /// alike and compare equal.
    targets: Box<[Target]>,
    /// The sum of the weights (> 0).
    total: u32,
    /// Split by `status.routes`, not the legacy rule: the revision needn't claim the host in
    /// its `spec.hosts` (a tag's host `<tag>-<host>` never is).
    from_routes: bool,
}

impl HostRoute {
    /// The answer the objects carrying `host`'s label give (`host` in any spelling), or None
    /// when none serves it.
    pub fn from_claims(host: &str, claims: &[ActivationEndpoints]) -> Option<Self> {
        let host = normalize_host(host);
        Self::by_routes(&host, claims).or_else(|| {
            let a = newest_unconflicted(claims)?;
            Some(Self {
                targets: Box::new([target(a, 1)]),
                total: 1,
                from_routes: false,
            })
        })
    }

    /// One revision taking all of the host: what the directory answers while the API server
    /// does not (no version: no member can say it is old).
    pub fn single(key: RevisionKey) -> Self {
        Self {
            targets: Box::new([Target {
                key,
                weight: 1,
                version: None,
            }]),
            total: 1,
            from_routes: false,
        }
    }

    /// The split `status.routes` gives, if any object lists the host and the percents of
    /// those that do sum to more than 0.
    fn by_routes(host: &str, claims: &[ActivationEndpoints]) -> Option<Self> {
        let mut listed = false;
        let mut targets: Vec<Target> = Vec::new();
        for a in claims {
            // An object naming the host twice is malformed: its first entry counts.
            let share = a.status.as_ref().and_then(|s| {
                s.routes
                    .iter()
                    .find(|r| r.host == host || normalize_host(&r.host) == host)
            });
            let Some(share) = share else { continue };
            listed = true;
            // The schema bounds percents to 0..=100; what got past it is clamped, so the sum
            // cannot overflow and a negative percent takes nothing.
            let weight = share.percent.clamp(0, 100).unsigned_abs();
            if weight > 0 {
                targets.push(target(a, weight));
            }
        }
        let total: u32 = targets.iter().map(|t| t.weight).sum();
        if !listed || total == 0 {
            return None;
        }
        targets
            .sort_by(|a, b| (&a.key.namespace, &a.key.name).cmp(&(&b.key.namespace, &b.key.name)));
        Some(Self {
            targets: targets.into_boxed_slice(),
            total,
            from_routes: true,
        })
    }

    /// The target a request goes to, given a uniformly random `r`: each target for a share of
    /// the values of `r` in proportion to its weight (`r` is taken modulo the total weight, at
    /// most a few hundred, so the bias over 2^32 values is below 10^-7).
    pub fn pick(&self, r: u32) -> &Target {
        let mut r = r % self.total;
        for t in &self.targets {
            if r < t.weight {
                return t;
            }
            r -= t.weight;
        }
        // Unreachable: the weights sum to `total`, and `r` is below it.
        &self.targets[self.targets.len() - 1]
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Whether the answer is a Route's split rather than the legacy rule's winner.
    pub fn is_routed(&self) -> bool {
        self.from_routes
    }

    /// Whether `other` sends the host's requests to the same revisions by the same weights
    /// (whatever the versions they were read at): a refresh that changes this moved the host.
    pub fn same_split(&self, other: &Self) -> bool {
        self.targets.len() == other.targets.len()
            && self
                .targets
                .iter()
                .zip(other.targets.iter())
                .all(|(a, b)| a.key == b.key && a.weight == b.weight)
    }
}

fn target(a: &ActivationEndpoints, weight: u32) -> Target {
    Target {
        key: RevisionKey::new(a.namespace().unwrap_or_default(), a.name_any()),
        weight,
        version: a.metadata.resource_version.as_deref().map(Arc::from),
    }
}

/// Whether a watched copy at resourceVersion `mine` is newer than one a host answer was read
/// at (`answered`). resourceVersions are opaque to clients in general, but both come from one
/// object's history on one API server, where they are etcd revisions: numbers that only grow.
/// Anything that does not parse as one says nothing (no refresh).
pub fn newer(mine: &str, answered: &str) -> bool {
    match (mine.parse::<u64>(), answered.parse::<u64>()) {
        (Ok(m), Ok(a)) => m > a,
        _ => false,
    }
}

/// Among the ActivationEndpoints claiming a host (the legacy rule): those the subsetter
/// marked as having lost it are out; of the rest, the newest (creationTimestamp, then name,
/// then namespace) wins, the rule the subsetter applies, for the moment before it has marked
/// the loser.
fn newest_unconflicted(claims: &[ActivationEndpoints]) -> Option<&ActivationEndpoints> {
    claims
        .iter()
        .filter(|a| {
            !a.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == HOST_CONFLICT && c.status == "True")
            })
        })
        .max_by(|a, b| {
            let k = |x: &ActivationEndpoints| {
                (
                    x.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    x.name_any(),
                    x.namespace().unwrap_or_default(),
                )
            };
            k(a).cmp(&k(b))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{ActivationEndpointsStatus, HostShare};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    const HOST: &str = "app.example.test";

    fn aep(ns: &str, name: &str, created: i64, conflict: bool) -> ActivationEndpoints {
        let mut a = ActivationEndpoints::new(name, Default::default());
        a.metadata.namespace = Some(ns.into());
        a.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(created).unwrap()));
        a.metadata.resource_version = Some(format!("{}", 100 + created));
        if conflict {
            a.status = Some(ActivationEndpointsStatus {
                conditions: vec![Condition {
                    type_: HOST_CONFLICT.into(),
                    status: "True".into(),
                    reason: "HostClaimedByNewerRevision".into(),
                    message: String::new(),
                    last_transition_time: Time(jiff::Timestamp::from_second(created).unwrap()),
                    observed_generation: None,
                }],
                ..Default::default()
            });
        }
        a
    }

    /// `a` with `routes` (host, percent) in its status.
    fn routed(mut a: ActivationEndpoints, routes: &[(&str, i32)]) -> ActivationEndpoints {
        a.status.get_or_insert_with(Default::default).routes = routes
            .iter()
            .map(|(host, percent)| HostShare {
                host: host.to_string(),
                percent: *percent,
            })
            .collect();
        a
    }

    /// The legacy answer's revision.
    fn winner(claims: &[ActivationEndpoints]) -> Option<RevisionKey> {
        let r = HostRoute::from_claims(HOST, claims)?;
        assert!(!r.is_routed());
        assert_eq!(r.targets().len(), 1);
        Some(r.targets()[0].key.clone())
    }

    /// (revision name, weight) of each target, in order.
    fn split(r: &HostRoute) -> Vec<(&str, u32)> {
        r.targets()
            .iter()
            .map(|t| (t.key.name.as_str(), t.weight))
            .collect()
    }

    #[test]
    fn newest_unconflicted_claim_wins() {
        assert_eq!(winner(&[]), None);
        let old = aep("a", "old", 10, false);
        let new = aep("a", "new", 20, false);
        assert_eq!(
            winner(&[old.clone(), new.clone()]),
            Some(RevisionKey::new("a", "new"))
        );
        // Once the subsetter has marked the loser, the mark decides even against the clock.
        let marked_new = aep("a", "new", 20, true);
        assert_eq!(
            winner(&[old.clone(), marked_new]),
            Some(RevisionKey::new("a", "old"))
        );
        // Same second: the greater name.
        let twin = aep("a", "zz", 20, false);
        assert_eq!(winner(&[new, twin]), Some(RevisionKey::new("a", "zz")));
    }

    #[test]
    fn without_routes_the_legacy_winner_takes_all_with_its_version() {
        assert_eq!(HostRoute::from_claims(HOST, &[]), None);
        let old = aep("a", "old", 10, false);
        let new = aep("a", "new", 20, false);
        let r = HostRoute::from_claims(HOST, &[old.clone(), new]).unwrap();
        assert!(!r.is_routed());
        assert_eq!(split(&r), [("new", 1)]);
        assert_eq!(r.targets()[0].version.as_deref(), Some("120"));
        // Every conflicted: nobody serves it.
        assert_eq!(
            HostRoute::from_claims(HOST, &[aep("a", "x", 1, true)]),
            None
        );
        // Routes for another host change nothing here.
        let other = routed(aep("a", "other", 30, false), &[("other.test", 100)]);
        let r = HostRoute::from_claims(HOST, &[old, other]).unwrap();
        assert_eq!(split(&r), [("other", 1)]);
    }

    #[test]
    fn routes_split_the_host_over_the_legacy_winner() {
        // The newest claimant would win by the legacy rule; a route says otherwise.
        let newest = aep("a", "newest", 30, false);
        let blue = routed(aep("a", "blue", 10, false), &[(HOST, 90)]);
        // A conflicted object that a route names still takes its share: the route decides.
        let green = routed(
            aep("a", "green", 20, true),
            &[("App.Example.Test:8080", 10)],
        );
        let claims = [newest, green, blue];
        let r = HostRoute::from_claims(HOST, &claims).unwrap();
        assert!(r.is_routed());
        // Ordered by revision whatever the list's order.
        assert_eq!(split(&r), [("blue", 90), ("green", 10)]);
        // The host asked in any spelling.
        assert_eq!(
            HostRoute::from_claims("APP.example.test.:80", &claims),
            Some(r)
        );
    }

    #[test]
    fn zero_percent_entries_take_nothing_and_all_zero_falls_back_to_legacy() {
        let a = routed(aep("a", "a", 10, false), &[(HOST, 0)]);
        let b = routed(aep("a", "b", 20, false), &[(HOST, 100)]);
        let c = aep("a", "c", 30, false);
        // `c` is newest but lists nothing: a listing object exists, so `c` takes none.
        let r = HostRoute::from_claims(HOST, &[a.clone(), b, c.clone()]).unwrap();
        assert_eq!(split(&r), [("b", 100)]);
        // Only zeros listed (or negatives got past the schema): the legacy rule.
        let neg = routed(aep("a", "neg", 5, false), &[(HOST, -5)]);
        let r = HostRoute::from_claims(HOST, &[a, neg, c]).unwrap();
        assert!(!r.is_routed());
        assert_eq!(split(&r), [("c", 1)]);
    }

    #[test]
    fn percents_that_do_not_sum_to_100_weigh_as_they_are() {
        // Between two writes of the subsetter: 90 + 90.
        let a = routed(aep("a", "a", 10, false), &[(HOST, 90)]);
        let b = routed(aep("a", "b", 20, false), &[(HOST, 90), (HOST, 5)]);
        let r = HostRoute::from_claims(HOST, &[a, b]).unwrap();
        assert_eq!(split(&r), [("a", 90), ("b", 90)]);
        let to_b = (0..180).filter(|&x| r.pick(x).key.name == "b").count();
        assert_eq!(to_b, 90, "half each, as 90:90 says");
        // Past the schema's bound: clamped.
        let big = routed(aep("a", "big", 10, false), &[(HOST, 1000)]);
        let r = HostRoute::from_claims(HOST, &[big]).unwrap();
        assert_eq!(split(&r), [("big", 100)]);
    }

    #[test]
    fn pick_gives_each_target_its_weight_of_the_whole_range() {
        for weights in [
            vec![100u32],
            vec![10, 90],
            vec![1, 99],
            vec![33, 33, 34],
            vec![1, 1, 1, 97],
        ] {
            let claims: Vec<ActivationEndpoints> = weights
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let percent = i32::try_from(*w).unwrap();
                    routed(aep("a", &format!("r{i}"), 1, false), &[(HOST, percent)])
                })
                .collect();
            let r = HostRoute::from_claims(HOST, &claims).unwrap();
            let total: u32 = weights.iter().sum();
            // Every value of r below the total, and a window past it and at the top of the
            // range (taken modulo the total): each target exactly its weight per period.
            for base in [0, total, u32::MAX - (u32::MAX % total) - total] {
                let mut counts = vec![0u32; weights.len()];
                for x in base..base + total {
                    let name = &r.pick(x).key.name;
                    let i: usize = name[1..].parse().unwrap();
                    counts[i] += 1;
                }
                assert_eq!(counts, weights, "from r = {base}");
            }
        }
        // A single target whatever r.
        let one = HostRoute::single(RevisionKey::new("a", "one"));
        assert!(
            [0, 1, u32::MAX]
                .iter()
                .all(|&x| one.pick(x).key.name == "one")
        );
        assert_eq!(one.targets()[0].version, None);
    }

    #[test]
    fn same_split_ignores_versions_but_not_keys_or_weights() {
        let a = routed(aep("a", "a", 10, false), &[(HOST, 50)]);
        let b = routed(aep("a", "b", 20, false), &[(HOST, 50)]);
        let before = HostRoute::from_claims(HOST, &[a.clone(), b.clone()]).unwrap();
        let mut a2 = a.clone();
        a2.metadata.resource_version = Some("999".into());
        let rewritten = HostRoute::from_claims(HOST, &[a2, b.clone()]).unwrap();
        assert_ne!(before, rewritten);
        assert!(before.same_split(&rewritten));
        let shifted = HostRoute::from_claims(
            HOST,
            &[routed(a, &[(HOST, 40)]), routed(b.clone(), &[(HOST, 60)])],
        )
        .unwrap();
        assert!(!before.same_split(&shifted));
        let only_b = HostRoute::from_claims(HOST, &[routed(b, &[(HOST, 100)])]).unwrap();
        assert!(!before.same_split(&only_b));
    }

    #[test]
    fn only_a_greater_number_is_newer() {
        assert!(newer("11", "10"));
        assert!(newer("100", "99"), "numerically, not as text");
        assert!(!newer("10", "10"));
        assert!(!newer("9", "10"));
        for (m, a) in [("x", "1"), ("1", "x"), ("", "1"), ("-1", "-2")] {
            assert!(!newer(m, a), "{m} vs {a}");
        }
    }
}
