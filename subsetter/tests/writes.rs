//! What the subsetter writes for a new revision, counted at the API server: at the design's
//! 100,000 revisions every extra write per revision is 100,000 writes an etcd commits.

mod support;

use std::sync::Arc;

use anyhow::Result;
use futures::future::try_join_all;
use subsetter::Random;
use support::*;

/// Writes by the subsetter's client to `resource` (`revisions/status`, …) so far.
fn writes(c: &Cluster, resource: &str) -> u64 {
    c.server
        .stats()
        .requests
        .iter()
        .filter(|(k, _)| k.resource == resource)
        .filter(|(k, _)| ["create", "update", "patch"].contains(&k.verb.as_str()))
        .map(|(_, n)| n)
        .sum()
}

/// A burst of new revisions: each gets one ActivationEndpoints create, one status write for
/// it and one for the Revision. The reconciles triggered by the subset's own watch events run
/// while the Revision watch has not shown the status written yet; they must not write the same
/// status again (seen: ~1.7 Revision status writes per revision in the scale scenario).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_revisions_costs_three_writes_each() -> Result<()> {
    const N: usize = 60;
    let c = Cluster::start().await?;
    for i in 1..=5 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.1.{i}"))
            .await?;
    }
    let running = c.run_subsetter(Arc::new(Random::seeded(1)));
    let names: Vec<String> = (0..N).map(|i| format!("r{i}")).collect();
    try_join_all(
        names
            .iter()
            .map(|n| c.create_revision(n, spec(5, 0, Some(2)))),
    )
    .await?;
    for n in &names {
        c.wait_endpoints(n, ready_with(2)).await?;
        c.wait_revision(n, |r| {
            r.status.as_ref().is_some_and(|s| {
                condition(&s.conditions, "Ready").is_some_and(|c| c.status == "True")
            })
        })
        .await?;
    }
    // Every trigger the writes caused has been reconciled: nothing queued, nothing running.
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_reconciles_queued") == 0
            && counter(m, "subsetter_reconciles_in_flight") == 0
    })
    .await?;
    let n = N as u64;
    assert_eq!(writes(&c, "activationendpoints"), n, "one create each");
    assert_eq!(
        writes(&c, "activationendpoints/status"),
        n,
        "one subset status each"
    );
    assert_eq!(
        writes(&c, "revisions/status"),
        n,
        "one Revision status each"
    );
    running.stop().await
}
