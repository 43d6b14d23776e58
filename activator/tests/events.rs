//! Kubernetes Events about Revisions, written to kubesim through kube's Recorder: one per
//! (revision, reason) per window, repeats after the window as a series on the same event.

use std::time::Duration;

use activator::ops::events::{
    EventConfig, EventSink, REASON_COLD_START_FAILED, REASON_NODE_FULL, REPORTING_CONTROLLER,
};
use anyhow::Context as _;
use crds::Revision;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kubesim::api::{ApiServer, ApiServerConfig};

/// Far longer than any event write takes: reaching it means the event never came.
const HANG: Duration = Duration::from_secs(60);
const NS: &str = "apps";
const POD: &str = "local-activator-x7k2p";

fn revision(name: &str) -> anyhow::Result<Revision> {
    let mut rev = Revision::new(
        name,
        serde_json::from_value(serde_json::json!({"template": {}}))?,
    );
    rev.metadata.namespace = Some(NS.into());
    rev.metadata.uid = Some(format!("uid-{name}"));
    rev.metadata.resource_version = Some("42".into());
    Ok(rev)
}

async fn cluster() -> anyhow::Result<(ApiServer, kube::Client)> {
    let api = ApiServer::start(ApiServerConfig::default()).await?;
    let client = api.client();
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NS.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nss.create(&PostParams::default(), &ns).await?;
    Ok((api, client))
}

/// The events regarding `revision`, once `done` holds for them (polled; bounded by `HANG`).
async fn events_until(
    client: &kube::Client,
    revision: &str,
    done: impl Fn(&[Event]) -> bool,
) -> anyhow::Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().fields(&format!("regarding.name={revision}"));
    tokio::time::timeout(HANG, async {
        loop {
            let list = events.list(&lp).await?.items;
            if done(&list) {
                return anyhow::Ok(list);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .context("the events never came")?
}

fn count(list: &[Event], reason: &str) -> usize {
    list.iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .count()
}

#[tokio::test]
async fn a_cold_start_failure_is_an_event_once_per_window() -> anyhow::Result<()> {
    let (_api, client) = cluster().await?;
    // One write at a time: the queue is written in order, so once the last event is there,
    // every event queued before it was written too.
    let sink = EventSink::new(
        client.clone(),
        POD,
        EventConfig {
            concurrency: 1,
            ..EventConfig::default()
        },
    );
    let rev = revision("hello-00001")?;
    assert!(sink.cold_start_failed(&rev, "Timeout", "no pod became ready in 300s".into()));
    assert!(
        !sink.cold_start_failed(&rev, "Timeout", "no pod became ready in 300s".into()),
        "a repeat within the window is not queued"
    );
    let mut newer = rev.clone();
    newer.metadata.resource_version = Some("43".into());
    assert!(!sink.cold_start_failed(&newer, "PodFailed", "another cause".into()));
    assert!(sink.node_full(&rev, "node-1", "maxPods share 2 reached"));

    let list = events_until(&client, "hello-00001", |l| count(l, REASON_NODE_FULL) == 1).await?;
    assert_eq!(count(&list, REASON_COLD_START_FAILED), 1, "{list:#?}");
    assert_eq!(list.len(), 2, "{list:#?}");

    let ev = list
        .iter()
        .find(|e| e.reason.as_deref() == Some(REASON_COLD_START_FAILED))
        .unwrap();
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.action.as_deref(), Some("ColdStart"));
    assert_eq!(
        ev.note.as_deref(),
        Some("Timeout: no pod became ready in 300s")
    );
    assert_eq!(
        ev.reporting_controller.as_deref(),
        Some(REPORTING_CONTROLLER)
    );
    assert_eq!(ev.reporting_instance.as_deref(), Some(POD));
    let regarding = ev.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Revision"));
    assert_eq!(
        regarding.api_version.as_deref(),
        Some("local-activator.dev/v1alpha1")
    );
    assert_eq!(regarding.namespace.as_deref(), Some(NS));
    assert_eq!(regarding.uid.as_deref(), Some("uid-hello-00001"));

    let full = list
        .iter()
        .find(|e| e.reason.as_deref() == Some(REASON_NODE_FULL))
        .unwrap();
    assert_eq!(full.action.as_deref(), Some("CreatePod"));
    let related = full.related.as_ref().unwrap();
    assert_eq!(
        (related.kind.as_deref(), related.name.as_deref()),
        (Some("Node"), Some("node-1"))
    );
    assert!(
        full.note
            .as_deref()
            .unwrap()
            .contains("maxPods share 2 reached")
    );

    // The core/v1 view, as `kubectl describe` reads it.
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().fields("involvedObject.name=hello-00001,reason=ColdStartFailed");
    assert_eq!(core.list(&lp).await?.items.len(), 1);
    assert_eq!(sink.dropped(), 0);
    Ok(())
}

/// After the window, the same (revision, reason) is written again: kube's Recorder makes it
/// a series on the first event (count 2), not a second object.
#[tokio::test]
async fn a_repeat_after_the_window_is_counted_on_the_same_event() -> anyhow::Result<()> {
    let (_api, client) = cluster().await?;
    let window = Duration::from_millis(50);
    let sink = EventSink::new(
        client.clone(),
        POD,
        EventConfig {
            window,
            ..EventConfig::default()
        },
    );
    let rev = revision("again-00001")?;
    assert!(sink.node_full(&rev, "node-1", "no memory"));
    events_until(&client, "again-00001", |l| l.len() == 1).await?;
    tokio::time::sleep(window * 2).await;
    assert!(sink.node_full(&rev, "node-1", "no memory"));
    let list = events_until(&client, "again-00001", |l| {
        l.iter()
            .any(|e| e.series.as_ref().is_some_and(|s| s.count == 2))
    })
    .await?;
    assert_eq!(list.len(), 1, "{list:#?}");
    Ok(())
}
