//! Message framing rules both request paths apply (RFC 9112 §6, RFC 9110 §8.6), so that the
//! fast lane and hyper's path cannot frame a message differently.

use std::time::Duration;

/// How long a client may take to send a request head, and an idle keep-alive connection may
/// wait for the next one: hyper's `header_read_timeout` and the fast lane's own timer.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest body length either lane accepts: nginx's (a signed 64-bit offset). hyper
/// takes up to 2^64 - 3, and a length near 2^64 wraps any sum a proxy makes with it.
pub const MAX_CONTENT_LENGTH: u64 = i64::MAX as u64;

/// A `Content-Length` value (RFC 9110 §8.6): `1*DIGIT`, with only the SP and HTAB around it
/// that httparse leaves (never Unicode whitespace: `str::trim` would take U+00A0, which
/// hyper and nginx refuse), and at most [`MAX_CONTENT_LENGTH`].
pub fn content_length(value: &[u8]) -> Option<u64> {
    let v = trim_ows(value);
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = v.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })?;
    (n <= MAX_CONTENT_LENGTH).then_some(n)
}

/// Optional whitespace (SP, HTAB: RFC 9110 §5.6.3) trimmed from both ends.
fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// What the activator refuses (400) in a request hyper's parser accepted: a body longer
/// than any it carries (hyper takes lengths up to 2^64 - 3; nginx refuses past 2^63 - 1,
/// and so does the fast lane), more than one Host (RFC 9112 §3.2), and chunked twice.
pub fn framing_problem(h: &http::HeaderMap) -> Option<&'static str> {
    let too_long = h
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .any(|v| content_length(v.as_bytes()).is_none());
    if too_long {
        return Some("invalid or too large content-length");
    }
    let mut hosts = h.get_all(http::header::HOST).iter();
    if hosts.next().is_some() && hosts.next().is_some() {
        return Some("more than one host header");
    }
    // RFC 9112 §6.1: chunked is applied once. hyper reads only whether the last coding is
    // chunked; passed on, `chunked, chunked` would be decoded twice by an app that honours it.
    let chunked = h
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .filter(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        .count();
    if chunked > 1 {
        return Some("the chunked transfer coding applied more than once");
    }
    None
}
