//! Per-member shares of a revision's maxScale and minScale.
//!
//! Members never coordinate with each other, so each gets a fixed quota: `maxPods` shares sum
//! to at most maxScale and `minPods` shares sum to exactly minScale (when there is at least
//! one member). The split is `floor(scale / n)` each, and the remainder goes one by one to the
//! first slots. Because policies keep members in their slots, replacing one member does not
//! move quota between the others.
//!
//! When maxScale < n, the members from slot `maxScale` on get `maxPods = 0` *while maxScale > 0*:
//! they have no quota and must forward cold starts to a member that has one. `maxPods = 0`
//! means "unlimited" only when the revision's maxScale is 0; a reader tells the two apart by
//! the revision's maxScale.

/// One member's share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub max_pods: i32,
    pub min_pods: i32,
}

/// Shares for `n` members in slot order. Negative scales (invalid specs) count as 0.
pub fn split(max_scale: i32, min_scale: i32, n: usize) -> Vec<Share> {
    let max_pods = split_one(max_scale.max(0), n);
    let min_pods = split_one(min_scale.max(0), n);
    max_pods
        .into_iter()
        .zip(min_pods)
        .map(|(max_pods, min_pods)| Share { max_pods, min_pods })
        .collect()
}

/// Raises the `minPods` of `shares` so that they keep at least `warm` pods between them,
/// dealt one at a time over the slots in `order` (the primary first) and round again, within
/// each slot's `maxPods` when the revision has a maxScale (`capped`). The minScale shares
/// already there count toward it.
pub fn add_warm(shares: &mut [Share], order: &[usize], warm: i32) {
    let capped = shares.iter().any(|s| s.max_pods > 0);
    let room = |s: &Share| !capped || s.min_pods < s.max_pods;
    let mut missing = warm - shares.iter().map(|s| s.min_pods).sum::<i32>();
    while missing > 0 && order.iter().any(|&i| shares.get(i).is_some_and(room)) {
        for &i in order {
            if missing == 0 {
                break;
            }
            if let Some(s) = shares.get_mut(i).filter(|s| room(s)) {
                s.min_pods += 1;
                missing -= 1;
            }
        }
    }
}

fn split_one(total: i32, n: usize) -> Vec<i32> {
    if n == 0 {
        return Vec::new();
    }
    // n is at most the number of activators; saturate rather than wrap for absurd inputs.
    let n32 = i32::try_from(n).unwrap_or(i32::MAX);
    let (base, rem) = (total / n32, total % n32);
    (0..n32).map(|i| base + i32::from(i < rem)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn warm_pods_go_to_the_primary_first_within_max_pods() {
        let mut s = split(0, 0, 3);
        add_warm(&mut s, &[2, 0, 1], 1);
        assert_eq!(s.iter().map(|s| s.min_pods).collect::<Vec<_>>(), [0, 0, 1]);
        let mut s = split(0, 0, 3);
        add_warm(&mut s, &[2, 0, 1], 4);
        assert_eq!(s.iter().map(|s| s.min_pods).collect::<Vec<_>>(), [1, 1, 2]);
        // minScale's shares count; maxScale caps each slot.
        let mut s = split(3, 1, 3);
        add_warm(&mut s, &[1, 0, 2], 10);
        assert_eq!(s.iter().map(|s| s.min_pods).collect::<Vec<_>>(), [1, 1, 1]);
        let mut s = split(0, 2, 2);
        add_warm(&mut s, &[1, 0], 2);
        assert_eq!(
            s.iter().map(|s| s.min_pods).collect::<Vec<_>>(),
            [1, 1],
            "nothing missing"
        );
    }

    #[test]
    fn even_and_uneven_splits() {
        let s = split(10, 4, 3);
        assert_eq!(
            s.iter().map(|s| s.max_pods).collect::<Vec<_>>(),
            vec![4, 3, 3]
        );
        assert_eq!(
            s.iter().map(|s| s.min_pods).collect::<Vec<_>>(),
            vec![2, 1, 1]
        );
    }

    #[test]
    fn unlimited_max_scale_gives_zero_everywhere() {
        assert!(
            split(0, 0, 3)
                .iter()
                .all(|s| s.max_pods == 0 && s.min_pods == 0)
        );
        let s = split(0, 5, 2);
        assert_eq!(s.iter().map(|s| s.min_pods).sum::<i32>(), 5);
    }

    #[test]
    fn max_scale_below_n_leaves_later_slots_without_quota() {
        let s = split(2, 1, 5);
        assert_eq!(
            s.iter().map(|s| s.max_pods).collect::<Vec<_>>(),
            vec![1, 1, 0, 0, 0]
        );
        assert_eq!(s[0].min_pods, 1);
    }

    #[test]
    fn no_members_no_shares() {
        assert!(split(10, 3, 0).is_empty());
    }

    #[test]
    fn same_order_same_shares() {
        assert_eq!(split(7, 3, 4), split(7, 3, 4));
    }

    #[test]
    fn property_sums_and_bounds() {
        let mut rng = StdRng::seed_from_u64(11);
        for _ in 0..5000 {
            let n = rng.random_range(0..40usize);
            let max = rng.random_range(0..100);
            let min = if max == 0 {
                rng.random_range(0..50)
            } else {
                rng.random_range(0..=max)
            };
            let s = split(max, min, n);
            assert_eq!(s.len(), n);
            if n == 0 {
                continue;
            }
            let max_sum: i32 = s.iter().map(|s| s.max_pods).sum();
            let min_sum: i32 = s.iter().map(|s| s.min_pods).sum();
            assert_eq!(min_sum, min);
            if max > 0 {
                assert!(max_sum <= max);
                assert!(
                    s.iter().all(|s| s.min_pods <= s.max_pods),
                    "{max} {min} {n}: {s:?}"
                );
            } else {
                assert_eq!(max_sum, 0);
            }
        }
    }
}
