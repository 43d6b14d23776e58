//! The subsetter through an API server outage: kubesim stopped and started again on the same
//! address, its watch history compacted meanwhile (every resumed watch gets 410 Gone, as from
//! a restarted kube-apiserver). Afterwards the leader still holds and renews its Lease, a
//! Revision created then gets its subset, and an activator that turns unready leaves one.
//! Figures (printed, not asserted): when each watch and the Lease came back, and the requests
//! the subsetter sent while the API server was down. `OUTAGE_SECS` sets the outage (default 8).

// The figures are this test's report (run it with --nocapture to read them).
#![allow(clippy::print_stdout)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use activator::cache::api_health::Heard;
use activator::ops::api_count::{ApiRequest, counted};
use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::wait::await_condition;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use subsetter::leader::{LeaseConfig, run_as_leader};
use subsetter::{Config, Random, Subsetter};
use support::*;
use tokio::sync::oneshot;

fn outage() -> Duration {
    let secs = std::env::var("OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(8);
    Duration::from_secs(secs)
}

fn by_verb(counts: &Family<ApiRequest, Counter>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let text = {
        let mut r = prometheus_client::registry::Registry::default();
        r.register("requests", "", counts.clone());
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
        s
    };
    for line in text.lines().filter(|l| l.starts_with("requests_total{")) {
        let (labels, n) = line.rsplit_once(' ').unwrap();
        let get = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        *out.entry(format!("{} {}", get("verb"), get("resource")))
            .or_default() += n.parse::<u64>().unwrap();
    }
    out
}

async fn lease_renewed_after(c: &Cluster, t: Timestamp) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), "default");
    tokio::time::timeout(
        WAIT,
        await_condition(leases, "subsetter", move |l: Option<&Lease>| {
            l.and_then(|l| l.spec.as_ref()).is_some_and(|s| {
                s.holder_identity.as_deref() == Some("subsetter")
                    && s.renew_time.as_ref().is_some_and(|r| r.0 > t)
            })
        }),
    )
    .await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_its_watches_and_its_reconciles_resume_after_an_api_server_outage() -> Result<()>
{
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let c = Cluster::start().await?;
    for i in 1..=3 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.6.{i}"))
            .await?;
    }
    // The subsetter's requests are counted as an activator counts its own, so that those it
    // sends to a stopped server (which counts nothing) are seen.
    let counts = Family::<ApiRequest, Counter>::default();
    // Nothing here reads what the client heard (the activator's API health does).
    let heard = Heard::default();
    let client = counted(c.server.client_as("subsetter"), counts.clone(), heard);
    let subsetter = Arc::new(Subsetter::new(
        client.clone(),
        Config::default(),
        Arc::new(Random::seeded(7)),
    ));
    let caches = Arc::new(subsetter.start_caches());
    let (stop, stopped_rx) = oneshot::channel::<()>();
    let lease = LeaseConfig {
        name: "subsetter".into(),
        namespace: "default".into(),
        identity: "subsetter".into(),
        duration_seconds: 3,
        grace_seconds: 1,
        release_timeout: Duration::from_millis(500),
    };
    let (s, cs) = (Arc::clone(&subsetter), Arc::clone(&caches));
    let task = tokio::spawn(async move {
        run_as_leader(
            client,
            lease,
            async move {
                let _ = stopped_rx.await;
            },
            move |stop| {
                let (s, cs) = (Arc::clone(&s), Arc::clone(&cs));
                async move { s.lead(&cs, stop).await }
            },
        )
        .await
    });
    lease_renewed_after(&c, Timestamp::UNIX_EPOCH).await?;
    c.create_revision("before", spec(0, 0, Some(2))).await?;
    let ae = c
        .wait_endpoints("before", |ae| members(ae).len() == 2)
        .await?;
    let leaving = members(&ae)[0].clone();

    let outage = outage();
    let last_watch = c
        .server
        .stats()
        .watches
        .iter()
        .map(|w| w.id)
        .max()
        .unwrap_or(0);
    let sent_before = by_verb(&counts);
    c.server.stop().await;
    let stopped = Instant::now();
    c.server.compact();
    // The outage itself: the time is the scenario, not a wait for something to happen.
    tokio::time::sleep(outage).await;
    let down = stopped.elapsed();
    let sent: BTreeMap<String, u64> = by_verb(&counts)
        .into_iter()
        .map(|(k, n)| {
            let was = sent_before.get(&k).copied().unwrap_or(0);
            (k, n - was)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    let resumed_wall = Timestamp::now();
    c.server.resume().await?;
    let resumed = Instant::now();

    // The watches, read from kubesim's accounting (it has no event to wait on; the few
    // milliseconds between reads bound the figures' resolution only). Not the Lease's: a
    // leader does not watch it (only a standby waits for its release); its renewal is
    // checked below.
    let wanted = ["revisions", "activationendpoints", "pods", "nodes"];
    let mut back: BTreeMap<&str, Duration> = BTreeMap::new();
    tokio::time::timeout(WAIT, async {
        while back.len() < wanted.len() {
            let stats = c.server.stats();
            for r in wanted {
                if !back.contains_key(r)
                    && stats
                        .watches
                        .iter()
                        .any(|w| w.open && w.id > last_watch && w.resource == r)
                {
                    back.insert(r, resumed.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("watches never resumed; resumed so far: {back:?}"));

    lease_renewed_after(&c, resumed_wall).await?;
    let renewed = resumed.elapsed();

    // The Revision watch and the reconciler: a new Revision gets its subset.
    let created = Instant::now();
    c.create_revision("after", spec(0, 0, Some(2))).await?;
    c.wait_endpoints("after", |ae| members(ae).len() == 2)
        .await?;
    let subset_after = created.elapsed();

    // The activator pod watch: a member turning unready leaves the subset.
    let ip = format!("127.0.6.{}", leaving.trim_start_matches("node-"));
    let changed = Instant::now();
    c.set_activator_ready(&leaving, &ip, false).await?;
    let l = leaving.clone();
    c.wait_endpoints("before", move |ae| !members(ae).contains(&l))
        .await?;
    let member_left = changed.elapsed();

    // Bounded: every watch and the Lease wait at least half the back-off's cap between
    // attempts after the first few (this catches a retry loop, not a slow one).
    let attempts: u64 = sent.values().sum();
    let secs = down.as_secs_f64();
    // The four watches, the Lease's renewals, and the Lease watch a standby would have.
    let sources = wanted.len() as f64 + 2.0;
    let per_source = 5.0 + secs / (crds::backoff::CAP.as_secs_f64() / 2.0);
    assert!(
        attempts as f64 <= 2.0 * sources * per_source,
        "the subsetter retried {attempts} times in {secs:.1} s: {sent:?}"
    );

    println!("outage: {secs:.1} s, watch history compacted (every resumed watch got 410)");
    println!(
        "subsetter requests while down: {attempts} = {:.2}/s ({sent:?})",
        attempts as f64 / secs
    );
    for (r, t) in &back {
        println!(
            "resumed {:>7.1} ms after the restart: {r} watch",
            t.as_secs_f64() * 1e3
        );
    }
    println!(
        "Lease renewed {:.0} ms after the restart; new revision's subset in {:.0} ms; an unready member left a subset in {:.0} ms",
        renewed.as_secs_f64() * 1e3,
        subset_after.as_secs_f64() * 1e3,
        member_left.as_secs_f64() * 1e3
    );

    let _ = stop.send(());
    task.await??;
    Ok(())
}

/// A Node NotReady right after an outage is its aftermath (the controller-manager marks each
/// node whose kubelet has not renewed its lease since, one node of three for 6 s after a
/// 30 s etcd outage on the repo's cluster): its activator stays a member for
/// `Config::outage_hold` after the outage's last sign, and is repaired only if its Node is
/// still NotReady then. Here the API server stops: the watches fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_not_ready_right_after_an_outage_is_held_then_repaired_if_it_stays() -> Result<()> {
    node_not_ready_after(Outage::ApiServer).await
}

/// The same after an etcd outage, which the watches do not see: the API server keeps them
/// open and quiet, and only its `/readyz` (probed every second) fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_not_ready_right_after_an_etcd_outage_is_held_then_repaired_if_it_stays()
-> Result<()> {
    node_not_ready_after(Outage::Etcd).await
}

#[derive(Debug, Clone, Copy)]
enum Outage {
    ApiServer,
    Etcd,
}

async fn node_not_ready_after(outage: Outage) -> Result<()> {
    let c = Cluster::start().await?;
    c.add_ready_nodes(&["node-1", "node-2", "node-3"]).await?;
    for i in 1..=3 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.7.{i}"))
            .await?;
    }
    let hold = Duration::from_secs(8);
    let running = c.run_subsetter_with(
        Arc::new(Random::seeded(7)),
        Config {
            outage_hold: hold,
            ..Config::default()
        },
    );
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_activators_available") == 3
    })
    .await?;
    c.create_revision("r", spec(0, 0, Some(2))).await?;
    let before = c.wait_endpoints("r", ready_with(2)).await?;
    println!("subset before the outage: {:?}", members(&before));
    let victim = members(&before)[0].clone();

    match outage {
        Outage::ApiServer => {
            // The watches fail (connections refused), then every resumed one gets 410.
            c.server.stop().await;
            c.server.compact();
            tokio::time::sleep(Duration::from_secs(2)).await;
            c.server.resume().await?;
        }
        Outage::Etcd => {
            // The watches stay open; the probe sees `/readyz` fail.
            c.server.stop_storage();
            c.wait_metrics(&running, |m| {
                counter(m, "subsetter_readyz_failures_total") >= 1
            })
            .await?;
            c.server.start_storage();
        }
    }

    let t = Instant::now();
    c.set_node_ready(&victim, false).await?;
    c.wait_metrics(&running, |m| {
        counter(m, "subsetter_disruption_holds_total") >= 1
    })
    .await?;
    let held = c.endpoints().get("r").await?;
    assert!(
        members(&held).contains(&victim),
        "{victim} stays a member while held: {:?}",
        members(&held)
    );
    // Still NotReady when the aftermath is over: repaired.
    let v = victim.clone();
    let after = c
        .wait_endpoints("r", move |ae| {
            ready_with(2)(ae) && !members(ae).contains(&v)
        })
        .await?;
    println!(
        "{victim} NotReady after the {outage:?} outage: held, then repaired {:?} after it \
         turned NotReady (hold {hold:?} from the outage's last sign); members {:?} -> {:?}",
        t.elapsed(),
        members(&before),
        members(&after)
    );
    running.stop().await?;
    Ok(())
}
