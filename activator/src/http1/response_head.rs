//! HTTP/1.1 response heads for the fast lane, as bytes (the client side): the response head
//! it reads from the pod and the one it sends back. Pure: no IO.
//!
//! Responses are held to the same rules as requests ([`super::request_head`]): a head that
//! is not CRLF throughout is rewritten, not relayed as it is; `Content-Length` beside
//! `Transfer-Encoding` is removed (RFC 9112 §6.3); `Connection` never removes a framing
//! header.

use std::fmt::Write as _;

use crds::contract::HEADER_ACTIVATOR_HOST_STALE;

use super::request_head::{MAX_HEADERS, Writer, has_bare_lf, header};
use crate::http1::framing::content_length;

/// How a response's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body (HEAD, 1xx, 204, 304).
    Empty,
    Length(u64),
    Chunked,
    /// Until the app closes the connection.
    UntilClose,
}

/// A response head from the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub len: usize,
    pub status: u16,
    pub framing: BodyFraming,
    /// The app closes the connection after this response.
    pub close: bool,
    /// HTTP/1.1 with no header to drop and no `x-activator-node`: it goes to the client as it
    /// is, with headers only added.
    pub plain: bool,
    /// Streaming by design ([`crate::http1::streaming`]): not bounded by the revision's timeout,
    /// only by the body idle timeout.
    pub streaming: bool,
}

impl ResponseHead {
    /// 1xx other than 101: another head follows.
    pub fn informational(&self) -> bool {
        (100..200).contains(&self.status) && self.status != 101
    }
}

/// Why a pod's response cannot be carried (answered 502).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadResponse(pub &'static str);

/// Parses the response head at the start of `buf`: None while it is not whole. Held to
/// what hyper's client accepts: a head it refuses is refused here too (502).
pub fn parse_response(buf: &[u8], to_head: bool) -> Result<Option<ResponseHead>, BadResponse> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(BadResponse("a response head that does not parse")),
    };
    let status = resp.code.ok_or(BadResponse("no status"))?;
    if status == 101 {
        return Err(BadResponse("101 to a request that asked for no upgrade"));
    }
    let http10 = resp.version == Some(0);
    // Relayed as it came only when every line ends in CRLF: a client that splits lines
    // on CRLF alone must read the same headers as this parse did.
    let plain = !http10 && !has_bare_lf(&buf[..len]);
    let seen = Seen::scan(resp.headers, http10, plain)?;
    let no_body = to_head || (100..200).contains(&status) || status == 204 || status == 304;
    // HTTP/1.0 has no transfer codings: a body framed by one is refused, as hyper's client
    // refuses it (a response without a body has no framing to get wrong).
    if http10 && seen.encoded && !no_body {
        return Err(BadResponse("transfer-encoding in an HTTP/1.0 response"));
    }
    let framing = seen.framing(no_body);
    Ok(Some(ResponseHead {
        len,
        status,
        framing,
        close: seen.close || framing == BodyFraming::UntilClose,
        plain: seen.plain,
        streaming: seen.streaming,
    }))
}

/// What a response's headers say about its framing and how it is relayed.
struct Seen {
    length: Option<u64>,
    /// The last transfer coding is chunked.
    chunked: bool,
    /// A transfer-encoding header.
    encoded: bool,
    close: bool,
    plain: bool,
    streaming: bool,
}

impl Seen {
    /// The response's headers in order, from what the status line said: the connection
    /// closes after an HTTP/1.0 response (`http10`) unless kept alive, and `plain` unless a
    /// header is dropped or rewritten on the way.
    fn scan(
        headers: &[httparse::Header<'_>],
        http10: bool,
        plain: bool,
    ) -> Result<Self, BadResponse> {
        let mut seen = Seen {
            length: None,
            chunked: false,
            encoded: false,
            close: http10,
            plain,
            streaming: false,
        };
        for h in headers {
            let is = |n: &str| h.name.eq_ignore_ascii_case(n);
            if is("content-length") {
                let n = content_length(h.value).ok_or(BadResponse("an invalid content-length"))?;
                if seen.length.is_some_and(|l| l != n) {
                    return Err(BadResponse("two different content-lengths"));
                }
                seen.length = Some(n);
            } else if is("transfer-encoding") {
                seen.encoded = true;
                // Only the last coding says whether the message is chunked.
                seen.chunked = h
                    .value
                    .rsplit(|b| *b == b',')
                    .next()
                    .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if is("connection") {
                seen.plain = false;
                for t in h.value.split(|b| *b == b',') {
                    let t = t.trim_ascii();
                    if t.eq_ignore_ascii_case(b"close") {
                        seen.close = true;
                    } else if t.eq_ignore_ascii_case(b"keep-alive") && http10 {
                        seen.close = false;
                    }
                }
            } else if is("content-type") {
                seen.streaming = crate::http1::streaming::is_streaming_type(h.value);
            } else if is("keep-alive")
                || is("proxy-connection")
                || is("te")
                || is("trailer")
                || is("upgrade")
                || is(crate::http1::names::HEADER_SERVED_BY)
                || is(HEADER_ACTIVATOR_HOST_STALE)
            {
                seen.plain = false;
            }
        }
        // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length, which is removed before
        // the message goes on (a client reading the length would frame it differently).
        if seen.encoded && seen.length.is_some() {
            seen.plain = false;
        }
        Ok(seen)
    }

    /// How the body is delimited: none (`no_body`: a HEAD request, 1xx, 204, 304, or a zero
    /// length), a length, chunks, or the app closing the connection.
    fn framing(&self, no_body: bool) -> BodyFraming {
        if no_body {
            BodyFraming::Empty
        } else if self.encoded {
            if self.chunked {
                BodyFraming::Chunked
            } else {
                BodyFraming::UntilClose
            }
        } else {
            match self.length {
                Some(0) => BodyFraming::Empty,
                Some(n) => BodyFraming::Length(n),
                None => BodyFraming::UntilClose,
            }
        }
    }
}

/// What the fast lane adds to a response head.
#[derive(Debug, Default)]
pub struct Additions<'a> {
    /// `x-activator-node`, unless the app set it.
    pub served_by: &'a [u8],
    /// `x-activator-cold-start: true` and `server-timing` for a request that waited.
    pub cold: Option<&'a str>,
    /// `connection: close`: the client connection ends after this response.
    pub close: bool,
}

/// Writes the response head to send to the client into `out`: the app's, as HTTP/1.1,
/// without hop-by-hop headers (those the app's `Connection` names too), plus `add`.
pub fn write_response(out: &mut Vec<u8>, head: &[u8], plain: bool, add: &Additions<'_>) {
    if !plain {
        return write_response_reparsed(out, head, add);
    }
    out.extend_from_slice(&head[..head.len() - 2]);
    header(
        out,
        crate::http1::names::HEADER_SERVED_BY.as_bytes(),
        add.served_by,
    );
    add_to_response(out, add);
}

/// What goes after the app's headers, blank line included.
fn add_to_response(out: &mut Vec<u8>, add: &Additions<'_>) {
    if let Some(timing) = add.cold {
        header(
            out,
            crate::http1::names::HEADER_COLD_START.as_bytes(),
            b"true",
        );
        if !timing.is_empty() {
            header(
                out,
                crate::http1::names::HEADER_SERVER_TIMING.as_bytes(),
                timing.as_bytes(),
            );
        }
    }
    if add.close {
        header(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
}

/// [`write_response`] for a head with headers to drop: parsed again, header by header.
fn write_response_reparsed(out: &mut Vec<u8>, head: &[u8], add: &Additions<'_>) {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    // Parsed before: the parse cannot fail.
    let _ = resp.parse(head);
    let status = resp.code.unwrap_or(502);
    let _ = write!(
        Writer(out),
        "HTTP/1.1 {status} {}\r\n",
        resp.reason.unwrap_or("")
    );
    let named: Vec<&[u8]> = resp
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
        .collect();
    let encoded = resp
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
    let mut served_by = false;
    for h in resp.headers.iter() {
        let is = |n: &str| h.name.eq_ignore_ascii_case(n);
        // The framing headers describe the bytes relayed as they are: `Connection` cannot
        // remove them, and a length beside a transfer coding goes (RFC 9112 §6.3).
        if is("transfer-encoding") || (is("content-length") && !encoded) {
            header(out, h.name.as_bytes(), h.value);
            continue;
        }
        if is("content-length") {
            continue;
        }
        // An app's host-stale hint is not an activator's: dropped (it would have the client's
        // entry, if it were a peer, read the host again).
        if is("connection")
            || is("keep-alive")
            || is("proxy-connection")
            || is("te")
            || is("trailer")
            || is("upgrade")
            || is(HEADER_ACTIVATOR_HOST_STALE)
            || named
                .iter()
                .any(|n| n.eq_ignore_ascii_case(h.name.as_bytes()))
        {
            continue;
        }
        served_by |= is(crate::http1::names::HEADER_SERVED_BY);
        header(out, h.name.as_bytes(), h.value);
    }
    if !served_by {
        header(
            out,
            crate::http1::names::HEADER_SERVED_BY.as_bytes(),
            add.served_by,
        );
    }
    add_to_response(out, add);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(head: &str, to_head: bool) -> ResponseHead {
        parse_response(head.as_bytes(), to_head).unwrap().unwrap()
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        let f = |h: &str| response(h, false).framing;
        assert_eq!(
            f("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"),
            BodyFraming::Length(5)
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            BodyFraming::Empty
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            BodyFraming::Chunked
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n"),
            BodyFraming::UntilClose
        );
        assert_eq!(
            f("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n"),
            BodyFraming::Empty
        );
        assert_eq!(f("HTTP/1.1 304 Not Modified\r\n\r\n"), BodyFraming::Empty);
        assert_eq!(
            response("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", true).framing,
            BodyFraming::Empty
        );
        let until_close = response("HTTP/1.1 200 OK\r\n\r\n", false);
        assert_eq!(
            (until_close.framing, until_close.close),
            (BodyFraming::UntilClose, true)
        );
        assert!(response("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n", false).close);
        assert!(
            !response(
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
                false
            )
            .close
        );
        assert!(
            response(
                "HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 1\r\n\r\n",
                false
            )
            .close
        );
        assert!(response("HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n", false).informational());
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\ncontent-le", false),
            Ok(None)
        );
        assert!(
            parse_response(
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                false
            )
            .is_err()
        );
        assert!(parse_response(b"HTTP/1.1 101 Switching\r\n\r\n", false).is_err());
        assert!(parse_response(b"garbage\r\n\r\n", false).is_err());
    }

    #[test]
    fn an_apps_host_stale_hint_never_reaches_the_client() {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nX-Activator-Host-Stale: 1\r\nx-app: a\r\n\r\n";
        let rh = parse_response(head.as_bytes(), false).unwrap().unwrap();
        assert!(!rh.plain, "the head must be rewritten without it");
        let mut out = Vec::new();
        let add = Additions {
            served_by: b"node-1",
            ..Default::default()
        };
        write_response(&mut out, head.as_bytes(), rh.plain, &add);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nx-app: a\r\nx-activator-node: node-1\r\n\r\n"
        );
    }

    #[test]
    fn the_client_gets_the_apps_head_without_hop_by_hop_headers() {
        let head = "HTTP/1.0 200 Fine\r\nContent-Length: 2\r\nConnection: keep-alive, x-hop\r\nKeep-Alive: timeout=5\r\nx-hop: 1\r\nx-app: a\r\n\r\n";
        let mut out = Vec::new();
        let rh = parse_response(head.as_bytes(), false).unwrap().unwrap();
        assert!(!rh.plain);
        write_response(
            &mut out,
            head.as_bytes(),
            rh.plain,
            &Additions {
                served_by: b"node-1",
                cold: Some("pod-ready;dur=3"),
                close: true,
            },
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 Fine\r\nContent-Length: 2\r\nx-app: a\r\nx-activator-node: node-1\r\n\
             x-activator-cold-start: true\r\nserver-timing: pod-ready;dur=3\r\nconnection: close\r\n\r\n"
        );
        let mut out = Vec::new();
        write_response(
            &mut out,
            b"HTTP/1.1 204 \r\nx-activator-node: other\r\n\r\n",
            false,
            &Additions {
                served_by: b"node-1",
                ..Default::default()
            },
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 204 \r\nx-activator-node: other\r\n\r\n"
        );
    }

    #[test]
    fn a_plain_response_head_gets_what_parsing_it_again_would_give() {
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-app: a\r\n\r\n";
        let rh = parse_response(head, false).unwrap().unwrap();
        assert!(rh.plain);
        let add = Additions {
            served_by: b"n1",
            cold: Some("wait;dur=1"),
            close: true,
        };
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        write_response(&mut fast, head, true, &add);
        write_response(&mut slow, head, false, &add);
        assert_eq!(
            String::from_utf8(fast).unwrap(),
            String::from_utf8(slow).unwrap()
        );
        for not_plain in [
            &b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nkeep-alive: timeout=5\r\ncontent-length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nx-activator-node: x\r\ncontent-length: 2\r\n\r\n",
        ] {
            assert!(!parse_response(not_plain, false).unwrap().unwrap().plain);
        }
    }
}
