//! `core/v1` and `events.k8s.io/v1` Events are one store: what kube-rs's Recorder writes
//! through events.k8s.io/v1 is read as a core Event with the fields mapped, and the other way
//! round; each API's validation answers 422 as the real server does.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event as NewEvent;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
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

    // A patch through one API shows in the other (core/v1: events.k8s.io/v1 keeps the note
    // immutable); a delete through one removes both.
    core.patch(
        "legacy",
        &PatchParams::default(),
        &Patch::Merge(json!({"message": "restarted"})),
    )
    .await?;
    assert_eq!(new.get("legacy").await?.note.as_deref(), Some("restarted"));
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
    // an empty controller is also reported as not a qualified name, as IsQualifiedName does
    assert_eq!(
        fields,
        vec![
            "reportingController",
            "reportingController",
            "reportingController",
            "reportingInstance",
            "action"
        ]
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

/// Waits for the next watch event of `name` (any type), as (type, object).
async fn next_about<K>(
    watch: &mut (impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Unpin),
    name: &str,
) -> (&'static str, K)
where
    K: kube::Resource,
{
    tokio::time::timeout(WAIT, async {
        while let Some(ev) = watch.next().await {
            let (ty, obj) = match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => ("APPLY", o),
                Ok(watcher::Event::Delete(o)) => ("DELETE", o),
                _ => continue,
            };
            if obj.meta().name.as_deref() == Some(name) {
                return (ty, obj);
            }
        }
        panic!("the watch ended")
    })
    .await
    .expect("a watch event in time")
}

#[tokio::test]
async fn recorder_series_and_core_writes_seen_through_the_other_api() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client = s.client();
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let new: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let mut core_watch = std::pin::pin!(watcher(core.clone(), watcher::Config::default()));
    let mut new_watch = std::pin::pin!(watcher(new.clone(), watcher::Config::default()));

    // The Recorder's second identical event is a merge patch with a series (events.k8s.io
    // update validation lets the series change); core readers see it as a series too.
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "local-activator.dev/activator".into(),
            instance: Some("node-1".into()),
        },
    );
    let regarding = ObjectReference {
        kind: Some("Node".into()),
        name: Some("node-1".into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: "Ready".into(),
        note: Some("activator ready".into()),
        action: "Start".into(),
        secondary: None,
    };
    recorder.publish(&ev, &regarding).await?;
    recorder.publish(&ev, &regarding).await?;
    let name = new.list(&ListParams::default()).await?.items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let got = core.get(&name).await?;
    let series = got.series.expect("a series");
    assert_eq!(series.count, Some(2));
    assert!(series.last_observed_time.is_some());
    assert_eq!(got.reason.as_deref(), Some("Ready"));
    assert!(got.event_time.is_some());
    loop {
        let (ty, seen) = next_about(&mut core_watch, &name).await;
        assert_eq!(ty, "APPLY");
        if seen.series.is_some() {
            break;
        }
    }

    // A core Event, written and then changed through core/v1: an events.k8s.io watcher sees
    // it created, modified and deleted with the fields mapped.
    let legacy: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "legacy"},
        "involvedObject": {"kind": "Pod", "name": "app-2", "namespace": "default", "uid": "u-2"},
        "reason": "Pulled", "message": "pulled", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-2"}, "count": 1,
        "firstTimestamp": "2026-11-23T00:00:00Z", "lastTimestamp": "2026-11-23T00:00:00Z",
    }))?;
    core.create(&PostParams::default(), &legacy).await?;
    let (ty, seen) = next_about(&mut new_watch, "legacy").await;
    assert_eq!(ty, "APPLY");
    assert_eq!(seen.note.as_deref(), Some("pulled"));
    assert_eq!(seen.deprecated_count, Some(1));
    assert!(seen.deprecated_first_timestamp.is_some());
    assert_eq!(seen.regarding.as_ref().unwrap().uid.as_deref(), Some("u-2"));
    // core/v1 updates keep only the legacy rules: the message and count may change
    core.patch(
        "legacy",
        &PatchParams::default(),
        &Patch::Merge(json!({"message": "pulled again", "count": 2})),
    )
    .await?;
    let (ty, seen) = next_about(&mut new_watch, "legacy").await;
    assert_eq!(ty, "APPLY");
    assert_eq!(seen.note.as_deref(), Some("pulled again"));
    assert_eq!(seen.deprecated_count, Some(2));
    assert_eq!(
        seen.metadata.resource_version,
        core.get("legacy").await?.metadata.resource_version
    );
    core.delete("legacy", &DeleteParams::default()).await?;
    let (ty, _) = next_about(&mut new_watch, "legacy").await;
    assert_eq!(ty, "DELETE");
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn events_api_updates_may_change_only_the_series() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client = s.client();
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let new: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let ev: NewEvent = serde_json::from_value(json!({
        "metadata": {"name": "e"},
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "eventTime": "2026-11-23T00:00:00.000000Z", "reason": "R", "type": "Normal",
        "note": "first", "action": "A",
        "reportingController": "local-activator.dev/c", "reportingInstance": "i",
    }))?;
    new.create(&PostParams::default(), &ev).await?;
    let e = api_err(
        new.patch(
            "e",
            &PatchParams::default(),
            &Patch::Merge(json!({"note": "second"})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "Event.events.k8s.io \"e\" is invalid: message: Invalid value: \"second\": field is immutable"
    );
    let e = api_err(
        new.patch(
            "e",
            &PatchParams::default(),
            &Patch::Merge(json!({"series": {"count": 1}})),
        )
        .await
        .unwrap_err(),
    );
    let causes: Vec<(String, String)> = e
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| (c.field, c.reason))
        .collect();
    assert_eq!(
        causes,
        vec![
            ("series.count".to_string(), "FieldValueInvalid".to_string()),
            (
                "series.lastObservedTime".to_string(),
                "FieldValueRequired".to_string()
            ),
        ]
    );
    // The same change through core/v1 is allowed (legacy rules only).
    core.patch(
        "e",
        &PatchParams::default(),
        &Patch::Merge(json!({"message": "second"})),
    )
    .await?;
    assert_eq!(new.get("e").await?.note.as_deref(), Some("second"));
    s.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn field_selectors_of_both_apis() -> anyhow::Result<()> {
    let s = ApiServer::start(ApiServerConfig::default()).await?;
    let client = s.client();
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let new: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let kubelet: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "from-kubelet"},
        "involvedObject": {"kind": "Pod", "name": "app-1", "namespace": "default"},
        "reason": "Pulled", "message": "m", "type": "Normal",
        "source": {"component": "kubelet", "host": "node-1"},
    }))?;
    core.create(&PostParams::default(), &kubelet).await?;
    let controller: NewEvent = serde_json::from_value(json!({
        "metadata": {"name": "from-controller"},
        "regarding": {"kind": "Node", "name": "node-1", "namespace": "default", "fieldPath": "spec"},
        "eventTime": "2026-11-23T00:00:00.000000Z", "reason": "R", "type": "Warning",
        "action": "A", "reportingController": "local-activator.dev/c", "reportingInstance": "i",
    }))?;
    new.create(&PostParams::default(), &controller).await?;

    let core_names = |sel: &'static str| {
        let core = core.clone();
        async move {
            let l = core.list(&ListParams::default().fields(sel)).await?;
            anyhow::Ok(
                l.items
                    .into_iter()
                    .map(|e| e.metadata.name.unwrap())
                    .collect::<Vec<_>>(),
            )
        }
    };
    let new_names = |sel: &'static str| {
        let new = new.clone();
        async move {
            let l = new.list(&ListParams::default().fields(sel)).await?;
            anyhow::Ok(
                l.items
                    .into_iter()
                    .map(|e| e.metadata.name.unwrap())
                    .collect::<Vec<_>>(),
            )
        }
    };
    // `source` is the source component, or the reporting controller when there is none
    assert_eq!(core_names("source=kubelet").await?, ["from-kubelet"]);
    assert_eq!(
        core_names("source=local-activator.dev/c").await?,
        ["from-controller"]
    );
    assert_eq!(
        core_names("involvedObject.kind=Node").await?,
        ["from-controller"]
    );
    assert_eq!(
        core_names("reportingComponent=local-activator.dev/c,type=Warning").await?,
        ["from-controller"]
    );
    assert_eq!(new_names("regarding.name=app-1").await?, ["from-kubelet"]);
    assert_eq!(
        new_names("regarding.fieldPath=spec").await?,
        ["from-controller"]
    );
    assert_eq!(
        new_names("reportingController=local-activator.dev/c").await?,
        ["from-controller"]
    );
    assert_eq!(new_names("source=kubelet").await?, ["from-kubelet"]);
    // each API takes its own names only
    let e = api_err(
        new.list(&ListParams::default().fields("involvedObject.name=app-1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    assert_eq!(e.message, "field label not supported: involvedObject.name");
    let e = api_err(
        core.list(&ListParams::default().fields("regarding.name=app-1"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    s.shutdown().await;
    Ok(())
}
