//! Names shared by every part of the system (docs/architecture.md, "The contracts"). Keeping them in the API crate means
//! the subsetter, the activators and a replacement subsetter written against this crate cannot
//! drift apart on a label spelling or a hash.

/// Prefix of the per-member label on ActivationEndpoints: `member.local-activator.dev/<h>`.
pub const MEMBER_LABEL_PREFIX: &str = "member.local-activator.dev/";
/// Prefix of the per-host label on ActivationEndpoints: `host.local-activator.dev/<h>`, `<h>`
/// the [`node_hash`] of the host as [`normalize_host`] writes it (docs/architecture.md, "The contracts").
pub const HOST_LABEL_PREFIX: &str = "host.local-activator.dev/";
/// App pod label: the revision's name.
pub const REVISION_LABEL: &str = "local-activator.dev/revision";
/// App pod label: the revision's uid.
pub const REVISION_UID_LABEL: &str = "local-activator.dev/revision-uid";
/// App pod label: the node whose activator created the pod.
pub const NODE_LABEL: &str = "local-activator.dev/node";
/// A Revision annotation: `"false"` turns its members' pre-pull of its images off (the
/// kubelet pulls at the first cold start, as without the pre-pull). Read when a member first
/// reads the revision (or its spec changes): set it at creation.
pub const PREPULL_ANNOTATION: &str = "local-activator.dev/prepull";
/// On a namespace: its Revisions belong to the subsetter this value names (a test rig's, a
/// canary's). A subsetter installed with the default `--namespace-selector`
/// ([`OTHER_SUBSETTERS_EXCLUDED`]) leaves such a namespace alone.
pub const SUBSETTER_LABEL: &str = "local-activator.dev/subsetter";
/// On a node: `false` keeps the activator DaemonSet off it (deploy/: a required node affinity
/// `NotIn [false]`). For nodes that must never take app pods from an activator, and for the
/// simulated nodes a load test registers in a real cluster, which run no DaemonSet pod.
pub const NODE_ACTIVATOR_LABEL: &str = "local-activator.dev/activator";
/// The installed subsetter's default namespace selector: every namespace not claimed by
/// another subsetter through [`SUBSETTER_LABEL`].
pub const OTHER_SUBSETTERS_EXCLUDED: &str = "!local-activator.dev/subsetter";

/// Activator (DaemonSet) pod labels, by which the subsetter discovers members.
pub const APP_NAME_LABEL: &str = "app.kubernetes.io/name";
pub const APP_NAME_VALUE: &str = "local-activator";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const COMPONENT_VALUE: &str = "activator";
/// The label selector that finds activator pods.
pub const ACTIVATOR_SELECTOR: &str =
    "app.kubernetes.io/name=local-activator,app.kubernetes.io/component=activator";

/// Request headers naming a revision (set by an ingress).
pub const HEADER_REVISION_NAMESPACE: &str = "x-revision-namespace";
pub const HEADER_REVISION_NAME: &str = "x-revision-name";
/// Knative's equivalents, accepted too.
pub const HEADER_KNATIVE_NAMESPACE: &str = "knative-serving-namespace";
pub const HEADER_KNATIVE_REVISION: &str = "knative-serving-revision";
/// Added by an activator that forwards to a peer; a request carrying it is never forwarded again.
/// Honoured only with a valid [`HEADER_ACTIVATOR_HOP_PROOF`] beside it: from anyone else it is
/// removed and the request is served as any client's.
pub const HEADER_ACTIVATOR_HOP: &str = "x-activator-hop";
/// The proof that a hop came from a peer activator: the cluster's hop secret (a mounted
/// Secret shared by the activators). Never passed on to an app.
pub const HEADER_ACTIVATOR_HOP_PROOF: &str = "x-activator-hop-proof";
/// Beside a proven hop: the forwarding activator has another member to try, so a member that
/// cannot serve the request at once (its share of pods all busy, its node full, draining)
/// answers 503 instead of queueing it, and the request spills to the next member. Between
/// activators only: removed from clients' requests, never passed on to an app.
pub const HEADER_ACTIVATOR_HOP_SPILL: &str = "x-activator-hop-spill";
/// Beside a proven hop: the resourceVersion of the chosen revision's ActivationEndpoints
/// that the forwarding activator's host answer was read from. A member whose own copy of
/// that object is newer answers with [`HEADER_ACTIVATOR_HOST_STALE`]. Between activators
/// only: removed from clients' requests, never passed on to an app.
pub const HEADER_ACTIVATOR_SUBSET_VERSION: &str = "x-activator-subset-version";
/// On a member's answer to a forwarded request: the host answer the forwarder used is older
/// than the member's subset (a Route or a hand-over moved the host), so the forwarder reads
/// the host again at once. Honoured only on answers from a peer it forwarded to; removed
/// before any answer reaches a client, and from apps' answers.
pub const HEADER_ACTIVATOR_HOST_STALE: &str = "x-activator-host-stale";
/// Beside a proven hop, on a request the entry resolved by its Host: the revision it picked,
/// `<namespace>/<name>`. The member serves that revision instead of resolving the Host again:
/// with a host split between revisions, a second pick at the member would not be the entry's.
/// Between activators only: removed from clients' requests, never passed on to an app.
pub const HEADER_ACTIVATOR_HOP_REVISION: &str = "x-activator-hop-revision";

/// Activator ports.
pub const DATA_PORT: u16 = 8080;
pub const ADMIN_PORT: u16 = 9090;

/// FNV-1a 64-bit hash of a node name, as 16 lowercase hex digits.
pub fn node_hash(node: &str) -> String {
    let mut hex = String::with_capacity(16);
    push_hex(&mut hex, fnv1a64(node));
    hex
}

/// The membership label key for `node`: `member.local-activator.dev/<fnv1a64 hex>`. Written
/// in place: the subsetter makes one per member of every subset it plans (300,000 when it
/// assigns 100,000 revisions), and two `format!`s per call were a tenth of that work.
pub fn member_label(node: &str) -> String {
    let mut label = String::with_capacity(MEMBER_LABEL_PREFIX.len() + 16);
    label.push_str(MEMBER_LABEL_PREFIX);
    push_hex(&mut label, fnv1a64(node));
    label
}

fn fnv1a64(s: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    s.bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// `h` as 16 lowercase hex digits.
fn push_hex(out: &mut String, h: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend(
        (0..16)
            .rev()
            .map(|i| char::from(HEX[((h >> (4 * i)) & 0xf) as usize])),
    );
}

/// The label selector an activator on `node` uses to watch the ActivationEndpoints listing it.
pub fn member_selector(node: &str) -> String {
    member_label(node)
}

/// A Host header value as hosts compare (RFC 9110 §4.2.3): without the port, in lower case,
/// without a trailing dot. `[v6]:port` keeps its brackets.
pub fn normalize_host(host: &str) -> String {
    let host = host.trim();
    let without_port = if host.starts_with('[') {
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

/// The host label key for `host` (any spelling: it is normalized first):
/// `host.local-activator.dev/<fnv1a64 hex of the normalized host>`.
pub fn host_label(host: &str) -> String {
    format!("{HOST_LABEL_PREFIX}{}", node_hash(&normalize_host(host)))
}

/// The label selector that finds the ActivationEndpoints of the revisions claiming `host`.
pub fn host_selector(host: &str) -> String {
    host_label(host)
}

/// The deterministic name of the `ordinal`-th app pod of `revision` created by the activator on
/// `node`. Two activators never produce the same name (the node hash differs), and a retried
/// create produces the same one (so 409 AlreadyExists means "already done").
///
/// Revision names are at most 63 characters, so the result (63 + 1 + 16 + 1 + digits) stays
/// far below the 253-character limit of pod names.
pub fn pod_name(revision: &str, node: &str, ordinal: u32) -> String {
    format!("{revision}-{}-{ordinal}", node_hash(node))
}

/// RFC 1123 label, as Kubernetes requires of namespace names.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain, as Kubernetes requires of most object names.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// The weight of `node` as a member of revision `namespace/name`: the member with the highest
/// weight is the revision's primary (rendezvous hashing), the one every entry activator sends
/// the revision's traffic to first. Shared so that the subsetter puts the pods a hand-over
/// starts where the traffic will land. FNV-1a 64 over the parts with a separator byte that
/// cannot occur in a Kubernetes name, then splitmix64's avalanche (FNV's low bits mix poorly
/// over short inputs that differ at the end).
pub fn member_weight(namespace: &str, name: &str, node: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, p) in [namespace, name, node].iter().enumerate() {
        if i > 0 {
            h ^= 0xff;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        for b in p.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        // Reference values of FNV-1a 64 (from the FNV test suite).
        assert_eq!(node_hash(""), "cbf29ce484222325");
        assert_eq!(node_hash("a"), "af63dc4c8601ec8c");
        assert_eq!(node_hash("foobar"), "85944171f73967e8");
    }

    #[test]
    fn member_label_is_the_prefix_and_the_hash() {
        assert_eq!(
            member_label("a"),
            "member.local-activator.dev/af63dc4c8601ec8c"
        );
        assert_eq!(
            member_label(""),
            "member.local-activator.dev/cbf29ce484222325"
        );
        for node in ["node-00017", "ip-10-0-0-1.ec2.internal", "ü"] {
            assert_eq!(
                member_label(node),
                format!("{MEMBER_LABEL_PREFIX}{:016x}", fnv1a64(node))
            );
        }
    }

    #[test]
    fn member_label_is_a_valid_qualified_key() {
        let l = member_label("node-17");
        let (prefix, name) = l.split_once('/').unwrap();
        assert_eq!(prefix, "member.local-activator.dev");
        assert_eq!(name.len(), 16);
        assert!(
            name.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    #[test]
    fn host_labels_ignore_port_case_and_trailing_dot() {
        let l = host_label("App.Example.com");
        for h in [
            "app.example.com",
            "APP.example.com:8080",
            "app.example.com.",
        ] {
            assert_eq!(host_label(h), l, "{h}");
        }
        assert_ne!(host_label("other.example.com"), l);
        assert_eq!(
            l,
            format!("{HOST_LABEL_PREFIX}{}", node_hash("app.example.com"))
        );
        assert_eq!(normalize_host("[::1]:80"), "[::1]");
    }

    #[test]
    fn pod_names_differ_per_node_and_ordinal_and_are_stable() {
        assert_eq!(pod_name("r", "n1", 0), pod_name("r", "n1", 0));
        assert_ne!(pod_name("r", "n1", 0), pod_name("r", "n2", 0));
        assert_ne!(pod_name("r", "n1", 0), pod_name("r", "n1", 1));
        assert!(pod_name(&"x".repeat(63), "some-node", 999).len() <= 253);
    }
}
