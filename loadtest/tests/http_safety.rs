//! The activator's HTTP/1.1 in front of hostile clients and an app that misbehaves on purpose,
//! end to end over real sockets, on both request paths: the fast lane (the default) and
//! hyper's (`fast_lane: false`). Each case is one attack or fault class (request smuggling,
//! response mixing, a replayed POST, unbounded exchanges), answered here as nginx answers it, or better.
//!
//! The app is a raw-socket server bound where a real pod's app listened (kubesim stops it and
//! leaves the pod Running and Ready), writing bytes no HTTP library would, and recording
//! every request as it arrived. It splits lines on CRLF alone, as a strict app would: a head
//! the activator passed on with a bare LF reads differently to it.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use kubesim::node::Delay;
use loadtest::demo::{echo_revision, host_of, member_nodes, wait_subsets};
use loadtest::{ClusterOptions, SimCluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Notify;

/// Bound on every wait: reaching it fails the test instead of hanging it.
const LIMIT: Duration = Duration::from_secs(30);
/// Where the forged-hop client connects from (any 127/8 address is local).
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 42);

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {LIMIT:?}"))
}

/// What the app does with one request.
enum Act {
    Reply(Vec<u8>),
    /// Reads the request, then closes without a byte of answer.
    Close,
    /// Writes this, then keeps the connection open and silent.
    Hold(Vec<u8>),
    /// Writes the first bytes; when the test says `go`, writes the second on the same
    /// connection (nobody asked for them) and tells the test they are written.
    ReplyThenStray(Vec<u8>, Vec<u8>),
    /// Writes a response too large for the sockets between, and tells the test (`cut`)
    /// when the activator closed the connection before taking it all.
    ReplyUntilCut(Vec<u8>),
}

type Script = Arc<dyn Fn(&Request) -> Act + Send + Sync>;

/// A request as the app read it: head split on CRLF alone, body by its content-length.
#[derive(Debug, Clone)]
struct Request {
    /// The activator's port of the connection it came on.
    conn: u16,
    line: String,
    headers: Vec<(String, String)>,
    head: Vec<u8>,
    body: Vec<u8>,
}

impl Request {
    fn path(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or("")
    }

    fn method(&self) -> &str {
        self.line.split(' ').next().unwrap_or("")
    }

    fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// The app's 200 naming the path it answered.
fn ok(path: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}",
        path.len()
    )
    .into_bytes()
}

struct App {
    seen: Arc<Mutex<Vec<Request>>>,
    go: Arc<Notify>,
    stray_written: Arc<Notify>,
    cut: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl App {
    fn start(l: TcpListener, script: Script) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (go, stray_written) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let cut = Arc::new(Notify::new());
        let task = tokio::spawn({
            let (seen, go, stray_written) = (seen.clone(), go.clone(), stray_written.clone());
            let cut = cut.clone();
            async move {
                let mut held = Vec::new();
                while let Ok((s, _)) = l.accept().await {
                    let signals = Signals {
                        go: go.clone(),
                        stray_written: stray_written.clone(),
                        cut: cut.clone(),
                    };
                    let conn = serve_conn(s, script.clone(), seen.clone(), signals);
                    held.push(tokio::spawn(conn));
                }
            }
        });
        Self {
            seen,
            go,
            stray_written,
            cut,
            task,
        }
    }

    fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How the app and the test tell each other where a scripted exchange is.
struct Signals {
    go: Arc<Notify>,
    stray_written: Arc<Notify>,
    cut: Arc<Notify>,
}

async fn serve_conn(
    mut s: TcpStream,
    script: Script,
    seen: Arc<Mutex<Vec<Request>>>,
    signals: Signals,
) {
    // Each write goes out at once: with Nagle's algorithm on, the stray answer would wait in
    // this socket for the ACK of the one before it, and "written" would not mean "sent".
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    let port = s.peer_addr().map(|a| a.port()).unwrap_or(0);
    while let Some(mut req) = read_request(&mut s, &mut buf).await {
        req.conn = port;
        seen.lock().unwrap().push(req.clone());
        match script(&req) {
            Act::Reply(b) => {
                if s.write_all(&b).await.is_err() {
                    return;
                }
            }
            Act::Close => return,
            Act::Hold(b) => {
                let _ = s.write_all(&b).await;
                std::future::pending::<()>().await;
            }
            Act::ReplyThenStray(first, stray) => {
                let _ = s.write_all(&first).await;
                signals.go.notified().await;
                let _ = s.write_all(&stray).await;
                signals.stray_written.notify_one();
            }
            Act::ReplyUntilCut(big) => {
                if s.write_all(&big).await.is_err() {
                    signals.cut.notify_one();
                }
                return;
            }
        }
    }
}

/// One request, read as a strict app would: lines end in CRLF, nothing else.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head: Vec<u8> = buf.drain(..end).collect();
    let text = String::from_utf8_lossy(&head[..end - 4]).into_owned();
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_string(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < length {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = buf.drain(..length).collect();
    Some(Request {
        conn: 0,
        line,
        headers,
        head,
        body,
    })
}

/// One revision whose only pod is served by a scripted raw app, behind one member activator.
struct Rig {
    c: SimCluster,
    ns: String,
    name: String,
    member: SocketAddr,
    app: App,
}

async fn rig(name: &str, fast: bool, timeout_seconds: Option<i64>, script: Script) -> Rig {
    rig_with(name, fast, timeout_seconds, None, script).await
}

/// [`rig`], with the activators' body idle timeout set.
async fn rig_with(
    name: &str,
    fast: bool,
    timeout_seconds: Option<i64>,
    body_idle: Option<Duration>,
    script: Script,
) -> Rig {
    let ns = format!("http-safety-{:08x}", rand::random::<u32>());
    let configure: loadtest::cluster::ConfigureActivator = Arc::new(move |cfg| {
        cfg.fast_lane = fast;
        if let Some(idle) = body_idle {
            cfg.body_idle_timeout = idle;
        }
    });
    let c = SimCluster::start(ClusterOptions {
        nodes: 3,
        start_delay: Delay::fixed_ms(20),
        default_activators: 2,
        revision_namespace: Some(ns.clone()),
        configure_activator: Some(configure),
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    c.ensure_own_namespace(&ns).await.unwrap();
    let mut rev = echo_revision(name, &ns, vec![host_of(name, &ns)]);
    if let Some(t) = timeout_seconds {
        rev.spec.timeout_seconds = t;
    }
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    api.create(&PostParams::default(), &rev).await.unwrap();
    wait_subsets(&c.client, &ns, &[name.to_string()], LIMIT)
        .await
        .unwrap();
    let members = member_nodes(&c.client, &ns, name).await.unwrap();
    let (node, member) = c
        .entries()
        .into_iter()
        .find(|(n, _)| *n == members[0])
        .unwrap();
    // A cold start through the member, by the real app; then the pod's address is ours.
    let mut s = TcpStream::connect(member).await.unwrap();
    s.write_all(req("GET", "/cold", &ns, name, "", "").as_bytes())
        .await
        .unwrap();
    let r = within("cold start", read_response(&mut s, &mut Vec::new())).await;
    assert_eq!(r.status, 200, "{}", r.head);
    let sim = c.fleet.node(&node).unwrap();
    let pod = sim
        .pods()
        .into_iter()
        .find(|p| p.namespace == ns && p.app_addr.is_some())
        .expect("the cold start's pod runs on the member");
    let addr = sim.take_over_app(&ns, &pod.name).await.unwrap();
    let l = TcpListener::bind(addr).await.unwrap();
    let rig = Rig {
        c,
        ns,
        name: name.to_string(),
        member,
        app: App::start(l, script),
    };
    // The activator still pools the connection the cold start used, which the real app's
    // stop cut. A GET finds it dead (and goes again on a fresh one: idempotent, no answer),
    // so each case starts on a live connection to the scripted app. A POST on it would be a
    // 502 on either path, rightly (the app may have read it): a race no proxy can close.
    let mut s = TcpStream::connect(member).await.unwrap();
    s.write_all(rig.req("GET", "/rig-ready", "", "").as_bytes())
        .await
        .unwrap();
    let r = within(
        "the scripted app answers",
        read_response(&mut s, &mut Vec::new()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    rig
}

/// A client connection to the member, and what it read past the last response.
struct Client {
    s: TcpStream,
    pending: Vec<u8>,
}

impl Client {
    /// Sends `request` and reads the response to it.
    async fn ask(&mut self, what: &str, request: &str) -> Response {
        self.s.write_all(request.as_bytes()).await.unwrap();
        within(what, read_response(&mut self.s, &mut self.pending)).await
    }
}

impl Rig {
    async fn client(&self) -> Client {
        Client {
            s: TcpStream::connect(self.member).await.unwrap(),
            pending: Vec::new(),
        }
    }

    /// A request head with exactly the framing headers in `extra` (none added).
    fn head(&self, method: &str, path: &str, extra: &str) -> String {
        format!(
            "{method} {path} HTTP/1.1\r\nhost: app\r\nx-revision-namespace: {}\r\n\
             x-revision-name: {}\r\n{extra}\r\n",
            self.ns, self.name
        )
    }

    fn req(&self, method: &str, path: &str, extra: &str, body: &str) -> String {
        req(method, path, &self.ns, &self.name, extra, body)
    }

    /// A plain request on a new connection still gets the app's answer: the activator
    /// keeps serving after whatever came before.
    async fn still_serves(&self) {
        let mut s = TcpStream::connect(self.member).await.unwrap();
        s.write_all(self.req("GET", "/still", "", "").as_bytes())
            .await
            .unwrap();
        let r = within("still serving", read_response(&mut s, &mut Vec::new())).await;
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, &b"/still"[..]),
            "{}{}",
            r.head,
            String::from_utf8_lossy(&r.body)
        );
    }
}

fn req(method: &str, path: &str, ns: &str, name: &str, extra: &str, body: &str) -> String {
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

/// A response as a strict client reads it.
#[derive(Debug)]
struct Response {
    status: u16,
    head: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Reads one response: framed by content-length, chunked (CRLF only) or the end of the
/// connection. Panics on a response a strict client cannot frame.
async fn read_response(s: &mut TcpStream, pending: &mut Vec<u8>) -> Response {
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
    let head = String::from_utf8_lossy(&pending[..end]).into_owned();
    pending.drain(..end);
    let status: u16 = head[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = head
        .trim_end()
        .split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_string(), v.trim().to_string()))
        .collect();
    let find = |name: &str| {
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    };
    let te = find("transfer-encoding");
    let cl = find("content-length");
    assert!(
        te.is_empty() || cl.is_empty(),
        "a response with both framing headers: {head}"
    );
    let mut fill = async |pending: &mut Vec<u8>| -> bool {
        let n = s.read(&mut chunk).await.unwrap_or(0);
        pending.extend_from_slice(&chunk[..n]);
        n > 0
    };
    let body = if status == 204 || status == 304 || status < 200 {
        Vec::new()
    } else if te
        .iter()
        .any(|v| v.to_ascii_lowercase().ends_with("chunked"))
    {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(i) = pending.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                assert!(fill(pending).await, "closed inside a chunk size: {head}");
            };
            let size_text = String::from_utf8_lossy(&pending[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
                .unwrap_or_else(|_| panic!("bad chunk size {size_text:?}"));
            pending.drain(..line_end + 2);
            if size == 0 {
                while !pending.starts_with(b"\r\n") {
                    assert!(fill(pending).await, "closed before the end of chunks");
                }
                pending.drain(..2);
                break body;
            }
            while pending.len() < size + 2 {
                assert!(fill(pending).await, "closed inside a chunk");
            }
            assert_eq!(
                &pending[size..size + 2],
                b"\r\n",
                "chunk data not ended by CRLF"
            );
            body.extend(pending.drain(..size));
            pending.drain(..2);
        }
    } else if let Some(n) = cl.first() {
        let n: usize = n.parse().expect("a numeric content-length");
        while pending.len() < n {
            assert!(fill(pending).await, "closed inside a body: {head}");
        }
        pending.drain(..n).collect()
    } else {
        while fill(pending).await {}
        std::mem::take(pending)
    };
    Response {
        status,
        head,
        headers,
        body,
    }
}

/// Everything until the connection ends.
async fn read_to_end(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got).await;
    got
}

fn answer_paths() -> Script {
    Arc::new(|r: &Request| Act::Reply(ok(r.path())))
}

/// Each case, once per request path.
macro_rules! on_both_paths {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn fast_lane() {
                super::$case(true).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hyper_path() {
                super::$case(false).await
            }
        }
    )*};
}

on_both_paths!(
    a_length_near_2_to_the_64_is_a_400,
    a_length_after_unicode_whitespace_is_a_400,
    a_head_of_bare_lf_reaches_the_app_with_crlf,
    a_header_hidden_behind_a_bare_lf_is_not_smuggled,
    a_forged_hop_neither_hides_the_client_nor_reaches_the_app,
    a_post_the_pod_may_have_read_is_never_sent_twice,
    a_response_with_both_framing_headers_loses_its_length,
    connection_cannot_remove_a_responses_length,
    bytes_the_app_wrote_after_a_response_never_reach_another_client,
    a_response_body_that_stalls_is_cut_at_the_revisions_timeout,
    a_chunked_body_with_bare_lf_is_not_passed_on,
    a_client_that_stops_reading_is_disconnected,
);

async fn a_length_near_2_to_the_64_is_a_400(fast: bool) {
    let r = rig("huge", fast, None, answer_paths()).await;
    let mut s = TcpStream::connect(r.member).await.unwrap();
    let bad = r.head("POST", "/huge", "content-length: 18446744073709551610\r\n");
    s.write_all(format!("{bad}0123456789").as_bytes())
        .await
        .unwrap();
    let resp = within("answer", read_response(&mut s, &mut Vec::new())).await;
    assert_eq!(resp.status, 400, "{}", resp.head);
    assert!(!resp.body.is_empty(), "a 400 says why");
    assert!(r.app.seen().iter().all(|q| q.path() != "/huge"));
    r.still_serves().await;
    r.c.shutdown().await;
}

async fn a_length_after_unicode_whitespace_is_a_400(fast: bool) {
    let r = rig("nbsp", fast, None, answer_paths()).await;
    let mut s = TcpStream::connect(r.member).await.unwrap();
    let bad = r.head("POST", "/nbsp", "content-length: \u{a0}5\r\n");
    s.write_all(format!("{bad}hello").as_bytes()).await.unwrap();
    let resp = within("answer", read_response(&mut s, &mut Vec::new())).await;
    assert_eq!(resp.status, 400, "{}", resp.head);
    assert!(r.app.seen().iter().all(|q| q.path() != "/nbsp"));
    r.still_serves().await;
    r.c.shutdown().await;
}

async fn a_head_of_bare_lf_reaches_the_app_with_crlf(fast: bool) {
    let r = rig("lf", fast, None, answer_paths()).await;
    let mut s = TcpStream::connect(r.member).await.unwrap();
    let lf = r.req("GET", "/lf", "", "").replace("\r\n", "\n");
    s.write_all(lf.as_bytes()).await.unwrap();
    let resp = within("answer", read_response(&mut s, &mut Vec::new())).await;
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"/lf"[..]));
    let seen = r.app.seen();
    let got = seen
        .iter()
        .find(|q| q.path() == "/lf")
        .expect("the app got it");
    assert_eq!(got.line, "GET /lf HTTP/1.1");
    assert!(
        !got.head.windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r'),
        "a bare LF reached the app: {:?}",
        String::from_utf8_lossy(&got.head)
    );
    r.c.shutdown().await;
}

async fn a_header_hidden_behind_a_bare_lf_is_not_smuggled(fast: bool) {
    let r = rig("smuggle", fast, None, answer_paths()).await;
    let mut s = TcpStream::connect(r.member).await.unwrap();
    // The activator may read `content-length: 10` here; an app splitting on CRLF alone
    // reads one header `x: a\ncontent-length: 10`. Passed on as it came, the 10 bytes
    // would be the next request on a pod connection shared by every client.
    let smuggle = r.head("POST", "/outer", "x: a\ncontent-length: 10\r\n");
    s.write_all(format!("{smuggle}GET /x HTT").as_bytes())
        .await
        .unwrap();
    let resp = within("answer", read_response(&mut s, &mut Vec::new())).await;
    if resp.status == 200 {
        let seen = r.app.seen();
        let outer = seen
            .iter()
            .find(|q| q.path() == "/outer")
            .expect("the app got the request");
        // The app framed the body the activator framed: no second request from its bytes.
        assert_eq!(outer.header("content-length"), ["10"], "{outer:?}");
        assert_eq!(outer.body, b"GET /x HTT");
        assert!(seen.iter().all(|q| q.method() != "GET" || q.path() != "/x"));
    } else {
        assert_eq!(resp.status, 400, "{}", resp.head);
    }
    r.still_serves().await;
    let seen = r.app.seen();
    assert!(seen.iter().all(|q| q.path() != "/x"), "smuggled: {seen:?}");
    r.c.shutdown().await;
}

async fn a_forged_hop_neither_hides_the_client_nor_reaches_the_app(fast: bool) {
    let r = rig("hop", fast, None, answer_paths()).await;
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from((CLIENT_IP, 0))).unwrap();
    let mut s = sock.connect(r.member).await.unwrap();
    let forged = r.req(
        "GET",
        "/forged",
        "x-activator-hop: evil\r\nx-activator-hop-proof: guess\r\nx-forwarded-for: 6.6.6.6\r\n",
        "",
    );
    s.write_all(forged.as_bytes()).await.unwrap();
    let resp = within("answer", read_response(&mut s, &mut Vec::new())).await;
    assert_eq!(resp.status, 200, "{}", resp.head);
    let seen = r.app.seen();
    let got = seen.iter().find(|q| q.path() == "/forged").unwrap();
    assert_eq!(
        got.header("x-forwarded-for"),
        ["6.6.6.6, 127.0.0.42"],
        "the real peer is appended: {got:?}"
    );
    assert!(
        got.header("forwarded")
            .iter()
            .any(|f| f.starts_with("for=127.0.0.42")),
        "{got:?}"
    );
    assert!(got.header("x-activator-hop").is_empty(), "{got:?}");
    assert!(got.header("x-activator-hop-proof").is_empty(), "{got:?}");
    r.c.shutdown().await;
}

async fn a_post_the_pod_may_have_read_is_never_sent_twice(fast: bool) {
    // The app answers a GET, then reads a POST on the same (pooled) connection and closes
    // without answering: nobody can know whether it acted on the POST.
    let script: Script = Arc::new(|r: &Request| match r.method() {
        "POST" => Act::Close,
        _ => Act::Reply(ok(r.path())),
    });
    let r = rig("replay", fast, None, script).await;
    let mut s = r.client().await;
    let resp = s.ask("GET", &r.req("GET", "/one", "", "")).await;
    assert_eq!(resp.status, 200);
    let resp = s.ask("POST", &r.req("POST", "/pay", "", "x")).await;
    assert_eq!(resp.status, 502, "{}", resp.head);
    let posts = r.app.seen().iter().filter(|q| q.method() == "POST").count();
    assert_eq!(posts, 1, "the POST reached the app {posts} times");
    r.still_serves().await;
    let posts = r.app.seen().iter().filter(|q| q.method() == "POST").count();
    assert_eq!(posts, 1, "the POST was sent again later");
    r.c.shutdown().await;
}

async fn a_response_with_both_framing_headers_loses_its_length(fast: bool) {
    let script: Script = Arc::new(|r: &Request| match r.path() {
        "/both" => Act::Reply(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        ),
        p => Act::Reply(ok(p)),
    });
    let r = rig("both", fast, None, script).await;
    let mut s = r.client().await;
    // read_response refuses a head with both.
    let resp = s.ask("both", &r.req("GET", "/both", "", "")).await;
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"hello"[..]));
    assert!(resp.header("content-length").is_empty(), "{}", resp.head);
    // The connection is in step: the next answer is the next request's.
    let resp = s.ask("after", &r.req("GET", "/after", "", "")).await;
    assert_eq!(resp.body, b"/after");
    r.c.shutdown().await;
}

async fn connection_cannot_remove_a_responses_length(fast: bool) {
    let script: Script = Arc::new(|r: &Request| match r.path() {
        "/named" => Act::Reply(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: content-length\r\n\r\nhello"
                .to_vec(),
        ),
        p => Act::Reply(ok(p)),
    });
    let r = rig("named", fast, None, script).await;
    let mut s = r.client().await;
    let resp = s.ask("named", &r.req("GET", "/named", "", "")).await;
    let framed = resp.header("content-length") == ["5"]
        || resp
            .header("transfer-encoding")
            .iter()
            .any(|v| v.ends_with("chunked"));
    assert!(framed, "an unframed keep-alive response: {}", resp.head);
    assert_eq!(resp.body, b"hello");
    let resp = s.ask("after", &r.req("GET", "/after", "", "")).await;
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"/after"[..]));
    r.c.shutdown().await;
}

async fn bytes_the_app_wrote_after_a_response_never_reach_another_client(fast: bool) {
    let script: Script = Arc::new(|r: &Request| match r.path() {
        "/204" => Act::ReplyThenStray(
            b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray".to_vec(),
        ),
        p => Act::Reply(ok(p)),
    });
    let r = rig("stray", fast, None, script).await;
    let mut a = r.client().await;
    let resp = a.ask("204", &r.req("GET", "/204", "", "")).await;
    assert_eq!(resp.status, 204);
    // The app now writes a whole response on that pod connection, which nobody asked for.
    r.app.go.notify_one();
    within("stray written", r.app.stray_written.notified()).await;
    let mut b = r.client().await;
    let resp = b
        .ask("another client", &r.req("GET", "/mine", "", ""))
        .await;
    assert_eq!(
        (resp.status, String::from_utf8_lossy(&resp.body).as_ref()),
        (200, "/mine"),
        "another client got bytes the app wrote for someone else: {:?}",
        r.app
            .seen()
            .iter()
            .map(|q| (q.conn, q.line.clone()))
            .collect::<Vec<_>>()
    );
    r.c.shutdown().await;
}

async fn a_response_body_that_stalls_is_cut_at_the_revisions_timeout(fast: bool) {
    let script: Script = Arc::new(|r: &Request| match r.path() {
        "/stall" => Act::Hold(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789".to_vec()),
        p => Act::Reply(ok(p)),
    });
    // timeoutSeconds 2, body idle timeout 30 s: the revision's timeout cuts it.
    let r = rig("stall", fast, Some(2), script).await;
    let mut s = TcpStream::connect(r.member).await.unwrap();
    s.write_all(r.req("GET", "/stall", "", "").as_bytes())
        .await
        .unwrap();
    let got = within("the connection closes", read_to_end(&mut s)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("0123456789"), "{text}");
    r.still_serves().await;
    r.c.shutdown().await;
}

async fn a_chunked_body_with_bare_lf_is_not_passed_on(fast: bool) {
    let script: Script = Arc::new(|r: &Request| match r.path() {
        "/lf-chunks" => Act::Reply(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n".to_vec(),
        ),
        p => Act::Reply(ok(p)),
    });
    let r = rig("lfchunks", fast, None, script).await;
    let mut s = TcpStream::connect(r.member).await.unwrap();
    s.write_all(r.req("GET", "/lf-chunks", "", "").as_bytes())
        .await
        .unwrap();
    // Whatever went out before the bad bytes were seen, the connection ends without a
    // message a client could take as whole (nor one framed differently from the app's).
    let got = within("the connection closes", read_to_end(&mut s)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(!text.contains("hello"), "{text:?}");
    r.still_serves().await;
    r.c.shutdown().await;
}

async fn a_client_that_stops_reading_is_disconnected(fast: bool) {
    // More than loopback's socket buffers hold between the app and a client that stops.
    const BIG: usize = 64 << 20;
    let script: Script = Arc::new(|r: &Request| match r.path() {
        "/big" => {
            let mut b = format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\n\r\n").into_bytes();
            b.resize(b.len() + BIG, b'x');
            Act::ReplyUntilCut(b)
        }
        p => Act::Reply(ok(p)),
    });
    // The revision's timeout (300 s by default) is far off: the body idle timeout cuts it.
    let r = rig_with(
        "slowreader",
        fast,
        None,
        Some(Duration::from_secs(1)),
        script,
    )
    .await;
    let mut s = TcpStream::connect(r.member).await.unwrap();
    s.write_all(r.req("GET", "/big", "", "").as_bytes())
        .await
        .unwrap();
    // The client reads nothing; the activator gives up on it and lets the app go.
    within("the activator cuts the exchange", r.app.cut.notified()).await;
    let got = within("the connection closes", read_to_end(&mut s)).await;
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        &got[..got.len().min(64)]
    );
    assert!(got.len() < BIG, "the whole body arrived: nothing was cut");
    r.still_serves().await;
    r.c.shutdown().await;
}
