//! The fast lane is an optimisation of hyper's path, so for any input the two must agree:
//! this property drives both with the same generated exchanges and compares what the app
//! received and what the client got.
//!
//! Two activators of one cluster are members of one revision, one with the fast lane (the
//! default), one with `fast_lane: false` (hyper serves every request); each has its own
//! pod, whose address a recording raw app takes over. A case is a request (a grammar of
//! methods, targets, framing and forwarding headers, line ends, whitespace, case, duplicates,
//! huge numbers, obs-fold, chunked bodies) and the app's answer to it (status, framing,
//! chunk sizes, extensions and trailers, bare LF, hop-by-hop headers, extra bytes, a close
//! after it). Each case goes through both activators on fresh client connections, at once.
//!
//! Compared, after the normalisation either path may apply (header order and name case, the
//! framing chosen for the same body, `date`, the node that served): the requests the app
//! received for the case (method, target, headers after hop-by-hop removal, body bytes, how
//! many times), and the response the client read (status, headers, body) — or, for an answer
//! the activator made itself, its status; or that the connection ended without a whole
//! response. `EQUIVALENCE_CASES` sets how many (100,000 by default); `EQUIVALENCE_SEED=<n>`
//! draws other cases than the fixed default set.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use kubesim::node::Delay;
use loadtest::demo::{echo_revision, host_of, member_nodes, wait_subsets};
use loadtest::{ClusterOptions, SimCluster};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const DEFAULT_CASES: usize = 100_000;
/// Cases in flight at once (each on both paths).
const CONCURRENCY: usize = 16;
/// A client that has read nothing new for this long calls the exchange hung.
const READ_IDLE: Duration = Duration::from_secs(5);
const LIMIT: Duration = Duration::from_secs(60);

/// One generated exchange: what the client writes (`{ID}` in the target is the case's
/// number), and what the app answers to it.
#[derive(Debug, Clone)]
struct Case {
    request: Vec<u8>,
    response: Vec<u8>,
    /// The app closes the connection after its answer.
    app_closes: bool,
}

// ---- the grammar -------------------------------------------------------------------------

fn line_end() -> impl Strategy<Value = &'static str> {
    prop_oneof![24 => Just("\r\n"), 1 => Just("\n")]
}

/// A header line (name, value) of the request, beyond the revision's.
fn request_header(body_len: usize) -> impl Strategy<Value = (String, String)> {
    let n = body_len.to_string();
    prop_oneof![
        Just(("content-length".to_string(), n.clone())),
        Just(("Content-Length".to_string(), format!(" {n} "))),
        Just(("content-length".to_string(), format!("0{n}"))),
        Just(("content-length".to_string(), format!("+{n}"))),
        Just(("content-length".to_string(), format!("{n}, {n}"))),
        Just(("content-length".to_string(), format!("\u{a0}{n}"))),
        Just((
            "content-length".to_string(),
            "18446744073709551610".to_string()
        )),
        Just((
            "content-length".to_string(),
            "9223372036854775808".to_string()
        )),
        Just(("content-length".to_string(), "-1".to_string())),
        Just(("transfer-encoding".to_string(), "chunked".to_string())),
        Just(("Transfer-Encoding".to_string(), "gzip, chunked".to_string())),
        Just(("transfer-encoding".to_string(), "chunked, gzip".to_string())),
        Just(("connection".to_string(), "close".to_string())),
        Just(("connection".to_string(), "keep-alive".to_string())),
        Just(("Connection".to_string(), "x-a, content-length".to_string())),
        Just(("connection".to_string(), "host".to_string())),
        Just(("x-a".to_string(), "1".to_string())),
        Just(("keep-alive".to_string(), "timeout=5".to_string())),
        Just(("x-forwarded-for".to_string(), "1.2.3.4".to_string())),
        Just((
            "X-Forwarded-For".to_string(),
            "1.2.3.4, 5.6.7.8".to_string()
        )),
        Just(("forwarded".to_string(), "for=1.2.3.4".to_string())),
        Just(("x-forwarded-proto".to_string(), "https".to_string())),
        Just(("x-forwarded-host".to_string(), "front.test".to_string())),
        Just(("x-activator-hop".to_string(), "evil".to_string())),
        Just(("x-activator-hop-proof".to_string(), "guess".to_string())),
        Just(("te".to_string(), "trailers".to_string())),
        Just(("te".to_string(), "gzip".to_string())),
        Just(("trailer".to_string(), "x-t".to_string())),
        Just(("proxy-connection".to_string(), "keep-alive".to_string())),
        Just(("x-spaced".to_string(), "a  b\tc".to_string())),
        Just(("x-obs-text".to_string(), "caf\u{e9}".to_string())),
        Just(("x-empty".to_string(), String::new())),
        Just(("host".to_string(), "second.test".to_string())),
        Just(("X-MiXeD-CaSe".to_string(), "V".to_string())),
    ]
}

/// A malformation spliced into a request head.
fn request_mutation() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![
        20 => Just(None),
        1 => Just(Some(" folded\r\n")),
        1 => Just(Some("no-colon\r\n")),
        1 => Just(Some("content-length : 1\r\n")),
        1 => Just(Some("x-nul: a\0b\r\n")),
        1 => Just(Some("x-cr: a\rb\r\n")),
    ]
}

fn request() -> impl Strategy<Value = Vec<u8>> {
    let method = prop_oneof![
        6 => Just("GET"),
        1 => Just("HEAD"),
        4 => Just("POST"),
        1 => Just("PUT"),
        1 => Just("DELETE"),
        1 => Just("OPTIONS"),
        1 => Just("PATCH"),
    ];
    let suffix = prop_oneof![
        Just(""),
        Just("?q=1"),
        Just("/a/b"),
        Just("?x=%20y&z"),
        Just("/%2e%2e/x"),
    ];
    let version = prop_oneof![20 => Just("HTTP/1.1"), 1 => Just("HTTP/1.0"), 1 => Just("HTTP/1.2")];
    let host = prop_oneof![Just(Some("app")), Just(Some("App.Test:8080")), Just(None)];
    let body = proptest::collection::vec(any::<u8>(), 0..24);
    (
        method,
        suffix,
        version,
        host,
        body,
        any::<bool>(),
        line_end(),
        request_mutation(),
        proptest::collection::vec((line_end(), any::<prop::sample::Index>()), 0..5),
    )
        .prop_flat_map(
            |(method, suffix, version, host, body, knative, first_end, mutation, picks)| {
                let n = picks.len();
                (
                    Just((method, suffix, version, host, body.clone(), knative)),
                    Just((first_end, mutation, picks)),
                    proptest::collection::vec(request_header(body.len()), n..=n),
                    chunking(body),
                )
            },
        )
        .prop_map(
            |(
                (method, suffix, version, host, body, knative),
                (first_end, mutation, picks),
                headers,
                chunked,
            )| {
                let mut h = format!("{method} /c/{{ID}}{suffix} {version}{first_end}");
                if let Some(host) = host {
                    h.push_str(&format!("host: {host}\r\n"));
                }
                let (ns, name) = if knative {
                    ("knative-serving-namespace", "Knative-Serving-Revision")
                } else {
                    ("x-revision-namespace", "X-Revision-Name")
                };
                h.push_str(&format!("{ns}: {{NS}}\r\n{name}: {{NAME}}\r\n"));
                let mut te = false;
                let mut cl = false;
                for ((end, _), (name, value)) in picks.iter().zip(&headers) {
                    te |= name.eq_ignore_ascii_case("transfer-encoding");
                    cl |= name.eq_ignore_ascii_case("content-length");
                    h.push_str(&format!("{name}: {value}{end}"));
                }
                if let Some(m) = mutation {
                    h.push_str(m);
                }
                h.push_str("\r\n");
                let mut bytes = h.into_bytes();
                // The body as its declared framing says (a chunked body whatever the
                // lengths say, when both are declared: the transfer coding wins).
                if te {
                    bytes.extend_from_slice(&chunked);
                } else if cl || method != "GET" {
                    bytes.extend_from_slice(&body);
                }
                bytes
            },
        )
}

/// `body` chunked: in pieces, sizes with or without extensions, trailers, a bare LF.
fn chunking(body: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(1usize..8, 0..6),
        prop_oneof![
            8 => Just(""),
            1 => Just(";ext=1"),
            1 => Just(" ;a=\"q q\""),
            1 => Just("\t"),
        ],
        prop_oneof![8 => Just(""), 1 => Just("x-t: 1\r\n")],
        prop_oneof![12 => Just("\r\n"), 1 => Just("\n")],
    )
        .prop_map(move |(cuts, ext, trailer, end)| {
            let mut out = Vec::new();
            let mut at = 0;
            for c in cuts {
                if at >= body.len() {
                    break;
                }
                let to = (at + c).min(body.len());
                out.extend_from_slice(format!("{:x}{ext}{end}", to - at).as_bytes());
                out.extend_from_slice(&body[at..to]);
                out.extend_from_slice(end.as_bytes());
                at = to;
            }
            if at < body.len() {
                out.extend_from_slice(format!("{:X}{end}", body.len() - at).as_bytes());
                out.extend_from_slice(&body[at..]);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(format!("0{end}{trailer}\r\n").as_bytes());
            out
        })
}

fn response_header(body_len: usize) -> impl Strategy<Value = (String, String)> {
    let n = body_len.to_string();
    prop_oneof![
        Just(("content-length".to_string(), n.clone())),
        Just(("Content-Length".to_string(), format!(" {n}"))),
        Just(("content-length".to_string(), format!("{n}, {n}"))),
        Just(("content-length".to_string(), format!("+{n}"))),
        Just(("content-length".to_string(), format!("\u{a0}{n}"))),
        Just(("transfer-encoding".to_string(), "chunked".to_string())),
        Just(("Transfer-Encoding".to_string(), "gzip, chunked".to_string())),
        Just(("transfer-encoding".to_string(), "gzip".to_string())),
        Just(("connection".to_string(), "close".to_string())),
        Just(("connection".to_string(), "keep-alive".to_string())),
        Just(("connection".to_string(), "content-length".to_string())),
        Just(("Connection".to_string(), "x-b".to_string())),
        Just(("x-b".to_string(), "hop".to_string())),
        Just(("keep-alive".to_string(), "timeout=5".to_string())),
        Just(("content-type".to_string(), "text/plain".to_string())),
        Just(("content-type".to_string(), "text/event-stream".to_string())),
        Just(("trailer".to_string(), "x-t".to_string())),
        Just(("upgrade".to_string(), "h2c".to_string())),
        Just(("x-activator-node".to_string(), "app-said".to_string())),
        Just(("x-app".to_string(), "a  b".to_string())),
        Just(("X-App-Case".to_string(), "dup".to_string())),
    ]
}

fn response() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let status = prop_oneof![
        12 => Just("200 OK"),
        1 => Just("201 Created"),
        1 => Just("204 No Content"),
        1 => Just("304 Not Modified"),
        2 => Just("404 Not Found"),
        1 => Just("500 Oops"),
        1 => Just("200"),
    ];
    let version = prop_oneof![12 => Just("HTTP/1.1"), 1 => Just("HTTP/1.0")];
    let early = prop_oneof![10 => Just(false), 1 => Just(true)];
    let body = proptest::collection::vec(any::<u8>(), 0..24);
    let mutation = prop_oneof![
        16 => Just(None),
        1 => Just(Some(" folded\r\n")),
        1 => Just(Some("bad header\r\n")),
        1 => Just(Some("x-lf: 1\n")),
    ];
    let extra = prop_oneof![12 => Just(&b""[..]), 1 => Just(&b"HTTP/1.1 200 OK\r\n\r\n"[..])];
    (
        status,
        version,
        early,
        body,
        mutation,
        extra,
        any::<bool>(),
        proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
    )
        .prop_flat_map(
            |(status, version, early, body, mutation, extra, closes, picks)| {
                let n = picks.len();
                (
                    Just((
                        status,
                        version,
                        early,
                        body.clone(),
                        mutation,
                        extra,
                        closes,
                    )),
                    proptest::collection::vec(response_header(body.len()), n..=n),
                    chunking(body),
                )
            },
        )
        .prop_map(
            |((status, version, early, body, mutation, extra, closes), headers, chunked)| {
                let mut out = Vec::new();
                if early {
                    out.extend_from_slice(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n");
                }
                let mut h = format!("{version} {status}\r\nx-app-case: 1\r\n");
                let (mut te, mut cl, mut coded) = (false, false, false);
                for (name, value) in &headers {
                    let is_te = name.eq_ignore_ascii_case("transfer-encoding");
                    // The last transfer-encoding line decides whether the body is chunked.
                    if is_te {
                        te = value.to_ascii_lowercase().ends_with("chunked");
                    }
                    coded |= is_te;
                    cl |= name.eq_ignore_ascii_case("content-length");
                    h.push_str(&format!("{name}: {value}\r\n"));
                }
                let code = &status[..3];
                let bodiless = code == "204" || code == "304";
                // A transfer coding other than chunked last means the body ends at the close.
                let framed = te || (cl && !coded);
                // A body that ends at the close must be followed by one. An HTTP/1.0 answer
                // closes too: hyper's client speaks HTTP/1.0 on a connection from then on,
                // so what a later case's request looks like would depend on which pooled
                // connection it got, not on the path that carried it.
                let closes = closes || (!framed && !bodiless) || version == "HTTP/1.0";
                // An app that closes says so: one that closes a keep-alive connection
                // silently races the next case's request for it, on either path (a request
                // the pod may have read is not sent again: http_safety.rs covers that case).
                if closes {
                    h.push_str("connection: close\r\n");
                }
                if let Some(m) = mutation {
                    h.push_str(m);
                }
                h.push_str("\r\n");
                out.extend_from_slice(h.as_bytes());
                if !bodiless {
                    if te {
                        out.extend_from_slice(&chunked);
                    } else {
                        out.extend_from_slice(&body);
                    }
                }
                out.extend_from_slice(extra);
                (out, closes)
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    (request(), response()).prop_map(|(request, (response, app_closes))| Case {
        request,
        response,
        app_closes,
    })
}

// ---- the recording app -------------------------------------------------------------------

/// What the app received for one case, as a strict app reads it (CRLF line ends only).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Received {
    line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

#[derive(Default)]
struct Table {
    /// Requests an app received that AWS's desync classifier grades Ambiguous or Severe.
    desync: Vec<String>,
    /// Case number → what the app answers.
    answers: HashMap<u64, (Vec<u8>, bool)>,
    /// (path, case) → requests received.
    received: HashMap<(usize, u64), Vec<Received>>,
}

type Shared = Arc<Mutex<Table>>;

async fn app(l: TcpListener, path: usize, table: Shared, pods: [SocketAddr; 2]) {
    while let Ok((s, _)) = l.accept().await {
        tokio::spawn(app_conn(s, path, table.clone(), pods));
    }
}

async fn app_conn(mut s: TcpStream, path: usize, table: Shared, pods: [SocketAddr; 2]) {
    let mut buf = Vec::new();
    loop {
        let Ok(Some((mut req, raw_head))) =
            tokio::time::timeout(READ_IDLE, read_request(&mut s, &mut buf)).await
        else {
            return;
        };
        // Host is the pod's own address when the client sent none: each path has its pod.
        for (n, v) in &mut req.headers {
            if n == "host" && pods.iter().any(|p| *v == p.to_string()) {
                *v = "<pod>".into();
            }
        }
        let id = case_id(&req.line);
        if let Some(why) = desync_risk(&raw_head) {
            table
                .lock()
                .unwrap()
                .desync
                .push(format!("path {path}, case {id}: {why}"));
        }
        let is_head = req.line.starts_with("HEAD ");
        let answer = {
            let mut t = table.lock().unwrap();
            t.received.entry((path, id)).or_default().push(req);
            t.answers.get(&id).cloned()
        };
        let (mut bytes, closes) = answer.unwrap_or_else(|| {
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
                false,
            )
        });
        if is_head && let Some(end) = bytes.windows(4).rposition(|w| w == b"\r\n\r\n") {
            // A HEAD answer has no body, whatever its framing says.
            bytes.truncate(end + 4);
        }
        if s.write_all(&bytes).await.is_err() || closes {
            return;
        }
    }
}

fn case_id(line: &str) -> u64 {
    line.split(' ')
        .nth(1)
        .and_then(|t| t.strip_prefix("/c/"))
        .map(|t| {
            t.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|d| d.parse().ok())
        .unwrap_or(0)
}

async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    match s.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// A second opinion on a request head an app received: AWS's `http_desync_guardian` (what
/// its load balancers classify requests with). None when it finds the head Compliant or
/// Acceptable, or Ambiguous only because a GET, HEAD, OPTIONS or DELETE carries a body: RFC
/// 9110 gives such a body no meaning, but it is framed like any other, and both paths (and
/// nginx) pass it on — the activator is not the place to decide what an app's methods mean.
/// Anything about framing, line ends, header syntax or the request line counts.
fn desync_risk(head: &[u8]) -> Option<String> {
    use http_desync_guardian::request_analyzer::HttpRequestData;
    use http_desync_guardian::{ClassificationReason as Why, RequestSafetyTier as Tier};
    let verdict = HttpRequestData::analyze_raw_request(head);
    let risky = match verdict.tier {
        Tier::Compliant | Tier::Acceptable => false,
        Tier::Ambiguous => !matches!(
            verdict.reason,
            Why::UndefinedContentLengthSemantics | Why::UndefinedTransferEncodingSemantics
        ),
        Tier::Severe => true,
    };
    risky.then(|| {
        format!(
            "{:?} ({:?}: {}) in {:?}",
            verdict.tier,
            verdict.reason,
            verdict.message.unwrap_or_default(),
            String::from_utf8_lossy(head)
        )
    })
}

/// A request and its head's raw bytes.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(Received, Vec<u8>)> {
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        if !fill(s, buf).await {
            return None;
        }
    };
    let head: Vec<u8> = buf.drain(..end).collect();
    let text = String::from_utf8_lossy(&head[..end - 4]).into_owned();
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default().to_string();
    let raw: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let te = raw.iter().any(|(n, _)| n == "transfer-encoding");
    let length: Option<usize> = raw
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok());
    let body = if te {
        read_chunked(s, buf).await?
    } else {
        let n = length.unwrap_or(0);
        while buf.len() < n {
            if !fill(s, buf).await {
                return None;
            }
        }
        buf.drain(..n).collect()
    };
    Some((
        Received {
            line,
            headers: normalise(raw),
            body,
        },
        head,
    ))
}

/// A chunked body, strictly; None if it is not one.
async fn read_chunked(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let i = loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                break i;
            }
            if buf.len() > 64 * 1024 || !fill(s, buf).await {
                return None;
            }
        };
        let line = String::from_utf8_lossy(&buf[..i]).into_owned();
        if line.contains('\n') {
            return None;
        }
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        buf.drain(..i + 2);
        if size == 0 {
            // Trailers, up to the blank line.
            loop {
                let j = loop {
                    if let Some(j) = buf.windows(2).position(|w| w == b"\r\n") {
                        break j;
                    }
                    if !fill(s, buf).await {
                        return None;
                    }
                };
                buf.drain(..j + 2);
                if j == 0 {
                    return Some(body);
                }
            }
        }
        while buf.len() < size + 2 {
            if !fill(s, buf).await {
                return None;
            }
        }
        if &buf[size..size + 2] != b"\r\n" {
            return None;
        }
        body.extend(buf.drain(..size));
        buf.drain(..2);
    }
}

/// Header fields as either path may write the same ones: names in lower case, sorted, the
/// framing (which each path picks for the same body) and the connection's own left out.
fn normalise(mut h: Vec<(String, String)>) -> Vec<(String, String)> {
    h.retain(|(n, _)| {
        !matches!(
            n.as_str(),
            "content-length" | "transfer-encoding" | "connection" | "date" | "x-activator-node"
        )
    });
    h.sort();
    h
}

// ---- the client --------------------------------------------------------------------------

/// What the client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// The app's response (it carries `x-app-case`), whole.
    App {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// An answer the activator made itself: its status (its text names the node).
    Activator(u16),
    /// The connection ended (or stalled) without a whole response.
    Broken,
}

async fn exchange(to: SocketAddr, request: &[u8], is_head: bool) -> Seen {
    let t = std::time::Instant::now();
    let seen = exchange_once(to, request, is_head).await;
    if t.elapsed() > Duration::from_secs(2) {
        SLOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    seen
}

/// Exchanges that took over 2 s (a client waiting out its read timeout): reported.
static SLOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

async fn exchange_once(to: SocketAddr, request: &[u8], is_head: bool) -> Seen {
    let Ok(mut s) = TcpStream::connect(to).await else {
        return Seen::Broken;
    };
    if s.write_all(request).await.is_err() {
        return Seen::Broken;
    }
    let mut buf = Vec::new();
    match tokio::time::timeout(LIMIT, read_response(&mut s, &mut buf, is_head)).await {
        Ok(Some(seen)) => seen,
        _ => Seen::Broken,
    }
}

async fn fill_idle(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    tokio::time::timeout(READ_IDLE, fill(s, buf))
        .await
        .unwrap_or(false)
}

async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>, is_head: bool) -> Option<Seen> {
    loop {
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            if !fill_idle(s, buf).await {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&buf[..end - 4]).into_owned();
        buf.drain(..end);
        if head.contains('\n') && head.split("\r\n").any(|l| l.contains('\n')) {
            return None;
        }
        let mut lines = head.split("\r\n");
        let status: u16 = lines.next()?.get(9..12)?.parse().ok()?;
        let raw: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        if (100..200).contains(&status) {
            // Informational: hyper's client does not pass them on; the final head follows.
            continue;
        }
        let te: Vec<&str> = raw
            .iter()
            .filter(|(n, _)| n == "transfer-encoding")
            .map(|(_, v)| v.as_str())
            .collect();
        let cl: Vec<&str> = raw
            .iter()
            .filter(|(n, _)| n == "content-length")
            .map(|(_, v)| v.as_str())
            .collect();
        if !te.is_empty() && !cl.is_empty() {
            // Both framing headers: the very thing a client must never get.
            return Some(Seen::App {
                status: 0,
                headers: raw,
                body: b"BOTH FRAMING HEADERS".to_vec(),
            });
        }
        let no_body = is_head || status == 204 || status == 304;
        let body = if no_body {
            Vec::new()
        } else if te
            .last()
            .is_some_and(|v| v.to_ascii_lowercase().ends_with("chunked"))
        {
            read_chunked_idle(s, buf).await?
        } else if let Some(n) = cl.first() {
            let n: usize = n.parse().ok()?;
            while buf.len() < n {
                if !fill_idle(s, buf).await {
                    return None;
                }
            }
            buf.drain(..n).collect()
        } else {
            while fill_idle(s, buf).await {}
            std::mem::take(buf)
        };
        let from_app = raw.iter().any(|(n, _)| n == "x-app-case");
        // The transfer codings other than chunked are what the body is (hyper chunks what
        // the fast lane relays until the close, and writes `gzip, chunked` for `gzip`); a
        // message without a body has no framing to compare (hyper drops it for HEAD).
        let codings: Vec<String> = te
            .iter()
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .filter(|t| t != "chunked" && !t.is_empty())
            .collect();
        let mut headers = normalise(raw);
        if !codings.is_empty() && !no_body {
            headers.push(("transfer-encoding".into(), codings.join(", ")));
        }
        headers.sort();
        return Some(if from_app {
            Seen::App {
                status,
                headers,
                body,
            }
        } else {
            Seen::Activator(status)
        });
    }
}

async fn read_chunked_idle(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    tokio::time::timeout(READ_IDLE * 2, read_chunked(s, buf))
        .await
        .ok()
        .flatten()
}

// ---- the rig -----------------------------------------------------------------------------

struct Rig {
    c: SimCluster,
    ns: String,
    name: String,
    /// The fast-lane activator, and the hyper-only one.
    entries: [SocketAddr; 2],
    table: Shared,
}

async fn rig() -> Rig {
    let ns = format!("equivalence-{:08x}", rand::random::<u32>());
    let name = "eq".to_string();
    // The first activator started has the fast lane, the other not.
    let lanes: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
    let configure: loadtest::cluster::ConfigureActivator = Arc::new({
        let lanes = lanes.clone();
        move |cfg| {
            let mut l = lanes.lock().unwrap();
            let fast = l.is_empty();
            l.insert(cfg.node_name.clone(), fast);
            cfg.fast_lane = fast;
        }
    });
    let c = SimCluster::start(ClusterOptions {
        nodes: 2,
        start_delay: Delay::fixed_ms(20),
        default_activators: 2,
        revision_namespace: Some(ns.clone()),
        configure_activator: Some(configure),
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    c.ensure_own_namespace(&ns).await.unwrap();
    let api: Api<crds::Revision> = Api::namespaced(c.client.clone(), &ns);
    // A pod on each member (minScale 2: a share of 1 each), so that each serves what enters
    // it rather than sending it to the revision's primary: both lanes carry the exchange.
    let mut rev = echo_revision(&name, &ns, vec![host_of(&name, &ns)]);
    rev.spec.min_scale = 2;
    api.create(&PostParams::default(), &rev).await.unwrap();
    wait_subsets(&c.client, &ns, std::slice::from_ref(&name), LIMIT)
        .await
        .unwrap();
    let members = member_nodes(&c.client, &ns, &name).await.unwrap();
    assert_eq!(members.len(), 2, "both activators are members");
    let lanes = lanes.lock().unwrap().clone();
    let entry = |fast: bool| {
        c.entries()
            .into_iter()
            .find(|(n, _)| lanes[n] == fast)
            .unwrap()
    };
    let (fast_node, fast_addr) = entry(true);
    let (hyper_node, hyper_addr) = entry(false);
    let table: Shared = Arc::default();
    // A pod on each node (its minScale share), Ready before any request.
    let pods_api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.client.clone(), &ns);
    for node in &members {
        let pod = crds::contract::pod_name(&name, node, 0);
        let ready = kube::runtime::wait::await_condition(
            pods_api.clone(),
            &pod,
            |p: Option<&k8s_openapi::api::core::v1::Pod>| {
                p.is_some_and(loadtest::observe::is_ready)
            },
        );
        tokio::time::timeout(LIMIT, ready)
            .await
            .unwrap_or_else(|_| panic!("{pod} Ready"))
            .unwrap();
    }
    let mut pods = Vec::new();
    for (node, addr) in [(&fast_node, fast_addr), (&hyper_node, hyper_addr)] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let cold = format!(
            "GET /cold HTTP/1.1\r\nhost: app\r\nx-revision-namespace: {ns}\r\n\
             x-revision-name: {name}\r\nconnection: close\r\n\r\n"
        );
        s.write_all(cold.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(LIMIT, s.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
        let sim = c.fleet.node(node).unwrap();
        let pod = sim
            .pods()
            .into_iter()
            .find(|p| p.namespace == ns && p.app_addr.is_some())
            .expect("the cold start's pod runs on its node");
        pods.push(sim.take_over_app(&ns, &pod.name).await.unwrap());
    }
    let pod_addrs = [pods[0], pods[1]];
    for (path, addr) in pod_addrs.into_iter().enumerate() {
        let l = TcpListener::bind(addr).await.unwrap();
        tokio::spawn(app(l, path, table.clone(), pod_addrs));
    }
    Rig {
        c,
        ns,
        name,
        entries: [fast_addr, hyper_addr],
        table,
    }
}

/// What one path did with one case.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    at_app: Vec<Received>,
    client: Seen,
}

impl Rig {
    async fn run(&self, id: u64, case: &Case) -> [Outcome; 2] {
        let request = splice(&case.request, id, &self.ns, &self.name);
        self.table
            .lock()
            .unwrap()
            .answers
            .insert(id, (case.response.clone(), case.app_closes));
        let is_head = case.request.starts_with(b"HEAD ");
        let (a, b) = tokio::join!(
            exchange(self.entries[0], &request, is_head),
            exchange(self.entries[1], &request, is_head)
        );
        let mut t = self.table.lock().unwrap();
        t.answers.remove(&id);
        let mut at = |path| t.received.remove(&(path, id)).unwrap_or_default();
        [
            Outcome {
                at_app: at(0),
                client: a,
            },
            Outcome {
                at_app: at(1),
                client: b,
            },
        ]
    }
}

/// The one difference allowed: an app that sends a 1xx and then a final head with a bare LF
/// gets a 502 from the fast lane, while hyper's client (which passes no 1xx on) may be left
/// waiting past the 1xx until the revision's timeout. Both are failures the client sees as
/// such, and the app received the same request; hyper's is the slower one.
fn both_fail_after_1xx(case: &Case, fast: &Outcome, hyper: &Outcome) -> bool {
    let failed = |s: &Seen| matches!(s, Seen::Broken | Seen::Activator(500..));
    let final_head = case
        .response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .filter(|_| case.response.starts_with(b"HTTP/1.1 1"))
        .map(|end| &case.response[end + 4..]);
    let bare_lf_after_1xx = final_head.is_some_and(|h| {
        let end = h
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or(h.len());
        h[..end].windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r')
    });
    bare_lf_after_1xx
        && fast.at_app == hyper.at_app
        && failed(&fast.client)
        && failed(&hyper.client)
}

/// The request with its placeholders filled in, byte for byte (the rest may not be UTF-8).
fn splice(bytes: &[u8], id: u64, ns: &str, name: &str) -> Vec<u8> {
    let id = id.to_string();
    let mut out = Vec::with_capacity(bytes.len() + 64);
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let (with, skip): (&[u8], usize) = if rest.starts_with(b"{ID}") {
            (id.as_bytes(), 4)
        } else if rest.starts_with(b"{NS}") {
            (ns.as_bytes(), 4)
        } else if rest.starts_with(b"{NAME}") {
            (name.as_bytes(), 6)
        } else {
            (&rest[..1], 1)
        };
        out.extend_from_slice(with);
        i += skip;
    }
    out
}

#[test]
fn the_fast_lane_does_what_hypers_path_does_for_any_exchange() {
    let cases: usize = std::env::var("EQUIVALENCE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rig = Arc::new(rt.block_on(rig()));
    // The same cases on every run (a failure recurs), unless EQUIVALENCE_SEED asks for others.
    let mut runner = match std::env::var("EQUIVALENCE_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(seed) => {
            let mut bytes = [0u8; 32];
            bytes[..8].copy_from_slice(&seed.to_le_bytes());
            TestRunner::new_with_rng(
                proptest::test_runner::Config::default(),
                proptest::test_runner::TestRng::from_seed(
                    proptest::test_runner::RngAlgorithm::ChaCha,
                    &bytes,
                ),
            )
        }
        None => TestRunner::deterministic(),
    };
    let strategy = case();
    let mut mismatches = Vec::new();
    let mut id = 0u64;
    let mut done = 0usize;
    let mut forwarded = [0usize; 2];
    while done < cases && mismatches.len() < 3 {
        let batch: Vec<(u64, Case)> = (0..CONCURRENCY.min(cases - done))
            .map(|_| {
                id += 1;
                (id, strategy.new_tree(&mut runner).unwrap().current())
            })
            .collect();
        done += batch.len();
        let results = rt.block_on(async {
            let runs = batch.iter().map(|(id, case)| {
                let rig = rig.clone();
                async move { rig.run(*id, case).await }
            });
            futures::future::join_all(runs).await
        });
        for ((id, case), [fast, hyper]) in batch.into_iter().zip(results) {
            forwarded[0] += usize::from(!fast.at_app.is_empty());
            forwarded[1] += usize::from(matches!(fast.client, Seen::App { .. }));
            if fast != hyper && !both_fail_after_1xx(&case, &fast, &hyper) {
                mismatches.push(format!(
                    "case {id}\n  request  {:?}\n  response {:?} (app closes: {})\n  fast lane {fast:?}\n  hyper     {hyper:?}",
                    String::from_utf8_lossy(&case.request),
                    String::from_utf8_lossy(&case.response),
                    case.app_closes
                ));
            }
        }
    }
    let rig = Arc::into_inner(rig).expect("no case holds the rig");
    let desync = std::mem::take(&mut rig.table.lock().unwrap().desync);
    rt.block_on(rig.c.shutdown());
    assert!(
        desync.is_empty(),
        "the activators forwarded {} requests the desync classifier grades risky, e.g.:\n{}",
        desync.len(),
        desync
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        mismatches.is_empty(),
        "the paths disagree ({} of {done} cases run):\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    // The grammar must reach both outcomes, or the property says little.
    assert!(
        forwarded[0] > done / 10 && forwarded[1] > done / 20,
        "too few cases reached the app ({}) or brought its answer back ({}) of {done}",
        forwarded[0],
        forwarded[1]
    );
    eprintln!(
        "{done} cases: {} reached the app, {} brought its answer back, on both paths alike \
         ({} exchanges waited out a read timeout)",
        forwarded[0],
        forwarded[1],
        SLOW.load(std::sync::atomic::Ordering::Relaxed)
    );
}
