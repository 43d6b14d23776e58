//! Two subsetter replicas with Lease leader election against kubesim: only the holder
//! reconciles, and when it shuts down the standby takes over.

mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::wait::await_condition;
use kubesim::delay::Delay;
use subsetter::leader::{LeaseConfig, run_as_leader};
use subsetter::{Caches, Config, Random, Subsetter};
use support::*;
use tokio::sync::oneshot;

struct Replica {
    subsetter: Arc<Subsetter>,
    /// Kept whether this replica leads or not, as the binary does.
    caches: Arc<Caches>,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<subsetter::Result<()>>,
}

/// A replica as the binary runs one: its own identity (kubesim counts its requests under
/// it), caches started at once, leading whenever it holds the Lease.
fn replica(c: &Cluster, identity: &str) -> Replica {
    replica_with(c, identity, 3)
}

/// A replica whose Lease lasts `duration_seconds` (renewed a second before it ends).
fn replica_with(c: &Cluster, identity: &str, duration_seconds: u64) -> Replica {
    let client = c.server.client_as(identity);
    let subsetter = Arc::new(Subsetter::new(
        client.clone(),
        Config::default(),
        Arc::new(Random::seeded(5)),
    ));
    let caches = Arc::new(subsetter.start_caches());
    let (tx, rx) = oneshot::channel::<()>();
    let lease = LeaseConfig {
        name: "subsetter".into(),
        namespace: "default".into(),
        identity: identity.into(),
        duration_seconds,
        grace_seconds: 1,
        release_timeout: Duration::from_millis(500),
    };
    let (s, cs) = (Arc::clone(&subsetter), Arc::clone(&caches));
    let task = tokio::spawn(async move {
        run_as_leader(
            client,
            lease,
            async move {
                let _ = rx.await;
            },
            move |stop| {
                let (s, cs) = (Arc::clone(&s), Arc::clone(&cs));
                async move { s.lead(&cs, stop).await }
            },
        )
        .await
    });
    Replica {
        subsetter,
        caches,
        shutdown: Some(tx),
        task,
    }
}

/// LISTs `user` made of the resources a subsetter caches.
fn lists_by(c: &Cluster, user: &str) -> u64 {
    c.server
        .stats()
        .requests_by_user
        .iter()
        .filter(|(k, _)| k.user == user && k.verb == "list")
        .filter(|(k, _)| {
            ["revisions", "activationendpoints", "pods", "nodes"].contains(&k.resource.as_str())
        })
        .map(|(_, n)| n)
        .sum()
}

fn reconciles(r: &Replica) -> u64 {
    counter(
        &r.subsetter.metrics().encode(),
        "subsetter_reconciles_total",
    )
}

async fn holder(c: &Cluster, pred: impl Fn(&str) -> bool) -> Result<String> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "default");
    let lease = tokio::time::timeout(
        WAIT,
        await_condition(leases, "subsetter", move |l: Option<&Lease>| {
            l.and_then(|l| l.spec.as_ref()?.holder_identity.as_deref())
                .is_some_and(&pred)
        }),
    )
    .await??;
    Ok(lease
        .and_then(|l| l.spec?.holder_identity)
        .unwrap_or_default())
}

#[tokio::test]
async fn only_the_leader_reconciles_and_the_standby_takes_over() -> Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let c = Cluster::start().await?;
    for i in 1..=3 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.1.{i}"))
            .await?;
    }
    let mut a = replica(&c, "replica-a");
    let mut b = replica(&c, "replica-b");
    let first = holder(&c, |h| h == "replica-a" || h == "replica-b").await?;

    c.create_revision("one", spec(0, 0, None)).await?;
    c.wait_endpoints("one", |ae| members(ae).len() == 3).await?;
    let (leader, standby) = if first == "replica-a" {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert!(reconciles(leader) > 0);
    assert_eq!(reconciles(standby), 0, "the standby reconciled");

    // The leader shuts down and releases the Lease; the standby takes over.
    let _ = leader.shutdown.take().unwrap().send(());
    (&mut leader.task).await??;
    let first2 = first.clone();
    let second = holder(&c, move |h| h != first2).await?;
    assert_ne!(second, first);
    c.create_revision("two", spec(0, 0, None)).await?;
    c.wait_endpoints("two", |ae| members(ae).len() == 3).await?;
    assert!(reconciles(standby) > 0);

    let _ = standby.shutdown.take().unwrap().send(());
    (&mut standby.task).await??;
    Ok(())
}

#[tokio::test]
async fn the_standby_keeps_its_caches_warm_and_takes_over_without_a_relist() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=3 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.3.{i}"))
            .await?;
    }
    let mut a = replica(&c, "replica-a");
    let mut b = replica(&c, "replica-b");
    let first = holder(&c, |h| h == "replica-a" || h == "replica-b").await?;
    let (leader, standby, standby_name) = if first == "replica-a" {
        (&mut a, &mut b, "replica-b")
    } else {
        (&mut b, &mut a, "replica-a")
    };
    c.create_revision("one", spec(0, 0, None)).await?;
    c.wait_endpoints("one", |ae| members(ae).len() == 3).await?;
    tokio::time::timeout(WAIT, standby.caches.wait_synced()).await?;
    assert!(standby.caches.is_synced());
    let listed = lists_by(&c, standby_name);
    assert!(listed >= 4, "the standby listed what it caches: {listed}");
    assert_eq!(reconciles(standby), 0, "the standby reconciled");

    let _ = leader.shutdown.take().unwrap().send(());
    (&mut leader.task).await??;
    holder(&c, move |h| h == standby_name).await?;
    c.create_revision("two", spec(0, 0, None)).await?;
    c.wait_endpoints("two", |ae| members(ae).len() == 3).await?;
    assert!(reconciles(standby) > 0);
    assert_eq!(
        lists_by(&c, standby_name),
        listed,
        "taking over reconciled from the warm caches, without listing again"
    );

    let _ = standby.shutdown.take().unwrap().send(());
    (&mut standby.task).await??;
    Ok(())
}

/// Far longer than any bounded stop takes: reaching it means the stop hung.
const HANG: Duration = Duration::from_secs(60);
const NEVER: Duration = Duration::from_secs(3600);

/// The leader's stop releases the Lease, one write; a server that never answers it must not
/// keep the replica from exiting.
#[tokio::test]
async fn leader_stop_is_bounded_when_the_release_is_never_answered() -> Result<()> {
    let c = Cluster::start().await?;
    let mut a = replica(&c, "replica-a");
    holder(&c, |h| h == "replica-a").await?;
    c.server.set_write_latency(Delay::Fixed(NEVER));
    let _ = a.shutdown.take().unwrap().send(());
    tokio::time::timeout(HANG, &mut a.task)
        .await
        .map_err(|_| anyhow::anyhow!("the leader's stop hung"))???;
    Ok(())
}

/// A replica stopped while it still waits for the API server to answer its first Lease read
/// returns at once.
#[tokio::test]
async fn stop_before_the_lease_is_read_returns() -> Result<()> {
    let c = Cluster::start().await?;
    c.server.set_read_latency(Delay::Fixed(NEVER));
    c.server.set_write_latency(Delay::Fixed(NEVER));
    let mut a = replica(&c, "replica-a");
    let _ = a.shutdown.take().unwrap().send(());
    tokio::time::timeout(HANG, &mut a.task)
        .await
        .map_err(|_| anyhow::anyhow!("the replica's stop hung"))???;
    Ok(())
}

/// Requests `user` made for the Lease, by verb.
fn lease_requests_by(c: &Cluster, user: &str, verb: &str) -> u64 {
    c.server
        .stats()
        .requests_by_user
        .iter()
        .filter(|(k, _)| k.user == user && k.verb == verb && k.resource == "leases")
        .map(|(_, n)| n)
        .sum()
}

/// A clean shutdown releases the Lease and the standby takes it at once: with an hour-long
/// Lease, a standby that slept until the released Lease would have expired (as
/// kube-lease-manager's own loop does) would not take over within the wait.
#[tokio::test]
async fn a_released_lease_is_taken_at_once_not_when_it_would_have_expired() -> Result<()> {
    let c = Cluster::start().await?;
    let mut a = replica_with(&c, "replica-a", 3600);
    holder(&c, |h| h == "replica-a").await?;
    let mut b = replica_with(&c, "replica-b", 3600);
    // The standby has read the Lease (held by replica-a) and gone to sleep on it.
    tokio::time::timeout(WAIT, async {
        while lease_requests_by(&c, "replica-b", "get") == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await?;
    let _ = a.shutdown.take().unwrap().send(());
    (&mut a.task).await??;
    assert_eq!(holder(&c, |h| h == "replica-b").await?, "replica-b");
    let _ = b.shutdown.take().unwrap().send(());
    (&mut b.task).await??;
    Ok(())
}
