//! kube-rs against kubesim's API server: CRUD, patches, status, lists, errors, discovery.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use kube::{Client, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::{Value, json};

async fn server() -> (ApiServer, Client) {
    let s = ApiServer::start(ApiServerConfig::default())
        .await
        .expect("server starts");
    let c = s.client();
    (s, c)
}

fn pod(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "app:1", "ports": [{"containerPort": 8080}]}]}
    }))
    .unwrap()
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Raw request returning (status code, body JSON).
async fn raw(client: &Client, method: &str, path: &str, ctype: &str, body: Value) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ctype)
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

#[tokio::test]
async fn pod_create_get_list_replace_delete() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let created = pods
        .create(&PostParams::default(), &pod("p1", json!({"app": "web"})))
        .await?;
    assert_eq!(created.namespace().as_deref(), Some("default"));
    assert!(created.uid().is_some());
    assert_eq!(created.metadata.generation, None, "pods have no generation");
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    let ts = created.metadata.creation_timestamp.clone().unwrap();
    assert_eq!(
        ts.0.to_string().len(),
        20,
        "whole-second RFC 3339: {}",
        ts.0
    );

    let got = pods.get("p1").await?;
    assert_eq!(got.resource_version(), created.resource_version());

    let mut gn = pod("", json!({}));
    gn.metadata.name = None;
    gn.metadata.generate_name = Some("gen-".into());
    let g = pods.create(&PostParams::default(), &gn).await?;
    assert!(
        g.name_any().starts_with("gen-") && g.name_any().len() == 9,
        "{}",
        g.name_any()
    );

    let list = pods.list(&ListParams::default()).await?;
    assert_eq!(list.items.len(), 2);
    let list_rv: u64 = list.metadata.resource_version.clone().unwrap().parse()?;
    assert!(list_rv >= g.resource_version().unwrap().parse::<u64>()?);

    // Lists of built-ins carry no kind/apiVersion on items.
    let (code, raw_list) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/pods",
        "application/json",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(raw_list["kind"], "PodList");
    assert!(raw_list["items"][0].get("kind").is_none());
    // Cluster-wide list of a namespaced kind.
    let all: Api<Pod> = Api::all(client.clone());
    assert_eq!(all.list(&ListParams::default()).await?.items.len(), 2);

    // Replace: labels change, resourceVersion increases.
    let mut p = got.clone();
    p.labels_mut().insert("tier".into(), "x".into());
    let replaced = pods.replace("p1", &PostParams::default(), &p).await?;
    assert!(
        replaced.resource_version().unwrap().parse::<u64>()?
            > got.resource_version().unwrap().parse::<u64>()?
    );
    // A stale resourceVersion conflicts.
    let e = api_err(
        pods.replace("p1", &PostParams::default(), &p)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    assert_eq!(e.reason, "Conflict");
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on pods \"p1\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // No-op replace keeps the resourceVersion.
    let same = pods
        .replace("p1", &PostParams::default(), &replaced)
        .await?;
    assert_eq!(same.resource_version(), replaced.resource_version());
    // Pod spec is immutable apart from images etc.
    let mut bad = replaced.clone();
    bad.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    let e = api_err(
        pods.replace("p1", &PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));

    // Unbound pod deletes at once and the answer is the pod.
    let del = pods.delete("p1", &DeleteParams::default()).await?;
    assert!(del.is_left(), "pod delete returns the object");
    let e = api_err(pods.get("p1").await.unwrap_err());
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", "pods \"p1\" not found")
    );
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn bound_pod_waits_for_kubelet_and_finalizers_hold_objects() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let mut p = pod("bound", json!({}));
    p.spec.as_mut().unwrap().node_name = Some("node-1".into());
    pods.create(&PostParams::default(), &p).await?;
    let d = pods.delete("bound", &DeleteParams::default()).await?;
    let marked = d.left().expect("object returned");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    assert!(
        pods.get("bound").await.is_ok(),
        "bound pod stays until its kubelet removes it"
    );
    pods.delete(
        "bound",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(api_err(pods.get("bound").await.unwrap_err()).code, 404);

    // Finalizers: a lease with one is only marked; removing it completes the deletion.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let l: Lease = serde_json::from_value(
        json!({"metadata": {"name": "l1", "finalizers": ["x/y"]}, "spec": {"holderIdentity": "a"}}),
    )?;
    leases.create(&PostParams::default(), &l).await?;
    let d = leases.delete("l1", &DeleteParams::default()).await?;
    assert!(d.left().unwrap().metadata.deletion_timestamp.is_some());
    leases
        .patch(
            "l1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    assert_eq!(api_err(leases.get("l1").await.unwrap_err()).code, 404);
    // Leases answer DELETE with a success Status.
    let l2: Lease = serde_json::from_value(json!({"metadata": {"name": "l2"}, "spec": {}}))?;
    leases.create(&PostParams::default(), &l2).await?;
    let st = leases
        .delete("l2", &DeleteParams::default())
        .await?
        .right()
        .expect("a Status");
    assert_eq!(
        st.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    assert_eq!(st.details.as_ref().unwrap().kind, "leases");
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn errors_have_the_real_status_format() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("dup", json!({})))
        .await?;
    let (code, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        serde_json::to_value(pod("dup", json!({})))?,
    )
    .await;
    assert_eq!(code, 409);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "pods \"dup\" already exists", "reason": "AlreadyExists",
               "details": {"name": "dup", "kind": "pods"}, "code": 409})
    );
    let (code, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/nope/pods",
        "application/json",
        serde_json::to_value(pod("x", json!({})))?,
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(body["message"], "namespaces \"nope\" not found");
    assert_eq!(
        body["details"],
        json!({"name": "nope", "kind": "namespaces"})
    );
    let (code, body) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/pods?fieldSelector=spec.foo%3Dx",
        "",
        Value::Null,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(body["reason"], "BadRequest");
    assert_eq!(body["message"], "field label not supported: spec.foo");
    let (code, body) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/pods/missing",
        "",
        Value::Null,
    )
    .await;
    assert_eq!(
        (code, body["details"]["kind"].as_str()),
        (404, Some("pods"))
    );
    let (code, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        json!({"metadata": {"name": "inv"}, "spec": {"containers": [{"name": "a"}]}}),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["message"],
        "Pod \"inv\" is invalid: spec.containers[0].image: Required value"
    );
    assert_eq!(
        body["details"]["causes"][0],
        json!({"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers[0].image"})
    );
    let (code, body) = raw(
        &client,
        "PATCH",
        "/api/v1/namespaces/default/pods/dup",
        "application/apply-patch+yaml",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dup"}}),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (422, Some("Invalid")),
        "apply needs a fieldManager: {body}"
    );
    let (code, body) = raw(
        &client,
        "PATCH",
        "/api/v1/namespaces/default/pods/dup",
        "text/plain",
        json!({}),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn every_patch_type_and_status() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pods.create(&PostParams::default(), &pod("pp", json!({"a": "1"})))
        .await?;
    let pp = PatchParams::default();
    let p = pods
        .patch(
            "pp",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"b": "2"}}})),
        )
        .await?;
    assert_eq!(p.labels().get("b").map(String::as_str), Some("2"));
    let jp =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/labels/c", "value": "3"}]))?;
    let p = pods.patch("pp", &pp, &Patch::<()>::Json(jp)).await?;
    assert_eq!(p.labels().len(), 3);
    // Strategic merge: containers merge by name, so the existing container keeps its image.
    let p = pods
        .patch(
            "pp",
            &pp,
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "app", "image": "app:2"}]}})),
        )
        .await?;
    let cs = &p.spec.as_ref().unwrap().containers;
    assert_eq!((cs.len(), cs[0].image.as_deref()), (1, Some("app:2")));
    assert_eq!(
        cs[0].ports.as_ref().map(|p| p.len()),
        Some(1),
        "strategic merge kept the ports"
    );

    // Status: main-resource writes ignore status; /status writes ignore the rest.
    let p = pods
        .patch(
            "pp",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await?;
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    let p = pods
        .patch_status("pp", &pp, &Patch::Merge(json!({"metadata": {"labels": {"z": "1"}}, "status": {"phase": "Running", "podIP": "127.1.0.2"}})))
        .await?;
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    assert!(!p.labels().contains_key("z"));
    let mut cur = pods.get("pp").await?;
    cur.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let r = pods
        .replace_status("pp", &PostParams::default(), &cur)
        .await?;
    assert_eq!(r.status.unwrap().phase.as_deref(), Some("Succeeded"));

    // Server-side apply: a conflict between managers, then force.
    let nodes: Api<Node> = Api::all(client.clone());
    let n1 = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a"}}});
    let applied = nodes
        .patch("n1", &PatchParams::apply("mgr-a"), &Patch::Apply(&n1))
        .await?;
    assert_eq!(applied.labels().get("zone").map(String::as_str), Some("a"));
    let n2 = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "b"}}});
    let e = api_err(
        nodes
            .patch("n1", &PatchParams::apply("mgr-b"), &Patch::Apply(&n2))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(e.message.contains("mgr-a"), "{}", e.message);
    let forced = nodes
        .patch(
            "n1",
            &PatchParams::apply("mgr-b").force(),
            &Patch::Apply(&n2),
        )
        .await?;
    assert_eq!(forced.labels().get("zone").map(String::as_str), Some("b"));
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn list_pagination_and_selectors() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    for i in 0..7 {
        let mut p = pod(
            &format!("p{i}"),
            json!({"app": if i % 2 == 0 { "even" } else { "odd" }}),
        );
        if i < 3 {
            p.spec.as_mut().unwrap().node_name = Some("n1".into());
        }
        pods.create(&PostParams::default(), &p).await?;
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = pods.list(&lp).await?;
        pages += 1;
        names.extend(page.items.iter().map(|p| p.name_any()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, (0..7).map(|i| format!("p{i}")).collect::<Vec<_>>());
    let even = pods.list(&ListParams::default().labels("app=even")).await?;
    assert_eq!(even.items.len(), 4);
    let notin = pods
        .list(&ListParams::default().labels("app notin (even)"))
        .await?;
    assert_eq!(notin.items.len(), 3);
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await?;
    assert_eq!(on_n1.items.len(), 3);
    let both = pods
        .list(
            &ListParams::default()
                .fields("spec.nodeName=n1")
                .labels("app=odd"),
        )
        .await?;
    assert_eq!(
        both.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        ["p1"]
    );
    let by_name = pods
        .list(&ListParams::default().fields("metadata.name=p5"))
        .await?;
    assert_eq!(by_name.items.len(), 1);

    // Delete collection with a selector.
    let deleted = pods
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=odd"),
        )
        .await?;
    assert_eq!(deleted.left().map(|l| l.items.len()), Some(3));
    // The ones bound to n1 wait for their kubelet; the odd unbound ones are gone.
    let left = pods.list(&ListParams::default()).await?;
    assert_eq!(left.items.len(), 5);
    let stats = s.stats();
    assert_eq!(stats.count("deletecollection", "pods"), 1);
    assert!(stats.count("list", "pods") >= 9);
    assert_eq!(stats.count("create", "pods"), 7);
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn namespaces_discovery_kubeconfig_and_metrics() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&n.to_string()), "{names:?}");
    }
    let d = Discovery::new(client.clone()).run().await?;
    let (ar, caps) = d
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.plural == "pods")
        .expect("pods discovered");
    assert_eq!((ar.kind.as_str(), caps.scope), ("Pod", Scope::Namespaced));
    assert!(
        caps.subresources
            .iter()
            .any(|(s, _)| s.plural == "pods/status" || s.plural == "status"),
        "{:?}",
        caps.subresources
    );
    let agg = Discovery::new(client.clone()).run_aggregated().await?;
    assert!(agg.groups().any(|g| g.name() == "coordination.k8s.io"));
    let v = client.apiserver_version().await?;
    assert_eq!(v.major, "1");

    let dir = std::env::temp_dir().join(format!("kubesim-kc-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("kubeconfig");
    s.write_kubeconfig(&path)?;
    let kc = kube::config::Kubeconfig::read_from(&path)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let c2 = Client::try_from(cfg)?;
    let pods: Api<Pod> = Api::default_namespaced(c2);
    pods.create(&PostParams::default(), &pod("via-kubeconfig", json!({})))
        .await?;

    let req = http::Request::get("/metrics").body(vec![])?;
    let text = client.request_text(req).await?;
    assert!(
        text.contains(
            "kubesim_apiserver_requests_total{verb=\"create\",group=\"\",resource=\"pods\"} 1"
        ),
        "{text}"
    );

    // Namespace deletion: Terminating, then its contents and the namespace go.
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "tmp"}}))?;
    nss.create(&PostParams::default(), &ns).await?;
    let tp: Api<Pod> = Api::namespaced(client.clone(), "tmp");
    tp.create(&PostParams::default(), &pod("x", json!({})))
        .await?;
    let d = nss
        .delete("tmp", &DeleteParams::default())
        .await?
        .left()
        .unwrap();
    assert_eq!(
        d.status.as_ref().unwrap().phase.as_deref(),
        Some("Terminating")
    );
    kube::runtime::wait::await_condition(
        nss.clone(),
        "tmp",
        kube::runtime::conditions::is_deleted(&d.uid().unwrap()),
    )
    .await?;
    assert_eq!(tp.list(&ListParams::default()).await?.items.len(), 0);
    s.shutdown().await;
    Ok(())
}

/// Pod DELETE as the pod strategy decides: the period is gracePeriodSeconds if given, else the
/// pod's terminationGracePeriodSeconds; 0 for an unbound or terminated pod; 0 removes at once
/// and the answer still carries deletionTimestamp and grace 0; a later DELETE only shortens.
#[tokio::test]
async fn pod_delete_grace_follows_the_pod_strategy() -> anyhow::Result<()> {
    let (s, client) = server().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());

    pods.create(&PostParams::default(), &pod("unbound", json!({})))
        .await?;
    let d = pods
        .delete("unbound", &DeleteParams::default())
        .await?
        .left()
        .expect("pods answer with the object");
    assert!(d.metadata.deletion_timestamp.is_some());
    assert_eq!(d.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(api_err(pods.get("unbound").await.unwrap_err()).code, 404);

    let mut p = pod("bound", json!({}));
    let spec = p.spec.as_mut().unwrap();
    spec.node_name = Some("node-1".into());
    spec.termination_grace_period_seconds = Some(7);
    pods.create(&PostParams::default(), &p).await?;
    let d = pods.delete("bound", &DeleteParams::default()).await?;
    assert_eq!(
        d.left().unwrap().metadata.deletion_grace_period_seconds,
        Some(7)
    );
    let d = pods
        .delete("bound", &DeleteParams::default().grace_period(20))
        .await?;
    assert_eq!(
        d.left().unwrap().metadata.deletion_grace_period_seconds,
        Some(7),
        "a later DELETE may only shorten the period"
    );
    assert!(pods.get("bound").await.is_ok(), "waits for its kubelet");
    let d = pods
        .delete("bound", &DeleteParams::default().grace_period(0))
        .await?
        .left()
        .expect("the object");
    assert_eq!(d.metadata.deletion_grace_period_seconds, Some(0));
    assert!(d.metadata.deletion_timestamp.is_some());
    assert_eq!(api_err(pods.get("bound").await.unwrap_err()).code, 404);

    // A bound pod that has terminated goes at once.
    let mut p = pod("done", json!({}));
    p.spec.as_mut().unwrap().node_name = Some("node-1".into());
    pods.create(&PostParams::default(), &p).await?;
    pods.patch_status(
        "done",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await?;
    let d = pods.delete("done", &DeleteParams::default()).await?;
    assert_eq!(
        d.left().unwrap().metadata.deletion_grace_period_seconds,
        Some(0)
    );
    assert_eq!(api_err(pods.get("done").await.unwrap_err()).code, 404);
    s.shutdown().await;
    Ok(())
}

/// Deleting a namespace: Terminating with the `kubernetes` finalizer until its objects are
/// gone; creating in it meanwhile is 403 with a NamespaceTerminating cause.
#[tokio::test]
async fn terminating_namespace_refuses_new_objects_then_goes() -> anyhow::Result<()> {
    use kube::runtime::wait::{await_condition, conditions};
    let (s, client) = server().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "going"}}))?;
    let created = nss.create(&PostParams::default(), &ns).await?;
    assert_eq!(
        created.spec.and_then(|s| s.finalizers),
        Some(vec!["kubernetes".to_string()])
    );
    // An object whose finalizer holds the namespace in Terminating.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "going");
    let l: Lease = serde_json::from_value(
        json!({"metadata": {"name": "held", "finalizers": ["x/y"]}, "spec": {}}),
    )?;
    leases.create(&PostParams::default(), &l).await?;
    let d = nss.delete("going", &DeleteParams::default()).await?;
    let terminating = d
        .left()
        .expect("a namespace DELETE answers with the object");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "going");
    let e = api_err(
        pods.create(&PostParams::default(), &pod("late", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        "pods \"late\" is forbidden: unable to create new content in namespace going because it is being terminated"
    );
    let cause = &e.details.expect("details").causes[0];
    assert_eq!(
        (cause.reason.as_str(), cause.field.as_str()),
        ("NamespaceTerminating", "metadata.namespace")
    );

    // Once the last object goes, so does the namespace.
    leases
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    let uid = terminating.metadata.uid.unwrap();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        await_condition(nss.clone(), "going", conditions::is_deleted(&uid)),
    )
    .await??;
    s.shutdown().await;
    Ok(())
}

/// ConfigMaps (the subsetter's configuration may live in one): the usual semantics, and
/// `immutable: true` refusing changes as the real validation does.
#[tokio::test]
async fn configmaps_are_served_and_immutable_ones_refuse_changes() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::wait::await_condition;
    let (s, client) = server().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "cfg", "labels": {"app": "subsetter"}},
        "data": {"policy": "random"},
        "binaryData": {"blob": "AAE="},
    }))?;
    cms.create(&PostParams::default(), &cm).await?;
    let listed = cms
        .list(&ListParams::default().labels("app=subsetter"))
        .await?;
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0].binary_data.as_ref().unwrap()["blob"].0,
        vec![0u8, 1]
    );
    assert!(
        cms.list(&ListParams::default().labels("app=other"))
            .await?
            .items
            .is_empty()
    );

    // A change is seen by a watch-based wait.
    let seen = await_condition(cms.clone(), "cfg", |c: Option<&ConfigMap>| {
        c.and_then(|c| c.data.as_ref()?.get("policy").cloned())
            .as_deref()
            == Some("least-loaded")
    });
    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"policy": "least-loaded"}})),
    )
    .await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), seen).await??;

    let frozen: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "frozen"}, "data": {"k": "v"}, "immutable": true,
    }))?;
    cms.create(&PostParams::default(), &frozen).await?;
    let e = api_err(
        cms.patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "ConfigMap \"frozen\" is invalid: data: Forbidden: field is immutable when `immutable` is set"
    );
    // Labels may still change.
    cms.patch(
        "frozen",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await?;
    s.shutdown().await;
    Ok(())
}

/// The namespace controller removes only its own `kubernetes` finalizer; another one keeps
/// the empty namespace Terminating until its owner drops it through `/finalize`.
#[tokio::test]
async fn namespace_waits_for_every_spec_finalizer() -> anyhow::Result<()> {
    use kube::runtime::wait::{await_condition, conditions};
    let (s, client) = server().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": "held"},
        "spec": {"finalizers": ["kubernetes", "example.com/cleanup"]},
    }))?;
    nss.create(&PostParams::default(), &ns).await?;
    let uid = nss.get("held").await?.metadata.uid.unwrap();
    nss.delete("held", &DeleteParams::default()).await?;
    let only_ours = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        await_condition(nss.clone(), "held", |n: Option<&Namespace>| {
            n.and_then(|n| n.spec.as_ref()?.finalizers.clone())
                == Some(vec!["example.com/cleanup".to_string()])
        }),
    )
    .await??
    .expect("still there");
    assert_eq!(
        only_ours.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    let mut done = nss.get("held").await?;
    done.spec.as_mut().unwrap().finalizers = Some(vec![]);
    nss.replace_subresource("finalize", "held", &PostParams::default(), &done)
        .await?;
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        await_condition(nss.clone(), "held", conditions::is_deleted(&uid)),
    )
    .await??;
    s.shutdown().await;
    Ok(())
}

/// Endpoints are served (in-cluster components read `default/kubernetes`, the API server's
/// own address, at start: crds::api_route), and what is stored is what the reader finds.
#[tokio::test]
async fn endpoints_are_served_and_the_api_servers_address_reads_back() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Endpoints;
    let (_s, client) = server().await;
    assert!(crds::api_route::read_addresses(&client).await?.is_empty());
    let eps: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    let ep: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "kubernetes"},
        "subsets": [{"addresses": [{"ip": "127.0.0.9"}], "ports": [{"name": "https", "port": 6443}]}],
    }))?;
    eps.create(&PostParams::default(), &ep).await?;
    assert_eq!(
        crds::api_route::read_addresses(&client).await?,
        vec!["127.0.0.9:6443".parse::<std::net::SocketAddr>()?]
    );
    Ok(())
}
