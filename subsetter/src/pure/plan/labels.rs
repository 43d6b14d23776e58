//! The labels a subset's object carries (one per member, one per host) and the merge patch
//! that makes its current labels so.

use std::collections::BTreeMap;

use crds::contract::{HOST_LABEL_PREFIX, MEMBER_LABEL_PREFIX, host_label, member_label};
use foldhash::HashSet as FastSet;
use serde_json::{Map, Value, json};

use super::inputs::SubsetInputs;
use crate::pure::hosts::label_of_normalized;

/// Every label the object should carry: its members', its hosts' (but those whose hand-over
/// waits) and its Routes' hosts'.
///
/// A revision keeps the labels of the hosts it loses: readers skip it by its HostConflict
/// condition, and the label is what lets them see that there is a conflict at all. Any
/// string hashes to a valid label key, so an odd host cannot make the write fail. A host
/// whose hand-over waits gets no label yet: no reader finds this revision for it.
pub(super) fn labels(inp: &SubsetInputs<'_>, chosen: &[String]) -> BTreeMap<String, String> {
    let pending: Option<FastSet<String>> = (!inp.pending_hosts.is_empty()).then(|| {
        inp.pending_hosts
            .iter()
            .map(|h| label_of_normalized(h))
            .collect()
    });
    chosen
        .iter()
        .map(|node| member_label(node))
        .chain(
            inp.revision
                .spec
                .hosts
                .iter()
                .map(|h| host_label(h))
                .filter(|l| pending.as_ref().is_none_or(|p| !p.contains(l))),
        )
        .chain(inp.routes.iter().map(|r| label_of_normalized(&r.host)))
        .map(|k| (k, String::new()))
        .collect()
}

/// The merge patch that makes the member and host labels of `current` equal to `wanted` (null
/// removes a label), leaving labels outside those prefixes alone; None when nothing differs.
pub fn label_patch(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> Option<Value> {
    let mut patch = Map::new();
    for (k, v) in wanted {
        if current.get(k) != Some(v) {
            patch.insert(k.clone(), Value::String(v.clone()));
        }
    }
    for k in current.keys() {
        let ours = k.starts_with(MEMBER_LABEL_PREFIX) || k.starts_with(HOST_LABEL_PREFIX);
        if ours && !wanted.contains_key(k) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    (!patch.is_empty()).then(|| json!({ "metadata": { "labels": patch } }))
}
