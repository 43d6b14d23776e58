//! The open-loop generator against a real, slow HTTP server: latency grows as the server
//! falls behind, while the send times keep to the schedule.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Empty, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use loadtest::open_loop::OpenLoop;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves one request at a time, each taking 20 ms: 50 requests/s at most.
async fn slow_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let one_at_a_time = Arc::new(tokio::sync::Mutex::new(()));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let gate = one_at_a_time.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    let gate = gate.clone();
                    async move {
                        let _serial = gate.lock().await;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from("ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_grows_against_a_slow_server_and_the_send_times_do_not() {
    let addr = slow_server().await;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    // 150 requests/s for one second against a server that answers 50/s.
    let run = OpenLoop {
        rate: 150.0,
        duration: Duration::from_secs(1),
        max_in_flight: 1_000,
    }
    .run(&CancellationToken::new(), |_| {
        let client = client.clone();
        async move {
            let uri = format!("http://{addr}/").parse().unwrap();
            client.get(uri).await.is_ok_and(|r| r.status().is_success())
        }
    })
    .await;
    assert_eq!(run.sent(), 150);
    assert_eq!(run.errors(), 0);
    let tenth = run.sent() / 10;
    let first = run.outcomes[..tenth]
        .iter()
        .map(|o| o.latency)
        .max()
        .unwrap();
    let last = run.outcomes[run.sent() - tenth..]
        .iter()
        .map(|o| o.latency)
        .min()
        .unwrap();
    assert!(
        last > first * 3,
        "the last requests queued behind the earlier ones: first tenth at most {first:?}, last tenth at least {last:?}"
    );
    let lag = run.send_lag();
    let latency = run.latency();
    assert!(
        lag.max * 10.0 < latency.max,
        "requests were sent on schedule, not when earlier ones were answered: send lag max {} ms, latency max {} ms",
        lag.max,
        latency.max
    );
    let span = run.outcomes.last().unwrap().intended;
    assert!(
        span >= Duration::from_millis(990),
        "the schedule spans the second: {span:?}"
    );
}
