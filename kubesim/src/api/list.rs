//! LIST: selectors, pagination with opaque continue tokens, and list bodies written without
//! re-serializing stored objects.

use std::io::Write;

use bytes::Bytes;
use serde_json::{Value, json};

use super::handlers::{Ctx, Reply};
use super::http::{Query, b64_decode, b64_encode};
use super::meta;
use super::resource::ResourceDef;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{State, Stored};
use super::watch::{node_term, partial_metadata};

/// Parsed `labelSelector` and `fieldSelector`.
pub(crate) struct Selectors {
    pub label: Option<LabelSelector>,
    pub field: Option<FieldSelector>,
    pub raw_label: String,
    pub raw_field: String,
    pub node: Option<String>,
}

impl Selectors {
    pub fn parse(def: &ResourceDef, q: &Query) -> Result<Self, ApiError> {
        let raw_label = q.get("labelSelector").unwrap_or("").to_string();
        let raw_field = q.get("fieldSelector").unwrap_or("").to_string();
        let label = if raw_label.trim().is_empty() {
            None
        } else {
            Some(LabelSelector::parse(&raw_label).map_err(ApiError::bad_request)?)
        };
        let field = if raw_field.trim().is_empty() {
            None
        } else {
            let f = FieldSelector::parse(&raw_field).map_err(ApiError::bad_request)?;
            for name in f.fields() {
                let ok = name == "metadata.name"
                    || (name == "metadata.namespace" && def.namespaced)
                    || def.field_labels.contains(&name);
                if !ok {
                    return Err(ApiError::bad_request(format!(
                        "field label not supported: {name}"
                    )));
                }
            }
            Some(f)
        };
        let node = if def.table_key() == "/pods" {
            node_term(&raw_field)
        } else {
            None
        };
        Ok(Self {
            label,
            field,
            raw_label,
            raw_field,
            node,
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(n) = &self.node {
            let on = obj
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if on != n {
                return false;
            }
        }
        if let Some(l) = &self.label {
            let labels = meta::meta(obj)
                .and_then(|m| m.get("labels"))
                .and_then(Value::as_object);
            if !l.matches(labels) {
                return false;
            }
        }
        self.field.as_ref().is_none_or(|f| f.matches(obj))
    }

    pub fn is_empty(&self) -> bool {
        self.label.is_none() && self.field.is_none()
    }
}

/// Writes one list item: built-in kinds' items carry no kind/apiVersion, custom resources'
/// do (as on a real server).
fn write_item(out: &mut Vec<u8>, def: &ResourceDef, s: &Stored, meta_only: bool) {
    if meta_only {
        let _ = serde_json::to_writer(&mut *out, &partial_metadata(s));
        return;
    }
    if def.custom {
        out.extend_from_slice(&s.json);
        return;
    }
    out.push(b'{');
    let mut first = true;
    // Built-in items are few next to the custom resources (pods and nodes, not 100,000
    // Revisions): parsing them again here costs less than keeping them parsed.
    if let Some(m) = s.full().as_object() {
        for (k, v) in m {
            if k == "kind" || k == "apiVersion" {
                continue;
            }
            if !first {
                out.push(b',');
            }
            first = false;
            let _ = serde_json::to_writer(&mut *out, k);
            out.push(b':');
            let _ = serde_json::to_writer(&mut *out, v);
        }
    }
    out.push(b'}');
}

/// A `{Kind}List` body.
pub(crate) fn list_body<'a>(
    def: &ResourceDef,
    items: impl Iterator<Item = &'a Stored>,
    rv: u64,
    cont: Option<String>,
    remaining: Option<usize>,
    meta_only: bool,
) -> Bytes {
    let mut out = Vec::with_capacity(1024);
    let mut lmeta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        lmeta["continue"] = json!(c);
    }
    if let Some(r) = remaining {
        lmeta["remainingItemCount"] = json!(r);
    }
    let (kind, av) = if meta_only {
        (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        )
    } else {
        (format!("{}List", def.kind), def.api_version())
    };
    let _ = write!(
        out,
        "{{\"kind\":\"{kind}\",\"apiVersion\":\"{av}\",\"metadata\":"
    );
    let _ = serde_json::to_writer(&mut out, &lmeta);
    out.extend_from_slice(b",\"items\":[");
    for (i, s) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_item(&mut out, def, s, meta_only);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let v = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}")});
    b64_encode(&serde_json::to_vec(&v).unwrap_or_default())
}

fn decode_continue(tok: &str) -> Option<(u64, String, String)> {
    let raw = b64_decode(tok)?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    let rv = v.get("rv")?.as_u64()?;
    let start = v.get("start")?.as_str()?.trim_end_matches('\u{0}');
    let (ns, name) = start.split_once('/')?;
    Some((rv, ns.to_string(), name.to_string()))
}

pub(crate) fn list(st: &State, ctx: &Ctx) -> Result<Reply, ApiError> {
    let def = &ctx.def;
    let sel = Selectors::parse(def, &ctx.query)?;
    let limit = match ctx.query.non_empty("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l}")))?,
        None => 0,
    };
    let (list_rv, after) = match ctx.query.non_empty("continue") {
        Some(tok) => {
            let (rv, ns, name) = decode_continue(tok).ok_or_else(|| {
                ApiError::bad_request(
                    "continue key is not valid: illegal base64 data at input byte 0",
                )
            })?;
            (rv, Some((ns, name)))
        }
        None => (st.rv, None),
    };
    let empty = std::collections::BTreeMap::new();
    let objects = st
        .tables
        .get(&def.table_key())
        .map(|t| &t.objects)
        .unwrap_or(&empty);
    let ns = ctx.ns.clone();
    let start = match (&after, &ns) {
        (Some(k), _) => std::ops::Bound::Excluded(k.clone()),
        (None, Some(n)) => std::ops::Bound::Included((n.clone(), String::new())),
        (None, None) => std::ops::Bound::Unbounded,
    };
    let visited = std::cell::Cell::new(0usize);
    let mut iter = objects
        .range((start, std::ops::Bound::Unbounded))
        .take_while(|(k, _)| ns.as_ref().is_none_or(|n| *n == k.0))
        .inspect(|_| visited.set(visited.get() + 1))
        .filter(|(_, s)| sel.matches(&s.view));
    let mut items: Vec<&Stored> = Vec::new();
    let mut cont = None;
    let mut remaining = None;
    let mut last_key = None;
    for (k, s) in iter.by_ref() {
        if limit > 0 && items.len() == limit {
            // A page from the storage ends here: what it read is what was visited so far.
            visited.set(visited.get() - 1);
            let page_end = visited.get();
            let rest = 1 + iter.count();
            visited.set(page_end);
            cont =
                last_key.map(|(ns, name): (&String, &String)| encode_continue(list_rv, ns, name));
            if sel.is_empty() {
                remaining = Some(rest);
            }
            break;
        }
        items.push(s);
        last_key = Some((&k.0, &k.1));
    }
    count_scan(st, ctx, &sel, visited.get(), items.len());
    let body = list_body(
        def,
        items.into_iter(),
        list_rv,
        cont,
        remaining,
        ctx.meta_only,
    );
    Ok(Reply {
        code: 200,
        body,
        warnings: Vec::new(),
    })
}

/// Whether the real server answers this LIST from its watch cache (`shouldDelegateList`,
/// cacher.go:724-739, with `ConsistentListFromCache` off as in v1.28): not a quorum read, not a
/// continuation, not an exact resourceVersion, and not paged unless `resourceVersion=0`.
fn from_cache(q: &Query) -> bool {
    let rv = q.get("resourceVersion").unwrap_or("");
    let limit = q.non_empty("limit").is_some_and(|l| l != "0");
    !rv.is_empty()
        && q.non_empty("continue").is_none()
        && !(limit && rv != "0")
        && q.get("resourceVersionMatch") != Some("Exact")
}

/// Counts what the LIST read as the real server would have read it. From the watch cache:
/// every object of the resource, in every namespace (it has no label or namespace index), but
/// only the node's pods with `spec.nodeName=` (pods' one index). From the storage: the
/// objects of the request's key range, as far as the page went (`visited`).
fn count_scan(st: &State, ctx: &Ctx, sel: &Selectors, visited: usize, returned: usize) {
    let def = &ctx.def;
    let Some(t) = st.tables.get(&def.table_key()) else {
        return;
    };
    let counters = t.watchers.counters();
    if !from_cache(&ctx.query) {
        counters.list(None, visited, returned);
        return;
    }
    match (&sel.node, t.watchers.indexed()) {
        (Some(n), true) => {
            let on_node = t
                .objects
                .values()
                .filter(|s| super::watch::node_name(&s.view) == n)
                .count();
            counters.list(Some("f:spec.nodeName"), on_node, returned);
        }
        _ => counters.list(Some(""), t.objects.len(), returned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_lists_the_watch_cache_serves() {
        let q = |s: &str| Query::parse(Some(s));
        assert!(from_cache(&q("resourceVersion=0")));
        assert!(from_cache(&q("resourceVersion=0&limit=500")));
        assert!(from_cache(&q("resourceVersion=12&labelSelector=a")));
        assert!(!from_cache(&q("labelSelector=a")), "quorum read: etcd");
        assert!(!from_cache(&q("resourceVersion=12&limit=5")));
        assert!(!from_cache(&q("resourceVersion=0&continue=x")));
        assert!(!from_cache(&q(
            "resourceVersion=12&resourceVersionMatch=Exact"
        )));
    }

    #[test]
    fn continue_tokens_roundtrip() {
        let t = encode_continue(42, "ns", "a-b");
        assert_eq!(decode_continue(&t), Some((42, "ns".into(), "a-b".into())));
        assert_eq!(decode_continue("!!"), None);
    }
}
