//! The subsetter's ActivationEndpoints store can lag the API (a watch that falls behind under
//! load, or a create whose answer was lost while the object was made): a reconcile then finds
//! no object in its store, and its create answers 409. It must take the object over and write
//! it, not retry a create that can never succeed.

mod support;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Result;
use futures::future::BoxFuture;
use kube::Api;
use kube::api::{Patch, PatchParams};
use subsetter::{Config, Random, Subsetter};
use support::*;

/// Passes every request through, except: watches of ActivationEndpoints never answer (the
/// store gets its first list and then hears nothing), and the answer to the first create of
/// one is lost — the object is made, the subsetter is told 500.
#[derive(Clone)]
struct BlindAepWatches<S>(S, Arc<AtomicBool>);

impl<S, B, RB> tower::Service<http::Request<B>> for BlindAepWatches<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>> + Send,
    S::Future: Send + 'static,
    RB: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let aeps = req.uri().path().ends_with("/activationendpoints");
        let blind = aeps && req.uri().query().is_some_and(|q| q.contains("watch=true"));
        let lose = aeps && req.method() == http::Method::POST && !self.1.swap(true, SeqCst);
        let answer = self.0.call(req);
        Box::pin(async move {
            if blind {
                std::future::pending::<()>().await;
            }
            let mut resp = answer.await?;
            if lose {
                *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            }
            Ok(resp)
        })
    }
}

#[tokio::test]
async fn a_subset_missing_from_a_lagging_store_is_taken_over_not_created_again() -> Result<()> {
    let c = Cluster::start().await?;
    for i in 1..=3 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.2.{i}"))
            .await?;
    }
    let blind = kube::client::ClientBuilder::try_from(c.server.kube_config())?
        .with_layer(&tower::layer::layer_fn(|s| {
            BlindAepWatches(s, Arc::new(AtomicBool::new(false)))
        }))
        .build();
    let subsetter = Arc::new(Subsetter::new(
        blind,
        Config::default(),
        Arc::new(Random::seeded(7)),
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let s = Arc::clone(&subsetter);
    let task = tokio::spawn(async move {
        s.run(async move {
            let _ = stopped.await;
        })
        .await
    });

    c.create_revision("lagged", spec(6, 0, None)).await?;
    let first = c.wait_endpoints("lagged", ready_with(3)).await?;
    let shares = |ae: &crds::ActivationEndpoints| {
        ae.status
            .as_ref()
            .map(|s| s.activators.iter().map(|m| m.max_pods).sum::<i32>())
    };
    assert_eq!(shares(&first), Some(6));

    // A change the subsetter must write; its store still has no ActivationEndpoints.
    let revs: Api<crds::Revision> = Api::namespaced(c.client.clone(), NS);
    revs.patch(
        "lagged",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"maxScale": 3}})),
    )
    .await?;
    let after = c
        .wait_endpoints("lagged", |ae| shares(ae) == Some(3))
        .await?;
    assert_eq!(
        after.metadata.uid, first.metadata.uid,
        "the same object, written over, not deleted and made again"
    );

    drop(stop);
    tokio::time::timeout(Duration::from_secs(30), task).await???;
    Ok(())
}
