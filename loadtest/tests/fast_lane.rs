//! The fast lane (activator `fast`), end to end: warm HTTP/1.1 requests named by headers or Host are
//! carried as bytes on the client's connection (pipelined ones in order), and a request it
//! does not carry goes to hyper's path on the same connection, which then serves the rest.
//! Every other system test runs through it too, since it is on by default.

use std::net::SocketAddr;
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use kubesim::node::Delay;
use loadtest::demo::{echo_revision, host_of, member_nodes, wait_subsets};
use loadtest::{ClusterOptions, SimCluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {LIMIT:?}"))
}

/// 3 nodes, one revision on 2 of them: (cluster, namespace, member, non-member).
async fn setup(
    name: &str,
) -> (
    SimCluster,
    String,
    (String, SocketAddr),
    (String, SocketAddr),
) {
    setup_with(name, None).await
}

/// [`setup`], each activator configured by `configure`.
async fn setup_with(
    name: &str,
    configure: Option<loadtest::cluster::ConfigureActivator>,
) -> (
    SimCluster,
    String,
    (String, SocketAddr),
    (String, SocketAddr),
) {
    let ns = format!("fast-lane-test-{:08x}", rand::random::<u32>());
    let c = SimCluster::start(ClusterOptions {
        nodes: 3,
        start_delay: Delay::fixed_ms(50),
        default_activators: 2,
        revision_namespace: Some(ns.clone()),
        configure_activator: configure,
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    c.ensure_own_namespace(&ns).await.unwrap();
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &echo_revision(name, &ns, vec![host_of(name, &ns)]),
    )
    .await
    .unwrap();
    wait_subsets(&c.client, &ns, &[name.to_string()], LIMIT)
        .await
        .unwrap();
    let members = member_nodes(&c.client, &ns, name).await.unwrap();
    let entries = c.entries();
    let member = entries
        .iter()
        .find(|(n, _)| *n == members[0])
        .unwrap()
        .clone();
    let outsider = entries
        .iter()
        .find(|(n, _)| !members.contains(n))
        .unwrap()
        .clone();
    (c, ns, member, outsider)
}

/// The metrics of the activator on `node`.
fn metrics_of<'a>(c: &'a SimCluster, node: &str) -> &'a activator::ops::metrics::Metrics {
    c.activators
        .iter()
        .find(|a| a.node == node)
        .expect("an activator on the node")
        .activator
        .metrics()
}

/// The activator's `activator_requests_total{route="warm",code}` on `node`.
fn warm(c: &SimCluster, node: &str, code: u16) -> u64 {
    use activator::ops::metrics::{Outcome, Route};
    metrics_of(c, node)
        .requests
        .get_or_create(&Outcome {
            route: Route::Warm,
            code,
        })
        .get()
}

fn handovers(c: &SimCluster, node: &str) -> u64 {
    metrics_of(c, node).fast_lane_handovers.get()
}

/// A request naming the revision by headers.
fn request(method: &str, path: &str, ns: &str, name: &str, extra: &str, body: &str) -> String {
    let length = if body.is_empty() && method == "GET" {
        String::new()
    } else {
        format!("content-length: {}\r\n", body.len())
    };
    format!(
        "{method} {path} HTTP/1.1\r\nhost: app\r\nx-revision-namespace: {ns}\r\n\
         x-revision-name: {name}\r\n{length}{extra}\r\n{body}"
    )
}

/// One response with a `content-length` body, read from `s` (`pending` holds bytes read past
/// the previous one): its status, head and body.
async fn response(s: &mut TcpStream, pending: &mut Vec<u8>) -> (u16, String, String) {
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "closed before a head: {:?}",
            String::from_utf8_lossy(pending)
        );
        pending.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(pending[..end].to_vec()).unwrap();
    let status: u16 = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no content-length in {head:?}"));
    while pending.len() < end + length {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed inside a body");
        pending.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8(pending[end..end + length].to_vec()).unwrap();
    pending.drain(..end + length);
    (status, head, body)
}

/// Sends a last request that asks to close, checks it is answered 200 and the connection
/// then ends (after the activator counted it); returns the answer's head.
async fn last_request_closes(
    s: &mut TcpStream,
    pending: &mut Vec<u8>,
    ns: &str,
    name: &str,
) -> String {
    s.write_all(request("GET", "/last", ns, name, "connection: close\r\n", "").as_bytes())
        .await
        .unwrap();
    let (status, head, _) = within("last", response(s, pending)).await;
    assert_eq!(status, 200, "{head}");
    let n = within("close", s.read(&mut [0u8; 16])).await.unwrap();
    assert_eq!(n, 0, "the connection stays open after connection: close");
    head
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_requests_stay_in_the_fast_lane_and_pipelined_ones_keep_their_order() {
    let (c, ns, (node, addr), _) = setup("fast").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut pending = Vec::new();
    // The first request starts the pod (it may be the one handed over, if the member's
    // subset watch had not seen the revision yet).
    s.write_all(request("GET", "/first", &ns, "fast", "", "").as_bytes())
        .await
        .unwrap();
    let (status, _, body) = within("first", response(&mut s, &mut pending)).await;
    assert_eq!((status, body.as_str()), (200, "GET /first\n"));
    let mut s = TcpStream::connect(addr).await.unwrap();
    let before = handovers(&c, &node);
    let (ok_before, not_found_before) = (warm(&c, &node, 200), warm(&c, &node, 404));

    // Three requests in one write, one of them with a body: three answers, in order.
    let pipelined = [
        request("GET", "/a", &ns, "fast", "", ""),
        request("POST", "/b", &ns, "fast", "", "0123456789"),
        request(
            "GET",
            "/c?q=1",
            &ns,
            "fast",
            "connection: keep-alive\r\n",
            "",
        ),
    ]
    .concat();
    s.write_all(pipelined.as_bytes()).await.unwrap();
    for want in ["GET /a\n", "POST /b\n0123456789", "GET /c?q=1\n"] {
        let (status, head, body) = within(want, response(&mut s, &mut pending)).await;
        assert_eq!(status, 200, "{head}");
        assert_eq!(body, want);
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("x-activator-node: {node}\r\n")),
            "{head}"
        );
    }
    // The app's own 404 is relayed, and counted as such between 200s on one connection.
    s.write_all(request("GET", "/d", &ns, "fast", "x-sim-status: 404\r\n", "").as_bytes())
        .await
        .unwrap();
    let (status, head, _) = within("404", response(&mut s, &mut pending)).await;
    assert_eq!(status, 404, "{head}");
    // Named by its Host only: looked up (one LIST, then cached), still in the fast lane.
    for path in ["/by-host", "/by-host-again"] {
        let by_host = format!(
            "GET {path} HTTP/1.1\r\nhost: {}\r\n\r\n",
            host_of("fast", &ns)
        );
        s.write_all(by_host.as_bytes()).await.unwrap();
        let (status, head, body) = within(path, response(&mut s, &mut pending)).await;
        assert_eq!((status, body), (200, format!("GET {path}\n")), "{head}");
    }
    // A request that asks to close gets its answer, then the end of the connection.
    let head = last_request_closes(&mut s, &mut pending, &ns, "fast").await;
    assert!(head.contains("connection: close\r\n"), "{head}");
    assert_eq!(
        handovers(&c, &node),
        before,
        "warm requests by headers or by Host were handed to hyper"
    );
    assert_eq!(
        (
            warm(&c, &node, 200) - ok_before,
            warm(&c, &node, 404) - not_found_before
        ),
        (6, 1),
        "each answer counted once, by its status"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_moves_between_serving_threads_between_requests_and_loses_nothing() {
    // Two serving threads that always count as hot and the other as cool: a busy
    // connection moves at every load tick, as it would off a thread that is really hot.
    let configure: loadtest::cluster::ConfigureActivator = std::sync::Arc::new(|cfg| {
        cfg.io_threads = 2;
        cfg.thread_hot = 0.0;
        cfg.thread_cool = 1.0;
    });
    let (c, ns, (node, addr), _) = setup_with("moving", Some(configure)).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut pending = Vec::new();
    s.write_all(request("GET", "/first", &ns, "moving", "", "").as_bytes())
        .await
        .unwrap();
    let (status, _, _) = within("first", response(&mut s, &mut pending)).await;
    assert_eq!(status, 200);
    // A new connection: the first request may have been the one handed to hyper.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let moved = || metrics_of(&c, &node).moved_off_hot_thread.get();
    let (moved_before, ok_before, handed_before) =
        (moved(), warm(&c, &node, 200), handovers(&c, &node));
    // Requests one after another, each with a body, until the connection moved twice.
    let mut sent = 0u64;
    within("two moves", async {
        while moved() < moved_before + 2 {
            let body = format!("body {sent}");
            s.write_all(request("POST", "/m", &ns, "moving", "", &body).as_bytes())
                .await
                .unwrap();
            let (status, head, got) = response(&mut s, &mut pending).await;
            assert_eq!((status, got), (200, format!("POST /m\n{body}")), "{head}");
            sent += 1;
        }
    })
    .await;
    // A last request that closes the connection: its end comes after the activator counted
    // every answer (a response can reach the client before its count is made).
    last_request_closes(&mut s, &mut pending, &ns, "moving").await;
    assert_eq!(
        warm(&c, &node, 200) - ok_before,
        sent + 1,
        "an answer lost or doubled"
    );
    assert_eq!(
        handovers(&c, &node),
        handed_before,
        "a moved connection left the fast lane"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_fast_lane_does_not_carry_is_served_by_hyper_on_the_same_connection() {
    let (c, ns, (node, addr), (outsider, outsider_addr)) = setup("handover").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut pending = Vec::new();
    s.write_all(request("GET", "/warm", &ns, "handover", "", "").as_bytes())
        .await
        .unwrap();
    let (status, _, _) = within("warm", response(&mut s, &mut pending)).await;
    assert_eq!(status, 200);
    let before = handovers(&c, &node);

    // A chunked request body is hyper's: the same connection goes on with it.
    let chunked = format!(
        "POST /chunked HTTP/1.1\r\nhost: app\r\nx-revision-namespace: {ns}\r\n\
         x-revision-name: handover\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    );
    s.write_all(chunked.as_bytes()).await.unwrap();
    let (status, _, body) = within("chunked", response(&mut s, &mut pending)).await;
    assert_eq!((status, body.as_str()), (200, "POST /chunked\nabc"));
    assert_eq!(handovers(&c, &node), before + 1);
    s.write_all(request("GET", "/after", &ns, "handover", "", "").as_bytes())
        .await
        .unwrap();
    let (status, _, body) = within("after", response(&mut s, &mut pending)).await;
    assert_eq!((status, body.as_str()), (200, "GET /after\n"));
    assert_eq!(
        handovers(&c, &node),
        before + 1,
        "one hand-over per connection"
    );

    // A node that is not a member hands the request over; hyper forwards it.
    let before = handovers(&c, &outsider);
    let mut o = TcpStream::connect(outsider_addr).await.unwrap();
    o.write_all(request("GET", "/via-peer", &ns, "handover", "", "").as_bytes())
        .await
        .unwrap();
    let (status, head, body) = within("forwarded", response(&mut o, &mut Vec::new())).await;
    assert_eq!((status, body.as_str()), (200, "GET /via-peer\n"), "{head}");
    assert_eq!(handovers(&c, &outsider), before + 1);

    // Garbage is hyper's too, and answered 400 with a short body.
    let mut g = TcpStream::connect(addr).await.unwrap();
    g.write_all(b"NOT HTTP AT ALL\r\n\r\n").await.unwrap();
    let (status, _, body) = within("garbage", response(&mut g, &mut Vec::new())).await;
    assert_eq!(status, 400);
    assert!(!body.is_empty());
    c.shutdown().await;
}
