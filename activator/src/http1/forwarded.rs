//! Telling the app who asked: `x-forwarded-for`, `-proto`, `-host` and RFC 7239 `forwarded`,
//! added by the first activator a request reaches.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue};

/// The peer address of the client connection a request arrived on, put in the request's
/// extensions by [`crate::accept::server`] at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

pub const X_FORWARDED_FOR: &str = "x-forwarded-for";
pub const X_FORWARDED_PROTO: &str = "x-forwarded-proto";
pub const X_FORWARDED_HOST: &str = "x-forwarded-host";
pub const FORWARDED: &str = "forwarded";

// Parsed once: inserting by `&str` parses the name on every request.
const XFF: HeaderName = HeaderName::from_static(X_FORWARDED_FOR);
const XFP: HeaderName = HeaderName::from_static(X_FORWARDED_PROTO);
const XFH: HeaderName = HeaderName::from_static(X_FORWARDED_HOST);
const FWD: HeaderName = HeaderName::from_static(FORWARDED);

/// Adds the forwarding headers for a request from `client` for `host`, keeping what a proxy in
/// front already said: `x-forwarded-for` and `forwarded` are appended to, `x-forwarded-proto`
/// and `x-forwarded-host` are set only when absent (an ingress that terminated TLS knows the
/// scheme better than we do). The activator speaks plain HTTP, so its own `proto` is `http`.
/// On every proxied request: each header value is written once, into its own buffer.
pub fn add(headers: &mut HeaderMap, client: Option<IpAddr>, host: Option<&str>) {
    if let Some(ip) = client
        && let Some(v) = value_of(x_forwarded_for(joined(headers, &XFF), ip))
    {
        headers.insert(XFF, v);
    }
    if !headers.contains_key(&XFP) {
        headers.insert(XFP, HeaderValue::from_static("http"));
    }
    if let Some(host) = host
        && !headers.contains_key(&XFH)
        && let Ok(v) = HeaderValue::from_str(host)
    {
        headers.insert(XFH, v);
    }
    if let Some(v) = value_of(forwarded(joined(headers, &FWD), client, host)) {
        headers.insert(FWD, v);
    }
}

/// `x-forwarded-for`: what came before (all values joined), then `client`.
pub fn x_forwarded_for(before: Option<String>, client: IpAddr) -> String {
    let mut xff = before.unwrap_or_default();
    if !xff.trim().is_empty() {
        xff.push_str(", ");
    } else {
        xff.clear();
    }
    let _ = write!(xff, "{client}");
    xff
}

/// `forwarded` (RFC 7239): what came before (all values joined), then this hop's element.
pub fn forwarded(before: Option<String>, client: Option<IpAddr>, host: Option<&str>) -> String {
    let mut fwd = before.unwrap_or_default();
    if !fwd.trim().is_empty() {
        fwd.push_str(", ");
    } else {
        fwd.clear();
    }
    if let Some(ip) = client {
        fwd.push_str("for=");
        node(&mut fwd, ip);
        fwd.push(';');
    }
    fwd.push_str("proto=http");
    if let Some(host) = host {
        fwd.push_str(";host=");
        value(&mut fwd, host);
    }
    fwd
}

/// A header value from a string, without copying it.
fn value_of(s: String) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(s)).ok()
}

/// All values of a list header as one comma-separated value (RFC 9110 §5.3), so appending
/// leaves a single header line whatever the client sent.
fn joined(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// RFC 7239 §6: an IPv6 node is bracketed, and so must be quoted.
fn node(out: &mut String, ip: IpAddr) {
    let _ = match ip {
        IpAddr::V4(v4) => write!(out, "{v4}"),
        IpAddr::V6(v6) => write!(out, "\"[{v6}]\""),
    };
}

/// Whether `s` is an RFC 9110 token, written in `forwarded` without quotes.
pub fn is_token(s: &str) -> bool {
    let is_tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    !s.is_empty() && s.chars().all(is_tchar)
}

/// A token as is, anything else (a host with a port has a `:`) as a quoted string.
pub fn value(out: &mut String, s: &str) {
    if is_token(s) {
        out.push_str(s);
    } else {
        out.push('"');
        for c in s.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(h: &'a HeaderMap, n: &str) -> &'a str {
        h.get(n).unwrap().to_str().unwrap()
    }

    #[test]
    fn a_fresh_request_gets_all_four() {
        let mut h = HeaderMap::new();
        add(
            &mut h,
            Some("10.1.2.3".parse().unwrap()),
            Some("app.example"),
        );
        assert_eq!(get(&h, X_FORWARDED_FOR), "10.1.2.3");
        assert_eq!(get(&h, X_FORWARDED_PROTO), "http");
        assert_eq!(get(&h, X_FORWARDED_HOST), "app.example");
        assert_eq!(
            get(&h, FORWARDED),
            "for=10.1.2.3;proto=http;host=app.example"
        );
    }

    #[test]
    fn what_a_proxy_in_front_set_is_kept_or_appended_to() {
        let mut h = HeaderMap::new();
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("1.1.1.1"));
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("2.2.2.2"));
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        h.insert(X_FORWARDED_HOST, HeaderValue::from_static("public.example"));
        h.insert(
            FORWARDED,
            HeaderValue::from_static("for=1.1.1.1;proto=https"),
        );
        add(
            &mut h,
            Some("::1".parse().unwrap()),
            Some("app.example:8080"),
        );
        assert_eq!(h.get_all(X_FORWARDED_FOR).iter().count(), 1);
        assert_eq!(get(&h, X_FORWARDED_FOR), "1.1.1.1, 2.2.2.2, ::1");
        assert_eq!(get(&h, X_FORWARDED_PROTO), "https");
        assert_eq!(get(&h, X_FORWARDED_HOST), "public.example");
        assert_eq!(
            get(&h, FORWARDED),
            "for=1.1.1.1;proto=https, for=\"[::1]\";proto=http;host=\"app.example:8080\""
        );
    }

    #[test]
    fn without_a_known_client_only_proto_and_host_are_said() {
        let mut h = HeaderMap::new();
        add(&mut h, None, None);
        assert!(!h.contains_key(X_FORWARDED_FOR));
        assert!(!h.contains_key(X_FORWARDED_HOST));
        assert_eq!(get(&h, FORWARDED), "proto=http");
    }
}
