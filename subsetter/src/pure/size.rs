//! How many activators a revision gets (its N), from its spec alone (the contracts, docs/architecture.md). Pure.
//!
//! - `spec.activators`, when set, is the operator's choice, taken as it is — even above
//!   `maxScale`: members without a share of pods still take requests and forward them to the
//!   members with one, which is how an operator buys more entry points for a capped revision;
//! - else, when the revision has a burst to absorb and pods of bounded capacity
//!   (`containerConcurrency` > 0, `targetBurstCapacity` ≥ 0), enough members for the burst:
//!   `ceil(targetBurstCapacity / containerConcurrency)`, at least 2 (one node's loss must not
//!   stop the revision) and at most `maxNodeSelection` (every member is a possible cold start,
//!   so more is not free);
//! - else (unlimited burst capacity, -1, or unlimited concurrency, 0) `maxNodeSelection`;
//! - a computed N is never above `maxScale` when that is set: a member beyond it would get no
//!   share of pods, only a cold start's worth of forwarding.
//!
//! Fewer eligible activators than N is not hidden by lowering N: the policy picks what there
//! is and the subset is `Degraded` (fewer than wanted); N = 1 is `Degraded` too (no HA).

use crds::RevisionSpec;

/// The N of a revision with `spec`, given the configured `max_node_selection` (default 3).
pub fn wanted(spec: &RevisionSpec, max_node_selection: usize) -> usize {
    let max_node_selection = max_node_selection.max(1);
    let explicit = spec
        .activators
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| *n > 0);
    if let Some(n) = explicit {
        return n;
    }
    let n = match (
        u64::try_from(spec.container_concurrency),
        u64::try_from(spec.target_burst_capacity),
    ) {
        (Ok(cc), Ok(tbc)) if cc > 0 => {
            let for_burst = usize::try_from(tbc.div_ceil(cc)).unwrap_or(usize::MAX);
            for_burst.max(2).min(max_node_selection)
        }
        _ => max_node_selection,
    };
    match usize::try_from(spec.max_scale) {
        Ok(max) if max > 0 => n.min(max),
        _ => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(cc: i64, tbc: i64, max_scale: i32, activators: Option<i32>) -> RevisionSpec {
        let mut s: RevisionSpec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"containers": [{"name": "app"}]}}
        }))
        .unwrap();
        s.container_concurrency = cc;
        s.target_burst_capacity = tbc;
        s.max_scale = max_scale;
        s.activators = activators;
        s
    }

    #[test]
    fn burst_capacity_over_concurrency_within_two_and_max_node_selection() {
        // 200 / 100 = 2
        assert_eq!(wanted(&spec(100, 200, 0, None), 3), 2);
        // 200 / 10 = 20, capped at maxNodeSelection
        assert_eq!(wanted(&spec(10, 200, 0, None), 3), 3);
        assert_eq!(wanted(&spec(10, 200, 0, None), 50), 20);
        // 250 / 100 rounds up to 3
        assert_eq!(wanted(&spec(100, 250, 0, None), 5), 3);
        // a burst a single pod absorbs still gets two members
        assert_eq!(wanted(&spec(1000, 200, 0, None), 3), 2);
        assert_eq!(wanted(&spec(10, 0, 0, None), 3), 2);
    }

    #[test]
    fn unlimited_burst_or_concurrency_takes_max_node_selection() {
        assert_eq!(wanted(&spec(10, -1, 0, None), 3), 3);
        assert_eq!(wanted(&spec(0, 200, 0, None), 4), 4);
        // the schema's defaults: containerConcurrency 0, targetBurstCapacity 200
        let defaults: RevisionSpec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"containers": [{"name": "app"}]}}
        }))
        .unwrap();
        assert_eq!(wanted(&defaults, 3), 3);
    }

    #[test]
    fn explicit_n_wins_and_max_scale_caps_a_computed_one() {
        assert_eq!(wanted(&spec(10, 200, 0, Some(7)), 3), 7);
        assert_eq!(wanted(&spec(10, 200, 5, Some(7)), 3), 7);
        assert_eq!(wanted(&spec(0, -1, 1, None), 3), 1);
        assert_eq!(wanted(&spec(100, 1000, 2, None), 9), 2);
    }

    proptest! {
        #[test]
        fn n_is_within_its_bounds(
            cc in 0i64..2000,
            tbc in -1i64..5000,
            max_scale in 0i32..20,
            activators in proptest::option::of(1i32..50),
            mns in 1usize..12,
        ) {
            let n = wanted(&spec(cc, tbc, max_scale, activators), mns);
            prop_assert!(n >= 1);
            if max_scale > 0 && activators.is_none() {
                prop_assert!(n <= max_scale as usize);
            }
            match activators {
                Some(a) => prop_assert_eq!(n, a as usize),
                None => {
                    prop_assert!(n <= mns);
                    if max_scale == 0 || max_scale >= 2 {
                        prop_assert!(n >= 2.min(mns));
                    }
                    if cc == 0 || tbc == -1 {
                        prop_assert_eq!(n, if max_scale > 0 { mns.min(max_scale as usize) } else { mns });
                    }
                }
            }
        }
    }
}
