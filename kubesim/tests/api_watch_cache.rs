//! The watch cache as kube-apiserver v1.28.7 runs it: which watchers an event is offered to,
//! watchers closed for not keeping up, 410 Gone for a resourceVersion older than the event
//! window, and LISTs that scan every object of a custom resource.

use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig, WatchCacheConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(20);
const WIDGETS: &str = "widgets.example.com";

async fn server(cfg: ApiServerConfig) -> anyhow::Result<(ApiServer, Client)> {
    let s = ApiServer::start(cfg).await?;
    let client = s.client();
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": WIDGETS},
        "spec": {
            "group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))?;
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await?;
    for ns in ["other"] {
        let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    }
    // Served once the CRD is established.
    let api = widgets(&client, "default");
    tokio::time::timeout(WAIT, async {
        while api.list(&ListParams::default()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await?;
    Ok((s, client))
}

fn widgets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn widget(name: &str, labels: Value, payload: usize) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name, "labels": labels},
        "spec": {"payload": "x".repeat(payload)},
    }))
    .unwrap()
}

/// A raw watch whose lines arrive on a channel as the server sends them.
async fn raw_watch(client: &Client, path_and_query: &str) -> mpsc::UnboundedReceiver<Value> {
    let req = http::Request::get(path_and_query.to_string())
        .body(vec![])
        .unwrap();
    let lines = client.request_stream(req).await.expect("watch starts");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = lines.lines();
        while let Ok(Some(l)) = lines.try_next().await {
            let _ = tx.send(serde_json::from_str(&l).unwrap());
        }
    });
    rx
}

/// Waits until the server's counters satisfy `f`.
async fn until_stats(s: &ApiServer, f: impl Fn(&kubesim::api::Stats) -> bool) {
    tokio::time::timeout(WAIT, async {
        while !f(&s.stats()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the counters got there");
}

/// A label selector narrows nothing at dispatch: an unscoped label-selected watch of a custom
/// resource is offered every event of the resource (and sends its client only what matches);
/// a watch scoped by name, or by another namespace, is offered none of the others' events.
#[tokio::test]
async fn unscoped_label_selected_watches_are_offered_every_event() -> anyhow::Result<()> {
    let (s, client) = server(ApiServerConfig::default()).await?;
    let api = widgets(&client, "default");
    let mut labelled = raw_watch(
        &client,
        "/apis/example.com/v1/widgets?watch=true&resourceVersion=1&labelSelector=member%3Da",
    )
    .await;
    let mut by_name = raw_watch(
        &client,
        "/apis/example.com/v1/namespaces/default/widgets?watch=true&resourceVersion=1&fieldSelector=metadata.name%3Dw-0",
    )
    .await;
    let _other_ns = raw_watch(
        &client,
        "/apis/example.com/v1/namespaces/other/widgets?watch=true&resourceVersion=1",
    )
    .await;
    until_stats(&s, |st| st.open_watches() == 3).await;
    let before = s.stats().events_offered(WIDGETS);
    for i in 0..20 {
        let labels = if i == 7 {
            json!({"member": "a"})
        } else {
            json!({})
        };
        api.create(
            &PostParams::default(),
            &widget(&format!("w-{i}"), labels, 10),
        )
        .await?;
    }
    until_stats(&s, |st| st.watch_cache[WIDGETS].events_dispatched >= 20).await;
    // 20 to the label-selected watch, 1 (w-0) to the name-scoped one, 0 to the other namespace.
    assert_eq!(s.stats().events_offered(WIDGETS) - before, 21);
    // What the clients get is filtered after queueing: one event each.
    let got = tokio::time::timeout(WAIT, labelled.recv()).await?.unwrap();
    assert_eq!(got["object"]["metadata"]["name"], "w-7");
    let got = tokio::time::timeout(WAIT, by_name.recv()).await?.unwrap();
    assert_eq!(got["object"]["metadata"]["name"], "w-0");
    assert!(labelled.try_recv().is_err() && by_name.try_recv().is_err());
    s.shutdown().await;
    Ok(())
}

/// Pods are the one resource with an indexed trigger: a watch by `spec.nodeName` is offered
/// only its node's pods, while a label-selected pod watch is offered all of them.
#[tokio::test]
async fn pod_watches_by_node_are_offered_only_their_node() -> anyhow::Result<()> {
    let (s, client) = server(ApiServerConfig::default()).await?;
    let _n1 = raw_watch(
        &client,
        "/api/v1/pods?watch=true&resourceVersion=1&fieldSelector=spec.nodeName%3Dn1",
    )
    .await;
    until_stats(&s, |st| st.open_watches() == 1).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::default_namespaced(client.clone());
    for (i, node) in ["n1", "n2", "n2", "n3"].iter().enumerate() {
        let p = serde_json::from_value(json!({
            "metadata": {"name": format!("p{i}")},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        }))?;
        pods.create(&PostParams::default(), &p).await?;
    }
    until_stats(&s, |st| st.watch_cache["pods"].events_dispatched >= 4).await;
    assert_eq!(s.stats().events_offered("pods"), 1);
    let _labelled = raw_watch(
        &client,
        "/api/v1/pods?watch=true&resourceVersion=1&labelSelector=app%3Dx",
    )
    .await;
    until_stats(&s, |st| st.open_watches() == 2).await;
    pods.delete("p2", &Default::default()).await?;
    until_stats(&s, |st| st.watch_cache["pods"].events_dispatched >= 5).await;
    // p2 was on n2: the node watch is not offered its deletion; the label-selected one is.
    assert_eq!(s.stats().events_offered("pods"), 2);
    s.shutdown().await;
    Ok(())
}

/// Opens a watch over a socket that reads nothing (a small receive buffer, so the server's
/// writes back up soon): the connection fills, then the watcher's result buffer, then its
/// input buffer, and the dispatcher, out of budget, closes it.
async fn stalled_watch(s: &ApiServer) -> anyhow::Result<tokio::net::TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.set_recv_buffer_size(4096)?;
    let mut conn = sock.connect(s.addr()).await?;
    let req = "GET /apis/example.com/v1/widgets?watch=true&resourceVersion=1 HTTP/1.1\r\nHost: kubesim\r\n\r\n";
    conn.write_all(req.as_bytes()).await?;
    Ok(conn)
}

#[tokio::test]
async fn a_watcher_that_never_reads_is_closed_and_counted() -> anyhow::Result<()> {
    let (s, client) = server(ApiServerConfig::default()).await?;
    let api = widgets(&client, "default");
    let mut stalled = stalled_watch(&s).await?;
    // A well-behaved client on the same resource, reading promptly.
    let mut prompt = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let prompt_seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = prompt_seen.clone();
    let reader = tokio::spawn(async move {
        while let Some(e) = prompt.next().await {
            if let Ok(watcher::Event::Apply(_)) = e {
                seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    until_stats(&s, |st| st.open_watches() == 2).await;
    let mut written = 0;
    while s.stats().terminated_watchers(WIDGETS) == 0 {
        assert!(written < 3000, "the stalled watcher was never closed");
        api.create(
            &PostParams::default(),
            &widget(&format!("big-{written}"), json!({}), 16 * 1024),
        )
        .await?;
        written += 1;
        tokio::task::yield_now().await;
    }
    eprintln!("stalled watcher closed after {written} writes");
    assert_eq!(
        s.stats().terminated_watchers(WIDGETS),
        1,
        "only the stalled one"
    );
    assert_eq!(s.stats().open_watches(), 1, "the prompt one still open");
    let metrics = client
        .request_text(http::Request::get("/metrics").body(vec![])?)
        .await?;
    assert!(
        metrics.contains(&format!(
            "apiserver_terminated_watchers_total{{resource=\"{WIDGETS}\"}} 1"
        )),
        "{metrics}"
    );
    // The stalled client, reading now, finds its response ended (the last chunk).
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !got.ends_with(b"\r\n0\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, stalled.read(&mut buf)).await??;
        assert!(n > 0, "connection closed before the response's end");
        got.extend_from_slice(&buf[..n]);
    }
    // The prompt watcher saw everything.
    tokio::time::timeout(WAIT, async {
        while prompt_seen.load(std::sync::atomic::Ordering::Relaxed) < written {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await?;
    reader.abort();
    s.shutdown().await;
    Ok(())
}

/// Reads a whole raw watch response (the server must end it).
async fn whole_watch(client: &Client, query: &str) -> Vec<Value> {
    let mut rx = raw_watch(
        client,
        &format!("/apis/example.com/v1/namespaces/default/widgets?{query}"),
    )
    .await;
    let mut all = Vec::new();
    while let Ok(Some(v)) = tokio::time::timeout(WAIT, rx.recv()).await {
        all.push(v);
    }
    all
}

/// The window holds 100 events and does not grow (an event counts as fresh for 1 ms): a watch
/// resuming from before it gets HTTP 200, one ERROR event with a 410 Expired Status naming the
/// oldest resourceVersion it could resume from, and the end of the stream.
#[tokio::test]
async fn resuming_from_before_the_window_is_410_gone() -> anyhow::Result<()> {
    let cfg = ApiServerConfig {
        watch_cache: WatchCacheConfig {
            event_fresh: Duration::from_millis(1),
            ..WatchCacheConfig::default()
        },
        ..ApiServerConfig::default()
    };
    let (s, client) = server(cfg).await?;
    let api = widgets(&client, "default");
    let w = api
        .create(&PostParams::default(), &widget("w", json!({}), 10))
        .await?;
    let rv0: u64 = w.resource_version().unwrap().parse()?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    for i in 0..150 {
        api.patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"n": i}})),
        )
        .await?;
    }
    // rv0 + 1 ..= rv0 + 150 happened; the window keeps the last 100.
    let oldest = rv0 + 50;
    let evs = whole_watch(&client, &format!("watch=true&resourceVersion={rv0}")).await;
    assert_eq!(
        evs,
        vec![json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {rv0} ({oldest})"),
            "reason": "Expired", "code": 410}})]
    );
    let evs = whole_watch(
        &client,
        &format!("watch=true&timeoutSeconds=1&resourceVersion={}", oldest - 1),
    )
    .await;
    assert_eq!(evs[0]["type"], "ERROR");
    let evs = whole_watch(
        &client,
        &format!("watch=true&timeoutSeconds=1&resourceVersion={oldest}"),
    )
    .await;
    assert_eq!(evs.len(), 100, "every event after {oldest}");
    assert_eq!(s.stats().watch_cache[WIDGETS].capacity, 100);
    s.shutdown().await;
    Ok(())
}

/// With the real 75 s freshness the same writes make the window grow (100 -> 200): nothing
/// expires.
#[tokio::test]
async fn a_busy_window_grows_instead() -> anyhow::Result<()> {
    let (s, client) = server(ApiServerConfig::default()).await?;
    let api = widgets(&client, "default");
    let w = api
        .create(&PostParams::default(), &widget("w", json!({}), 10))
        .await?;
    let rv0: u64 = w.resource_version().unwrap().parse()?;
    for i in 0..150 {
        api.patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"n": i}})),
        )
        .await?;
    }
    let evs = whole_watch(
        &client,
        &format!("watch=true&timeoutSeconds=1&resourceVersion={rv0}"),
    )
    .await;
    assert_eq!(evs.len(), 150);
    assert_eq!(s.stats().watch_cache[WIDGETS].capacity, 200);
    s.shutdown().await;
    Ok(())
}

/// A label-selected LIST of a custom resource reads every object of the resource, in every
/// namespace, whatever it returns; one from the storage (no resourceVersion) reads its
/// namespace's.
#[tokio::test]
async fn a_label_selected_list_scans_every_object() -> anyhow::Result<()> {
    let (s, client) = server(ApiServerConfig::default()).await?;
    for (ns, n) in [("default", 30), ("other", 12)] {
        let api = widgets(&client, ns);
        for i in 0..n {
            let labels = if i == 3 {
                json!({"member": "a"})
            } else {
                json!({})
            };
            api.create(
                &PostParams::default(),
                &widget(&format!("w-{i}"), labels, 10),
            )
            .await?;
        }
    }
    let scanned = |s: &ApiServer| s.stats().list_objects_scanned(WIDGETS);
    let cached = ListParams::default().labels("member=a").match_any();
    let before = scanned(&s);
    let got = widgets(&client, "default").list(&cached).await?;
    assert_eq!(got.items.len(), 1);
    assert_eq!(
        scanned(&s) - before,
        42,
        "the whole resource, both namespaces"
    );
    let before = scanned(&s);
    let got = widgets(&client, "default")
        .list(&ListParams::default().labels("member=a"))
        .await?;
    assert_eq!(got.items.len(), 1);
    assert_eq!(
        scanned(&s) - before,
        30,
        "a quorum read: its namespace's keys"
    );
    let c = &s.stats().watch_cache[WIDGETS];
    assert_eq!(c.cache_lists[""], (1, 42));
    assert_eq!(c.cache_list_returned, 1);
    let metrics = client
        .request_text(http::Request::get("/metrics").body(vec![])?)
        .await?;
    for line in [
        "apiserver_cache_list_fetched_objects_total{resource_prefix=\"/example.com/widgets\",index=\"\"} 42",
        "apiserver_cache_list_total{resource_prefix=\"/example.com/widgets\",index=\"\"} 1",
        "kubesim_apiserver_list_objects_scanned_total{resource=\"widgets.example.com\"} 72",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    s.shutdown().await;
    Ok(())
}
