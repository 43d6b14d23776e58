//! `subsetter_reconciles_queued` counts the revisions waiting for a reconcile: with the
//! reconciles in flight held on their first write, the rest of the revisions wait in the queue
//! and the gauge shows exactly them; once the writes go through and every subset is written, it
//! is back to 0.

mod support;

use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Result;
use futures::future::BoxFuture;
use subsetter::{Config, Random, Subsetter};
use support::*;
use tokio::sync::watch;

/// Holds every ActivationEndpoints create until the gate opens.
#[derive(Clone)]
struct HoldCreates<S>(S, watch::Receiver<bool>);

impl<S, B, RB> tower::Service<http::Request<B>> for HoldCreates<S>
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
        let hold = req.uri().path().ends_with("/activationendpoints")
            && req.method() == http::Method::POST;
        let mut gate = self.1.clone();
        let answer = self.0.call(req);
        Box::pin(async move {
            if hold {
                let _ = gate.wait_for(|open| *open).await;
            }
            answer.await
        })
    }
}

/// The value of a gauge in the metrics text.
fn gauge(text: &str, name: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn the_queue_gauge_counts_revisions_waiting_and_returns_to_zero() -> Result<()> {
    const REVISIONS: usize = 24;
    const CONCURRENCY: u16 = 4;
    let c = Cluster::start().await?;
    for i in 1..=3 {
        c.add_activator(&format!("node-{i}"), &format!("127.0.3.{i}"))
            .await?;
    }
    for i in 0..REVISIONS {
        c.create_revision(&format!("q{i}"), spec(0, 0, None))
            .await?;
    }
    let (open, gate) = watch::channel(false);
    let held = kube::client::ClientBuilder::try_from(c.server.kube_config())?
        .with_layer(&tower::layer::layer_fn(|s| HoldCreates(s, gate.clone())))
        .build();
    let config = Config {
        concurrency: CONCURRENCY,
        ..Config::default()
    };
    let subsetter = Arc::new(Subsetter::new(held, config, Arc::new(Random::seeded(3))));
    let before = subsetter.metrics().encode();
    assert_eq!(gauge(&before, "subsetter_reconciles_queued"), Some(0));
    let running = {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let s = Arc::clone(&subsetter);
        let task = tokio::spawn(async move {
            s.run(async move {
                let _ = stopped.await;
            })
            .await
        });
        (stop, task)
    };
    let metrics = subsetter.metrics();
    let wait = |check: Box<dyn Fn(&str) -> bool + Send>| {
        let metrics = Arc::clone(&metrics);
        async move {
            tokio::time::timeout(WAIT, async {
                // Metrics have no event to watch: poll (as Cluster::wait_metrics does).
                while !check(&metrics.encode()) {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
            .await
        }
    };

    // CONCURRENCY reconciles hold on their create; every other revision waits its turn.
    let waiting = (REVISIONS - usize::from(CONCURRENCY)) as i64;
    let reached = wait(Box::new(move |t| {
        gauge(t, "subsetter_reconciles_queued") == Some(waiting)
            && gauge(t, "subsetter_reconciles_in_flight") == Some(i64::from(CONCURRENCY))
    }))
    .await;
    assert!(
        reached.is_ok(),
        "expected {waiting} queued and {CONCURRENCY} in flight:\n{}",
        metrics.encode()
    );

    open.send_replace(true);
    for i in 0..REVISIONS {
        c.wait_endpoints(&format!("q{i}"), ready_with(3)).await?;
    }
    let drained = wait(Box::new(|t| {
        gauge(t, "subsetter_reconciles_queued") == Some(0)
            && gauge(t, "subsetter_reconciles_in_flight") == Some(0)
    }))
    .await;
    assert!(drained.is_ok(), "queue not drained:\n{}", metrics.encode());

    let (stop, task) = running;
    drop(stop);
    tokio::time::timeout(WAIT, task).await???;
    Ok(())
}
