//! Which container images a node holds, and which a revision needs, as the subsetter compares
//! them (image locality, docs/subsetter.md "Image locality"). Pure.
//!
//! The kubelet reports a node's images in `Node.status.images[].names` (up to its
//! `nodeStatusMaxImages`, 50 by default), each name as containerd keeps it: fully qualified
//! (`docker.io/library/nginx:1.27`, `registry:5000/app@sha256:…`). A template names images the
//! way people write them (`nginx`, `app:v1`). [`Reference::parse`] brings both to one form
//! (the rules of `distribution/reference.ParseNormalizedNamed`): a first component that is not
//! a host (no `.` or `:`, not `localhost`) means Docker Hub, `docker.io/library/` for a single
//! component, and no tag and no digest means `:latest`.
//!
//! A node keeps only a sorted set of 64-bit fingerprints of the normalised names
//! ([`ImageSet`]), not the names: 8 bytes a name, and a Node update whose images are the same
//! compares equal without a string. A revision's image matches by digest when it names one
//! (the digest is what the runtime pulls), else by `name:tag`.

use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::pure::ring::{RingHasher, ring_hash};

/// Docker Hub as containerd names it.
pub const DOCKER_HUB: &str = "docker.io";

/// An image reference in normalised form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The registry host (with port), e.g. `docker.io`, `registry:5000`.
    pub domain: String,
    /// The repository path, e.g. `library/nginx`.
    pub path: String,
    /// The tag; `latest` when the reference had neither tag nor digest.
    pub tag: Option<String>,
    /// `algorithm:hex`, e.g. `sha256:…`.
    pub digest: Option<String>,
}

impl Reference {
    /// Parses and normalises `s`; None for what is not an image reference (a malformed name
    /// matches nothing rather than something wrong).
    pub fn parse(s: &str) -> Option<Self> {
        let p = Parts::of(s)?;
        let path = if p.library {
            format!("library/{}", p.path)
        } else {
            p.path.to_owned()
        };
        Some(Self {
            domain: p.domain.to_owned(),
            path,
            tag: p.tag().map(str::to_owned),
            digest: p
                .digest
                .map(|(alg, hex)| format!("{alg}:{}", hex.to_ascii_lowercase())),
        })
    }

    /// `domain/path@digest`, when there is a digest.
    pub fn by_digest(&self) -> Option<String> {
        let d = self.digest.as_ref()?;
        Some(format!("{}/{}@{d}", self.domain, self.path))
    }

    /// `domain/path:tag`, when there is a tag.
    pub fn by_tag(&self) -> Option<String> {
        let t = self.tag.as_ref()?;
        Some(format!("{}/{}:{t}", self.domain, self.path))
    }

    /// What a revision's image is matched by: its digest when it names one, else its tag.
    pub fn match_key(&self) -> Option<String> {
        self.by_digest().or_else(|| self.by_tag())
    }
}

/// The fingerprint of `s`'s match key ([`Reference::match_key`]), taken from the pieces of the
/// reference as written, with no string built: a revision's first plan reads its images this
/// way (six allocations a reference were most of that read).
pub fn match_fingerprint(s: &str) -> Option<u64> {
    let p = Parts::of(s)?;
    let mut h = RingHasher::default();
    h.write(p.domain.as_bytes());
    h.write(if p.library { b"/library/" } else { b"/" });
    h.write(p.path.as_bytes());
    match (p.digest, p.tag()) {
        (Some((alg, hex)), _) => {
            h.write(b"@");
            h.write(alg.as_bytes());
            h.write(b":");
            for b in hex.bytes() {
                h.write(&[b.to_ascii_lowercase()]);
            }
        }
        (None, Some(tag)) => {
            h.write(b":");
            h.write(tag.as_bytes());
        }
        (None, None) => return None,
    }
    Some(h.finish())
}

/// A reference split and checked, its pieces borrowed from the text: what [`Reference::parse`]
/// and [`match_fingerprint`] both read (the rules of `ParseNormalizedNamed`).
struct Parts<'a> {
    domain: &'a str,
    /// The path as written; `library/` goes before it when `library`.
    path: &'a str,
    library: bool,
    tag: Option<&'a str>,
    /// (algorithm, hex as written).
    digest: Option<(&'a str, &'a str)>,
}

impl<'a> Parts<'a> {
    fn of(s: &'a str) -> Option<Self> {
        if s.is_empty() || s.len() > 4096 || s.chars().any(|c| c.is_whitespace()) {
            return None;
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(parse_digest(d)?)),
            None => (s, None),
        };
        // A `:` after the last `/` starts the tag; one before it is a registry's port.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                (&rest[..at], Some(valid_tag(&rest[at + 1..])?))
            }
            None => (rest, None),
        };
        let (domain, path) = match name.split_once('/') {
            Some((first, remainder))
                if first.contains(['.', ':']) || first == "localhost" || has_upper(first) =>
            {
                (first, remainder)
            }
            _ => (DOCKER_HUB, name),
        };
        let domain = if domain == "index.docker.io" {
            DOCKER_HUB
        } else {
            domain
        };
        if !valid_domain(domain) || !valid_path(path) {
            return None;
        }
        Some(Self {
            domain,
            path,
            library: domain == DOCKER_HUB && !path.contains('/'),
            tag,
            digest,
        })
    }

    /// The tag; `latest` when the reference has neither tag nor digest.
    fn tag(&self) -> Option<&'a str> {
        match (self.tag, self.digest) {
            (None, None) => Some("latest"),
            (t, _) => t,
        }
    }
}

fn has_upper(s: &str) -> bool {
    s.chars().any(|c| c.is_ascii_uppercase())
}

/// `algorithm:encoded`: the algorithm in lower-case letters and digits (with `+._-`
/// separators), the encoding hex of at least 32 digits. The pieces as written.
fn parse_digest(d: &str) -> Option<(&str, &str)> {
    let (alg, hex) = d.split_once(':')?;
    let alg_ok = !alg.is_empty()
        && alg
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+._-".contains(c));
    let hex_ok = hex.len() >= 32 && hex.chars().all(|c| c.is_ascii_hexdigit());
    (alg_ok && hex_ok).then_some((alg, hex))
}

fn valid_tag(t: &str) -> Option<&str> {
    let ok = !t.is_empty()
        && t.len() <= 128
        && t.chars().enumerate().all(|(i, c)| {
            c.is_ascii_alphanumeric() || c == '_' || (i > 0 && (c == '.' || c == '-'))
        });
    ok.then_some(t)
}

/// A host (letters, digits, `-`, `.`; or a bracketed IPv6 address) with an optional numeric
/// port.
fn valid_domain(d: &str) -> bool {
    let (host, port) = match d.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') => (h, Some(p)),
        _ => (d, None),
    };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        !v6.is_empty() && v6.chars().all(|c| c.is_ascii_hexdigit() || c == ':')
    } else {
        !host.is_empty()
            && host.split('.').all(|l| {
                !l.is_empty()
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            })
    };
    host_ok
        && port
            .is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.chars().all(|c| c.is_ascii_digit()))
}

/// Path components of lower-case letters, digits and the separators `.`, `_`, `__`, `-`.
fn valid_path(p: &str) -> bool {
    !p.is_empty()
        && p.split('/').all(|c| {
            !c.is_empty()
                && c.starts_with(|x: char| x.is_ascii_lowercase() || x.is_ascii_digit())
                && c.ends_with(|x: char| x.is_ascii_lowercase() || x.is_ascii_digit())
                && c.chars()
                    .all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || "._-".contains(x))
        })
}

/// A name's 64-bit fingerprint: stable across processes (FNV-1a with a finalizer).
pub fn fingerprint(key: &str) -> u64 {
    ring_hash(key)
}

/// The images a node holds: the fingerprints of every normalised name it reports (by digest
/// and by tag), sorted. A node reporting no images has the empty set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ImageSet(std::sync::Arc<[u64]>);

impl ImageSet {
    /// From the names a node reports (each may be a tag or a digest reference).
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut v: Vec<u64> = names
            .into_iter()
            .filter_map(Reference::parse)
            .flat_map(|r| [r.by_digest(), r.by_tag()])
            .flatten()
            .map(|k| fingerprint(&k))
            .collect();
        v.sort_unstable();
        v.dedup();
        Self(v.into())
    }

    /// From fingerprints already computed (synthetic clusters: the bench, tests).
    pub fn from_fingerprints(mut v: Vec<u64>) -> Self {
        v.sort_unstable();
        v.dedup();
        Self(v.into())
    }

    /// `node.status.images[].names`.
    pub fn of_node(node: &Node) -> Self {
        let images = node.status.as_ref().and_then(|s| s.images.as_ref());
        Self::from_names(
            images
                .into_iter()
                .flatten()
                .flat_map(|i| i.names.iter().flatten())
                .map(String::as_str),
        )
    }

    /// Whether every one of `wanted` (fingerprints of match keys) is here.
    pub fn holds_all(&self, wanted: &[u64]) -> bool {
        wanted.iter().all(|w| self.0.binary_search(w).is_ok())
    }

    pub fn fingerprints(&self) -> &[u64] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes this set holds on the heap (shared by its clones: the node's facts and its
    /// entry in the load index hold one allocation).
    pub fn heap_bytes(&self) -> usize {
        self.0.len() * std::mem::size_of::<u64>()
    }
}

/// The images a revision's pod pulls (every container and init container), as fingerprints of
/// their match keys, sorted. An image that cannot be parsed is left out: such a pod cannot
/// start anywhere, and no node is better for it.
pub fn wanted(template: &Value) -> Vec<u64> {
    let spec = &template["spec"];
    let mut v: Vec<u64> = ["initContainers", "containers"]
        .iter()
        .filter_map(|k| spec[k].as_array())
        .flatten()
        .filter_map(|c| c["image"].as_str())
        .filter_map(match_fingerprint)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// [`wanted`] read straight from the template's JSON text, which a revision keeps
/// ([`crds::PodTemplate::json`]): only the containers' `image` fields are decoded, where
/// [`wanted`] needs the whole template built as a tree first (the tree was most of the first
/// plan of each revision). Any text the narrow reading refuses (a field of another type, a
/// repeated key) is read the whole way, so both give the same answer for every template.
pub fn wanted_json(template: &str) -> Vec<u64> {
    use std::borrow::Cow;

    #[derive(serde::Deserialize)]
    struct Template<'a> {
        #[serde(borrow, default)]
        spec: Option<Spec<'a>>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spec<'a> {
        #[serde(borrow, default)]
        init_containers: Option<Vec<Container<'a>>>,
        #[serde(borrow, default)]
        containers: Option<Vec<Container<'a>>>,
    }
    #[derive(serde::Deserialize)]
    struct Container<'a> {
        #[serde(borrow, default)]
        image: Option<Cow<'a, str>>,
    }

    let Ok(t) = serde_json::from_str::<Template<'_>>(template) else {
        return serde_json::from_str::<Value>(template).map_or_else(|_| Vec::new(), |v| wanted(&v));
    };
    let Some(spec) = t.spec else {
        return Vec::new();
    };
    let mut v: Vec<u64> = [spec.init_containers, spec.containers]
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|c| c.image)
        .filter_map(|i| match_fingerprint(&i))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Entries [`WantedCache`] keeps before it starts over: a revision deleted leaves its entry
/// behind, and clearing now and then (each live revision then parses once more) bounds that
/// without a hook on deletes. 2^18 entries are about 16 MB at most.
const WANTED_CACHE_ENTRIES: usize = 1 << 18;

/// [`wanted`] of each revision, by uid and generation. A plan runs on every reconcile (a
/// membership change, a node's update, a rebalance) but a template changes only with the
/// revision's generation: parsing it each time was a sixth of the assignment time with image
/// locality off (docs/benchmarks.md). Keyed by the uid's fingerprint: two uids colliding in
/// 64 bits among 2^18 is a chance of about 2^-28, and would cost one revision its preference.
#[derive(Debug, Default)]
pub struct WantedCache {
    by_uid: std::sync::Mutex<foldhash::HashMap<u64, Generation>>,
}

/// A cached revision: the generation parsed and its images.
type Generation = (Option<i64>, std::sync::Arc<[u64]>);

impl WantedCache {
    /// The images `template` pulls, for the revision `uid` at `generation`: parsed on the first
    /// call for that generation, shared after. Without a uid (an object built in a test) it
    /// parses every time.
    pub fn get(
        &self,
        uid: Option<&str>,
        generation: Option<i64>,
        template: &crds::PodTemplate,
    ) -> std::sync::Arc<[u64]> {
        let Some(uid) = uid else {
            return wanted_json(template.json()).into();
        };
        let key = fingerprint(uid);
        let mut map = self
            .by_uid
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((g, w)) = map.get(&key)
            && *g == generation
        {
            return std::sync::Arc::clone(w);
        }
        if map.len() >= WANTED_CACHE_ENTRIES {
            map.clear();
        }
        let w: std::sync::Arc<[u64]> = wanted_json(template.json()).into();
        map.insert(key, (generation, std::sync::Arc::clone(&w)));
        w
    }

    /// Revisions cached.
    pub fn len(&self) -> usize {
        self.by_uid
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    mod narrow_reading {
        use super::*;
        use proptest::prelude::*;

        /// A JSON value of a kind a template's field could hold, or should not.
        fn field() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                Just(json!(7)),
                Just(json!(true)),
                prop::sample::select(vec![
                    "nginx", "app:v1", "registry:5000/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                    // Escaped characters: the text then holds no borrowable string.
                    "Bad Name", "", "localhost/x", "quay.io/a/b:c", "a\"b:1", "tab\there",
                ])
                .prop_map(|s| Value::String(s.to_owned())),
            ]
        }

        fn container() -> impl Strategy<Value = Value> {
            prop_oneof![
                4 => (field(), any::<bool>()).prop_map(|(image, named)| if named {
                    json!({"name": "c", "image": image})
                } else {
                    json!({"image": image})
                }),
                1 => Just(json!({"name": "no-image"})),
                1 => Just(json!("not an object")),
            ]
        }

        fn list() -> impl Strategy<Value = Value> {
            prop_oneof![
                4 => prop::collection::vec(container(), 0..4).prop_map(Value::Array),
                1 => Just(Value::Null),
                1 => Just(json!({"not": "a list"})),
            ]
        }

        fn template() -> impl Strategy<Value = Value> {
            prop_oneof![
                8 => (list(), list(), any::<bool>()).prop_map(|(c, i, with_init)| {
                    let mut spec = json!({"containers": c});
                    if with_init {
                        spec["initContainers"] = i;
                    }
                    json!({"metadata": {"labels": {"a": "b"}}, "spec": spec})
                }),
                1 => Just(json!({"spec": null})),
                1 => Just(json!({"spec": "text"})),
                1 => Just(json!({})),
                1 => Just(json!([1, 2])),
            ]
        }

        proptest! {
            /// The narrow reading of the text and the whole tree agree on every template,
            /// the odd ones included.
            #[test]
            fn the_text_read_narrowly_gives_what_the_tree_gives(t in template()) {
                let text = t.to_string();
                prop_assert_eq!(wanted_json(&text), wanted(&t));
            }
        }

        proptest! {
            /// The fingerprint taken from the pieces is the fingerprint of the match key the
            /// parsed reference spells out, for references and for what only looks like one.
            #[test]
            fn the_fingerprint_from_the_pieces_is_that_of_the_match_key(
                s in prop_oneof![
                    "(([a-zA-Z0-9.-]{1,8}(:[0-9]{1,5})?|localhost|index\\.docker\\.io)/)?[a-z0-9._/-]{1,12}(:[A-Za-z0-9._-]{0,6})?(@[a-z0-9+._-]{0,7}:[0-9a-fA-F]{30,40})?",
                    "\\PC{0,24}",
                ]
            ) {
                let spelled = Reference::parse(&s).and_then(|r| r.match_key()).map(|k| fingerprint(&k));
                prop_assert_eq!(match_fingerprint(&s), spelled, "{}", s);
            }
        }

        /// A repeated key: serde's derive refuses it where a tree keeps the last, so the
        /// narrow reading falls back and still answers as the tree does.
        #[test]
        fn a_repeated_key_is_read_as_the_tree_reads_it() {
            for text in [
                r#"{"spec":{"containers":[{"image":"a:1","image":"b:2"}]}}"#,
                r#"{"spec":{"containers":[{"image":"a:1"}]},"spec":{"containers":[{"image":"c:3"}]}}"#,
                r#"{"spec":{"containers":[{"image":"a:1"}],"containers":[]}}"#,
            ] {
                let tree: Value = serde_json::from_str(text).unwrap();
                assert_eq!(wanted_json(text), wanted(&tree), "{text}");
            }
            assert_eq!(wanted_json("not json"), Vec::<u64>::new());
        }
    }

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn key(s: &str) -> Option<String> {
        Reference::parse(s)?.match_key()
    }

    #[test]
    fn short_names_are_docker_hub_library_at_latest() {
        assert_eq!(
            key("nginx").as_deref(),
            Some("docker.io/library/nginx:latest")
        );
        assert_eq!(
            key("nginx:1.27").as_deref(),
            Some("docker.io/library/nginx:1.27")
        );
        assert_eq!(
            key("bitnami/redis").as_deref(),
            Some("docker.io/bitnami/redis:latest")
        );
        assert_eq!(
            key("index.docker.io/library/nginx:1").as_deref(),
            Some("docker.io/library/nginx:1")
        );
        assert_eq!(
            key("docker.io/library/nginx:1"),
            key("nginx:1"),
            "what containerd reports is what the template means"
        );
    }

    #[test]
    fn registries_ports_and_localhost_are_domains() {
        let r = Reference::parse("registry:5000/app:v1").unwrap();
        assert_eq!(
            (r.domain.as_str(), r.path.as_str()),
            ("registry:5000", "app")
        );
        assert_eq!(r.tag.as_deref(), Some("v1"));
        // A port, not a tag: the default tag applies.
        assert_eq!(
            key("registry:5000/app").as_deref(),
            Some("registry:5000/app:latest")
        );
        assert_eq!(
            key("localhost/app").as_deref(),
            Some("localhost/app:latest")
        );
        assert_eq!(
            key("ghcr.io/org/team/app:2").as_deref(),
            Some("ghcr.io/org/team/app:2")
        );
    }

    #[test]
    fn a_digest_is_what_matches_when_there_is_one() {
        let with_tag = format!("registry:5000/app:v1@{D}");
        assert_eq!(key(&with_tag), Some(format!("registry:5000/app@{D}")));
        let r =
            Reference::parse(&format!("app@{}", D.to_uppercase().replace("SHA", "sha"))).unwrap();
        assert_eq!(r.tag, None, "a digest alone gets no default tag");
        assert_eq!(
            r.digest.as_deref(),
            Some(D),
            "hex is compared in lower case"
        );
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in [
            "",
            "app name",
            "App",
            "app:",
            "app:-x",
            "/app",
            "app//x",
            "app@sha256:abc",
            "app@:0123456789abcdef0123456789abcdef",
            "registry:5000/",
            "app:v1:v2/x",
        ] {
            assert_eq!(Reference::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_node_holds_what_it_reports_by_tag_and_by_digest() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"images": [
                {"names": [format!("registry:5000/app@{D}"), "registry:5000/app:v1"],
                 "sizeBytes": 1000},
                {"names": ["docker.io/library/nginx:1.27"]},
                {"names": ["not an image"]},
                {}
            ]}
        }))
        .unwrap();
        let set = ImageSet::of_node(&node);
        let want = |image: &str| wanted(&json!({"spec": {"containers": [{"image": image}]}}));
        assert!(set.holds_all(&want("registry:5000/app:v1")));
        assert!(set.holds_all(&want(&format!("registry:5000/app@{D}"))));
        assert!(set.holds_all(&want(&format!("registry:5000/app:v2@{D}"))));
        assert!(set.holds_all(&want("nginx:1.27")));
        assert!(!set.holds_all(&want("nginx")), "latest is not 1.27");
        assert!(!set.holds_all(&want("registry:5000/app:v2")));
        assert_eq!(set.fingerprints().len(), 3);
        // Both containers' images are needed.
        let two = wanted(&json!({"spec": {
            "initContainers": [{"image": "nginx:1.27"}],
            "containers": [{"image": "registry:5000/app:v1"}, {"name": "no image"}]
        }}));
        assert_eq!(two.len(), 2);
        assert!(set.holds_all(&two));
        assert!(ImageSet::default().holds_all(&[]));
        assert!(!ImageSet::default().holds_all(&two));
    }

    #[test]
    fn the_same_names_in_another_order_are_the_same_set() {
        let a = ImageSet::from_names(["nginx:1", "redis", "docker.io/library/nginx:1"]);
        let b = ImageSet::from_names(["docker.io/library/redis:latest", "nginx:1"]);
        assert_eq!(a, b);
        assert_eq!(a.heap_bytes(), 16);
    }

    #[test]
    fn the_cache_parses_a_generation_once_and_a_new_one_again() {
        let cache = WantedCache::default();
        let t1 = json!({"spec": {"containers": [{"image": "nginx:1"}]}});
        let t2 = json!({"spec": {"containers": [{"image": "nginx:2"}]}});
        let first = cache.get(Some("u1"), Some(1), &crds::PodTemplate::from(&t1));
        assert_eq!(&*first, wanted(&t1).as_slice());
        // Same generation: what was parsed, even if handed another template (it cannot
        // differ for one generation; this shows nothing is parsed).
        let again = cache.get(Some("u1"), Some(1), &crds::PodTemplate::from(&t2));
        assert!(std::sync::Arc::ptr_eq(&first, &again));
        assert_eq!(
            &*cache.get(Some("u1"), Some(2), &crds::PodTemplate::from(&t2)),
            wanted(&t2).as_slice()
        );
        assert_eq!(
            &*cache.get(Some("u2"), Some(2), &crds::PodTemplate::from(&t1)),
            wanted(&t1).as_slice()
        );
        assert_eq!(cache.len(), 2);
        // No uid: parsed, not kept.
        assert_eq!(
            &*cache.get(None, Some(1), &crds::PodTemplate::from(&t2)),
            wanted(&t2).as_slice()
        );
        assert_eq!(cache.len(), 2);
    }
}
