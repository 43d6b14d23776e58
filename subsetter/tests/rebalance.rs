//! Gradual rebalancing: activators that join take no members at once (no churn), then the
//! rebalancer moves a bounded number from the most loaded until the load is even enough.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use subsetter::Config;
use subsetter::policy::LeastLoaded;
use subsetter::rebalance::Limits;
use support::*;

#[tokio::test]
async fn new_activators_get_members_gradually() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=4 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.5.{i}"))
            .await?;
    }
    let config = Config {
        rebalance_interval: Duration::from_millis(200),
        rebalance: Limits {
            threshold: 1.2,
            max_moves: 2,
        },
        ..Config::default()
    };
    let running = c.run_subsetter_with(Arc::new(LeastLoaded), config);
    for r in 0..8 {
        c.create_revision(&format!("r{r}"), spec(0, 0, Some(2)))
            .await?;
    }
    for r in 0..8 {
        c.wait_endpoints(&format!("r{r}"), ready_with(2)).await?;
    }
    for i in 5..=6 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.5.{i}"))
            .await?;
    }
    // 16 members over 6 activators: 4,4,4,4,0,0 until the rebalancer moves four of them
    // (max 4 > 1.2 × 2.67), two per interval, and stops at 3,3,3,3,2,2.
    let moved = "subsetter_members_replaced_total{reason=\"rebalance\"}";
    c.wait_metrics(&running, |m| counter(m, moved) >= 4).await?;
    running.stop().await?;
    let mut loads: BTreeMap<String, usize> = (1..=6).map(|i| (format!("node-{i}"), 0)).collect();
    for ae in c.endpoints().list(&Default::default()).await?.items {
        assert_eq!(members(&ae).len(), 2, "every subset keeps its N");
        for m in members(&ae) {
            *loads.entry(m).or_default() += 1;
        }
    }
    let max = loads.values().max().copied().unwrap_or(0);
    let min = loads.values().min().copied().unwrap_or(0);
    assert!(max <= 3 && min >= 2, "{loads:?}");
    Ok(())
}
