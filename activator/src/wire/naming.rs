//! Which revision a request names (stage 1 of the request path). Pure logic, no IO: the
//! handler looks the answer up (a Host through [`crate::cache::hosts`]).
//!
//! A request names its revision with `x-revision-namespace` + `x-revision-name` (an ingress
//! sets them), Knative's `knative-serving-namespace` + `knative-serving-revision`, or by its
//! Host (`:authority` in HTTP/2).

use crds::contract::{
    HEADER_KNATIVE_NAMESPACE, HEADER_KNATIVE_REVISION, HEADER_REVISION_NAME,
    HEADER_REVISION_NAMESPACE,
};
use http::{HeaderMap, HeaderName};

/// A revision, as `namespace/name`: the one object key of `crds`.
pub use crds::ObjectKey as RevisionKey;

/// What a request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// A revision, by headers.
    Revision(RevisionKey),
    /// A host, to be looked up.
    Host(String),
}

/// Why a request names nothing usable (400 for bad names, 404 for no name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unnamed {
    /// Revision headers that cannot be Kubernetes names.
    BadName(String),
    /// Neither revision headers nor a host.
    Nothing,
}

/// The revision (or host) a request names. The revision headers win over the host; a pair
/// is used only when both of its headers are present.
pub fn named(headers: &HeaderMap, authority: Option<&str>) -> Result<Named, Unnamed> {
    // Parsed once, not on every request.
    const NAMESPACE: HeaderName = HeaderName::from_static(HEADER_REVISION_NAMESPACE);
    const NAME: HeaderName = HeaderName::from_static(HEADER_REVISION_NAME);
    const KNATIVE_NAMESPACE: HeaderName = HeaderName::from_static(HEADER_KNATIVE_NAMESPACE);
    const KNATIVE_REVISION: HeaderName = HeaderName::from_static(HEADER_KNATIVE_REVISION);
    let header = |n: &HeaderName| headers.get(n).and_then(|v| v.to_str().ok());
    let pair = header(&NAMESPACE)
        .zip(header(&NAME))
        .or_else(|| header(&KNATIVE_NAMESPACE).zip(header(&KNATIVE_REVISION)));
    if let Some((ns, name)) = pair {
        if !is_dns_label(ns) || !is_dns_subdomain(name) {
            return Err(Unnamed::BadName(format!(
                "invalid revision namespace/name in headers: {ns:?}/{name:?}"
            )));
        }
        return Ok(Named::Revision(RevisionKey::new(ns, name)));
    }
    // HTTP/2 carries the host in :authority, HTTP/1.1 in Host.
    let host = header(&http::header::HOST)
        .or(authority)
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .ok_or(Unnamed::Nothing)?;
    Ok(Named::Host(host.to_string()))
}

pub use crds::contract::{is_dns_label, is_dns_subdomain};

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn header_names_must_be_kubernetes_names() {
        assert!(is_dns_label("default"));
        assert!(is_dns_subdomain("rev-1.v2"));
        for bad in ["", "-a", "a-", "A", "a/b", "..", "a..b", &"x".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
        assert!(!is_dns_label("a.b"));
        assert!(!is_dns_subdomain("../etc"));
    }

    #[test]
    fn revision_headers_win_over_the_host_and_knative_headers_count() {
        let h = headers(&[
            ("host", "app.test"),
            ("x-revision-namespace", "ns"),
            ("x-revision-name", "r1"),
        ]);
        assert_eq!(
            named(&h, None),
            Ok(Named::Revision(RevisionKey::new("ns", "r1")))
        );
        let k = headers(&[
            ("knative-serving-namespace", "ns"),
            ("knative-serving-revision", "r2"),
        ]);
        assert_eq!(
            named(&k, None),
            Ok(Named::Revision(RevisionKey::new("ns", "r2")))
        );
        // Half a pair is no name: the host decides.
        let half = headers(&[("host", "app.test"), ("x-revision-name", "r1")]);
        assert_eq!(named(&half, None), Ok(Named::Host("app.test".into())));
        assert_eq!(
            named(&HeaderMap::new(), Some("h2.test:443")),
            Ok(Named::Host("h2.test:443".into()))
        );
        assert_eq!(named(&HeaderMap::new(), None), Err(Unnamed::Nothing));
        let bad = headers(&[("x-revision-namespace", "NS"), ("x-revision-name", "r")]);
        assert!(matches!(named(&bad, None), Err(Unnamed::BadName(_))));
    }

    proptest! {
        /// Whatever the headers hold, resolution never panics, and a revision it names is
        /// always a pair of valid Kubernetes names taken verbatim from one header pair.
        #[test]
        fn any_headers_resolve_to_valid_names_or_a_clear_refusal(
            ns in "[ -~]{0,70}",
            name in "[ -~]{0,70}",
            host in "[ -~]{0,40}",
            knative in any::<bool>(),
            with_host in any::<bool>(),
        ) {
            let (nh, rh) = if knative {
                ("knative-serving-namespace", "knative-serving-revision")
            } else {
                ("x-revision-namespace", "x-revision-name")
            };
            let mut h = HeaderMap::new();
            if let (Ok(n), Ok(r)) = (HeaderValue::from_str(&ns), HeaderValue::from_str(&name)) {
                h.insert(nh, n);
                h.insert(rh, r);
            }
            if with_host && let Ok(v) = HeaderValue::from_str(&host) {
                h.insert("host", v);
            }
            match named(&h, None) {
                Ok(Named::Revision(k)) => {
                    prop_assert!(is_dns_label(&k.namespace));
                    prop_assert!(is_dns_subdomain(&k.name));
                    prop_assert_eq!(k.namespace, ns);
                    prop_assert_eq!(k.name, name);
                }
                Ok(Named::Host(hv)) => {
                    prop_assert!(!hv.is_empty());
                    prop_assert!(!h.contains_key(nh), "a full header pair names a revision or is refused");
                }
                Err(Unnamed::BadName(_)) => prop_assert!(h.contains_key(nh)),
                Err(Unnamed::Nothing) => prop_assert!(!h.contains_key(nh)),
            }
        }
    }
}
