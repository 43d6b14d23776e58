//! An activator lost while its Node is Ready (a DaemonSet rolling update deletes the old pod
//! before the new one starts; a restart; a deleted pod) stays a member while its replacement
//! comes, and the replacement is written into its subsets in place: no subset moves. One not
//! replaced within the hold is repaired then; one whose Node turns NotReady meanwhile is
//! repaired at once; one whose old pod drains longer than the hold is held until it is gone
//! (`subsetter/src/replacements.rs`).

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use crds::ActivationEndpoints;
use futures::StreamExt;
use kube::runtime::watcher;
use subsetter::{Config, Random};
use support::*;

const NODES: [&str; 4] = ["node-1", "node-2", "node-3", "node-4"];

/// Four Ready nodes with an activator each, a subsetter holding lost activators for `hold`,
/// and a revision "r" with 2 members.
async fn start(hold: Duration) -> Result<(Cluster, Running, ActivationEndpoints)> {
    let c = Cluster::start().await?;
    c.add_ready_nodes(&NODES).await?;
    for (i, n) in NODES.iter().enumerate() {
        c.add_activator(n, &format!("127.0.8.{}", i + 1)).await?;
    }
    let running = c.run_subsetter_with(
        Arc::new(Random::seeded(11)),
        Config {
            replacement_hold: hold,
            ..Config::default()
        },
    );
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_activators_available") == 4
    })
    .await?;
    c.create_revision("r", spec(0, 0, Some(2))).await?;
    let ae = c.wait_endpoints("r", ready_with(2)).await?;
    Ok((c, running, ae))
}

/// The member sets seen, in order.
type Seen = Arc<Mutex<Vec<BTreeSet<String>>>>;

/// Every member set "r"'s ActivationEndpoints shows from now on, in order.
fn record_members(c: &Cluster) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let stream = watcher(
        c.endpoints(),
        watcher::Config::default().fields("metadata.name=r"),
    );
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::Apply(ae) | watcher::Event::InitApply(ae)) = ev {
                let m: BTreeSet<String> = members(&ae).into_iter().collect();
                s.lock().unwrap().push(m);
            }
        }
    });
    (seen, task)
}

/// A new activator pod on `node` at `ip`, Ready; returns "r"'s subset once it names that pod
/// and address for the node (written in place).
async fn replace(c: &Cluster, node: &str, ip: &str) -> Result<ActivationEndpoints> {
    let new_pod = format!("activator-{node}-v2");
    c.add_activator_pod(node, &new_pod, ip).await?;
    let (node, address) = (node.to_owned(), format!("{ip}:8080"));
    c.wait_endpoints("r", move |ae| {
        ae.status.as_ref().is_some_and(|s| {
            s.activators
                .iter()
                .any(|m| m.node == node && m.pod == new_pod && m.address == address)
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activator_replaced_on_its_ready_node_keeps_its_subsets_and_is_written_in_place()
-> Result<()> {
    let (c, running, before) = start(Duration::from_secs(60)).await?;
    let original: BTreeSet<String> = members(&before).into_iter().collect();
    let victim = members(&before)[0].clone();
    let (seen, task) = record_members(&c);
    // The rolling update: the old pod goes first (hostPort, no surge)…
    c.delete_activator(&victim).await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_replacement_holds_total") == 1
            && counter(m, "subsetter_held_for_replacement") == 1
    })
    .await?;
    // …then the new one, with a new name and address, Ready.
    let after = replace(&c, &victim, "127.0.8.99").await?;
    let text = running.subsetter.metrics().encode();
    task.abort();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        members(&after).into_iter().collect::<BTreeSet<_>>(),
        original,
        "the same members, the replacement in place"
    );
    assert!(
        seen.iter().all(|m| *m == original),
        "no member set but the original was ever written: {seen:?}"
    );
    assert_eq!(counter(&text, "subsetter_held_for_replacement"), 0);
    assert_eq!(
        counter(&text, "subsetter_replacement_holds_expired_total"),
        0
    );
    assert_eq!(counter(&text, "subsetter_members_left_total"), 0, "{text}");
    running.stop().await
}

/// The DaemonSet creates the replacement only once the old pod is gone, and the old activator
/// drains for up to its `--drain-timeout` (90 s) first: a hold counted from the loss ran out
/// under such a drain on the repo's cluster and moved the member. Held while the old pod
/// terminates, the hold counts from when it is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activator_draining_longer_than_the_hold_keeps_its_subsets_until_replaced() -> Result<()>
{
    let hold = Duration::from_secs(3) + Duration::from_millis(500);
    let (c, running, before) = start(hold).await?;
    let original: BTreeSet<String> = members(&before).into_iter().collect();
    let victim = members(&before)[0].clone();
    let (seen, task) = record_members(&c);
    // Deleted with a grace period: the pod stays, terminating, while it drains.
    c.pods()
        .delete(
            &activator_pod(&victim),
            &kube::api::DeleteParams::default().grace_period(60),
        )
        .await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_held_for_replacement") == 1
    })
    .await?;
    assert!(
        c.pods().get_opt(&activator_pod(&victim)).await?.is_some(),
        "the old pod is still terminating"
    );
    // Twice the hold passes while it drains (the time is what is tested, not a wait for an
    // event): still held, nothing expired.
    tokio::time::sleep(hold * 2).await;
    let text = running.subsetter.metrics().encode();
    assert_eq!(
        counter(&text, "subsetter_held_for_replacement"),
        1,
        "{text}"
    );
    assert_eq!(
        counter(&text, "subsetter_replacement_holds_expired_total"),
        0
    );
    // The drain ends (the kubelet removes the pod), then the new pod comes.
    c.delete_activator(&victim).await?;
    let after = replace(&c, &victim, "127.0.8.98").await?;
    let text = running.subsetter.metrics().encode();
    task.abort();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        members(&after).into_iter().collect::<BTreeSet<_>>(),
        original
    );
    assert!(
        seen.iter().all(|m| *m == original),
        "no member set but the original was ever written: {seen:?}"
    );
    assert_eq!(
        counter(&text, "subsetter_replacement_holds_expired_total"),
        0
    );
    assert_eq!(counter(&text, "subsetter_members_left_total"), 0, "{text}");
    running.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activator_not_replaced_within_the_hold_is_repaired_then() -> Result<()> {
    let (c, running, before) = start(Duration::from_secs(4)).await?;
    let victim = members(&before)[0].clone();
    c.delete_activator(&victim).await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_held_for_replacement") == 1
    })
    .await?;
    let held = c.endpoints().get("r").await?;
    assert!(
        members(&held).contains(&victim),
        "{victim} is still a member while held: {:?}",
        members(&held)
    );
    let v = victim.clone();
    let after = c
        .wait_endpoints("r", move |ae| {
            ready_with(2)(ae) && !members(ae).contains(&v)
        })
        .await?;
    let text = running.subsetter.metrics().encode();
    assert_eq!(
        counter(&text, "subsetter_replacement_holds_expired_total"),
        1,
        "{text}"
    );
    assert_eq!(counter(&text, "subsetter_held_for_replacement"), 0);
    assert_ne!(members(&before), members(&after));
    running.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_activator_whose_node_turns_not_ready_is_repaired_at_once() -> Result<()> {
    // A hold far beyond the wait: only the Node's NotReady can end it in time.
    let (c, running, before) = start(Duration::from_secs(3600)).await?;
    let victim = members(&before)[0].clone();
    c.delete_activator(&victim).await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_held_for_replacement") == 1
    })
    .await?;
    c.set_node_ready(&victim, false).await?;
    let v = victim.clone();
    c.wait_endpoints("r", move |ae| {
        ready_with(2)(ae) && !members(ae).contains(&v)
    })
    .await?;
    let text = running.subsetter.metrics().encode();
    assert_eq!(counter(&text, "subsetter_held_for_replacement"), 0);
    assert_eq!(
        counter(&text, "subsetter_replacement_holds_expired_total"),
        0
    );
    running.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_hold_a_lost_activator_on_a_ready_node_is_repaired_after_the_settle() -> Result<()>
{
    let (c, running, before) = start(Duration::ZERO).await?;
    let victim = members(&before)[0].clone();
    c.delete_activator(&victim).await?;
    let v = victim.clone();
    c.wait_endpoints("r", move |ae| {
        ready_with(2)(ae) && !members(ae).contains(&v)
    })
    .await?;
    let text = running.subsetter.metrics().encode();
    assert_eq!(counter(&text, "subsetter_replacement_holds_total"), 0);
    running.stop().await
}
