//! The directory: where an activator that cannot reach the API server looks up a Host or a
//! revision it has not seen (docs/architecture.md, "The scale it must hold": warm traffic does not need the control plane).
//!
//! Every subsetter replica, leader or standby, already keeps every Revision and every
//! ActivationEndpoints in memory for its reconciles, and keeps them through an API server
//! outage (a watch that fails keeps its store). It answers two reads from that memory, over
//! plain HTTP/1.1 on its directory port:
//!
//! - `GET /v1/hosts/<host>`: the revision that wins the host (the subsetter's own rule);
//! - `GET /v1/revisions/<namespace>/<name>`: that revision.
//!
//! Both answer `200` with a JSON [`DirectoryAnswer`], `404` when nothing matches, `400` for
//! a host or name that cannot be one, `503` until the replica's caches have synced. The
//! activator asks only when the API server gives no answer, so the directory carries an
//! outage's lookups, not the steady state's.
//!
//! A third read serves an activator's start: `GET /v1/members/<node>` answers the
//! ActivationEndpoints that carry the node's member label ([`MembersAnswer`]), as the
//! label-selected list the activator would make, and a resourceVersion its watch can start
//! from. On a real API server that list scans every ActivationEndpoints in the watch cache
//! (custom resources have no label index): at 100,000 revisions about 0.2 s of API server CPU
//! per activator started, and a DaemonSet rollout starts them all
//! (docs/membership-watch-cost.md). The subsetter holds the same objects in memory; the
//! watch from the answer's version is an O(events) read of the cache's recent history.

use serde::{Deserialize, Serialize};

use crate::contract::{is_dns_label, is_dns_subdomain};
use crate::{ActivationEndpoints, Revision};

/// The path prefix of a host lookup.
pub const HOSTS_PATH: &str = "/v1/hosts/";
/// The path prefix of a revision lookup.
pub const REVISIONS_PATH: &str = "/v1/revisions/";
/// The subsetter's directory port (named `directory` in its pod spec).
pub const DIRECTORY_PORT: u16 = 9092;
/// Largest answer an activator reads (a Revision's template is at most a few KiB; the
/// API server's own limit on an object is 1.5 MiB).
pub const MAX_ANSWER_BYTES: usize = 2 * 1024 * 1024;

/// The path prefix of a node's memberships.
pub const MEMBERS_PATH: &str = "/v1/members/";

/// The ActivationEndpoints carrying a node's member label, as a replica's watch last showed
/// them all, and a version a label-selected watch started from sees every later change
/// from: no object in `items` is newer than it, and every change after it is a watch event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MembersAnswer {
    #[serde(rename = "resourceVersion")]
    pub resource_version: String,
    pub items: Vec<ActivationEndpoints>,
}

/// The path prefix of a host's claims: every ActivationEndpoints carrying the host's label,
/// as a label-selected list across namespaces finds them (a [`MembersAnswer`]), for an
/// activator to route the host by (its split, its newest claimant) without that list, which
/// scans every subset on the API server.
pub const HOST_CLAIMS_PATH: &str = "/v1/host-claims/";

/// The path asking for `host`'s claims (normalized).
pub fn host_claims_path(host: &str) -> String {
    format!(
        "{HOST_CLAIMS_PATH}{}",
        crate::contract::normalize_host(host)
    )
}

/// The host a host-claims path asks for, normalized: None when `path` is not one, an error
/// when the host cannot be one (as [`DirectoryQuery::parse`] checks a host).
pub fn parse_host_claims(path: &str) -> Option<Result<String, BadQuery>> {
    let host = path.strip_prefix(HOST_CLAIMS_PATH)?;
    Some(
        match DirectoryQuery::parse(&format!("{HOSTS_PATH}{host}")) {
            Ok(DirectoryQuery::Host(h)) => Ok(h),
            _ => Err(BadQuery::Host(host.chars().take(64).collect())),
        },
    )
}

/// The path asking for `node`'s memberships.
pub fn members_path(node: &str) -> String {
    format!("{MEMBERS_PATH}{node}")
}

/// The node a members path asks for: None when `path` is not one, an error when its node
/// cannot be a Node's name (an RFC 1123 subdomain).
pub fn parse_members(path: &str) -> Option<Result<String, BadQuery>> {
    let node = path.strip_prefix(MEMBERS_PATH)?;
    Some(if is_dns_subdomain(node) {
        Ok(node.to_string())
    } else {
        Err(BadQuery::Node(node.chars().take(64).collect()))
    })
}

/// A revision with its subset, as the directory answers it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DirectoryAnswer {
    pub revision: Revision,
    /// None while the subsetter has not written the revision's ActivationEndpoints yet.
    pub endpoints: Option<ActivationEndpoints>,
}

/// What a directory path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectoryQuery {
    /// A host, normalized ([`crate::contract::normalize_host`]).
    Host(String),
    Revision {
        namespace: String,
        name: String,
    },
}

/// Why a path is not a directory query (answered 400, or 404 for an unknown path).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadQuery {
    #[error("no such directory path")]
    UnknownPath,
    #[error("invalid host {0:?}")]
    Host(String),
    #[error("invalid revision namespace/name {0:?}")]
    Revision(String),
    #[error("invalid node name {0:?}")]
    Node(String),
}

impl DirectoryQuery {
    /// The path asking this query.
    pub fn path(&self) -> String {
        match self {
            Self::Host(h) => format!("{HOSTS_PATH}{h}"),
            Self::Revision { namespace, name } => format!("{REVISIONS_PATH}{namespace}/{name}"),
        }
    }

    /// Parses a request path strictly: a host is a DNS name (letters, digits, `-`, `.`, at
    /// most 253 bytes; an optional port is dropped), a revision a namespace (RFC 1123 label)
    /// and a name (RFC 1123 subdomain). Nothing else is looked up.
    pub fn parse(path: &str) -> Result<Self, BadQuery> {
        if let Some(host) = path.strip_prefix(HOSTS_PATH) {
            let h = crate::contract::normalize_host(host);
            let ok = !h.is_empty()
                && h.len() <= 253
                && h.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            return if ok {
                Ok(Self::Host(h))
            } else {
                Err(BadQuery::Host(host.chars().take(64).collect()))
            };
        }
        if let Some(rest) = path.strip_prefix(REVISIONS_PATH) {
            let bad = || BadQuery::Revision(rest.chars().take(64).collect());
            let (ns, name) = rest.split_once('/').ok_or_else(bad)?;
            if !is_dns_label(ns) || !is_dns_subdomain(name) {
                return Err(bad());
            }
            return Ok(Self::Revision {
                namespace: ns.to_string(),
                name: name.to_string(),
            });
        }
        Err(BadQuery::UnknownPath)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_normalized_and_checked() {
        assert_eq!(
            DirectoryQuery::parse("/v1/hosts/App.Example.com:8080"),
            Ok(DirectoryQuery::Host("app.example.com".into()))
        );
        for bad in [
            "/v1/hosts/",
            "/v1/hosts/a..b",
            "/v1/hosts/a/b",
            "/v1/hosts/a%2eb",
            "/v1/hosts/a b",
            "/v1/hosts/a_b",
            "/v1/hosts/..",
        ] {
            assert!(
                matches!(DirectoryQuery::parse(bad), Err(BadQuery::Host(_))),
                "{bad}"
            );
        }
        let long = format!("/v1/hosts/{}", "a.".repeat(200));
        assert!(DirectoryQuery::parse(&long).is_err());
    }

    #[test]
    fn host_claims_paths_are_hosts() {
        assert_eq!(
            parse_host_claims(&host_claims_path("App.Example:80")),
            Some(Ok("app.example".into()))
        );
        for bad in [
            "/v1/host-claims/",
            "/v1/host-claims/a_b",
            "/v1/host-claims/a/b",
        ] {
            assert!(matches!(parse_host_claims(bad), Some(Err(_))), "{bad}");
        }
        assert_eq!(parse_host_claims("/v1/hosts/a"), None);
        assert_eq!(
            DirectoryQuery::parse("/v1/host-claims/a"),
            Err(BadQuery::UnknownPath)
        );
    }

    #[test]
    fn revisions_are_kubernetes_names() {
        assert_eq!(
            DirectoryQuery::parse("/v1/revisions/default/app-1.v2"),
            Ok(DirectoryQuery::Revision {
                namespace: "default".into(),
                name: "app-1.v2".into()
            })
        );
        for bad in [
            "/v1/revisions/default",
            "/v1/revisions/default/",
            "/v1/revisions/Default/app",
            "/v1/revisions/default/app/x",
            "/v1/revisions//app",
            "/v1/revisions/-a/app",
        ] {
            assert!(
                matches!(DirectoryQuery::parse(bad), Err(BadQuery::Revision(_))),
                "{bad}"
            );
        }
        assert_eq!(
            DirectoryQuery::parse("/v2/hosts/a"),
            Err(BadQuery::UnknownPath)
        );
    }

    #[test]
    fn members_paths_name_a_node() {
        assert_eq!(
            parse_members("/v1/members/la-node1"),
            Some(Ok("la-node1".into()))
        );
        assert_eq!(
            parse_members(&members_path("ip-10-0-1-2.ec2.internal")),
            Some(Ok("ip-10-0-1-2.ec2.internal".into()))
        );
        for bad in [
            "/v1/members/",
            "/v1/members/a/b",
            "/v1/members/A",
            "/v1/members/a%2f",
        ] {
            assert!(
                matches!(parse_members(bad), Some(Err(BadQuery::Node(_)))),
                "{bad}"
            );
        }
        assert_eq!(parse_members("/v1/hosts/a"), None);
        assert_eq!(
            DirectoryQuery::parse("/v1/members/a"),
            Err(BadQuery::UnknownPath),
            "not a revision lookup"
        );
    }

    #[test]
    fn paths_round_trip() {
        for q in [
            DirectoryQuery::Host("a.example".into()),
            DirectoryQuery::Revision {
                namespace: "ns".into(),
                name: "r.1".into(),
            },
        ] {
            assert_eq!(DirectoryQuery::parse(&q.path()), Ok(q));
        }
    }
}
