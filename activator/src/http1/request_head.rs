//! HTTP/1.1 request heads for the fast lane, as bytes (the server side): which requests it
//! may carry and the request head it sends to the pod. Pure: no IO. The response side is
//! [`super::response_head`].
//!
//! The fast lane takes only what it can carry byte for byte without changing meaning:
//! an HTTP/1.1 request in origin form whose every line ends in CRLF, with no body or one
//! `Content-Length` (1*DIGIT, at most 2^63 - 1), at most one `Host`, no upgrade, no `Expect`,
//! no `Transfer-Encoding`, no activator hop headers, and its revision named by headers or
//! Host. Everything else is [`Classified::Fallback`]: served by hyper, which has the whole
//! protocol and normalises what it forwards (a head with bare LF line ends is rewritten with
//! CRLF there, never passed on as it came: an app that splits lines on CRLF alone would
//! frame it differently — RFC 9112 §2.2).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;

use crds::contract::{
    HEADER_ACTIVATOR_HOP, HEADER_ACTIVATOR_HOP_PROOF, HEADER_ACTIVATOR_HOP_SPILL,
    HEADER_ACTIVATOR_HOST_STALE, HEADER_ACTIVATOR_SUBSET_VERSION, HEADER_KNATIVE_NAMESPACE,
    HEADER_KNATIVE_REVISION, HEADER_REVISION_NAME, HEADER_REVISION_NAMESPACE,
};

use crate::http1::forwarded;
use crate::http1::framing::content_length;
use crate::wire::naming::{Named, RevisionKey, is_dns_label, is_dns_subdomain};

/// Headers httparse reads per message (as many as hyper's default): a request with more is
/// left to hyper.
pub const MAX_HEADERS: usize = 100;

/// What the fast lane makes of the bytes received so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Classified {
    /// A whole request head the fast lane carries.
    Fast(RequestHead),
    /// More bytes are needed.
    Partial,
    /// Hyper serves this (the reason, for logs and the fallback counter).
    Fallback(&'static str),
}

/// A request head the fast lane carries: offsets into the bytes it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Length of the head, blank line included: the body (if any) starts here.
    pub len: usize,
    /// The declared body length (0 without `Content-Length`).
    pub body_len: u64,
    /// The client asked to close the connection after this request.
    pub close: bool,
    /// `HEAD`: the response has no body, whatever its framing headers say.
    pub is_head: bool,
    /// The method is idempotent (RFC 9110 §9.2.2): the request may go again on another
    /// connection when the pod closed one without answering.
    pub idempotent: bool,
    /// The revision, from the revision header pair, or the Host to look it up by.
    pub name: Named,
    /// Set when the head can go to the pod as it is, with headers only added (no header to
    /// drop or merge): what [`write_request`] needs then, found in this one parse.
    pub plain: Option<Plain>,
}

/// The client's address as the forwarding headers write it, formatted once per connection.
#[derive(Debug, Clone)]
pub struct Client {
    pub ip: IpAddr,
    /// `x-forwarded-for`'s element.
    xff: String,
    /// `forwarded`'s element up to its host: `for=...;proto=http`.
    fwd: String,
}

impl Client {
    pub fn new(ip: IpAddr) -> Self {
        Self {
            ip,
            xff: forwarded::x_forwarded_for(None, ip),
            fwd: forwarded::forwarded(None, Some(ip), None),
        }
    }
}

/// What a head that goes out as it is needs for the headers added to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plain {
    /// Where the Host header's value is in the head.
    pub host: Option<Range<usize>>,
    pub has_xfp: bool,
    pub has_xfh: bool,
}

/// Parses the request head at the start of `buf`, if it is whole, and decides whether the
/// fast lane may carry it.
pub fn classify_request(buf: &[u8]) -> Classified {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Classified::Partial,
        Err(_) => return Classified::Fallback("unparsed"),
    };
    if req.version != Some(1) {
        return Classified::Fallback("http/1.0");
    }
    let (Some(method), Some(path)) = (req.method, req.path) else {
        return Classified::Fallback("unparsed");
    };
    if method == "CONNECT" || !path.starts_with('/') {
        return Classified::Fallback("request target");
    }
    // httparse takes a bare LF as a line end: such a head goes to hyper, which writes it
    // out again with CRLF (passed on as it is, an app that splits on CRLF would read
    // different headers — and a different framing — than the activator did).
    if has_bare_lf(&buf[..len]) {
        return Classified::Fallback("bare LF");
    }
    let mut head = Parsed::default();
    let base = buf.as_ptr() as usize;
    for h in req.headers.iter() {
        if let Err(why) = head.header(h.name, h.value) {
            return Classified::Fallback(why);
        }
        let is = |n: &str| h.name.eq_ignore_ascii_case(n);
        if is("host") {
            let at = h.value.as_ptr() as usize - base;
            head.hosts += 1;
            head.host = Some(at..at + h.value.len());
        } else if is("connection") || is("keep-alive") || is("proxy-connection") || is("trailer") {
            head.drops = true;
        } else if is(forwarded::X_FORWARDED_FOR) || is(forwarded::FORWARDED) {
            head.merges = true;
        } else if is(forwarded::X_FORWARDED_PROTO) {
            head.has_xfp = true;
        } else if is(forwarded::X_FORWARDED_HOST) {
            head.has_xfh = true;
        }
    }
    // RFC 9112 §3.2: more than one Host is answered 400 (hyper's path does).
    if head.hosts > 1 {
        return Classified::Fallback("hosts");
    }
    let name = match head.key() {
        Ok(Some(key)) => Named::Revision(key),
        // No pair: the Host names the app, as on hyper's path.
        Ok(None) => match head.host.clone().filter(|_| head.hosts == 1) {
            Some(r) => match std::str::from_utf8(&buf[r]).map(str::trim) {
                Ok(h) if !h.is_empty() => Named::Host(h.to_string()),
                _ => return Classified::Fallback("no revision named"),
            },
            None => return Classified::Fallback("no revision named"),
        },
        Err(()) => return Classified::Fallback("invalid revision headers"),
    };
    let plain = (!head.drops && !head.merges).then(|| Plain {
        host: head.host.clone(),
        has_xfp: head.has_xfp,
        has_xfh: head.has_xfh,
    });
    Classified::Fast(RequestHead {
        len,
        body_len: head.content_length.unwrap_or(0),
        close: head.close,
        is_head: method == "HEAD",
        idempotent: matches!(
            method,
            "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
        ),
        name,
        plain,
    })
}

/// What one pass over the request's headers finds.
#[derive(Default)]
struct Parsed<'a> {
    content_length: Option<u64>,
    close: bool,
    te: bool,
    ns: Option<&'a str>,
    name: Option<&'a str>,
    knative_ns: Option<&'a str>,
    knative_name: Option<&'a str>,
    host: Option<Range<usize>>,
    hosts: usize,
    /// A hop-by-hop header to drop, or forwarding headers to merge.
    drops: bool,
    merges: bool,
    has_xfp: bool,
    has_xfh: bool,
}

impl<'a> Parsed<'a> {
    fn header(&mut self, name: &str, value: &'a [u8]) -> Result<(), &'static str> {
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        if is("content-length") {
            let n = content_length(value).ok_or("content-length")?;
            if self.content_length.replace(n).is_some() {
                return Err("content-length");
            }
        } else if is("transfer-encoding") {
            return Err("transfer-encoding");
        } else if is("upgrade") {
            return Err("upgrade");
        } else if is("expect") {
            return Err("expect");
        } else if is("te") {
            // One `TE: trailers` passes as it is (gRPC needs it); anything else hyper's path
            // rewrites (it keeps one `trailers`).
            if !value.eq_ignore_ascii_case(b"trailers") || std::mem::replace(&mut self.te, true) {
                return Err("te");
            }
        } else if is("connection") {
            for token in value.split(|b| *b == b',') {
                let t = token.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if !t.is_empty() && !t.eq_ignore_ascii_case(b"keep-alive") {
                    // It names other headers as hop-by-hop: hyper strips them.
                    return Err("connection");
                }
            }
        } else if is(HEADER_ACTIVATOR_HOP)
            || is(HEADER_ACTIVATOR_HOP_PROOF)
            || is(HEADER_ACTIVATOR_HOP_SPILL)
            || is(crds::contract::HEADER_ACTIVATOR_HOP_REVISION)
            || is(HEADER_ACTIVATOR_SUBSET_VERSION)
            || is(HEADER_ACTIVATOR_HOST_STALE)
        {
            // Whether a peer activator sent it is for hyper's path to check (a forwarded
            // request is the rare one); the fast lane serves clients, and hyper's path
            // removes a client's before anything reads them.
            return Err("hop");
        } else if is(HEADER_REVISION_NAMESPACE) {
            self.ns = Some(once(self.ns, value)?);
        } else if is(HEADER_REVISION_NAME) {
            self.name = Some(once(self.name, value)?);
        } else if is(HEADER_KNATIVE_NAMESPACE) {
            self.knative_ns = Some(once(self.knative_ns, value)?);
        } else if is(HEADER_KNATIVE_REVISION) {
            self.knative_name = Some(once(self.knative_name, value)?);
        }
        Ok(())
    }

    /// The revision the headers name, by the rules of [`crate::wire::naming::named`]: None for
    /// no pair, Err for an invalid one (hyper answers those 400).
    fn key(&self) -> Result<Option<RevisionKey>, ()> {
        let Some((ns, name)) = self
            .ns
            .zip(self.name)
            .or(self.knative_ns.zip(self.knative_name))
        else {
            return Ok(None);
        };
        if is_dns_label(ns) && is_dns_subdomain(name) {
            Ok(Some(RevisionKey::new(ns, name)))
        } else {
            Err(())
        }
    }
}

/// A revision header's value, refusing a second one (hyper's path reads the first; better
/// to leave such a request to it than to pick differently).
fn once<'a>(seen: Option<&'a str>, value: &'a [u8]) -> Result<&'a str, &'static str> {
    if seen.is_some() {
        return Err("repeated revision header");
    }
    std::str::from_utf8(value).map_err(|_| "revision header")
}

/// Whether a head has a line ending in LF alone (or a CR that ends no line).
pub fn has_bare_lf(head: &[u8]) -> bool {
    let mut prev = 0u8;
    for &b in head {
        match b {
            b'\n' if prev != b'\r' => return true,
            _ if prev == b'\r' && b != b'\n' => return true,
            _ => {}
        }
        prev = b;
    }
    prev == b'\r'
}

/// Writes the request head to send to the pod into `out`: the client's head without its
/// hop-by-hop headers, with `x-forwarded-*` and `forwarded` added when this is the first
/// activator (as [`crate::http1::forwarded::add`] does on hyper's path), and a `Host` naming the
/// target when the client sent none. `head` is the client's head, as classified.
pub fn write_request(
    out: &mut Vec<u8>,
    head: &[u8],
    parsed: &RequestHead,
    client: &Client,
    target: SocketAddr,
) {
    let Some(plain) = &parsed.plain else {
        return write_request_reparsed(out, head, client.ip, target);
    };
    // All but the blank line, as it came; then what is added.
    out.extend_from_slice(&head[..head.len() - 2]);
    let host = plain
        .host
        .as_ref()
        .and_then(|r| std::str::from_utf8(&head[r.clone()]).ok());
    if plain.host.is_none() {
        let mut s = String::new();
        let _ = write!(s, "{target}");
        header(out, b"host", s.as_bytes());
    }
    {
        // Nothing came before (a head with forwarding headers is reparsed): the
        // connection's own elements, formatted once.
        header(
            out,
            forwarded::X_FORWARDED_FOR.as_bytes(),
            client.xff.as_bytes(),
        );
        if !plain.has_xfp {
            header(out, forwarded::X_FORWARDED_PROTO.as_bytes(), b"http");
        }
        if let Some(h) = host
            && !plain.has_xfh
        {
            header(out, forwarded::X_FORWARDED_HOST.as_bytes(), h.as_bytes());
        }
        out.extend_from_slice(forwarded::FORWARDED.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(client.fwd.as_bytes());
        if let Some(h) = host {
            out.extend_from_slice(b";host=");
            if forwarded::is_token(h) {
                out.extend_from_slice(h.as_bytes());
            } else {
                let mut quoted = String::new();
                forwarded::value(&mut quoted, h);
                out.extend_from_slice(quoted.as_bytes());
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The forwarding headers of the first activator (as [`crate::http1::forwarded::add`] writes them).
fn add_forwarding(
    out: &mut Vec<u8>,
    xff: Option<String>,
    fwd: Option<String>,
    client: IpAddr,
    host: Option<&str>,
    has_xfp: bool,
    has_xfh: bool,
) {
    let xff = forwarded::x_forwarded_for(xff, client);
    header(out, forwarded::X_FORWARDED_FOR.as_bytes(), xff.as_bytes());
    if !has_xfp {
        header(out, forwarded::X_FORWARDED_PROTO.as_bytes(), b"http");
    }
    if let Some(h) = host
        && !has_xfh
    {
        header(out, forwarded::X_FORWARDED_HOST.as_bytes(), h.as_bytes());
    }
    let fwd = forwarded::forwarded(fwd, Some(client), host);
    header(out, forwarded::FORWARDED.as_bytes(), fwd.as_bytes());
}

/// [`write_request`] for a head with headers to drop or merge: parsed again, header by header.
fn write_request_reparsed(out: &mut Vec<u8>, head: &[u8], client: IpAddr, target: SocketAddr) {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    // Classified before: the parse cannot fail.
    let _ = req.parse(head);
    // The request line written again from what was parsed, never cut out of the bytes.
    let _ = write!(
        Writer(out),
        "{} {} HTTP/1.1\r\n",
        req.method.unwrap_or("GET"),
        req.path.unwrap_or("/")
    );
    let mut host: Option<&[u8]> = None;
    let mut xff: Vec<&[u8]> = Vec::new();
    let mut fwd: Vec<&[u8]> = Vec::new();
    let (mut has_xfp, mut has_xfh) = (false, false);
    for h in req.headers.iter() {
        let is = |n: &str| h.name.eq_ignore_ascii_case(n);
        if is("connection") || is("keep-alive") || is("proxy-connection") || is("trailer") {
            continue;
        }
        if is(forwarded::X_FORWARDED_FOR) {
            xff.push(h.value);
            continue;
        }
        if is(forwarded::FORWARDED) {
            fwd.push(h.value);
            continue;
        }
        has_xfp |= is(forwarded::X_FORWARDED_PROTO);
        has_xfh |= is(forwarded::X_FORWARDED_HOST);
        if is("host") {
            host = Some(h.value);
        }
        header(out, h.name.as_bytes(), h.value);
    }
    let host = host.and_then(|h| std::str::from_utf8(h).ok());
    if host.is_none() {
        let mut s = String::new();
        let _ = write!(s, "{target}");
        header(out, b"host", s.as_bytes());
    }
    let joined = |vs: &[&[u8]]| -> Option<String> {
        let vs: Vec<&str> = vs
            .iter()
            .filter_map(|v| std::str::from_utf8(v).ok())
            .collect();
        (!vs.is_empty()).then(|| vs.join(", "))
    };
    add_forwarding(
        out,
        joined(&xff),
        joined(&fwd),
        client,
        host,
        has_xfp,
        has_xfh,
    );
    out.extend_from_slice(b"\r\n");
}

pub(crate) fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `fmt::Write` into a byte buffer.
pub(crate) struct Writer<'a>(pub(crate) &'a mut Vec<u8>);

impl std::fmt::Write for Writer<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Where the request's body bytes lie in a buffer that holds its head and what followed.
pub fn body_in(buffered: usize, head: &RequestHead) -> Range<usize> {
    // Lengths are at most 2^63 - 1 ([`content_length`]): the sum cannot wrap.
    let end = (head.len as u64)
        .saturating_add(head.body_len)
        .min(buffered as u64) as usize;
    head.len..end
}

#[cfg(test)]
mod tests {
    use super::*;

    const REV: &str = "x-revision-namespace: ns\r\nx-revision-name: r1\r\n";

    fn fast(req: &str) -> RequestHead {
        match classify_request(req.as_bytes()) {
            Classified::Fast(h) => h,
            other => panic!("{req:?}: {other:?}"),
        }
    }

    fn fallback(req: &str) -> &'static str {
        match classify_request(req.as_bytes()) {
            Classified::Fallback(why) => why,
            other => panic!("{req:?}: {other:?}"),
        }
    }

    #[test]
    fn a_plain_request_is_fast_and_partial_heads_wait() {
        let req = format!("GET /x HTTP/1.1\r\nhost: a\r\n{REV}\r\nrest");
        let h = fast(&req);
        assert_eq!(h.len, req.len() - 4);
        assert_eq!(h.name, Named::Revision(RevisionKey::new("ns", "r1")));
        assert_eq!(
            (h.body_len, h.close, h.is_head, h.idempotent),
            (0, false, false, true)
        );
        assert_eq!(classify_request(&req.as_bytes()[..20]), Classified::Partial);
        let post = fast(&format!(
            "POST / HTTP/1.1\r\nContent-Length: 12\r\nConnection: keep-alive, close\r\n{REV}\r\n"
        ));
        assert_eq!((post.body_len, post.close), (12, true));
        let k = fast(
            "HEAD / HTTP/1.1\r\nknative-serving-namespace: k\r\nknative-serving-revision: r\r\n\r\n",
        );
        assert_eq!(k.name, Named::Revision(RevisionKey::new("k", "r")));
        // No revision headers: the Host names it.
        let host = fast("GET / HTTP/1.1\r\nHost:  app.test:80 \r\n\r\n");
        assert_eq!(host.name, Named::Host("app.test:80".into()));
        assert!(k.is_head);
    }

    #[test]
    fn anything_unusual_is_left_to_hyper() {
        for (req, why) in [
            (format!("GET / HTTP/1.0\r\n{REV}\r\n"), "http/1.0"),
            (
                format!("GET http://a/ HTTP/1.1\r\n{REV}\r\n"),
                "request target",
            ),
            ("CONNECT a:1 HTTP/1.1\r\n\r\n".to_string(), "request target"),
            (
                format!("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n{REV}\r\n"),
                "transfer-encoding",
            ),
            (
                format!("GET / HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n{REV}\r\n"),
                "upgrade",
            ),
            (
                format!(
                    "POST / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 1\r\n{REV}\r\n"
                ),
                "expect",
            ),
            (
                format!("GET / HTTP/1.1\r\nconnection: x-secret\r\n{REV}\r\n"),
                "connection",
            ),
            (format!("GET / HTTP/1.1\r\nte: gzip\r\n{REV}\r\n"), "te"),
            (
                format!("POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 1\r\n{REV}\r\n"),
                "content-length",
            ),
            (
                format!("POST / HTTP/1.1\r\ncontent-length: -1\r\n{REV}\r\n"),
                "content-length",
            ),
            ("GET / HTTP/1.1\r\n\r\n".to_string(), "no revision named"),
            (
                "GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n".to_string(),
                "hosts",
            ),
            (
                "GET / HTTP/1.1\r\nx-revision-namespace: NS\r\nx-revision-name: r\r\n\r\n"
                    .to_string(),
                "invalid revision headers",
            ),
            (
                format!("GET / HTTP/1.1\r\n{REV}x-revision-name: r2\r\n\r\n"),
                "repeated revision header",
            ),
            ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_string(), "unparsed"),
            // Bare LF anywhere, and the smuggling shape: a header hidden behind one.
            (
                format!("GET / HTTP/1.1\n{}\n", REV.replace("\r\n", "\n")),
                "bare LF",
            ),
            (
                format!("POST / HTTP/1.1\r\nx: a\ncontent-length: 10\r\n{REV}\r\n"),
                "bare LF",
            ),
            // Lengths: Unicode whitespace, past 2^63 - 1, near 2^64 (wraps a sum).
            (
                format!("POST / HTTP/1.1\r\ncontent-length: \u{a0}5\r\n{REV}\r\n"),
                "content-length",
            ),
            (
                format!("POST / HTTP/1.1\r\ncontent-length: 9223372036854775808\r\n{REV}\r\n"),
                "content-length",
            ),
            (
                format!("POST / HTTP/1.1\r\ncontent-length: 18446744073709551610\r\n{REV}\r\n"),
                "content-length",
            ),
            (
                format!("POST / HTTP/1.1\r\ncontent-length: 5, 5\r\n{REV}\r\n"),
                "content-length",
            ),
            // A hop is hyper's path to check; two Hosts are a 400 there.
            (
                format!("GET / HTTP/1.1\r\nx-activator-hop: n1\r\n{REV}\r\n"),
                "hop",
            ),
            (
                format!("GET / HTTP/1.1\r\nx-activator-hop-proof: s\r\n{REV}\r\n"),
                "hop",
            ),
            (
                format!("GET / HTTP/1.1\r\nx-activator-hop-spill: 1\r\n{REV}\r\n"),
                "hop",
            ),
            // So are the hints between entries and members: removed there from a client's.
            (
                format!("GET / HTTP/1.1\r\nX-Activator-Subset-Version: 9\r\n{REV}\r\n"),
                "hop",
            ),
            (
                format!("GET / HTTP/1.1\r\nx-activator-host-stale: 1\r\n{REV}\r\n"),
                "hop",
            ),
            (
                format!("GET / HTTP/1.1\r\nx-activator-hop-revision: ns/r\r\n{REV}\r\n"),
                "hop",
            ),
            (
                format!("GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n{REV}\r\n"),
                "hosts",
            ),
            (
                "GET / HTTP/1.1\r\nbad header\r\n\r\n".to_string(),
                "unparsed",
            ),
        ] {
            assert_eq!(fallback(&req), why, "{req:?}");
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        assert_eq!(
            fallback(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            "unparsed"
        );
    }

    fn request_out(req: &str, client: &str) -> String {
        let mut out = Vec::new();
        let head = fast(req);
        let (bytes, client, target) = (
            &req.as_bytes()[..head.len],
            Client::new(client.parse().unwrap()),
            "127.1.0.5:8080".parse().unwrap(),
        );
        write_request(&mut out, bytes, &head, &client, target);
        // A head that goes out as it is gets what parsing it again would give, but for
        // the order of the headers (none is dropped or merged).
        if head.plain.is_some() {
            let mut slow = Vec::new();
            write_request_reparsed(&mut slow, bytes, client.ip, target);
            let lines = |b: &[u8]| {
                let mut l: Vec<String> = String::from_utf8_lossy(b)
                    .lines()
                    .map(str::to_string)
                    .collect();
                l.sort();
                l
            };
            assert_eq!(lines(&out), lines(&slow));
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn only_heads_with_nothing_to_drop_or_merge_go_out_as_they_are() {
        assert!(
            fast(&format!(
                "GET / HTTP/1.1\r\nhost: a\r\nx-forwarded-proto: https\r\n{REV}\r\n"
            ))
            .plain
            .is_some()
        );
        for req in [
            format!("GET / HTTP/1.1\r\nconnection: keep-alive\r\n{REV}\r\n"),
            format!("GET / HTTP/1.1\r\nx-forwarded-for: 1.1.1.1\r\n{REV}\r\n"),
        ] {
            assert!(fast(&req).plain.is_none(), "{req:?}");
        }
    }

    #[test]
    fn the_pod_gets_the_head_without_hop_by_hop_headers_and_with_forwarding_ones() {
        let out = request_out(
            &format!(
                "GET /a?b HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-Forwarded-For: 10.0.0.1\r\nX-Forwarded-Proto: https\r\n{REV}\r\n"
            ),
            "127.0.0.9",
        );
        assert_eq!(
            out,
            "GET /a?b HTTP/1.1\r\nHost: app.test\r\nX-Forwarded-Proto: https\r\n\
             x-revision-namespace: ns\r\nx-revision-name: r1\r\n\
             x-forwarded-for: 10.0.0.1, 127.0.0.9\r\nx-forwarded-host: app.test\r\n\
             forwarded: for=127.0.0.9;proto=http;host=app.test\r\n\r\n"
        );
        // No Host: the target's address; what a proxy in front said is kept and the real
        // peer appended.
        let out = request_out(
            &format!("GET / HTTP/1.1\r\nx-forwarded-for: 1.2.3.4\r\nte: trailers\r\n{REV}\r\n"),
            "127.0.0.9",
        );
        assert_eq!(
            out,
            "GET / HTTP/1.1\r\nte: trailers\r\n\
             x-revision-namespace: ns\r\nx-revision-name: r1\r\nhost: 127.1.0.5:8080\r\n\
             x-forwarded-for: 1.2.3.4, 127.0.0.9\r\nx-forwarded-proto: http\r\n\
             forwarded: for=127.0.0.9;proto=http\r\n\r\n"
        );
    }

    /// The same forwarding headers as hyper's path writes for the same request.
    #[test]
    fn forwarding_headers_match_the_hyper_path() {
        // Written from the connection's own elements (request_out compares with the parse).
        let plain = request_out(&format!("GET / HTTP/1.1\r\nhost: h:81\r\n{REV}\r\n"), "::1");
        assert!(
            plain.contains("forwarded: for=\"[::1]\";proto=http;host=\"h:81\"\r\n"),
            "{plain}"
        );
        let out = request_out(
            &format!(
                "GET / HTTP/1.1\r\nhost: h:81\r\nforwarded: for=1.1.1.1\r\nforwarded: for=2.2.2.2\r\n{REV}\r\n"
            ),
            "::1",
        );
        let mut h = http::HeaderMap::new();
        h.append("forwarded", "for=1.1.1.1".parse().unwrap());
        h.append("forwarded", "for=2.2.2.2".parse().unwrap());
        forwarded::add(&mut h, Some("::1".parse().unwrap()), Some("h:81"));
        for name in [
            "forwarded",
            "x-forwarded-for",
            "x-forwarded-host",
            "x-forwarded-proto",
        ] {
            let line = format!("{name}: {}\r\n", h[name].to_str().unwrap());
            assert!(out.contains(&line), "{line:?} in {out:?}");
        }
    }

    #[test]
    fn the_body_is_what_follows_the_head_up_to_its_length() {
        let head = fast(&format!(
            "POST / HTTP/1.1\r\ncontent-length: 4\r\n{REV}\r\n"
        ));
        assert_eq!(body_in(head.len + 2, &head), head.len..head.len + 2);
        assert_eq!(body_in(head.len + 9, &head), head.len..head.len + 4);
    }
}
