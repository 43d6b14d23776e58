//! Stopping the API server and starting it again on the same address (an outage): closed to
//! new connections, open ones cut, and the state kept.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": value}})).unwrap()
}

/// The next item of a watcher (no back-off: each poll is one attempt).
async fn next<S>(w: &mut S) -> Result<Event<ConfigMap>, watcher::Error>
where
    S: futures::Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(WAIT, w.next())
        .await
        .expect("an item in time")
        .expect("the watcher does not end")
}

fn no_answer(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Service(_) | kube::Error::HyperError(_))
}

#[tokio::test]
async fn a_stopped_server_answers_nothing_and_resumes_with_its_state() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let addr = s.addr();
    let client: Client = s.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let created = cms
        .create(&PostParams::default(), &config_map("a", "1"))
        .await?;
    let mut w = watcher::watcher(cms.clone(), watcher::Config::default()).boxed();
    while !matches!(next(&mut w).await?, Event::InitDone) {}

    s.stop().await;
    // The open watch was cut (an error or its end), and its next attempt finds the port
    // closed.
    loop {
        match next(&mut w).await {
            Err(watcher::Error::WatchStartFailed(e)) => {
                assert!(no_answer(&e), "{e:?}");
                break;
            }
            Err(watcher::Error::WatchFailed(_)) => {}
            other => panic!("expected a refused watch, got {other:?}"),
        }
    }
    match cms.get("a").await {
        Err(e) => assert!(no_answer(&e), "an answer from a stopped server: {e:?}"),
        Ok(cm) => panic!("a stopped server answered: {cm:?}"),
    }
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the port is still open"
    );

    s.resume().await?;
    assert_eq!(s.addr(), addr);
    let got = cms.get("a").await?;
    assert_eq!(got.resource_version(), created.resource_version());
    // The watcher resumes from where it was (the history is kept) and sees a change.
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await?;
    loop {
        match next(&mut w).await {
            Ok(Event::Apply(cm))
                if cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get("k"))
                    .map(String::as_str)
                    == Some("2") =>
            {
                break;
            }
            Ok(Event::Init | Event::InitApply(_) | Event::InitDone) => {
                panic!("re-listed although the history held the resourceVersion")
            }
            _ => {}
        }
    }
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_watch_resumed_after_a_compaction_during_the_stop_is_told_410() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(s.client());
    cms.create(&PostParams::default(), &config_map("a", "1"))
        .await?;
    let mut w = watcher::watcher(cms.clone(), watcher::Config::default()).boxed();
    while !matches!(next(&mut w).await?, Event::InitDone) {}
    // A write after the list, so that compacting leaves the list's resourceVersion behind.
    cms.create(&PostParams::default(), &config_map("b", "1"))
        .await?;
    s.stop().await;
    s.compact();
    s.resume().await?;
    loop {
        match next(&mut w).await {
            Err(watcher::Error::WatchError(status)) => {
                assert_eq!(status.code, 410);
                break;
            }
            Err(_) => {}
            Ok(e) => panic!("an event before the 410: {e:?}"),
        }
    }
    // Then the watcher re-lists and has the object again.
    loop {
        if let Event::InitApply(cm) = next(&mut w).await? {
            assert_eq!(cm.name_any(), "a");
            break;
        }
    }
    s.shutdown().await;
    Ok(())
}
