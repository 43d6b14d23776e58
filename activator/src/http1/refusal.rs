//! The answer the activator makes itself ([`Refusal`]) as HTTP/1.1 bytes, for the fast lane
//! (hyper's path writes the same answer from `Refusal::into_response`).

use super::names::HEADER_SERVED_BY;
use crate::wire::answer::{CONTENT_TYPE, Refusal};

/// The answer the activator makes itself, for a client connection that closes after it
/// (the request's body may not have been read).
pub fn refusal_bytes(out: &mut Vec<u8>, r: &Refusal, served_by: &[u8]) {
    use std::fmt::Write as _;
    let body = r.body_text();
    let mut s = String::with_capacity(160 + body.len());
    let _ = write!(
        s,
        "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\n",
        r.status.as_u16(),
        r.status.canonical_reason().unwrap_or(""),
        CONTENT_TYPE,
        body.len()
    );
    if let Some(secs) = r.retry_after_secs {
        let _ = write!(s, "retry-after: {secs}\r\n");
    }
    out.clear();
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(HEADER_SERVED_BY.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(served_by);
    out.extend_from_slice(b"\r\nconnection: close\r\n\r\n");
    out.extend_from_slice(body.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_why_and_closes() {
        let mut out = Vec::new();
        refusal_bytes(&mut out, &Refusal::unavailable("full"), b"n1");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
             content-length: 5\r\nretry-after: 1\r\nx-activator-node: n1\r\nconnection: close\r\n\r\nfull\n"
        );
    }
}
