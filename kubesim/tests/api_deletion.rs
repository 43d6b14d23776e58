//! Deletion and admission as kube-apiserver v1.28 does them, through kube-rs: the pod
//! strategy's grace periods, namespace termination (the `kubernetes` finalizer, `/finalize`,
//! NamespaceLifecycle admission) and the TaintNodesByCondition admission with the node
//! lifecycle controller's condition taints.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Client, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};
use kubesim::node::NodeLifecycleController;
use serde_json::{Value, json};

/// Hang detector for anything awaited (not a performance bound).
const WAIT: Duration = Duration::from_secs(20);

async fn server() -> (ApiServer, Client) {
    let s = ApiServer::start(ApiServerConfig::default())
        .await
        .expect("server starts");
    let c = s.client();
    (s, c)
}

fn pod(name: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "app:1"}],
        }
    }))
    .unwrap()
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn ensure_ns(client: &Client, name: &str) {
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
}

/// Raw request returning (status code, body JSON).
async fn raw(client: &Client, method: &str, path: &str, body: Value) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(if body.is_null() {
            vec![]
        } else {
            serde_json::to_vec(&body).unwrap()
        })
        .unwrap();
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("transport ok");
    let code = resp.status().as_u16();
    use http_body_util::BodyExt;
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn wait_until<K>(api: &Api<K>, name: &str, cond: impl Condition<K>) -> Option<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K: kube::Resource<DynamicType = ()>,
{
    tokio::time::timeout(WAIT, await_condition(api.clone(), name, cond))
        .await
        .expect("condition met in time")
        .expect("watch works")
}

/// The next watch event (skipping bookmarks), as (type, object).
async fn next_event<K, S>(s: &mut S) -> (&'static str, K)
where
    S: futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin,
{
    loop {
        let ev = tokio::time::timeout(WAIT, s.next())
            .await
            .expect("an event in time")
            .expect("stream open")
            .expect("a decodable event");
        match ev {
            WatchEvent::Added(o) => return ("ADDED", o),
            WatchEvent::Modified(o) => return ("MODIFIED", o),
            WatchEvent::Deleted(o) => return ("DELETED", o),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
}

fn ts(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    t.0.as_second()
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// A period of 0 (asked for on a bound pod, or forced by an unbound one) writes the deletion
/// (MODIFIED, deletionTimestamp now and grace 0) and removes the pod (DELETED) in one DELETE,
/// whose answer is the pod as deleted.
#[tokio::test]
async fn pod_deleted_with_grace_zero_is_written_then_removed() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let bound = pods
        .create(&PostParams::default(), &pod("bound", Some("node-1")))
        .await?;
    pods.create(&PostParams::default(), &pod("unbound", None))
        .await?;
    let from = pods.get("unbound").await?.resource_version().unwrap();
    let mut events = pods.watch(&WatchParams::default(), &from).await?.boxed();

    for name in ["bound", "unbound"] {
        let params = if name == "bound" {
            DeleteParams::default().grace_period(0)
        } else {
            DeleteParams::default()
        };
        let answer = pods.delete(name, &params).await?.left().expect("the pod");
        assert_eq!(
            answer.metadata.deletion_grace_period_seconds,
            Some(0),
            "{name}"
        );
        let at = ts(answer
            .metadata
            .deletion_timestamp
            .as_ref()
            .expect("deletionTimestamp"));
        assert!((at - now()).abs() <= 5, "{name}: deletionTimestamp is now");

        let (ty, o) = next_event::<Pod, _>(&mut events).await;
        assert_eq!((ty, o.name_any().as_str()), ("MODIFIED", name));
        assert_eq!(o.metadata.deletion_grace_period_seconds, Some(0));
        let (ty, o) = next_event::<Pod, _>(&mut events).await;
        assert_eq!((ty, o.name_any().as_str()), ("DELETED", name));
        assert!(
            o.metadata.deletion_timestamp.is_some(),
            "DELETED carries the deletion"
        );
        assert_eq!(o.resource_version(), answer.resource_version());
        assert_eq!(api_err(pods.get(name).await.unwrap_err()).code, 404);
    }
    assert_eq!(
        bound.spec.unwrap().termination_grace_period_seconds,
        Some(30)
    );
    s.shutdown().await;
    Ok(())
}

/// A graceful DELETE sets deletionTimestamp = now + period (query parameter or body); later
/// DELETEs only shorten it, moving the deadline with it; a negative period counts as 1 s; the
/// pod stays until its kubelet deletes it with grace 0.
#[tokio::test]
async fn pod_grace_period_deadline_and_shortening() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("slow", Some("node-1")))
        .await?;
    let (code, body) = raw(
        &client,
        "DELETE",
        "/api/v1/namespaces/default/pods/slow?gracePeriodSeconds=60",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let first: Pod = serde_json::from_value(body)?;
    assert_eq!(first.metadata.deletion_grace_period_seconds, Some(60));
    let deadline = ts(first.metadata.deletion_timestamp.as_ref().unwrap());
    assert!((deadline - 60 - now()).abs() <= 5, "deadline is now + 60 s");

    // No period, or a longer one: nothing changes (not even the resourceVersion).
    for params in [
        DeleteParams::default(),
        DeleteParams::default().grace_period(90),
    ] {
        let again = pods.delete("slow", &params).await?.left().unwrap();
        assert_eq!(again.metadata.deletion_grace_period_seconds, Some(60));
        assert_eq!(again.resource_version(), first.resource_version());
    }
    // A shorter one moves the deadline back by the difference.
    let shorter = pods
        .delete("slow", &DeleteParams::default().grace_period(10))
        .await?
        .left()
        .unwrap();
    assert_eq!(shorter.metadata.deletion_grace_period_seconds, Some(10));
    assert_eq!(
        ts(shorter.metadata.deletion_timestamp.as_ref().unwrap()),
        deadline - 50
    );
    assert!(pods.get("slow").await.is_ok(), "waits for its kubelet");

    // A negative period (sent raw: kube-rs's grace_period takes a u32) counts as 1 s.
    pods.create(&PostParams::default(), &pod("negative", Some("node-1")))
        .await?;
    let (code, body) = raw(
        &client,
        "DELETE",
        "/api/v1/namespaces/default/pods/negative",
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": -5}),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["metadata"]["deletionGracePeriodSeconds"], 1);

    // The kubelet's final grace-0 DELETE removes it.
    let gone = pods
        .delete("slow", &DeleteParams::default().grace_period(0))
        .await?
        .left()
        .unwrap();
    assert_eq!(gone.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(
        ts(gone.metadata.deletion_timestamp.as_ref().unwrap()),
        deadline - 60
    );
    assert_eq!(api_err(pods.get("slow").await.unwrap_err()).code, 404);
    s.shutdown().await;
    Ok(())
}

/// DELETE of a namespace answers it Terminating (deletionTimestamp, no grace period, the
/// `kubernetes` finalizer); it stays, through other updates and DELETEs, while a bound pod in
/// it waits for its kubelet; creating in it is 403, creating in a missing namespace 404;
/// watchers see MODIFIED, then DELETED once the pod is gone.
#[tokio::test]
async fn terminating_namespace_waits_for_its_pods_kubelet() -> anyhow::Result<()> {
    let (s, client) = server().await;
    ensure_ns(&client, "doomed").await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "doomed");
    pods.create(&PostParams::default(), &pod("resident", Some("node-1")))
        .await?;
    let from = nss.get("doomed").await?.resource_version().unwrap();
    let mut events = nss
        .watch(
            &WatchParams::default().fields("metadata.name=doomed"),
            &from,
        )
        .await?
        .boxed();

    let answer = nss
        .delete("doomed", &DeleteParams::default())
        .await?
        .left()
        .expect("a namespace DELETE answers with the namespace");
    assert!(answer.metadata.deletion_timestamp.is_some());
    assert_eq!(answer.metadata.deletion_grace_period_seconds, None);
    assert_eq!(
        answer.spec.as_ref().and_then(|s| s.finalizers.clone()),
        Some(vec!["kubernetes".to_string()])
    );
    assert_eq!(
        answer.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Terminating")
    );
    let (ty, o) = next_event::<Namespace, _>(&mut events).await;
    assert_eq!(ty, "MODIFIED");
    assert!(o.metadata.deletion_timestamp.is_some());

    // The namespace controller deletes the pod gracefully; its kubelet has not answered yet.
    let terminating = wait_until(&pods, "resident", |p: Option<&Pod>| {
        p.is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await
    .unwrap();
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));

    // Neither an update nor another DELETE lets the namespace go early.
    nss.patch(
        "doomed",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await?;
    let (ty, o) = next_event::<Namespace, _>(&mut events).await;
    assert_eq!(
        (ty, o.labels().get("touched").map(String::as_str)),
        ("MODIFIED", Some("yes"))
    );
    let again = nss
        .delete("doomed", &DeleteParams::default())
        .await?
        .left()
        .expect("still the namespace");
    assert_eq!(
        again.metadata.deletion_timestamp,
        answer.metadata.deletion_timestamp
    );
    assert!(nss.get("doomed").await.is_ok());

    let e = api_err(
        pods.create(&PostParams::default(), &pod("late", None))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "pods \"late\" is forbidden: unable to create new content in namespace doomed because it is being terminated"
    );
    let details = e.details.expect("details");
    assert_eq!(
        (details.name.as_str(), details.kind.as_str()),
        ("late", "pods")
    );
    let cause = &details.causes[0];
    assert_eq!(
        (
            cause.reason.as_str(),
            cause.message.as_str(),
            cause.field.as_str()
        ),
        (
            "NamespaceTerminating",
            "namespace doomed is being terminated",
            "metadata.namespace"
        )
    );

    let missing: Api<Pod> = Api::namespaced(client.clone(), "nowhere");
    let e = api_err(
        missing
            .create(&PostParams::default(), &pod("p", None))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", "namespaces \"nowhere\" not found")
    );

    // The kubelet finishes the pod; the namespace controller then finalizes the namespace.
    pods.delete("resident", &DeleteParams::default().grace_period(0))
        .await?;
    // The namespace controller's finalize deletes it in one write: DELETED, no MODIFIED.
    let (ty, o) = next_event::<Namespace, _>(&mut events).await;
    assert_eq!(ty, "DELETED");
    assert!(o.metadata.deletion_timestamp.is_some());
    assert_eq!(api_err(nss.get("doomed").await.unwrap_err()).code, 404);
    s.shutdown().await;
    Ok(())
}

/// `spec.finalizers` is what holds a namespace: the controller drops only `kubernetes`;
/// `PUT .../finalize` edits the list (names validated as the real server does) and removing
/// the last one deletes the namespace.
#[tokio::test]
async fn namespace_finalize_subresource() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": "kept"},
        "spec": {"finalizers": ["example.com/keep"]},
    }))?;
    let created = nss.create(&PostParams::default(), &ns).await?;
    let uid = created.uid().unwrap();
    nss.delete("kept", &DeleteParams::default()).await?;
    let held = wait_until(&nss, "kept", |n: Option<&Namespace>| {
        n.and_then(|n| n.spec.as_ref()?.finalizers.clone())
            == Some(vec!["example.com/keep".to_string()])
    })
    .await
    .expect("held by the other finalizer");
    assert_eq!(
        held.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Terminating")
    );

    // A finalizer name must be standard or qualified.
    let mut bad = held.clone();
    bad.spec.as_mut().unwrap().finalizers = Some(vec!["bogus".into()]);
    let e = api_err(
        nss.replace_subresource("finalize", "kept", &PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "Namespace \"kept\" is invalid: spec.finalizers[0]: Invalid value: \"bogus\": name is neither a standard finalizer name nor is it fully qualified"
    );

    let mut done = held.clone();
    done.spec.as_mut().unwrap().finalizers = Some(vec![]);
    nss.replace_subresource("finalize", "kept", &PostParams::default(), &done)
        .await?;
    wait_until(&nss, "kept", conditions::is_deleted(&uid)).await;
    s.shutdown().await;
    Ok(())
}

fn taints(n: &Node) -> Vec<(String, String)> {
    let mut t: Vec<(String, String)> = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect();
    t.sort();
    t
}

fn pair(k: &str, e: &str) -> (String, String) {
    (k.to_string(), e.to_string())
}

const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// Every created Node gets `not-ready:NoSchedule` (kept with the creator's taints, never
/// doubled); the lifecycle controller takes it off when Ready turns True and puts it back when
/// Ready turns False, leaving other taints alone.
#[tokio::test]
async fn node_not_ready_taint_follows_the_ready_condition() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let plain: Node = serde_json::from_value(json!({"metadata": {"name": "plain"}}))?;
    let created = nodes.create(&PostParams::default(), &plain).await?;
    assert_eq!(taints(&created), vec![pair(NOT_READY, "NoSchedule")]);

    let own: Node = serde_json::from_value(json!({
        "metadata": {"name": "own"},
        "spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]},
    }))?;
    let created = nodes.create(&PostParams::default(), &own).await?;
    assert_eq!(
        taints(&created),
        vec![
            pair("dedicated", "NoSchedule"),
            pair(NOT_READY, "NoSchedule")
        ]
    );
    // Same key, other effect: a different taint, so admission still adds NoSchedule.
    let other: Node = serde_json::from_value(json!({
        "metadata": {"name": "other"},
        "spec": {"taints": [{"key": NOT_READY, "effect": "NoExecute"}]},
    }))?;
    let created = nodes.create(&PostParams::default(), &other).await?;
    assert_eq!(
        taints(&created),
        vec![pair(NOT_READY, "NoExecute"), pair(NOT_READY, "NoSchedule")]
    );
    let already: Node = serde_json::from_value(json!({
        "metadata": {"name": "already"},
        "spec": {"taints": [{"key": NOT_READY, "effect": "NoSchedule"}]},
    }))?;
    let created = nodes.create(&PostParams::default(), &already).await?;
    assert_eq!(taints(&created), vec![pair(NOT_READY, "NoSchedule")]);

    // A grace far beyond the test: the controller never finds the node stale here.
    let _controller = NodeLifecycleController::start(client.clone(), Duration::from_secs(3600));
    let ready = |status: &str| {
        json!({"status": {"conditions": [{
            "type": "Ready", "status": status, "reason": "KubeletReady",
            "lastHeartbeatTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            "lastTransitionTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        }]}})
    };
    nodes
        .patch_status("own", &PatchParams::default(), &Patch::Merge(ready("True")))
        .await?;
    let n = wait_until(&nodes, "own", |n: Option<&Node>| {
        n.is_some_and(|n| !taints(n).contains(&pair(NOT_READY, "NoSchedule")))
    })
    .await
    .unwrap();
    assert_eq!(
        taints(&n),
        vec![pair("dedicated", "NoSchedule")],
        "only the condition taint goes"
    );

    nodes
        .patch_status(
            "own",
            &PatchParams::default(),
            &Patch::Merge(ready("False")),
        )
        .await?;
    let n = wait_until(&nodes, "own", |n: Option<&Node>| {
        n.is_some_and(|n| taints(n).contains(&pair(NOT_READY, "NoSchedule")))
    })
    .await
    .unwrap();
    assert_eq!(
        taints(&n),
        vec![
            pair("dedicated", "NoSchedule"),
            pair(NOT_READY, "NoExecute"),
            pair(NOT_READY, "NoSchedule"),
        ]
    );

    // A node that never reported keeps its admission taint.
    assert_eq!(
        taints(&nodes.get("plain").await?),
        vec![pair(NOT_READY, "NoSchedule")]
    );
    s.shutdown().await;
    Ok(())
}

/// Node status writes through `/status` (as the kubelet makes them) never touch taints.
#[tokio::test]
async fn node_status_writes_keep_taints() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n"}}))?;
    nodes.create(&PostParams::default(), &n).await?;
    let mut n = nodes.get("n").await?;
    n.spec.as_mut().unwrap().taints = None;
    n.status = Some(serde_json::from_value(json!({"phase": "Running"}))?);
    let after = nodes
        .replace_status("n", &PostParams::default(), &n)
        .await?;
    assert_eq!(taints(&after), vec![pair(NOT_READY, "NoSchedule")]);
    s.shutdown().await;
    Ok(())
}
