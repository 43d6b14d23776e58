//! An activator's memberships at start from the directory (`cache::seeded`): no
//! label-selected list of ActivationEndpoints (a scan of every subset on a real API server),
//! the watch from the directory's version, and the list as before whenever the directory's
//! answer cannot be trusted or its version is gone. Against kubesim, with a directory that
//! answers what the test tells it to.

#[path = "support/kubesim_cluster.rs"]
mod kubesim_cluster;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use activator::WatchOnly;
use activator::cache::directory::DirectorySource;
use activator::config::ActivatorConfig;
use anyhow::Context as _;
use bytes::Bytes;
use crds::directory::MembersAnswer;
use crds::{ActivationEndpoints, ActivationEndpointsStatus, ActivatorMember};
use http_body_util::Full;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig};

/// Far longer than any step takes: reaching it means it never happened.
const HANG: Duration = Duration::from_secs(30);
const NS: &str = "apps";
const NODE: &str = "n1";

/// kubesim with the project's CRDs and the apps namespace, keeping `history` watch events
/// per resource.
async fn cluster(history: usize) -> anyhow::Result<ApiServer> {
    let cfg = ApiServerConfig {
        watch_history: history,
        ..ApiServerConfig::default()
    };
    kubesim_cluster::cluster(cfg, NS).await
}

/// A subset of `nodes`, labelled and with its status, as the subsetter writes it.
async fn subset(api: &Api<ActivationEndpoints>, name: &str, nodes: &[&str]) -> anyhow::Result<()> {
    let mut ae = ActivationEndpoints::new(name, Default::default());
    ae.metadata.labels = Some(
        nodes
            .iter()
            .map(|n| (crds::contract::member_label(n), String::new()))
            .collect(),
    );
    let created = api.create(&PostParams::default(), &ae).await?;
    let status = ActivationEndpointsStatus {
        activators: nodes
            .iter()
            .map(|n| ActivatorMember {
                node: (*n).into(),
                address: "127.0.0.1:8080".into(),
                pod: format!("activator-{n}"),
                max_pods: 1,
                min_pods: 0,
            })
            .collect(),
        ..Default::default()
    };
    api.patch_status(
        &created.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await?;
    Ok(())
}

/// A directory replica that answers `/v1/members/<node>` with whatever `answer` holds now.
async fn directory(answer: Arc<Mutex<Option<MembersAnswer>>>) -> anyhow::Result<SocketAddr> {
    Ok(counted_directory(answer).await?.0)
}

/// [`directory`], and how many times it was asked for memberships (503s included).
async fn counted_directory(
    answer: Arc<Mutex<Option<MembersAnswer>>>,
) -> anyhow::Result<(SocketAddr, Arc<AtomicUsize>)> {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let answer = Arc::clone(&answer);
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let answer = answer.lock().unwrap().clone();
                        // Memberships asked (revisions are read from the directory too).
                        let ok = req.uri().path() == crds::directory::members_path(NODE);
                        if ok {
                            counter.fetch_add(1, Ordering::SeqCst);
                        }
                        async move {
                            let resp = match answer.filter(|_| ok) {
                                Some(a) => hyper::Response::new(Full::new(Bytes::from(
                                    serde_json::to_vec(&a).expect("json"),
                                ))),
                                None => {
                                    let mut r = hyper::Response::new(Full::new(
                                        Bytes::from_static(b"no\n"),
                                    ));
                                    *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                                    r
                                }
                            };
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), svc)
                    .await;
            });
        }
    });
    Ok((addr, asked))
}

/// What a label-selected list gives now, as a truthful replica would answer it.
async fn truthful(api: &Api<ActivationEndpoints>) -> anyhow::Result<MembersAnswer> {
    let list = api
        .list(&ListParams::default().labels(&crds::contract::member_selector(NODE)))
        .await?;
    Ok(MembersAnswer {
        resource_version: list.metadata.resource_version.context("a list's version")?,
        items: list.items,
    })
}

fn config(directory: SocketAddr) -> ActivatorConfig {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut cfg = ActivatorConfig::new(NODE, any, any);
    cfg.directory = DirectorySource::Static(vec![directory]);
    // The watch seeded by the directory, not the stream (tests/members_streamed.rs).
    cfg.members_streamed = false;
    cfg
}

/// A client of `server`, and its ActivationEndpoints in the apps namespace.
fn clients(server: &ApiServer) -> (kube::Client, Api<ActivationEndpoints>) {
    let client = server.client();
    let aes = Api::namespaced(client.clone(), NS);
    (client, aes)
}

/// An activator's watches for `NODE` asking the directory at `directory`, once synced.
async fn started(client: &kube::Client, directory: SocketAddr) -> anyhow::Result<WatchOnly> {
    let w = WatchOnly::start(&config(directory), client.clone());
    tokio::time::timeout(HANG, w.synced()).await?;
    Ok(w)
}

/// The subsets the watch holds, once it holds `want` (it converges on a change).
async fn holds(w: &WatchOnly, want: usize) -> anyhow::Result<()> {
    tokio::time::timeout(HANG, async {
        while w.counts().0 != want {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .with_context(|| format!("held {} subsets, not {want}", w.counts().0))
}

fn lists(api: &ApiServer) -> u64 {
    api.stats().count("list", "activationendpoints")
}

#[tokio::test]
async fn a_start_from_the_directory_lists_nothing_and_sees_every_later_change() -> anyhow::Result<()>
{
    let server = cluster(10_000).await?;
    let (client, aes) = clients(&server);
    subset(&aes, "a", &[NODE, "n2"]).await?;
    subset(&aes, "b", &["n2", "n3"]).await?;
    subset(&aes, "c", &[NODE]).await?;
    let answer = Arc::new(Mutex::new(Some(truthful(&aes).await?)));
    // Changes after the answer's version, before the start: the watch replays them.
    subset(&aes, "d", &[NODE, "n3"]).await?;
    aes.delete("a", &DeleteParams::default()).await?;
    let listed_before = lists(&server);

    let w = started(&client, directory(answer).await?).await?;
    holds(&w, 2).await?; // c, d
    subset(&aes, "e", &[NODE]).await?;
    holds(&w, 3).await?;
    // Leaving: the member label goes (the API server sends the watch a deletion).
    aes.patch(
        "c",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(serde_json::json!([
            {"op": "remove", "path": format!("/metadata/labels/{}", crds::contract::member_label(NODE).replace('/', "~1"))}
        ]))?),
    )
    .await?;
    holds(&w, 2).await?;
    assert_eq!(
        lists(&server),
        listed_before,
        "the start listed the subsets: {:?}",
        server.stats().requests
    );
    assert!(server.stats().count("watch", "activationendpoints") >= 1);
    Ok(())
}

#[tokio::test]
async fn a_version_the_api_server_no_longer_has_is_listed_instead() -> anyhow::Result<()> {
    // Two events kept: the answer's version is gone by the time the watch starts from it.
    let server = cluster(2).await?;
    let (client, aes) = clients(&server);
    subset(&aes, "a", &[NODE]).await?;
    let answer = Arc::new(Mutex::new(Some(truthful(&aes).await?)));
    for name in ["b", "c"] {
        subset(&aes, name, &[NODE]).await?;
    }
    let listed_before = lists(&server);

    let w = started(&client, directory(answer).await?).await?;
    holds(&w, 3).await?;
    assert!(
        lists(&server) > listed_before,
        "the 410 did not end in a list"
    );
    subset(&aes, "d", &[NODE]).await?;
    holds(&w, 4).await?;
    Ok(())
}

/// An answer that does not hold to the query, or none, is never used: the subsets are listed,
/// and the watch holds what the API server has.
#[tokio::test]
async fn an_answer_that_cannot_be_trusted_is_listed_instead() -> anyhow::Result<()> {
    let server = cluster(10_000).await?;
    let (client, aes) = clients(&server);
    subset(&aes, "a", &[NODE]).await?;
    subset(&aes, "b", &["n2"]).await?;
    let truth = truthful(&aes).await?;
    let others = aes.get("b").await?;
    let answers = [
        // A subset that does not list the node.
        Some(MembersAnswer {
            items: vec![truth.items[0].clone(), others],
            ..truth.clone()
        }),
        // A version that is not one.
        Some(MembersAnswer {
            resource_version: "1; drop".into(),
            ..truth.clone()
        }),
        // No answer (503).
        None,
    ];
    for answer in answers {
        let what = format!("{answer:?}");
        let listed_before = lists(&server);
        let w = started(&client, directory(Arc::new(Mutex::new(answer))).await?).await?;
        holds(&w, 1).await?;
        assert!(lists(&server) > listed_before, "not listed after {what}");
    }
    // And a directory nobody listens at.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?
    };
    let listed_before = lists(&server);
    let w = started(&client, closed).await?;
    holds(&w, 1).await?;
    assert!(lists(&server) > listed_before);
    let names: BTreeSet<String> = aes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|a| a.name_any())
        .collect();
    assert_eq!(names, BTreeSet::from(["a".to_string(), "b".to_string()]));
    Ok(())
}

/// A version that expires later on (the API server ended the watch and no longer has it, as
/// a busy real one does) takes a new first state from the directory, not a list, whether the
/// first one was the directory's or listed.
#[tokio::test]
async fn a_version_expired_later_on_is_answered_by_the_directory_not_a_list() -> anyhow::Result<()>
{
    let server = cluster(10_000).await?;
    let (client, aes) = clients(&server);
    subset(&aes, "a", &[NODE]).await?;
    subset(&aes, "b", &["n2"]).await?;
    for first_listed in [false, true] {
        let answer = Arc::new(Mutex::new(if first_listed {
            None
        } else {
            Some(truthful(&aes).await?)
        }));
        let (addr, asked) = counted_directory(Arc::clone(&answer)).await?;
        let listed_before = lists(&server);
        let w = started(&client, addr).await?;
        holds(&w, 1).await?;
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        let listed_at_start = lists(&server);
        assert_eq!(listed_at_start > listed_before, first_listed);
        // A change the watch shows: its version is now the API server's own.
        subset(&aes, "c", &[NODE]).await?;
        holds(&w, 2).await?;

        // A change the watch does not show, so its version falls behind; then every watch
        // ends and no earlier version can be watched from any more. The directory knows the
        // present.
        subset(&aes, &format!("other-{first_listed}"), &["n2"]).await?;
        let present = truthful(&aes).await?;
        let listed = lists(&server);
        server.compact();
        *answer.lock().unwrap() = Some(present);
        server.close_watches();
        tokio::time::timeout(HANG, async {
            while asked.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .context("the directory was not asked after the 410")?;
        // Later changes arrive on the watch from the directory's version.
        subset(&aes, "d", &[NODE]).await?;
        holds(&w, 3).await?;
        aes.delete("d", &DeleteParams::default()).await?;
        aes.delete("c", &DeleteParams::default()).await?;
        holds(&w, 1).await?;
        assert_eq!(
            lists(&server),
            listed,
            "the 410 ended in a list (first state listed: {first_listed})"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 2);
    }
    Ok(())
}

/// An API server that stops and comes back with its history: the watch resumes from its
/// version, asking neither the directory nor for a list.
#[tokio::test]
async fn an_outage_resumes_the_watch_from_its_version() -> anyhow::Result<()> {
    let server = cluster(10_000).await?;
    let (client, aes) = clients(&server);
    subset(&aes, "a", &[NODE]).await?;
    let answer = Arc::new(Mutex::new(Some(truthful(&aes).await?)));
    let (addr, asked) = counted_directory(answer).await?;
    let w = started(&client, addr).await?;
    subset(&aes, "b", &[NODE]).await?;
    holds(&w, 2).await?;
    let listed = lists(&server);
    let watches = server.stats().count("watch", "activationendpoints");

    server.stop().await;
    server.resume().await?;
    subset(&aes, "c", &[NODE]).await?;
    holds(&w, 3).await?;
    assert!(server.stats().count("watch", "activationendpoints") > watches);
    assert_eq!(lists(&server), listed, "the resumed watch listed");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "the resumed watch asked the directory"
    );
    Ok(())
}
