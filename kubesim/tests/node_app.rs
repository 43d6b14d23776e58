//! The simulated app on its own, without an API server.

#[path = "node_support/mod.rs"]
mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use kubesim::node::{App, AppSpec};
use support::{get, http_client, refused, send};

fn spec(z: u8) -> AppSpec {
    AppSpec {
        pod_name: "web-1".into(),
        namespace: "apps".into(),
        node_name: "node-0200".into(),
        // Block of node index 200 (127.10.200.x), which no other test file uses.
        addr: SocketAddr::from((Ipv4Addr::new(127, 10, 200, z), 8080)),
        delay: Duration::ZERO,
        concurrency: None,
    }
}

#[tokio::test]
async fn echoes_and_names_itself() {
    let app = App::start(spec(2)).await.unwrap();
    let client = http_client();
    let a = send(
        &client,
        "POST",
        app.addr(),
        "/hello/world?x=1",
        &[],
        "payload",
    )
    .await
    .unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(a.body, "POST /hello/world?x=1\npayload");
    assert_eq!(a.headers["x-pod-name"], "web-1");
    assert_eq!(a.headers["x-pod-namespace"], "apps");
    assert_eq!(a.headers["x-node-name"], "node-0200");
    assert_eq!(a.headers["x-pod-ip"], "127.10.200.2");

    let h = get(&client, app.addr(), "/healthz").await.unwrap();
    assert_eq!((h.status, h.body.as_str()), (200, "ok\n"));
    let forced = send(
        &client,
        "GET",
        app.addr(),
        "/",
        &[("x-sim-status", "502")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(forced.status, 502);

    assert_eq!(app.stats().requests(), 2, "healthz is not counted");
    assert_eq!(app.stats().health_checks(), 1);
}

#[tokio::test]
async fn concurrency_cap_answers_503() {
    let app = App::start(AppSpec {
        concurrency: Some(1),
        delay: Duration::from_millis(300),
        ..spec(3)
    })
    .await
    .unwrap();
    let client = http_client();
    let addr = app.addr();
    let slow = tokio::spawn({
        let client = client.clone();
        async move { get(&client, addr, "/slow").await.map(|a| a.status) }
    });
    // The first request holds the only slot until its delay is over.
    let stats = app.stats().clone();
    tokio::time::timeout(Duration::from_secs(5), async {
        while stats.in_flight() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("first request in flight");
    let second = send(
        &client,
        "GET",
        addr,
        "/fast",
        &[("x-sim-delay-ms", "0")],
        "",
    )
    .await
    .unwrap();
    assert_eq!(second.status, 503);
    assert_eq!(slow.await.unwrap().unwrap(), 200);
    assert_eq!(app.stats().rejected(), 1);
    assert_eq!(app.stats().requests(), 2);
}

#[tokio::test]
async fn stop_refuses_connections() {
    let app = App::start(spec(4)).await.unwrap();
    let addr = app.addr();
    assert!(!refused(addr).await);
    app.stop().await;
    assert!(refused(addr).await);
}

#[tokio::test]
async fn drain_finishes_in_flight_requests_and_refuses_new_ones() {
    let app = App::start(AppSpec {
        delay: Duration::from_millis(400),
        ..spec(5)
    })
    .await
    .unwrap();
    let addr = app.addr();
    let stats = app.stats().clone();
    let client = http_client();
    let in_flight = tokio::spawn({
        let client = client.clone();
        async move {
            get(&client, addr, "/long")
                .await
                .map(|a| (a.status, a.body))
        }
    });
    tokio::time::timeout(Duration::from_secs(5), async {
        while stats.in_flight() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("request in flight");
    let drained = tokio::spawn(app.drain(Duration::from_secs(10)));
    let (status, body) = in_flight.await.unwrap().unwrap();
    assert_eq!((status, body.as_str()), (200, "GET /long\n"));
    drained.await.unwrap();
    assert!(refused(addr).await);
}

#[tokio::test]
async fn drain_cuts_requests_that_outlive_the_grace_period() {
    let app = App::start(AppSpec {
        delay: Duration::from_secs(30),
        ..spec(6)
    })
    .await
    .unwrap();
    let addr = app.addr();
    let stats = app.stats().clone();
    let client = http_client();
    let in_flight = tokio::spawn({
        let client = client.clone();
        async move { get(&client, addr, "/forever").await.map(|a| a.status) }
    });
    tokio::time::timeout(Duration::from_secs(5), async {
        while stats.in_flight() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("request in flight");
    app.drain(Duration::from_millis(100)).await;
    let result = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .expect("cut, not hanging");
    assert!(result.unwrap().is_err(), "the connection was cut");
}

#[tokio::test]
async fn black_hole_accepts_but_never_answers() {
    let app = App::start(spec(7)).await.unwrap();
    let addr = app.addr();
    let client = http_client();
    assert_eq!(get(&client, addr, "/before").await.unwrap().status, 200);
    app.black_hole();
    // A fresh connection (not the pooled one) is accepted...
    let fresh = http_client();
    let pending =
        tokio::time::timeout(Duration::from_millis(500), get(&fresh, addr, "/after")).await;
    assert!(pending.is_err(), "answered while black-holed");
    assert!(!refused(addr).await, "still accepting");
    // ...and the pooled keep-alive connection gets no answer either.
    let pooled =
        tokio::time::timeout(Duration::from_millis(500), get(&client, addr, "/again")).await;
    assert!(
        pooled.is_err(),
        "answered on an open connection while black-holed"
    );
    drop(app);
}
