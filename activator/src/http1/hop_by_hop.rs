//! Headers that describe one connection, not the message: removed from what is passed on, in
//! either direction (RFC 9110 §7.6.1).

use http::header::{CONTENT_LENGTH, HOST, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Whether a comma-separated header lists `token` (case-insensitively).
pub fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1). `TE: trailers`
/// stays: it says the client takes trailers, which gRPC needs the app to know. `Connection`
/// can name extension headers, never the message's framing or its Host: those are the
/// message's own, and removing them would let one side frame it differently.
pub fn strip(h: &mut HeaderMap) {
    let trailers = has_token(h, &TE, "trailers");
    let named: Vec<HeaderName> = h
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| n.trim().parse().ok())
        .filter(|n| *n != CONTENT_LENGTH && *n != TRANSFER_ENCODING && *n != HOST)
        .collect();
    for n in named {
        h.remove(n);
    }
    // Names parsed once, not per request (this runs on every request and response).
    const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
    const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
    for n in [
        http::header::CONNECTION,
        KEEP_ALIVE,
        PROXY_CONNECTION,
        TE,
        http::header::TRAILER,
        UPGRADE,
    ] {
        h.remove(n);
    }
    if trailers {
        h.insert(TE, HeaderValue::from_static("trailers"));
    }
}

/// Removes the headers only activators exchange — the hop and its proof, spill mark, picked
/// revision and subset version, and a host-stale hint — before a request goes to an app, or
/// on to a peer, which gets fresh ones.
pub fn strip_activator_hops(headers: &mut HeaderMap) {
    use super::names::{HOP, HOP_REVISION, HOST_STALE, PROOF, SPILL, SUBSET_VERSION};
    for n in [HOP, PROOF, SPILL, HOP_REVISION, SUBSET_VERSION, HOST_STALE] {
        headers.remove(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_and_te_trailers_stays() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private, te"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("te", HeaderValue::from_static("trailers, deflate"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("x-app", HeaderValue::from_static("kept"));
        strip(&mut h);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-app", "te"]);
        assert_eq!(h["te"], "trailers");
    }

    #[test]
    fn connection_never_removes_framing_or_host() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("content-length, transfer-encoding, host, x-a"),
        );
        h.insert("content-length", HeaderValue::from_static("5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("host", HeaderValue::from_static("app"));
        h.insert("x-a", HeaderValue::from_static("1"));
        strip(&mut h);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-length", "host", "transfer-encoding"]);
    }
}
