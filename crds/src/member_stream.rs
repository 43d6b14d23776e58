//! The membership stream: how a directory replica streams one node's memberships to its
//! activator, so that no activator watches or lists ActivationEndpoints on the API server
//! (docs/member-stream.md).
//!
//! Why: kube-apiserver offers every event of a custom resource to every watcher that is not
//! scoped by namespace or name, and filters by label afterwards, in each watcher's goroutine
//! (cacher.go `startDispatching`); a label-selected list scans every object. With one
//! member-label watch per activator, each subset write cost the API server O(nodes)
//! (docs/membership-watch-cost.md). Every subsetter replica already holds every subset in a
//! member-label index; it hands each node only its own, in O(members) per write.
//!
//! `GET /v1/member-stream/<node>[?since=<resourceVersion>]` answers `200` with
//! `application/x-ndjson`: one JSON [`Frame`] per line, at most [`MAX_FRAME_BYTES`] each.
//!
//! - The first frame is a [`Frame::Sync`]: every subset listing the node (`held`, each with
//!   its resourceVersion) at the replica's version, and the objects themselves for those newer
//!   than `since` (all of them without `since`). A resume is O(changes), not a snapshot, and
//!   no version is ever too old: the replica computes it from its index, not from a history.
//! - Then [`Frame::Apply`] (a subset lists the node, new or changed), [`Frame::Left`] (one no
//!   longer does, or is gone), [`Frame::Hosts`] (hosts whose revision may have changed) and
//!   [`Frame::Bookmark`] (the replica's version moved on; also a heartbeat), in the order its
//!   watch saw them.
//!
//! Versions are etcd's revisions as the API server gives them (resourceVersions), so they
//! compare across replicas. A replica behind `since` does not answer (`503`): an activator
//! never takes a state older than one it holds. The pure half of the client, turning a
//! sync into the state it replaces, is [`resync`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ActivationEndpoints;
use crate::contract::is_dns_subdomain;
use crate::key::ObjectKey;

/// The path prefix of a node's membership stream.
pub const STREAM_PATH: &str = "/v1/member-stream/";
/// The largest frame a client reads: a sync of a few hundred subsets (an object is ~1 KiB).
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;
/// Why a replica never streams (answered `501`, not `503`): it watches one namespace, not
/// every subset. An activator then follows the member-label watch at once: this is the
/// configuration, not an outage.
pub const ONE_NAMESPACE: &str = "this replica watches one namespace, not every subset";

/// The content type of the stream.
pub const CONTENT_TYPE: &str = "application/x-ndjson";

/// One line of the stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum Frame {
    /// The node's memberships at `resourceVersion`: `held` names each, `items` are those
    /// newer than the request's `since` (every one without it).
    Sync {
        #[serde(rename = "resourceVersion")]
        resource_version: String,
        held: Vec<Held>,
        items: Vec<ActivationEndpoints>,
    },
    /// A subset that lists the node, created or changed.
    Apply { object: Box<ActivationEndpoints> },
    /// A subset that no longer lists the node, or is gone.
    Left {
        namespace: String,
        name: String,
        #[serde(rename = "resourceVersion")]
        resource_version: String,
    },
    /// Subsets carrying these host labels (`crate::contract::host_label`) changed: a host an
    /// activator has looked up may be served by another revision now.
    Hosts {
        #[serde(rename = "resourceVersion")]
        resource_version: String,
        labels: Vec<String>,
    },
    /// Every change up to `resourceVersion` that concerns the node has been sent.
    Bookmark {
        #[serde(rename = "resourceVersion")]
        resource_version: String,
    },
}

/// A subset a sync names, with its version.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Held {
    pub namespace: String,
    pub name: String,
    #[serde(rename = "resourceVersion")]
    pub resource_version: String,
}

/// What a stream request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamQuery {
    pub node: String,
    /// The newest version the client holds; None for a first state.
    pub since: Option<u64>,
}

/// Why a stream request or a frame is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("invalid node name {0:?}")]
    Node(String),
    #[error("invalid query {0:?}: only since=<resourceVersion> is understood")]
    Query(String),
    #[error("a version that is not one: {0:?}")]
    Version(String),
    #[error("a frame that cannot be read: {0}")]
    Frame(String),
    #[error("{0}/{1} does not list this node")]
    NotMine(String, String),
    #[error("the sync names {0}, which this client holds at another version and was not sent")]
    Missing(String),
}

/// The path (and query) asking for `node`'s stream from `since`.
pub fn stream_path(node: &str, since: Option<u64>) -> String {
    match since {
        Some(v) => format!("{STREAM_PATH}{node}?since={v}"),
        None => format!("{STREAM_PATH}{node}"),
    }
}

/// Parses a stream request strictly: None when `path` is not a stream path; the node must be
/// a Node's name, the query nothing or `since=<digits>`.
pub fn parse_stream(path: &str, query: Option<&str>) -> Option<Result<StreamQuery, StreamError>> {
    let node = path.strip_prefix(STREAM_PATH)?;
    if !is_dns_subdomain(node) {
        return Some(Err(StreamError::Node(node.chars().take(64).collect())));
    }
    let since = match query {
        None => None,
        Some(q) => match q.strip_prefix("since=").map(version) {
            Some(Ok(v)) => Some(v),
            _ => return Some(Err(StreamError::Query(q.chars().take(64).collect()))),
        },
    };
    Some(Ok(StreamQuery {
        node: node.to_string(),
        since,
    }))
}

/// A resourceVersion as a number (etcd's revision): at most 20 digits.
pub fn version(s: &str) -> Result<u64, StreamError> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(StreamError::Version(s.chars().take(32).collect()));
    }
    s.parse()
        .map_err(|_| StreamError::Version(s.chars().take(32).collect()))
}

impl Frame {
    /// One line of the stream (the JSON and a newline).
    pub fn line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Reads one line (without its newline) strictly, and holds it to the node it streams:
    /// every object named, carrying `member_label`, every version a number.
    pub fn read(line: &[u8], member_label: &str) -> Result<Self, StreamError> {
        if line.len() > MAX_FRAME_BYTES {
            return Err(StreamError::Frame(format!("{} bytes", line.len())));
        }
        let f: Frame =
            serde_json::from_slice(line).map_err(|e| StreamError::Frame(e.to_string()))?;
        match &f {
            Frame::Sync {
                resource_version,
                held,
                items,
            } => {
                version(resource_version)?;
                for h in held {
                    version(&h.resource_version)?;
                }
                for o in items {
                    mine(o, member_label)?;
                }
            }
            Frame::Apply { object } => mine(object, member_label)?,
            Frame::Left {
                resource_version, ..
            }
            | Frame::Hosts {
                resource_version, ..
            }
            | Frame::Bookmark { resource_version } => {
                version(resource_version)?;
            }
        }
        Ok(f)
    }
}

/// `o` is named, carries a numeric version and the node's member label.
fn mine(o: &ActivationEndpoints, member_label: &str) -> Result<(), StreamError> {
    let ns = o.metadata.namespace.as_deref().unwrap_or_default();
    let name = o.metadata.name.as_deref().unwrap_or_default();
    if ns.is_empty() || name.is_empty() {
        return Err(StreamError::Frame("an object without a name".into()));
    }
    version(o.metadata.resource_version.as_deref().unwrap_or_default())?;
    let labelled = o
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(member_label));
    if !labelled {
        return Err(StreamError::NotMine(ns.into(), name.into()));
    }
    Ok(())
}

/// The key of an object (namespace and name).
pub fn key_of(o: &ActivationEndpoints) -> ObjectKey {
    ObjectKey::new(
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default(),
    )
}

/// The state a sync replaces the client's with: each subset it names, from its `items` when
/// sent, else the client's own copy (`held_now`), which must be at the named version (it was
/// not sent because it is not newer than the client's `since`). Err when one is neither: the
/// client's state is not what its version said, and it must ask for a first state.
pub fn resync(
    held_now: &BTreeMap<ObjectKey, ActivationEndpoints>,
    held: Vec<Held>,
    items: Vec<ActivationEndpoints>,
) -> Result<Vec<ActivationEndpoints>, StreamError> {
    let mut sent: BTreeMap<ObjectKey, ActivationEndpoints> =
        items.into_iter().map(|o| (key_of(&o), o)).collect();
    let mut out = Vec::with_capacity(held.len());
    for h in held {
        let key = ObjectKey::new(h.namespace, h.name);
        if let Some(o) = sent.remove(&key) {
            out.push(o);
            continue;
        }
        match held_now.get(&key) {
            Some(o) if o.metadata.resource_version.as_deref() == Some(&h.resource_version) => {
                out.push(o.clone())
            }
            _ => return Err(StreamError::Missing(key.to_string())),
        }
    }
    // Items the sync sent but did not name would be a replica's mistake: not taken.
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::member_label;

    fn ae(ns: &str, name: &str, rv: &str, node: &str) -> ActivationEndpoints {
        let mut a = ActivationEndpoints::new(name, Default::default());
        a.metadata.namespace = Some(ns.into());
        a.metadata.resource_version = Some(rv.into());
        a.metadata.labels = Some([(member_label(node), "true".to_string())].into());
        a
    }

    fn held(ns: &str, name: &str, rv: &str) -> Held {
        Held {
            namespace: ns.into(),
            name: name.into(),
            resource_version: rv.into(),
        }
    }

    #[test]
    fn paths_are_parsed_strictly() {
        assert_eq!(
            parse_stream("/v1/member-stream/n1", None),
            Some(Ok(StreamQuery {
                node: "n1".into(),
                since: None
            }))
        );
        assert_eq!(
            parse_stream("/v1/member-stream/n1", Some("since=42")),
            Some(Ok(StreamQuery {
                node: "n1".into(),
                since: Some(42)
            }))
        );
        let path = stream_path("n1", Some(7));
        let (p, q) = path.split_once('?').unwrap();
        assert_eq!(parse_stream(p, Some(q)).unwrap().unwrap().since, Some(7));
        for (p, q) in [
            ("/v1/member-stream/N1", None),
            ("/v1/member-stream/", None),
            ("/v1/member-stream/a/b", None),
            ("/v1/member-stream/n1", Some("since=")),
            ("/v1/member-stream/n1", Some("since=-1")),
            ("/v1/member-stream/n1", Some("since=1&x=2")),
            ("/v1/member-stream/n1", Some("since=123456789012345678901")),
            ("/v1/member-stream/n1", Some("watch=1")),
        ] {
            assert!(matches!(parse_stream(p, q), Some(Err(_))), "{p} {q:?}");
        }
        assert_eq!(parse_stream("/v1/members/n1", None), None);
    }

    #[test]
    fn frames_round_trip_and_are_held_to_the_node() {
        let label = member_label("n1");
        let frames = [
            Frame::Sync {
                resource_version: "10".into(),
                held: vec![held("a", "x", "9")],
                items: vec![ae("a", "x", "9", "n1")],
            },
            Frame::Apply {
                object: Box::new(ae("a", "y", "11", "n1")),
            },
            Frame::Left {
                namespace: "a".into(),
                name: "x".into(),
                resource_version: "12".into(),
            },
            Frame::Hosts {
                resource_version: "13".into(),
                labels: vec![crate::contract::host_label("a.example")],
            },
            Frame::Bookmark {
                resource_version: "14".into(),
            },
        ];
        for f in frames {
            let line = f.line();
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(Frame::read(&line[..line.len() - 1], &label), Ok(f));
        }
        // Another node's subset, a bad version, unknown fields and types, garbage.
        let other = Frame::Apply {
            object: Box::new(ae("a", "y", "11", "n2")),
        }
        .line();
        assert!(matches!(
            Frame::read(&other[..other.len() - 1], &label),
            Err(StreamError::NotMine(..))
        ));
        for bad in [
            &br#"{"type":"BOOKMARK","resourceVersion":"x1"}"#[..],
            br#"{"type":"BOOKMARK","resourceVersion":"1","extra":1}"#,
            br#"{"type":"DELETE_ALL"}"#,
            br#"{"type":"SYNC","resourceVersion":"1","held":[{"namespace":"a","name":"b","resourceVersion":""}],"items":[]}"#,
            b"\xff\xfe",
            b"",
        ] {
            assert!(Frame::read(bad, &label).is_err(), "{:?}", bad);
        }
        let huge = vec![b' '; MAX_FRAME_BYTES + 1];
        assert!(Frame::read(&huge, &label).is_err());
    }

    #[test]
    fn a_sync_keeps_unchanged_copies_and_takes_what_it_sent() {
        let now: BTreeMap<_, _> = [ae("a", "x", "5", "n1"), ae("a", "gone", "6", "n1")]
            .into_iter()
            .map(|o| (key_of(&o), o))
            .collect();
        let out = resync(
            &now,
            vec![held("a", "x", "5"), held("a", "new", "9")],
            vec![ae("a", "new", "9", "n1")],
        )
        .expect("consistent");
        let names: Vec<_> = out
            .iter()
            .map(|o| o.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["x", "new"]);
        // A copy at another version than the one named, and not sent: ask for a first state.
        assert_eq!(
            resync(&now, vec![held("a", "x", "7")], vec![]),
            Err(StreamError::Missing("a/x".into()))
        );
        assert!(resync(&BTreeMap::new(), vec![held("a", "x", "5")], vec![]).is_err());
    }
}
