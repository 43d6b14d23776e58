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

/// The status and body of `method path` with `body`, over one raw HTTP/1.1 connection (the
/// kube client retries a 504 by itself).
async fn raw(addr: std::net::SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr)
        .await
        .expect("a connection");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: kubesim\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).await.expect("sent");
    c.write_all(body).await.expect("sent");
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.expect("an answer");
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// Its etcd stopped, a kube-apiserver keeps serving from its watch cache: open watches stay
/// open, reads naming a resourceVersion are answered, its health checks fail, and a write
/// waits for the storage — 504 at its request's `timeout`, served if the storage comes back
/// first. (The subsetter's outage hold tells an etcd outage from its failed `/readyz`: its
/// watches do not fail.)
#[tokio::test]
async fn a_server_whose_storage_stopped_answers_from_its_cache_and_fails_its_health_checks()
-> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client: Client = s.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.create(&PostParams::default(), &config_map("a", "1"))
        .await?;
    let mut w = watcher::watcher(cms.clone(), watcher::Config::default()).boxed();
    while !matches!(next(&mut w).await?, Event::InitDone) {}

    s.stop_storage();
    for check in ["/readyz", "/livez", "/healthz"] {
        let (code, body) = raw(s.addr(), "GET", check, b"").await;
        assert_eq!(code, 500, "{check}: {body}");
        assert!(body.contains("[-]etcd failed"), "{check}: {body}");
    }
    let cached = cms
        .list(&kube::api::ListParams::default().match_any())
        .await?;
    assert_eq!(cached.items.len(), 1, "a read from the cache is answered");
    let (code, body) = raw(
        s.addr(),
        "POST",
        "/api/v1/namespaces/default/configmaps?timeout=1s",
        &serde_json::to_vec(&config_map("b", "1"))?,
    )
    .await;
    assert_eq!(code, 504, "{body}");
    assert!(body.contains("\"reason\":\"Timeout\""), "{body}");

    // A write without a timeout waits for the storage, and is served when it is back.
    let waiting = tokio::spawn({
        let cms = cms.clone();
        async move {
            cms.patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"k": "2"}})),
            )
            .await
        }
    });
    // The patch has reached the server (it is counted on arrival) and waits there.
    tokio::time::timeout(WAIT, async {
        while s.stats().count("patch", "configmaps") == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await?;
    assert!(
        !waiting.is_finished(),
        "a write is not served without storage"
    );
    s.start_storage();
    let patched = tokio::time::timeout(WAIT, waiting).await???;
    assert_eq!(patched.data.unwrap_or_default()["k"], "2");
    let (code, body) = raw(s.addr(), "GET", "/readyz", b"").await;
    assert_eq!(code, 200, "{body}");
    // The watch never failed: its next item is the change, not an error or a relist.
    match next(&mut w).await? {
        Event::Apply(cm) => assert_eq!(cm.data.unwrap_or_default()["k"], "2"),
        other => panic!("expected the change on the open watch, got {other:?}"),
    }
    s.shutdown().await;
    Ok(())
}
