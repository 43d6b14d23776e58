//! Object metadata helpers: timestamps, uids, generated names and name validation.

use rand::RngExt;
use serde_json::{Map, Value};

/// RFC 3339 with whole seconds, as the API server writes `metav1.Time`.
pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A timestamp `secs` seconds from now, in `metav1.Time` format.
pub(crate) fn rfc3339_in(secs: i64) -> String {
    let ts = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(secs))
        .unwrap_or_else(|_| jiff::Timestamp::now());
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A random version-4 UUID, formatted as the API server does.
pub(crate) fn new_uid() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The 5-character suffix the API server appends to `generateName` (no vowels, as in
/// k8s.io/apimachinery's `rand.String`).
pub(crate) fn name_suffix() -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHANUMS[rng.random_range(0..ALPHANUMS.len())] as char)
        .collect()
}

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Messages for an invalid DNS-1123 subdomain (most object names), empty when valid.
pub(crate) fn validate_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if !s.split('.').all(is_label_chars) {
        errs.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    errs
}

fn is_label_chars(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Messages for an invalid DNS-1123 label (namespace names, container names), empty when valid.
pub(crate) fn validate_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !is_label(s) && (s.len() <= 63 || !is_label_chars(s)) {
        errs.push(DNS1123_LABEL_MSG.to_string());
    }
    errs
}

pub(crate) fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj.as_object_mut()
            .expect("object")
            .insert("metadata".into(), Value::Object(Map::new()));
    }
    obj.get_mut("metadata")
        .and_then(Value::as_object_mut)
        .expect("metadata is an object")
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(field)).and_then(Value::as_str)
}

pub(crate) fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub(crate) fn namespace_of(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn set_finalizers(obj: &mut Value, f: Vec<String>) {
    let m = meta_mut(obj);
    if f.is_empty() {
        m.remove("finalizers");
    } else {
        m.insert("finalizers".into(), Value::from(f));
    }
}

pub(crate) fn is_deleting(obj: &Value) -> bool {
    meta(obj)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|v| !v.is_null())
}

/// `(uid, controller)` of each ownerReference.
pub(crate) fn owner_uids(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The object with `metadata.resourceVersion` replaced, for DELETED events that carry an
/// object's last content at the deletion's resourceVersion.
pub(crate) fn with_rv(obj: &Value, rv: u64) -> Value {
    let mut o = obj.clone();
    meta_mut(&mut o).insert("resourceVersion".into(), Value::String(rv.to_string()));
    o
}

/// Removes explicit nulls the way Go's typed decoding would drop them from metadata.
pub(crate) fn strip_null_meta(obj: &mut Value) {
    let m = meta_mut(obj);
    m.retain(|_, v| !v.is_null());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_whole_seconds_utc() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    }

    #[test]
    fn uid_is_uuid_v4() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, new_uid());
    }

    #[test]
    fn names() {
        assert!(validate_subdomain("a.b-c").is_empty());
        assert!(!validate_subdomain("A").is_empty());
        assert!(!validate_subdomain("-a").is_empty());
        assert!(validate_label(&"a".repeat(63)).is_empty());
        assert_eq!(validate_label(&"a".repeat(64)).len(), 1);
        assert!(!validate_label("a.b").is_empty());
        assert_eq!(name_suffix().len(), 5);
    }
}
