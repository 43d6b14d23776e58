//! Protocols and bad input through the activators, end to end: subsetter + one activator per
//! node + kubesim's simulated nodes in this process, real HTTP over loopback sockets.
//!
//! Upgrades (a websocket-style echo), h2c, gRPC-style HTTP/2 with trailers for a port named
//! `h2c`, streaming bodies both ways, the forwarding headers the app sees, a stalled request
//! body answered 408, and the activator's short answers to requests it cannot serve.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use activator::ActivatorConfig;
use activator::upstream::proxy::{Upstream, UpstreamProtocol};
use activator::wire::answer::full;
use bytes::Bytes;
use crds::contract::{HEADER_REVISION_NAME, HEADER_REVISION_NAMESPACE, REVISION_LABEL};
use futures::SinkExt;
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use kubesim::node::{AppStats, Delay};
use loadtest::demo::{echo_revision, host_of, member_nodes, wait_subsets};
use loadtest::{ClusterOptions, SimCluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Bound on every wait: reaching it fails the test instead of hanging it.
const LIMIT: Duration = Duration::from_secs(30);
/// The body idle timeout of the activators the stalled-body test restarts.
const SHORT_BODY_IDLE: Duration = Duration::from_millis(500);
/// Where the forwarding test's client connects from (any 127/8 address is local).
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 42);

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {LIMIT:?}"))
}

type Configure = Arc<dyn Fn(&mut ActivatorConfig) + Send + Sync>;

/// 3 nodes, revisions on 2 of them: every revision has a non-member to forward from.
async fn cluster() -> (SimCluster, String) {
    cluster_with(None).await
}

async fn cluster_with(configure_activator: Option<Configure>) -> (SimCluster, String) {
    let ns = format!("protocols-test-{:08x}", rand::random::<u32>());
    let c = SimCluster::start(ClusterOptions {
        nodes: 3,
        start_delay: Delay::fixed_ms(50),
        default_activators: 2,
        revision_namespace: Some(ns.clone()),
        configure_activator,
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    c.ensure_own_namespace(&ns).await.unwrap();
    (c, ns)
}

/// Where requests for a revision can enter: a member, and a non-member that forwards. Requests
/// name the revision with the ingress headers, and carry its host for the app to see.
struct Entries {
    host: String,
    namespace: String,
    name: String,
    member: (String, SocketAddr),
    outsider: (String, SocketAddr),
}

/// Creates the echo revision `name`, its container port named `port_name`.
async fn revision(c: &SimCluster, ns: &str, name: &str, port_name: &str) -> Entries {
    let mut rev = serde_json::to_value(echo_revision(name, ns, vec![host_of(name, ns)])).unwrap();
    rev["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = port_name.into();
    let rev: crds::Revision = serde_json::from_value(rev).unwrap();
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), ns);
    api.create(&PostParams::default(), &rev).await.unwrap();
    wait_subsets(&c.client, ns, &[name.to_string()], LIMIT)
        .await
        .unwrap();
    let members = member_nodes(&c.client, ns, name).await.unwrap();
    let entries = c.entries();
    let member = entries
        .iter()
        .find(|(n, _)| *n == members[0])
        .unwrap()
        .clone();
    let outsider = entries
        .iter()
        .find(|(n, _)| !members.contains(n))
        .expect("3 nodes, 2 members")
        .clone();
    Entries {
        host: host_of(name, ns),
        namespace: ns.to_string(),
        name: name.to_string(),
        member,
        outsider,
    }
}

/// The counters of the revision's pods (a forwarded request may land on either member's).
async fn apps_of(c: &SimCluster, ns: &str, rev: &str) -> Vec<Arc<AppStats>> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    pods.list(&ListParams::default().labels(&format!("{REVISION_LABEL}={rev}")))
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| {
            c.fleet
                .app_stats(ns, &p.name_any())
                .expect("the pod's app runs on a simulated node")
        })
        .collect()
}

fn h1_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn h2_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

async fn connect_from(src: Ipv4Addr, dst: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((src, 0))).unwrap();
    s.connect(dst).await.unwrap()
}

/// Reads a response head through its blank line; returns it and the bytes read past it.
async fn read_head(s: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return (String::from_utf8_lossy(&buf).into_owned(), rest);
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "closed before a full head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Everything the server sends until it closes the connection.
async fn read_until_closed(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

async fn text(resp: Response<Incoming>) -> String {
    String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned()
}

impl Entries {
    /// A request for the revision: its host, and the headers naming it.
    fn request(&self, method: &str, uri: &str) -> http::request::Builder {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::HOST, &self.host)
            .header(HEADER_REVISION_NAMESPACE, &self.namespace)
            .header(HEADER_REVISION_NAME, &self.name)
    }

    /// The same head lines, for requests written by hand.
    fn raw_head(&self) -> String {
        format!(
            "Host: {}\r\n{HEADER_REVISION_NAMESPACE}: {}\r\n{HEADER_REVISION_NAME}: {}\r\n",
            self.host, self.namespace, self.name
        )
    }

    fn get(&self, addr: SocketAddr, path: &str) -> Request<Full<Bytes>> {
        self.request("GET", &format!("http://{addr}{path}"))
            .body(Full::default())
            .unwrap()
    }
}

/// A request naming its revision by Host only.
fn get_host(addr: SocketAddr, host: &str, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}{path}"))
        .header(http::header::HOST, host)
        .body(Full::default())
        .unwrap()
}

/// Sends an upgrade request on a raw connection, checks the 101, then checks the tunnel echoes.
async fn upgrade_and_echo(entry: SocketAddr, e: &Entries) {
    let mut s = TcpStream::connect(entry).await.unwrap();
    let req = format!(
        "GET /chat HTTP/1.1\r\n{}Connection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        e.raw_head()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let (head, rest) = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");
    assert!(rest.is_empty(), "nothing before the client speaks");
    // Two round trips: the tunnel carries bytes both ways for as long as it is open.
    for msg in [&b"hello through the tunnel"[..], b"\x00\x01binary\xff"] {
        s.write_all(msg).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg);
    }
    // Closing our side ends the app's echo, which closes the tunnel back to us.
    s.shutdown().await.unwrap();
    let mut tail = Vec::new();
    s.read_to_end(&mut tail).await.unwrap();
    assert!(tail.is_empty(), "{tail:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_is_tunnelled_through_a_member_and_through_a_forwarding_peer() {
    let (c, ns) = cluster().await;
    let e = revision(&c, &ns, "ws", "http").await;
    // The first one waits for the pod's cold start, then switches.
    within("upgrade via a member", upgrade_and_echo(e.member.1, &e)).await;
    within(
        "upgrade via a non-member",
        upgrade_and_echo(e.outsider.1, &e),
    )
    .await;
    // Each reached the app as an upgrade; the EOFs above show each tunnel closed end to end.
    let apps = apps_of(&c, &ns, "ws").await;
    assert_eq!(apps.iter().map(|a| a.upgrades()).sum::<u64>(), 2);
    c.shutdown().await;
}

/// The member's requests holding a slot on a pod now.
fn in_flight(c: &SimCluster, node: &str) -> i64 {
    c.activators
        .iter()
        .find(|a| a.node == node)
        .expect("an activator on the node")
        .activator
        .metrics()
        .in_flight
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_upgrade_holds_its_pod_slot_until_the_tunnel_closes() {
    let (c, ns) = cluster().await;
    let e = revision(&c, &ns, "ws-slot", "http").await;
    let mut s = TcpStream::connect(e.member.1).await.unwrap();
    let req = format!(
        "GET /chat HTTP/1.1\r\n{}Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        e.raw_head()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let (head, _) = within("101", read_head(&mut s)).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    // A round trip: the tunnel is up at both ends, long after the 101 went out.
    s.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    within("echo", s.read_exact(&mut back)).await.unwrap();
    assert_eq!(&back, b"ping");
    assert_eq!(
        in_flight(&c, &e.member.0),
        1,
        "an open tunnel is a request in flight for the app: its slot is held"
    );
    s.shutdown().await.unwrap();
    let mut tail = Vec::new();
    within("tunnel closes", s.read_to_end(&mut tail))
        .await
        .unwrap();
    // No event to await for a gauge: poll it, bounded.
    within("slot freed", async {
        while in_flight(&c, &e.member.0) != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_prior_knowledge_is_served_directly_and_through_a_peer() {
    let (c, ns) = cluster().await;
    let e = revision(&c, &ns, "h2", "http").await;
    let client = h2_client();
    for (via, addr) in [&e.member, &e.outsider] {
        let resp = within(via, client.request(e.get(*addr, "/over-h2"))).await;
        let resp = resp.unwrap_or_else(|err| panic!("via {via}: {err}"));
        assert_eq!(resp.status(), StatusCode::OK, "via {via}");
        assert_eq!(
            resp.version(),
            Version::HTTP_2,
            "the activator answered in HTTP/2"
        );
        // A port not named h2c gets HTTP/1.1, whatever the client spoke.
        assert_eq!(resp.headers()["x-request-version"], "HTTP/1.1");
        assert_eq!(text(resp).await, "GET /over-h2\n");
    }
    c.shutdown().await;
}

/// A gRPC frame: uncompressed, 4-byte big-endian length, message.
fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut f = vec![0u8];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    Bytes::from(f)
}

fn grpc_request(uri: String, e: &Entries, frame: Bytes) -> Request<Full<Bytes>> {
    e.request("POST", &uri)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Full::new(frame))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_h2c_keeps_its_trailers_when_the_port_is_named_h2c() {
    let (c, ns) = cluster().await;
    let e = revision(&c, &ns, "grpc", "h2c").await;
    let client = h2_client();
    let frame = grpc_frame(b"ping");
    for (via, addr) in [&e.member, &e.outsider] {
        let uri = format!("http://{addr}/echo.Echo/Say");
        let resp = within(via, client.request(grpc_request(uri, &e, frame.clone()))).await;
        let resp = resp.unwrap_or_else(|err| panic!("via {via}: {err}"));
        assert_eq!(resp.status(), StatusCode::OK, "via {via}");
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        assert_eq!(
            resp.headers()["x-request-version"],
            "HTTP/2.0",
            "via {via}: the app was spoken to in HTTP/2"
        );
        let body = resp.into_body().collect().await.unwrap();
        let trailers = body.trailers().cloned().expect("trailers reach the client");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(body.to_bytes(), frame);
    }
    c.shutdown().await;
}

/// `Upstream::send_h2` on its own, against the simulated app: HTTP/2 to the app, the client's
/// host as `:authority`, trailers back.
#[tokio::test]
async fn send_h2_speaks_http2_to_the_app_and_keeps_trailers() {
    let block = kubesim::node::reserve::reserve_nodes(1).unwrap();
    let ip = kubesim::node::addresses::node_ip(block.first());
    let app = kubesim::node::App::start(kubesim::node::AppSpec {
        pod_name: "grpc-1".into(),
        namespace: "apps".into(),
        node_name: "node".into(),
        addr: SocketAddr::from((ip, 8080)),
        delay: Duration::ZERO,
        concurrency: None,
    })
    .await
    .unwrap();
    let any = SocketAddr::from((ip, 0));
    let upstream = Upstream::new(&ActivatorConfig::new("node", any, any).upstream());
    let frame = grpc_frame(b"hello");
    let req = Request::post("/echo.Echo/Say")
        .header(http::header::HOST, "grpc.example.test")
        .header(http::header::CONTENT_TYPE, "application/grpc+proto")
        .header(http::header::TE, "trailers")
        .header("x-sim-echo-headers", "1")
        .body(full(frame.clone()))
        .unwrap();
    let resp = within(
        "send_h2",
        upstream.send_to(UpstreamProtocol::H2c, req, app.addr(), &[], "the app"),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-request-version"], "HTTP/2.0");
    let body = resp.into_body().collect().await.unwrap();
    assert_eq!(body.trailers().unwrap()["grpc-status"], "0");
    assert_eq!(body.to_bytes(), frame);

    // The same over send (HTTP/1.1) has no trailers to lose but shows the app's view of the
    // host; here over h2, the app sees the host as :authority (hyper puts it in the URI), and
    // no Host header that could disagree with it.
    let req = Request::get("/where")
        .header(http::header::HOST, "grpc.example.test")
        .header("x-sim-echo-headers", "1")
        .body(full(Bytes::new()))
        .unwrap();
    let resp = upstream
        .send_to(UpstreamProtocol::H2c, req, app.addr(), &[], "the app")
        .await
        .unwrap();
    let echoed =
        String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned();
    assert!(!echoed.contains("\nhost:"), "{echoed}");
    assert!(
        echoed.contains("\nx-forwarded-host: grpc.example.test\n"),
        "{echoed}"
    );
    drop(app);
}

/// The `name: value` header lines the sim app echoes (`x-sim-echo-headers`).
fn echoed_headers(body: &str) -> Vec<(String, String)> {
    body.lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    h.iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_sees_forwarding_headers_added_once() {
    let (c, ns) = cluster().await;
    let e = revision(&c, &ns, "fwd", "http").await;
    for (via, addr) in [&e.member, &e.outsider] {
        let stream = connect_from(CLIENT_IP, *addr).await;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = e
            .request("GET", "/who")
            .header("x-sim-echo-headers", "1")
            // What a load balancer in front said.
            .header("x-forwarded-for", "203.0.113.7")
            .header("connection", "keep-alive, x-hop-private")
            .header("x-hop-private", "not for the app")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = within(via, send.send_request(req)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "via {via}");
        let body = text(resp).await;
        let h = echoed_headers(&body);
        // The client's address is appended once; through a peer, the peer activator's own
        // address follows it (every hop appends its real peer: a hop never hides a client).
        let xff = header(&h, "x-forwarded-for");
        let fwd = header(&h, "forwarded");
        let client_fwd = format!("for=127.0.0.42;proto=http;host={}", e.host);
        if *addr == e.member.1 {
            assert_eq!(xff, ["203.0.113.7, 127.0.0.42"], "via {via}: {body}");
            assert_eq!(fwd, [client_fwd.as_str()], "via {via}");
        } else {
            let xff: Vec<&str> = xff.iter().flat_map(|v| v.split(", ")).collect();
            assert_eq!(xff.len(), 3, "via {via}: {body}");
            assert_eq!(xff[..2], ["203.0.113.7", "127.0.0.42"], "via {via}: {body}");
            let fwd: Vec<&str> = fwd.iter().flat_map(|v| v.split(", ")).collect();
            assert_eq!(fwd.len(), 2, "via {via}: {body}");
            assert_eq!(fwd[0], client_fwd, "via {via}: {body}");
            assert!(fwd[1].starts_with("for="), "via {via}: {body}");
        }
        assert!(
            header(&h, "x-activator-hop").is_empty()
                && header(&h, "x-activator-hop-proof").is_empty(),
            "via {via}: the hop headers reached the app: {body}"
        );
        assert_eq!(header(&h, "x-forwarded-proto"), ["http"], "via {via}");
        assert_eq!(
            header(&h, "x-forwarded-host"),
            [e.host.as_str()],
            "via {via}"
        );
        assert_eq!(header(&h, "host"), [e.host.as_str()], "via {via}");
        assert!(header(&h, "x-hop-private").is_empty(), "via {via}: {body}");
    }
    c.shutdown().await;
}

/// Reads response frames into `seen` until it ends with `suffix`.
async fn read_until(body: &mut Incoming, seen: &mut String, suffix: &str) {
    while !seen.ends_with(suffix) {
        let frame = within(suffix, body.frame())
            .await
            .unwrap_or_else(|| panic!("the body ended before {suffix:?}: {seen:?}"))
            .unwrap();
        if let Ok(d) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&d));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_both_ways_without_being_buffered() {
    let (c, ns) = cluster().await;
    let e = revision(&c, &ns, "stream", "http").await;
    for (via, addr) in [&e.member, &e.outsider] {
        let stream = TcpStream::connect(*addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
        let req = e
            .request("POST", "/duplex")
            .header("x-sim-stream", "1")
            .body(StreamBody::new(rx))
            .unwrap();
        // The answer starts before the request body has ended...
        tx.send(Ok(Frame::data(Bytes::from_static(b"one;"))))
            .await
            .unwrap();
        let resp = within(via, send.send_request(req)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let mut seen = String::new();
        read_until(&mut body, &mut seen, "one;").await;
        assert_eq!(seen, "POST /duplex\none;");
        // ...and each piece comes back before the next is sent: nothing waits for the whole.
        tx.send(Ok(Frame::data(Bytes::from_static(b"two;"))))
            .await
            .unwrap();
        read_until(&mut body, &mut seen, "two;").await;
        tx.send(Ok(Frame::data(Bytes::from_static(b"three;"))))
            .await
            .unwrap();
        drop(tx);
        let rest = within(via, body.collect()).await.unwrap().to_bytes();
        seen.push_str(&String::from_utf8_lossy(&rest));
        assert_eq!(seen, "POST /duplex\none;two;three;", "via {via}");
    }
    c.shutdown().await;
}

/// `Content-Length: 100`, 3 bytes, then nothing: a 408 with a short body, and the connection
/// closed; the app's request fails (its connection was cut) rather than waiting.
async fn stall(entry: SocketAddr, e: &Entries) -> (String, Duration) {
    let mut s = TcpStream::connect(entry).await.unwrap();
    let start = Instant::now();
    let req = format!(
        "POST /upload HTTP/1.1\r\n{}Content-Length: 100\r\n\r\nabc",
        e.raw_head()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    // Read to the end: only returns once the activator closed the connection.
    let answer = read_until_closed(&mut s).await;
    (answer, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_answered_408_and_frees_both_connections() {
    let (c, ns) = cluster_with(Some(Arc::new(|cfg: &mut ActivatorConfig| {
        cfg.body_idle_timeout = SHORT_BODY_IDLE;
    })))
    .await;
    let e = revision(&c, &ns, "stall", "http").await;
    // Pods first, so the stall is about the body, not a cold start; the non-member's
    // requests stick to one member, whose pod the warm-up names.
    let mut pods = Vec::new();
    for (via, addr) in [&e.member, &e.outsider] {
        let warm = within(via, h1_client().request(e.get(*addr, "/warm")))
            .await
            .unwrap();
        assert_eq!(warm.status(), StatusCode::OK, "via {via}");
        let pod = warm.headers()["x-pod-name"].to_str().unwrap().to_string();
        pods.push(c.fleet.app_stats(&ns, &pod).expect("a simulated pod"));
    }

    for ((via, addr), app) in [&e.member, &e.outsider].into_iter().zip(&pods) {
        let failed_before = app.body_errors();
        let (answer, took) = within(via, stall(*addr, &e)).await;
        assert!(answer.starts_with("HTTP/1.1 408 "), "via {via}: {answer}");
        assert!(
            answer.ends_with("the request body sent nothing for 500 ms\n"),
            "via {via}: a short body says why: {answer}"
        );
        // The 40 s of the report were the app's and the client's connections held open;
        // this bound only says they were not.
        assert!(took < Duration::from_secs(10), "via {via}: {took:?}");
        // The app's side: its read of the body failed (the connection to it was cut), and it
        // holds no request.
        assert!(
            app.wait_for(LIMIT, |s| s.body_errors() == failed_before + 1
                && s.in_flight() == 0)
                .await,
            "via {via}: the app's request was not released: {} body errors, {} in flight",
            app.body_errors(),
            app.in_flight()
        );
    }
    // Still serving, on fresh connections.
    for (via, addr) in [&e.member, &e.outsider] {
        let resp = within(via, h1_client().request(e.get(*addr, "/after")))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "via {via}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_short_answers_and_the_activator_keeps_serving() {
    let (c, ns) = cluster().await;
    let e = revision(&c, &ns, "sturdy", "http").await;
    let addr = e.member.1;

    // Garbage: hyper's own 400, with a body saying why.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"this is not http\r\n\r\n").await.unwrap();
    let answer = within("garbage", read_until_closed(&mut s)).await;
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.ends_with("could not be parsed\n"), "{answer}");

    // More header fields than the server takes: 431, with a body.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("GET / HTTP/1.1\r\n{}", e.raw_head());
    for i in 0..200 {
        req.push_str(&format!("x-filler-{i}: {i}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let answer = within("too many headers", read_until_closed(&mut s)).await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
    assert!(answer.ends_with("too large or too many\n"), "{answer}");

    // Header values the handler refuses, and an unknown revision: the activator's own answers.
    let client = h1_client();
    let resp = within(
        "bad revision name",
        client.request(
            Request::get(format!("http://{addr}/"))
                .header("x-revision-namespace", "../etc")
                .header("x-revision-name", "x")
                .body(Full::default())
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(!text(resp).await.trim().is_empty(), "a body says why");
    let resp = within(
        "unknown host",
        client.request(get_host(addr, "nobody.example.test", "/")),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let body = text(resp).await;
    assert!(body.contains("unknown revision"), "{body}");
    assert!(body.len() < 200, "short: {body}");

    // And over HTTP/2 the activator's answers have their bodies too.
    let resp = within(
        "unknown host over h2",
        h2_client().request(get_host(addr, "nobody.example.test", "/")),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert!(text(resp).await.contains("unknown revision"));

    // The process kept serving: a normal request on a fresh connection is answered by the app.
    let resp = within("after", h1_client().request(e.get(addr, "/fine")))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(text(resp).await, "GET /fine\n");
    c.shutdown().await;
}
