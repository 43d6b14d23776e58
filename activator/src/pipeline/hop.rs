//! Telling a peer activator's forwarded request from a client's (the contract: `x-activator-hop` is
//! honoured only from a peer activator). Pure: no IO.
//!
//! The proof is a shared secret, the same for every activator of a cluster (a Secret mounted
//! into the DaemonSet, `--hop-secret-file`), sent beside the hop header as
//! `x-activator-hop-proof`. Why not the peer's address: a forwarded request reaches a member's
//! hostPort from the peer pod's address, its node's (when the CNI masquerades) or a load
//! balancer's, depending on the network — no address check holds on every cluster, and a
//! client on a node's network could share it. Why not a signature per request: the hop
//! travels on the cluster network an attacker who could read the proof could also reach the
//! pods on directly; a static secret compared in constant time keeps the hot path at one
//! comparison. Without a secret, no hop is honoured (and the activator warns at start).
//!
//! A hop that is not proven is treated as a client header: removed, the request routed as
//! any other. Neither header ever reaches an app, and a hop never changes what the app
//! learns about the client: the forwarding headers always get the real peer address
//! appended ([`crate::upstream::proxy`]).

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::error::Error;
use crate::wire::naming::{RevisionKey, is_dns_label, is_dns_subdomain};

pub use crate::http1::names::{HOP, HOP_REVISION, HOST_STALE, PROOF, SPILL, SUBSET_VERSION};

/// The cluster's hop secret, if this activator has one.
#[derive(Clone, Default)]
pub struct HopAuth {
    secret: Option<HeaderValue>,
}

impl std::fmt::Debug for HopAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself.
        f.debug_struct("HopAuth")
            .field("configured", &self.secret.is_some())
            .finish()
    }
}

impl HopAuth {
    /// No secret: no hop is honoured.
    pub fn none() -> Self {
        Self::default()
    }

    /// From the secret's text (a mounted Secret's file: surrounding whitespace, such as a
    /// final newline, is not part of it).
    pub fn new(secret: &str) -> Result<Self, Error> {
        let s = secret.trim();
        if s.is_empty() {
            return Err(Error::Config("the hop secret is empty".into()));
        }
        let v = HeaderValue::from_str(s)
            .ok()
            .filter(|_| s.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| {
                Error::Config(
                    "the hop secret must be visible ASCII (it travels in a header)".into(),
                )
            })?;
        Ok(Self { secret: Some(v) })
    }

    /// `Bearer <secret>`: the proof a directory replica asks before it streams this node's
    /// memberships (`cache::member_stream`).
    pub fn bearer(&self) -> Option<HeaderValue> {
        let s = self.secret.as_ref()?;
        let mut v = HeaderValue::from_bytes(&[b"Bearer ", s.as_bytes()].concat()).ok()?;
        v.set_sensitive(true);
        Some(v)
    }

    pub fn configured(&self) -> bool {
        self.secret.is_some()
    }

    /// Whether `headers` carry a hop made by a peer activator: the hop header, and exactly
    /// one proof equal to this cluster's secret.
    pub fn verified(&self, headers: &HeaderMap) -> bool {
        let Some(secret) = &self.secret else {
            return false;
        };
        if !headers.contains_key(&HOP) {
            return false;
        }
        let mut proofs = headers.get_all(&PROOF).iter();
        match (proofs.next(), proofs.next()) {
            (Some(p), None) => constant_time_eq(p.as_bytes(), secret.as_bytes()),
            _ => false,
        }
    }

    /// The headers a forward to a peer carries: the hop naming this node, and the proof;
    /// with `spill`, the mark that another member can take the request if this one cannot
    /// serve it at once.
    pub fn forward_headers(&self, node: &str, spill: bool) -> Vec<(HeaderName, String)> {
        let mut h = vec![(HOP, node.to_string())];
        if let Some(s) = &self.secret
            && let Ok(s) = s.to_str()
        {
            h.push((PROOF, s.to_string()));
        }
        if spill {
            h.push((SPILL, "1".to_string()));
        }
        h
    }
}

/// Whether a proven hop says the request may spill to another member (see
/// [`crds::contract::HEADER_ACTIVATOR_HOP_SPILL`]); only asked once [`HopAuth::verified`] held.
pub fn may_spill(headers: &HeaderMap) -> bool {
    headers.get(&SPILL).is_some_and(|v| v.as_bytes() == b"1")
}

/// What a forward of a request resolved by its Host adds beside the hop: the revision the
/// entry picked (the member serves that one, not a pick of its own), and the version of that
/// revision's subset the host answer was read at, when known (a member with a newer copy
/// says so: [`crds::contract::HEADER_ACTIVATOR_SUBSET_VERSION`]).
pub fn pick_headers(key: &RevisionKey, version: Option<&str>) -> Vec<(HeaderName, String)> {
    let mut h = vec![(HOP_REVISION, format!("{}/{}", key.namespace, key.name))];
    if let Some(v) = version {
        h.push((SUBSET_VERSION, v.to_string()));
    }
    h
}

/// The revision a proven hop's entry picked (only asked once [`HopAuth::verified`] held);
/// None without one, or with one that is not a revision's name.
pub fn picked_revision(headers: &HeaderMap) -> Option<RevisionKey> {
    let v = headers.get(&HOP_REVISION)?.to_str().ok()?;
    let (ns, name) = v.split_once('/')?;
    (is_dns_label(ns) && is_dns_subdomain(name)).then(|| RevisionKey::new(ns, name))
}

/// The version of the picked revision's subset a proven hop's host answer was read at.
pub fn subset_version(headers: &HeaderMap) -> Option<&str> {
    headers.get(&SUBSET_VERSION)?.to_str().ok()
}

/// Whether a member's answer says the host answer this entry forwarded by is older than the
/// member's subset ([`crds::contract::HEADER_ACTIVATOR_HOST_STALE`]).
pub fn says_stale(headers: &HeaderMap) -> bool {
    headers
        .get(&HOST_STALE)
        .is_some_and(|v| v.as_bytes() == b"1")
}

pub use crate::http1::hop_by_hop::strip_activator_hops as strip;

/// Equality whose time does not depend on where the first difference is (the length of the
/// secret is not hidden; it is not the secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_a_hop_with_the_clusters_proof_is_honoured() {
        let auth = HopAuth::new("s3cret\n").unwrap();
        let hop = "x-activator-hop";
        let proof = "x-activator-hop-proof";
        assert!(auth.verified(&headers(&[(hop, "n1"), (proof, "s3cret")])));
        for forged in [
            headers(&[(hop, "n1")]),
            headers(&[(hop, "n1"), (proof, "guess")]),
            headers(&[(hop, "n1"), (proof, "s3cre")]),
            headers(&[(hop, "n1"), (proof, "s3cret"), (proof, "s3cret")]),
            headers(&[(proof, "s3cret")]),
        ] {
            assert!(!auth.verified(&forged), "{forged:?}");
        }
        // No secret configured: nothing is honoured, not even an empty proof.
        assert!(!HopAuth::none().verified(&headers(&[(hop, "n1"), (proof, "")])));
    }

    #[test]
    fn a_forward_carries_the_node_and_the_proof_and_strip_removes_both() {
        let auth = HopAuth::new("abc").unwrap();
        let mut h = HeaderMap::new();
        for (n, v) in auth.forward_headers("node-1", true) {
            h.insert(n, v.parse().unwrap());
        }
        assert!(auth.verified(&h));
        assert!(may_spill(&h));
        assert_eq!(h[&HOP], "node-1");
        strip(&mut h);
        assert!(h.is_empty());
        assert_eq!(HopAuth::none().forward_headers("n", false).len(), 1);
        assert!(
            !auth
                .forward_headers("n", false)
                .iter()
                .any(|(n, _)| n == SPILL)
        );
    }

    #[test]
    fn a_pick_carries_the_revision_and_version_and_strip_removes_them() {
        let key = RevisionKey::new("ns", "r-1.v2");
        let mut h = HeaderMap::new();
        for (n, v) in pick_headers(&key, Some("42")) {
            h.insert(n, v.parse().unwrap());
        }
        assert_eq!(picked_revision(&h), Some(key.clone()));
        assert_eq!(subset_version(&h), Some("42"));
        assert_eq!(pick_headers(&key, None).len(), 1);
        for bad in ["ns", "NS/r", "ns/", "/r", "ns/r/x", "n s/r"] {
            let h = headers(&[("x-activator-hop-revision", bad)]);
            assert_eq!(picked_revision(&h), None, "{bad}");
        }
        h.insert("x-activator-host-stale", HeaderValue::from_static("1"));
        assert!(says_stale(&h));
        assert!(!says_stale(&headers(&[("x-activator-host-stale", "0")])));
        strip(&mut h);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn unusable_secrets_are_refused_with_a_reason() {
        assert!(
            HopAuth::new(" \n")
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        assert!(
            HopAuth::new("a b")
                .unwrap_err()
                .to_string()
                .contains("visible ASCII")
        );
        assert!(
            format!("{:?}", HopAuth::new("topsecret").unwrap())
                .find("topsecret")
                .is_none()
        );
    }
}
