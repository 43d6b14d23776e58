//! The CRD flow against kubesim: applying the generated CRD YAML, schema defaults, pruning and
//! validation (422s naming the field), custom resource semantics, a kube-runtime Controller,
//! and garbage collection of owned pods.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

async fn with_crds() -> anyhow::Result<(ApiServer, Client)> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client = s.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let mut names = Vec::new();
    for f in std::fs::read_dir(&dir)? {
        let path = f?.path();
        // kustomize's file lists the CRDs; it is not one.
        if path.extension().and_then(|e| e.to_str()) != Some("yaml")
            || path.ends_with("kustomization.yaml")
        {
            continue;
        }
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(&path)?)?;
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply("kubesim-test").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        names.push(name);
    }
    assert_eq!(
        names.len(),
        3,
        "every generated CRD applied (Revision, ActivationEndpoints, Route)"
    );
    for n in names {
        tokio::time::timeout(
            WAIT,
            await_condition(crds.clone(), &n, conditions::is_crd_established()),
        )
        .await??;
    }
    Ok((s, client))
}

fn revisions(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<crds::Revision>(&());
    Api::namespaced_with(client.clone(), "default", &ar)
}

fn revision(name: &str, spec: Value) -> DynamicObject {
    let mut full =
        json!({"template": {"spec": {"containers": [{"name": "app", "image": "app:1"}]}}});
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    serde_json::from_value(json!({
        "apiVersion": "local-activator.dev/v1alpha1", "kind": "Revision",
        "metadata": {"name": name}, "spec": full
    }))
    .unwrap()
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn revisions_are_defaulted_and_validated() -> anyhow::Result<()> {
    let (s, client) = with_crds().await?;
    let revs = revisions(&client);
    let r = revs
        .create(
            &PostParams::default(),
            &revision("ok", json!({"hosts": ["a.example"]})),
        )
        .await?;
    assert_eq!(r.data["spec"]["port"], 8080, "schema default");
    assert_eq!(r.data["spec"]["targetBurstCapacity"], 200);
    assert_eq!(r.metadata.generation, Some(1));
    // The typed client reads it back.
    let typed: Api<crds::Revision> = Api::default_namespaced(client.clone());
    assert_eq!(typed.get("ok").await?.spec.hosts, ["a.example"]);

    let cases: [(&str, Value, &str); 3] = [
        (
            "scale",
            json!({"minScale": 3, "maxScale": 2}),
            "maxScale must be >= minScale when maxScale > 0",
        ),
        ("negative", json!({"minScale": -1}), "spec.minScale"),
        ("port", json!({"port": 70000}), "spec.port"),
    ];
    for (name, spec, needle) in cases {
        let e = api_err(
            revs.create(&PostParams::default(), &revision(name, spec))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (e.code, e.reason.as_str()),
            (422, "Invalid"),
            "{name}: {e:?}"
        );
        assert!(
            e.message.starts_with(&format!(
                "Revision.local-activator.dev \"{name}\" is invalid: "
            )),
            "{}",
            e.message
        );
        assert!(e.message.contains(needle), "{name}: {}", e.message);
    }
    let long = "a".repeat(64);
    let e = api_err(
        revs.create(&PostParams::default(), &revision(&long, json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("metadata.name must be no more than 63 characters"),
        "{}",
        e.message
    );

    // Custom resources: list items keep kind/apiVersion; no strategic merge (415).
    let req = http::Request::get("/apis/local-activator.dev/v1alpha1/namespaces/default/revisions")
        .body(vec![])?;
    let list: Value = serde_json::from_str(&client.request_text(req).await?)?;
    assert_eq!(list["items"][0]["kind"], "Revision");
    let e = api_err(
        revs.patch(
            "ok",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"port": 9}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 415);

    // Generation follows spec only; status is a subresource.
    let r = revs
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"l": "1"}}})),
        )
        .await?;
    assert_eq!(r.metadata.generation, Some(1));
    let r = revs
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minScale": 1}, "status": {"observedGeneration": 9}})),
        )
        .await?;
    assert_eq!(r.metadata.generation, Some(2));
    assert!(
        r.data.get("status").is_none(),
        "main-resource patch ignores status"
    );
    let r = revs
        .patch_status(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minScale": 5}, "status": {"observedGeneration": 2}})),
        )
        .await?;
    assert_eq!(r.metadata.generation, Some(2));
    assert_eq!(r.data["spec"]["minScale"], 1, "status patch ignores spec");
    assert_eq!(r.data["status"]["observedGeneration"], 2);
    // A CR PUT without resourceVersion is invalid.
    let mut no_rv = r.clone();
    no_rv.metadata.resource_version = None;
    let e = api_err(
        revs.replace("ok", &PostParams::default(), &no_rv)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    let st = revs
        .delete("ok", &DeleteParams::default())
        .await?
        .right()
        .expect("a Status");
    assert_eq!(st.details.unwrap().kind, "revisions");
    s.shutdown().await;
    Ok(())
}

async fn raw(client: &Client, path: &str, body: Value) -> (u16, Vec<String>, Value) {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    use http_body_util::BodyExt;
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, warnings, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn unknown_fields_are_pruned_or_refused() -> anyhow::Result<()> {
    let (s, client) = with_crds().await?;
    let path = "/apis/local-activator.dev/v1alpha1/namespaces/default/revisions";
    let mut body = serde_json::to_value(revision("pr", json!({})))?;
    body["spec"]["foo"] = json!(1);
    let (code, warnings, obj) = raw(&client, path, body.clone()).await;
    assert_eq!(code, 201);
    assert!(obj["spec"].get("foo").is_none(), "pruned");
    assert_eq!(warnings, ["299 - \"unknown field \\\"spec.foo\\\"\""]);
    body["metadata"]["name"] = json!("strict");
    let (code, _, st) = raw(&client, &format!("{path}?fieldValidation=Strict"), body).await;
    assert_eq!(code, 400);
    assert_eq!(st["reason"], "BadRequest");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"spec.foo\""),
        "{st}"
    );
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn controller_reconciles_revisions() -> anyhow::Result<()> {
    let (s, client) = with_crds().await?;
    let typed: Api<crds::Revision> = Api::default_namespaced(client.clone());
    async fn reconcile(
        r: Arc<crds::Revision>,
        api: Arc<Api<crds::Revision>>,
    ) -> Result<Action, kube::Error> {
        let status = json!({"status": {"observedGeneration": r.metadata.generation}});
        api.patch_status(
            &r.name_any(),
            &PatchParams::default(),
            &Patch::Merge(status),
        )
        .await?;
        Ok(Action::await_change())
    }
    fn on_error(_: Arc<crds::Revision>, _: &kube::Error, _: Arc<Api<crds::Revision>>) -> Action {
        Action::requeue(Duration::from_millis(100))
    }
    let ctl = Controller::new(typed.clone(), watcher::Config::default())
        .run(reconcile, on_error, Arc::new(typed.clone()))
        .for_each(|_| async {});
    let ctl = tokio::spawn(ctl);
    revisions(&client)
        .create(&PostParams::default(), &revision("ctl", json!({})))
        .await?;
    let done = |r: Option<&crds::Revision>| {
        r.and_then(|r| r.status.as_ref())
            .and_then(|s| s.observed_generation)
            == Some(1)
    };
    tokio::time::timeout(WAIT, await_condition(typed.clone(), "ctl", done)).await??;
    typed
        .patch(
            "ctl",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"maxScale": 4}})),
        )
        .await?;
    let done2 = |r: Option<&crds::Revision>| {
        r.and_then(|r| r.status.as_ref())
            .and_then(|s| s.observed_generation)
            == Some(2)
    };
    tokio::time::timeout(WAIT, await_condition(typed.clone(), "ctl", done2)).await??;
    ctl.abort();
    s.shutdown().await;
    Ok(())
}

fn owned_pod(name: &str, owner: &DynamicObject) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "local-activator.dev/v1alpha1", "kind": "Revision", "name": owner.name_any(),
            "uid": owner.uid().unwrap(), "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn garbage_collection_of_owned_pods() -> anyhow::Result<()> {
    let (s, client) = with_crds().await?;
    let revs = revisions(&client);
    let pods: Api<Pod> = Api::default_namespaced(client.clone());

    // Background: deleting the Revision removes its pod.
    let r = revs
        .create(&PostParams::default(), &revision("gc", json!({})))
        .await?;
    let p = pods
        .create(&PostParams::default(), &owned_pod("gc-pod", &r))
        .await?;
    revs.delete("gc", &DeleteParams::default()).await?;
    tokio::time::timeout(
        WAIT,
        await_condition(
            pods.clone(),
            "gc-pod",
            conditions::is_deleted(&p.uid().unwrap()),
        ),
    )
    .await??;

    // Foreground: the owner waits (foregroundDeletion finalizer) until its dependents are gone.
    let r = revs
        .create(&PostParams::default(), &revision("fg", json!({})))
        .await?;
    let p = pods
        .create(&PostParams::default(), &owned_pod("fg-pod", &r))
        .await?;
    let marked = revs
        .delete("fg", &DeleteParams::foreground())
        .await?
        .left()
        .expect("owner still present");
    assert!(
        marked
            .finalizers()
            .iter()
            .any(|f| f == "foregroundDeletion")
    );
    assert!(marked.metadata.deletion_timestamp.is_some());
    tokio::time::timeout(
        WAIT,
        await_condition(
            pods.clone(),
            "fg-pod",
            conditions::is_deleted(&p.uid().unwrap()),
        ),
    )
    .await??;
    tokio::time::timeout(
        WAIT,
        await_condition(
            revs.clone(),
            "fg",
            conditions::is_deleted(&r.uid().unwrap()),
        ),
    )
    .await??;

    // Orphan: the pod stays, without its ownerReference.
    let r = revs
        .create(&PostParams::default(), &revision("or", json!({})))
        .await?;
    pods.create(&PostParams::default(), &owned_pod("or-pod", &r))
        .await?;
    revs.delete("or", &DeleteParams::orphan()).await?;
    let p = pods.get("or-pod").await?;
    assert!(p.owner_references().is_empty());
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn deleting_a_crd_unregisters_it() -> anyhow::Result<()> {
    let (s, client) = with_crds().await?;
    let ar = ApiResource::erase::<crds::ActivationEndpoints>(&());
    let aes: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let ae: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "local-activator.dev/v1alpha1", "kind": "ActivationEndpoints", "metadata": {"name": "x"}, "spec": {}
    }))?;
    aes.create(&PostParams::default(), &ae).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = format!(
        "{}.local-activator.dev",
        crds::ActivationEndpoints::plural(&())
    );
    let uid = crds.get(&name).await?.uid().unwrap();
    crds.delete(&name, &DeleteParams::default()).await?;
    tokio::time::timeout(
        WAIT,
        await_condition(crds.clone(), &name, conditions::is_deleted(&uid)),
    )
    .await??;
    let e = api_err(aes.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 404);
    // The other CRD is still served.
    assert!(
        revisions(&client)
            .list(&ListParams::default())
            .await
            .is_ok()
    );
    s.shutdown().await;
    Ok(())
}
