//! Telling the app who asked: `x-forwarded-for`, `-proto`, `-host` and RFC 7239 `forwarded`,
//! added by the first activator a request reaches.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderValue};

/// The peer address of the client connection a request arrived on, put in the request's
/// extensions by [`crate::server`] at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

pub const X_FORWARDED_FOR: &str = "x-forwarded-for";
pub const X_FORWARDED_PROTO: &str = "x-forwarded-proto";
pub const X_FORWARDED_HOST: &str = "x-forwarded-host";
pub const FORWARDED: &str = "forwarded";

/// Adds the forwarding headers for a request from `client` for `host`, keeping what a proxy in
/// front already said: `x-forwarded-for` and `forwarded` are appended to, `x-forwarded-proto`
/// and `x-forwarded-host` are set only when absent (an ingress that terminated TLS knows the
/// scheme better than we do). The activator speaks plain HTTP, so its own `proto` is `http`.
pub fn add(headers: &mut HeaderMap, client: Option<IpAddr>, host: Option<&str>) {
    if let Some(ip) = client {
        let ip = ip.to_string();
        let joined = joined(headers, X_FORWARDED_FOR);
        let xff = match joined {
            Some(before) if !before.trim().is_empty() => format!("{before}, {ip}"),
            _ => ip,
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            headers.insert(X_FORWARDED_FOR, v);
        }
    }
    if !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if let Some(host) = host
        && !headers.contains_key(X_FORWARDED_HOST)
        && let Ok(v) = HeaderValue::from_str(host)
    {
        headers.insert(X_FORWARDED_HOST, v);
    }

    let mut element = Vec::with_capacity(3);
    if let Some(ip) = client {
        element.push(format!("for={}", node(ip)));
    }
    element.push("proto=http".to_string());
    if let Some(host) = host {
        element.push(format!("host={}", value(host)));
    }
    let element = element.join(";");
    let forwarded = match joined(headers, FORWARDED) {
        Some(before) if !before.trim().is_empty() => format!("{before}, {element}"),
        _ => element,
    };
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert(FORWARDED, v);
    }
}

/// All values of a list header as one comma-separated value (RFC 9110 §5.3), so appending
/// leaves a single header line whatever the client sent.
fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// RFC 7239 §6: an IPv6 node is bracketed, and so must be quoted.
fn node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    }
}

/// A token as is, anything else (a host with a port has a `:`) as a quoted string.
fn value(s: &str) -> String {
    let is_tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !s.is_empty() && s.chars().all(is_tchar) {
        s.to_string()
    } else {
        let escaped: String = s
            .chars()
            .flat_map(|c| match c {
                '"' | '\\' => vec!['\\', c],
                c => vec![c],
            })
            .collect();
        format!("\"{escaped}\"")
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
