//! `core/v1` and `events.k8s.io/v1` Events are one store: what kube-rs's Recorder writes
//! through events.k8s.io/v1 is read as a core Event with the fields mapped, and the other way
//! round; each API's validation answers 422 as the real server does.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event as NewEvent;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kubesim::api::{ApiServer, ApiServerConfig};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn one_store_through_both_apis() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client = s.client();
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let new: Api<NewEvent> = Api::namespaced(client.clone(), "default");

    // A core watch sees what the Recorder writes through events.k8s.io/v1.
    let mut watch = std::pin::pin!(watcher(core.clone(), watcher::Config::default()));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "local-activator.dev/subsetter".into(),
            instance: Some("subsetter-0".into()),
        },
    );
    let regarding = ObjectReference {
        kind: Some("Pod".into()),
        name: Some("app-1".into()),
        namespace: Some("default".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    };
    recorder
        .publish(
            &Event {
                type_: EventType::Warning,
                reason: "NodeFull".into(),
                note: Some("no room on node-1".into()),
                action: "Schedule".into(),
                secondary: None,
            },
            &regarding,
        )
        .await?;
    let written = new.list(&Default::default()).await?.items;
    assert_eq!(written.len(), 1);
    let name = written[0].metadata.name.clone().unwrap();

    let seen = tokio::time::timeout(WAIT, async {
        while let Some(ev) = watch.next().await {
            if let Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e)) = ev {
                return Some(e);
            }
        }
        None
    })
    .await?
    .expect("the core watch saw the event");
    assert_eq!(seen.metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(seen.message.as_deref(), Some("no room on node-1"));
    assert_eq!(seen.involved_object.name.as_deref(), Some("app-1"));
    assert_eq!(
        seen.reporting_component.as_deref(),
        Some("local-activator.dev/subsetter")
    );
    assert_eq!(seen.reporting_instance.as_deref(), Some("subsetter-0"));
    assert_eq!(seen.action.as_deref(), Some("Schedule"));
    assert_eq!(seen.type_.as_deref(), Some("Warning"));
    assert_eq!(seen.metadata.uid, written[0].metadata.uid);
    assert_eq!(
        seen.metadata.resource_version,
        written[0].metadata.resource_version
    );

    // A core Event, as kubectl's old clients write it, read through events.k8s.io/v1.
    let old: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "legacy"},
        "involvedObject": {"kind": "Pod", "name": "app-2", "namespace": "default"},
        "reason": "Started", "message": "started", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-1"}, "count": 3,
    }))?;
    core.create(&PostParams::default(), &old).await?;
    let got = new.get("legacy").await?;
    assert_eq!(got.note.as_deref(), Some("started"));
    assert_eq!(got.regarding.unwrap().name.as_deref(), Some("app-2"));
    assert_eq!(got.deprecated_count, Some(3));
    assert_eq!(
        got.deprecated_source.unwrap().component.as_deref(),
        Some("kubelet")
    );

    // A patch through one API shows in the other; a delete through one removes both.
    new.patch(
        "legacy",
        &PatchParams::default(),
        &Patch::Merge(json!({"note": "restarted"})),
    )
    .await?;
    assert_eq!(
        core.get("legacy").await?.message.as_deref(),
        Some("restarted")
    );
    new.delete("legacy", &DeleteParams::default()).await?;
    assert_eq!(api_err(core.get("legacy").await.unwrap_err()).code, 404);
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn each_api_validates_as_the_real_server_does() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client = s.client();
    let new: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let bare: NewEvent = serde_json::from_value(json!({
        "metadata": {"name": "bare"},
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "R", "type": "Normal",
    }))?;
    let e = api_err(new.create(&PostParams::default(), &bare).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    let fields: Vec<String> = e
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert!(fields.contains(&"eventTime".to_string()), "{fields:?}");

    let missing: NewEvent = serde_json::from_value(json!({
        "metadata": {"name": "missing"},
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "eventTime": "2026-11-23T00:00:00.000000Z", "reason": "R", "type": "Normal",
    }))?;
    let e = api_err(
        new.create(&PostParams::default(), &missing)
            .await
            .unwrap_err(),
    );
    let fields: Vec<String> = e
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert_eq!(
        fields,
        vec!["reportingController", "reportingInstance", "action"]
    );

    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let elsewhere: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "elsewhere"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "other"},
        "reason": "R", "message": "m",
    }))?;
    let e = api_err(
        core.create(&PostParams::default(), &elsewhere)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(
        e.message,
        "Event \"elsewhere\" is invalid: involvedObject.namespace: Invalid value: \"other\": does not match event.namespace"
    );
    s.shutdown().await;
    Ok(())
}
