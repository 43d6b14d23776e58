//! The latency model: writes and reads can be held back (an etcd commit, a slow list) while
//! watches keep flowing. The model's numbers are for load tests; here an answer that never
//! comes makes each rule visible without timing anything.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::delay::Delay;
use serde_json::json;

const NEVER: Duration = Duration::from_secs(3600);
const WAIT: Duration = Duration::from_secs(10);

fn lease(name: &str) -> Lease {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"holderIdentity": "a"}}))
        .unwrap()
}

#[tokio::test]
async fn writes_wait_for_their_commit_and_reads_do_not() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let leases: Api<Lease> = Api::default_namespaced(s.client());
    leases
        .create(&PostParams::default(), &lease("before"))
        .await?;

    s.set_write_latency(Delay::Fixed(NEVER));
    let (pp, held) = (PostParams::default(), lease("held"));
    let create = leases.create(&pp, &held);
    tokio::pin!(create);
    let lp = Default::default();
    // The write is held back: meanwhile reads are answered and do not see it.
    tokio::select! {
        r = &mut create => panic!("a write finished under an endless write latency: {r:?}"),
        listed = leases.list(&lp) => {
            let names: Vec<_> = listed?.items.into_iter().filter_map(|c| c.metadata.name).collect();
            assert_eq!(names, vec!["before".to_string()]);
        }
    }
    assert_eq!(leases.get_opt("held").await?, None);

    // Back to no latency: a new write goes through at once.
    s.set_write_latency(Delay::ZERO);
    tokio::time::timeout(WAIT, leases.create(&PostParams::default(), &lease("after"))).await??;
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn reads_can_be_held_back_while_writes_go_through() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let leases: Api<Lease> = Api::default_namespaced(s.client());
    s.set_read_latency(Delay::Fixed(NEVER));
    let (pp, w) = (PostParams::default(), lease("w"));
    let lp = Default::default();
    let list = leases.list(&lp);
    tokio::pin!(list);
    tokio::select! {
        r = &mut list => panic!("a list finished under an endless read latency: {r:?}"),
        created = leases.create(&pp, &w) => { created?; }
    }
    s.shutdown().await;
    Ok(())
}
