//! HTTP plumbing: query strings, bodies and JSON responses.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::{Response, StatusCode, header};
use serde_json::Value;

use super::status::ApiError;

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed_unsync()
}

/// Decoded query parameters, in order (kube-client sends `?&a=b`, so empty pairs are skipped).
#[derive(Debug, Default, Clone)]
pub(crate) struct Query(Vec<(String, String)>);

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Query {
    pub fn parse(q: Option<&str>) -> Self {
        let Some(q) = q else { return Self::default() };
        Self(
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (decode(k), decode(v)),
                    None => (decode(p), String::new()),
                })
                .collect(),
        )
    }
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(kk, _)| kk == k)
            .map(|(_, v)| v.as_str())
    }
    /// Non-empty value of `k`.
    pub fn non_empty(&self, k: &str) -> Option<&str> {
        self.get(k).filter(|v| !v.is_empty())
    }
    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1" | "True"))
    }
    pub fn all(&self, k: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(kk, _)| kk == k)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// A JSON response with an optional list of warnings (sent as `Warning: 299 - "..."`).
pub(crate) fn json_response(code: u16, body: Bytes, warnings: &[String]) -> Response<Body> {
    let mut b = Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::OK))
        .header(header::CONTENT_TYPE, "application/json");
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        b = b.header("Warning", format!("299 - \"{escaped}\""));
    }
    b.body(full(body)).expect("valid response")
}

pub(crate) fn value_response(code: u16, v: &Value, warnings: &[String]) -> Response<Body> {
    json_response(
        code,
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
        warnings,
    )
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    value_response(e.code, &e.to_value(), &[])
}

pub(crate) fn text_response(code: u16, ctype: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::OK))
        .header(header::CONTENT_TYPE, ctype)
        .body(full(body))
        .expect("valid response")
}

/// Minimal standard base64 (continue tokens are opaque base64 like the real server's).
pub(crate) fn b64_encode(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if c.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if c.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

pub(crate) fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for c in s.chunks(4) {
        let mut n = 0u32;
        for (i, &b) in c.iter().enumerate() {
            n |= val(b)? << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if c.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if c.len() > 3 {
            out.push(n as u8);
        }
        if c.len() == 1 {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some("&labelSelector=app%3Dweb%2Cx+in+(a)&watch=true&x"));
        assert_eq!(q.get("labelSelector"), Some("app=web,x in (a)"));
        assert!(q.flag("watch"));
        assert_eq!(q.get("x"), Some(""));
        assert_eq!(q.get("y"), None);
    }

    #[test]
    fn base64_roundtrip() {
        for s in [
            "",
            "a",
            "ab",
            "abc",
            "abcd",
            "{\"rv\":12,\"start\":\"ns/x\\u0000\"}",
        ] {
            assert_eq!(b64_decode(&b64_encode(s.as_bytes())).unwrap(), s.as_bytes());
        }
        assert_eq!(b64_encode(b"abcd"), "YWJjZA==");
    }
}
