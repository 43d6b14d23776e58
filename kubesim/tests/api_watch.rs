//! kube-rs watchers, reflectors and raw watch streams against kubesim.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Client, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

async fn server() -> (ApiServer, Client) {
    let cfg = ApiServerConfig {
        bookmark_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let s = ApiServer::start(cfg).await.expect("server starts");
    let c = s.client();
    (s, c)
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}
    }))
    .unwrap()
}

/// Next event of a watcher stream, failing the test after a while instead of hanging.
async fn next<S>(s: &mut S) -> Event<Pod>
where
    S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    loop {
        match tokio::time::timeout(WAIT, s.next())
            .await
            .expect("an event in time")
        {
            Some(Ok(e)) => return e,
            Some(Err(e)) => tracing::info!("watcher error (it retries): {e}"),
            None => panic!("watcher ended"),
        }
    }
}

/// Skips events until one satisfies `f`.
async fn until<S>(s: &mut S, f: impl Fn(&Event<Pod>) -> bool) -> Event<Pod>
where
    S: futures::Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    loop {
        let e = next(s).await;
        if f(&e) {
            return e;
        }
    }
}

fn is_apply(name: &'static str) -> impl Fn(&Event<Pod>) -> bool {
    move |e| matches!(e, Event::Apply(p) if p.name_any() == name)
}

fn is_delete(name: &'static str) -> impl Fn(&Event<Pod>) -> bool {
    move |e| matches!(e, Event::Delete(p) if p.name_any() == name)
}

#[tokio::test]
async fn watcher_sees_adds_updates_deletes_and_resumes() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("before", json!({})))
        .await?;
    let mut w = watcher::watcher(pods.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    assert!(matches!(next(&mut w).await, Event::Init));
    assert!(matches!(next(&mut w).await, Event::InitApply(p) if p.name_any() == "before"));
    assert!(matches!(next(&mut w).await, Event::InitDone));

    pods.create(&PostParams::default(), &pod("a", json!({})))
        .await?;
    until(&mut w, is_apply("a")).await;
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await?;
    let e = until(&mut w, is_apply("a")).await;
    let Event::Apply(p) = e else { unreachable!() };
    assert_eq!(p.labels().get("x").map(String::as_str), Some("1"));
    pods.delete("a", &DeleteParams::default()).await?;
    until(&mut w, is_delete("a")).await;

    // The server ends every watch stream; the watcher re-watches from its last
    // resourceVersion without listing again, and misses nothing.
    let lists_before = s.stats().count("list", "pods");
    s.close_watches();
    pods.create(&PostParams::default(), &pod("after-close", json!({})))
        .await?;
    until(&mut w, is_apply("after-close")).await;
    let st = s.stats();
    assert_eq!(
        st.count("list", "pods"),
        lists_before,
        "resumed without a relist"
    );
    assert!(st.count("watch", "pods") >= 2);
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn watcher_relists_after_410() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("p", json!({})))
        .await?;
    let mut w = watcher::watcher(pods.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    until(&mut w, |e| matches!(e, Event::InitDone)).await;
    // A write elsewhere moves the cluster's resourceVersion past the watcher's; after a
    // compaction the watcher's resourceVersion is too old to resume from.
    let leases: Api<Lease> = Api::default_namespaced(client.clone());
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "l"}, "spec": {}}))?,
        )
        .await?;
    s.compact();
    s.close_watches();
    until(&mut w, |e| matches!(e, Event::Init)).await;
    until(
        &mut w,
        |e| matches!(e, Event::InitApply(p) if p.name_any() == "p"),
    )
    .await;
    until(&mut w, |e| matches!(e, Event::InitDone)).await;
    assert_eq!(s.stats().count("list", "pods"), 2);
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn selectors_and_transitions() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let cfg = watcher::Config::default().labels("app=web");
    let mut w = watcher::watcher(pods.clone(), cfg)
        .default_backoff()
        .boxed();
    until(&mut w, |e| matches!(e, Event::InitDone)).await;
    pods.create(&PostParams::default(), &pod("db", json!({"app": "db"})))
        .await?;
    pods.create(&PostParams::default(), &pod("web", json!({"app": "web"})))
        .await?;
    // The first event after InitDone is "web": "db" never matched.
    assert!(is_apply("web")(&next(&mut w).await));
    // web stops matching -> DELETED with its last content; db starts matching -> ADDED.
    pods.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await?;
    let e = next(&mut w).await;
    let Event::Delete(p) = e else {
        panic!("expected Delete, got {e:?}")
    };
    assert_eq!(
        p.labels().get("app").map(String::as_str),
        Some("web"),
        "last matching content"
    );
    pods.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await?;
    assert!(is_apply("db")(&next(&mut w).await));

    // A kubelet-style watch on spec.nodeName sees a pod ADDED when it is bound to its node.
    let fcfg = watcher::Config::default().fields("spec.nodeName=n1");
    let mut fw = watcher::watcher(pods.clone(), fcfg)
        .default_backoff()
        .boxed();
    until(&mut fw, |e| matches!(e, Event::InitDone)).await;
    pods.create(&PostParams::default(), &pod("unbound", json!({})))
        .await?;
    let mut bound = pod("bound", json!({}));
    bound.spec.as_mut().unwrap().node_name = Some("n2".into());
    pods.create(&PostParams::default(), &bound).await?;
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "unbound"}, "target": {"kind": "Node", "name": "n1"}});
    let req = http::Request::post("/api/v1/namespaces/default/pods/unbound/binding")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&binding)?)?;
    client.request_text(req).await?;
    let e = next(&mut fw).await;
    let Event::Apply(p) = e else {
        panic!("expected Apply, got {e:?}")
    };
    assert_eq!(
        (p.name_any().as_str(), p.spec.unwrap().node_name.as_deref()),
        ("unbound", Some("n1"))
    );
    let st = s.stats();
    let fwatch = st
        .watches
        .iter()
        .find(|w| w.field_selector == "spec.nodeName=n1")
        .expect("watch recorded");
    assert!(fwatch.open);
    assert_eq!(
        fwatch.events, 1,
        "only the bound pod's event reached the node watch"
    );
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn streaming_list_and_reflector() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for n in ["s1", "s2"] {
        pods.create(&PostParams::default(), &pod(n, json!({})))
            .await?;
    }
    let cfg = watcher::Config::default().streaming_lists();
    let (reader, writer) = reflector::store::<Pod>();
    let mut w = reflector::reflector(writer, watcher::watcher(pods.clone(), cfg))
        .default_backoff()
        .boxed();
    until(&mut w, |e| matches!(e, Event::InitDone)).await;
    let mut names: Vec<String> = reader.state().iter().map(|p| p.name_any()).collect();
    names.sort();
    assert_eq!(names, ["s1", "s2"]);
    assert_eq!(
        s.stats().count("list", "pods"),
        0,
        "a streaming list is a watch"
    );
    pods.delete("s1", &DeleteParams::default()).await?;
    until(&mut w, is_delete("s1")).await;
    assert_eq!(reader.state().len(), 1);
    pods.create(&PostParams::default(), &pod("s3", json!({})))
        .await?;
    until(&mut w, is_apply("s3")).await;
    assert!(
        reader
            .get(&reflector::ObjectRef::new("s3").within("default"))
            .is_some()
    );
    s.shutdown().await;
    Ok(())
}

/// Reads a whole raw watch response (the server must end it).
async fn raw_watch(client: &Client, query: &str) -> Vec<Value> {
    let req = http::Request::get(format!("/api/v1/namespaces/default/pods?{query}"))
        .body(vec![])
        .unwrap();
    let lines = client.request_stream(req).await.expect("watch starts");
    use futures::AsyncBufReadExt;
    let all: Vec<String> = tokio::time::timeout(WAIT, lines.lines().try_collect())
        .await
        .expect("stream ends")
        .unwrap();
    all.iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn raw_watch_protocol() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let p = pods
        .create(&PostParams::default(), &pod("r", json!({})))
        .await?;
    let rv: u64 = p.resource_version().unwrap().parse()?;

    // timeoutSeconds ends the stream cleanly; rv=0 starts with synthetic ADDED events.
    let evs = raw_watch(&client, "watch=true&timeoutSeconds=1&resourceVersion=0").await;
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[0]["object"]["kind"], "Pod");

    // Streaming list: ADDED for current objects, then the initial-events-end bookmark.
    let evs = raw_watch(
        &client,
        "watch=true&timeoutSeconds=1&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
    )
    .await;
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[1]["type"], "BOOKMARK");
    assert_eq!(
        evs[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // A no-op update sends nothing and keeps the resourceVersion.
    let same = pods.replace("r", &PostParams::default(), &p).await?;
    assert_eq!(same.resource_version(), p.resource_version());
    pods.patch(
        "r",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
    )
    .await?;
    let evs = raw_watch(
        &client,
        &format!("watch=true&timeoutSeconds=1&resourceVersion={rv}"),
    )
    .await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["type"], "MODIFIED");

    // 410: HTTP 200, one ERROR event with an Expired Status, then the end.
    s.compact();
    let cur = s.resource_version();
    let evs = raw_watch(&client, &format!("watch=true&resourceVersion={rv}")).await;
    assert_eq!(
        evs,
        vec![
            json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {rv} ({cur})"), "reason": "Expired", "code": 410}})
        ]
    );
    s.shutdown().await;
    Ok(())
}

/// A real server's quiet watch is silent: no BOOKMARK unless asked for, and then about once a
/// minute (here: the configured interval) plus one 2 s before `timeoutSeconds` ends.
#[tokio::test]
async fn quiet_watches_are_silent_and_bookmarks_keep_the_real_cadence() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("q", json!({})))
        .await?;
    let rv = s.resource_version();

    // Not asked for: nothing at all until the stream ends.
    let evs = raw_watch(
        &client,
        &format!("watch=true&timeoutSeconds=3&resourceVersion={rv}"),
    )
    .await;
    assert_eq!(evs, Vec::<Value>::new());

    // Asked for, with the interval (an hour here) longer than the watch: only the one just
    // before the end, carrying the current resourceVersion.
    let evs = raw_watch(
        &client,
        &format!("watch=true&timeoutSeconds=3&allowWatchBookmarks=true&resourceVersion={rv}"),
    )
    .await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["type"], "BOOKMARK");
    assert_eq!(evs[0]["object"]["kind"], "Pod");
    assert_eq!(
        evs[0]["object"]["metadata"]["resourceVersion"],
        rv.to_string()
    );
    s.shutdown().await;

    // A short interval: bookmarks keep coming, never more often than the interval, and none
    // in the last 2 s.
    let fast = ApiServer::start(ApiServerConfig {
        bookmark_interval: Duration::from_millis(500),
        ..Default::default()
    })
    .await?;
    let client = fast.client();
    let evs = raw_watch(
        &client,
        "watch=true&timeoutSeconds=4&allowWatchBookmarks=true&resourceVersion=1",
    )
    .await;
    assert!(evs.iter().all(|e| e["type"] == "BOOKMARK"), "{evs:?}");
    assert!((1..=4).contains(&evs.len()), "{} bookmarks", evs.len());
    fast.shutdown().await;
    Ok(())
}
