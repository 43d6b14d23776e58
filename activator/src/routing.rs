//! Host routing: which revision a Host header names. Pure logic, no IO.
//!
//! Several revisions may claim one host (a new revision of an app claims the old one's hosts
//! before the old one is deleted). The newest claim wins: latest creationTimestamp, then the
//! greatest name, so every activator picks the same winner without coordination.

use std::collections::{BTreeSet, HashMap};

/// A revision, as `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RevisionKey {
    pub namespace: String,
    pub name: String,
}

impl RevisionKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for RevisionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One revision's claim on a host. Ordered so that the greatest claim is the winner.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Claim {
    /// creationTimestamp as seconds since the epoch (finer precision is not stored by the API).
    created: i64,
    name: String,
    namespace: String,
}

/// Host -> winning revision, maintained incrementally from revision adds and deletes.
#[derive(Debug, Default, Clone)]
pub struct HostTable {
    claims: HashMap<String, BTreeSet<Claim>>,
    /// What each revision claimed last, so an update that drops a host removes its claim.
    claimed: HashMap<RevisionKey, (i64, Vec<String>)>,
}

impl HostTable {
    /// Records (or replaces) the hosts `rev` claims.
    pub fn upsert(&mut self, rev: &RevisionKey, created: i64, hosts: &[String]) {
        self.remove(rev);
        let hosts: Vec<String> = hosts.iter().map(|h| normalize_host(h)).collect();
        for host in &hosts {
            self.claims.entry(host.clone()).or_default().insert(Claim {
                created,
                name: rev.name.clone(),
                namespace: rev.namespace.clone(),
            });
        }
        self.claimed.insert(rev.clone(), (created, hosts));
    }

    /// Forgets every claim of `rev`.
    pub fn remove(&mut self, rev: &RevisionKey) {
        let Some((created, hosts)) = self.claimed.remove(rev) else {
            return;
        };
        let claim = Claim {
            created,
            name: rev.name.clone(),
            namespace: rev.namespace.clone(),
        };
        for host in hosts {
            if let Some(set) = self.claims.get_mut(&host) {
                set.remove(&claim);
                if set.is_empty() {
                    self.claims.remove(&host);
                }
            }
        }
    }

    /// The revision a Host header value routes to.
    pub fn resolve(&self, host: &str) -> Option<RevisionKey> {
        let c = self.claims.get(&normalize_host(host))?.last()?;
        Some(RevisionKey::new(c.namespace.clone(), c.name.clone()))
    }

    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

/// Host header values compare without the port and case-insensitively (RFC 9110 §4.2.3).
pub fn normalize_host(host: &str) -> String {
    let host = host.trim();
    let without_port = if host.starts_with('[') {
        // [v6]:port
        host.split_once(']')
            .map(|(h, _)| format!("{h}]"))
            .unwrap_or_else(|| host.to_string())
    } else {
        match host.rsplit_once(':') {
            Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h.to_string(),
            _ => host.to_string(),
        }
    };
    without_port.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> RevisionKey {
        RevisionKey::new("ns", n)
    }

    #[test]
    fn newest_claim_wins_then_name() {
        let mut t = HostTable::default();
        t.upsert(&key("a"), 10, &["app.example.com".into()]);
        t.upsert(&key("b"), 20, &["app.example.com".into()]);
        assert_eq!(t.resolve("app.example.com"), Some(key("b")));
        t.upsert(&key("c"), 20, &["app.example.com".into()]);
        assert_eq!(
            t.resolve("app.example.com"),
            Some(key("c")),
            "same time: greater name wins"
        );
        t.remove(&key("c"));
        t.remove(&key("b"));
        assert_eq!(t.resolve("app.example.com"), Some(key("a")));
        t.remove(&key("a"));
        assert_eq!(t.resolve("app.example.com"), None);
        assert!(t.is_empty());
    }

    #[test]
    fn update_that_drops_a_host_removes_the_claim() {
        let mut t = HostTable::default();
        t.upsert(&key("a"), 1, &["x.test".into(), "y.test".into()]);
        t.upsert(&key("a"), 1, &["y.test".into()]);
        assert_eq!(t.resolve("x.test"), None);
        assert_eq!(t.resolve("y.test"), Some(key("a")));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn host_matching_ignores_port_case_and_trailing_dot() {
        let mut t = HostTable::default();
        t.upsert(&key("a"), 1, &["App.Example.com".into()]);
        for h in [
            "app.example.com",
            "APP.example.com:8080",
            "app.example.com.",
        ] {
            assert_eq!(t.resolve(h), Some(key("a")), "{h}");
        }
        assert_eq!(normalize_host("[::1]:80"), "[::1]");
    }
}
