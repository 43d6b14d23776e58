//! Defaulting and validation of built-in kinds (the parts kube-apiserver's strategies and
//! default admission plugins apply that clients can observe).

use serde_json::{Map, Value, json};

use super::meta;
use super::status::{Cause, forbidden, invalid_value, required};

/// Defaults a pod as the API server and its default admission plugins do.
pub(crate) fn default_pod(pod: &mut Value) {
    let spec = pod
        .as_object_mut()
        .expect("object")
        .entry("spec")
        .or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    let defaults = [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
        ("serviceAccountName", json!("default")),
    ];
    for (k, v) in defaults {
        spec.entry(k).or_insert(v);
    }
    if let Some(sa) = spec.get("serviceAccountName").cloned() {
        spec.entry("serviceAccount").or_insert(sa);
    }
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(list) {
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                default_container(c);
            }
        }
    }
    // DefaultTolerationSeconds admission plugin.
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    if let Some(ts) = tolerations.as_array_mut() {
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            let has = ts
                .iter()
                .any(|t| t.get("key").and_then(Value::as_str) == Some(key));
            if !has {
                ts.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
}

/// The taint kube-apiserver's TaintNodesByCondition admission plugin puts on every new Node:
/// nothing is scheduled there until the node lifecycle controller sees it Ready.
pub(crate) const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// Admission of a new Node (TaintNodesByCondition): adds `not-ready:NoSchedule`, keeping the
/// taints the creator sent.
pub(crate) fn taint_new_node(node: &mut Value) {
    let Some(obj) = node.as_object_mut() else {
        return;
    };
    let spec = obj.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    let taints = spec.entry("taints").or_insert_with(|| json!([]));
    if !taints.is_array() {
        *taints = json!([]);
    }
    let list = taints.as_array_mut().expect("an array");
    let present = list.iter().any(|t| {
        t.get("key").and_then(Value::as_str) == Some(NOT_READY_TAINT)
            && t.get("effect").and_then(Value::as_str) == Some("NoSchedule")
    });
    if !present {
        list.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
    }
}

/// ConfigMap update validation (ValidateConfigMapUpdate): once `immutable` is true, neither
/// the data nor the flag may change.
pub(crate) fn validate_configmap_update(new: &Value, old: &Value) -> Vec<Cause> {
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return Vec::new();
    }
    let why = "field is immutable when `immutable` is set";
    let mut causes = Vec::new();
    if new.get("immutable") != old.get("immutable") {
        causes.push(forbidden("immutable", why));
    }
    for field in ["data", "binaryData"] {
        let empty = |v: Option<&Value>| v.is_none_or(|v| v.is_null() || v == &json!({}));
        let (a, b) = (new.get(field), old.get(field));
        if a != b && !(empty(a) && empty(b)) {
            causes.push(forbidden(field, why));
        }
    }
    causes
}

fn default_container(c: &mut Map<String, Value>) {
    let image = c.get("image").and_then(Value::as_str).unwrap_or("");
    let last = image.rsplit('/').next().unwrap_or("");
    let pull = if image.contains('@') || (last.contains(':') && !last.ends_with(":latest")) {
        "IfNotPresent"
    } else {
        "Always"
    };
    c.entry("imagePullPolicy").or_insert(json!(pull));
    c.entry("terminationMessagePath")
        .or_insert(json!("/dev/termination-log"));
    c.entry("terminationMessagePolicy").or_insert(json!("File"));
    c.entry("resources").or_insert(json!({}));
    if let Some(Value::Array(ports)) = c.get_mut("ports") {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.entry("protocol").or_insert(json!("TCP"));
        }
    }
}

/// The pod's QoS class from its containers' requests and limits.
pub(crate) fn qos_class(pod: &Value) -> &'static str {
    let cs: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|l| {
            pod.get("spec")
                .and_then(|s| s.get(*l))
                .and_then(Value::as_array)
        })
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &cs {
        let req = c.pointer("/resources/requests").and_then(Value::as_object);
        let lim = c.pointer("/resources/limits").and_then(Value::as_object);
        if req.is_some_and(|r| !r.is_empty()) || lim.is_some_and(|l| !l.is_empty()) {
            any = true;
        }
        for r in ["cpu", "memory"] {
            let l = lim.and_then(|l| l.get(r));
            let q = req.and_then(|q| q.get(r)).or(l);
            if l.is_none() || q != l {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// A subset of pod validation: what a malformed template would trip over first.
pub(crate) fn validate_pod(pod: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    match containers {
        None => causes.push(required("spec.containers")),
        Some(cs) if cs.is_empty() => causes.push(required("spec.containers")),
        Some(_) => {}
    }
    let mut names = Vec::new();
    for list in ["initContainers", "containers"] {
        let Some(cs) = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
        else {
            continue;
        };
        for (i, c) in cs.iter().enumerate() {
            let at = format!("spec.{list}[{i}]");
            match c.get("name").and_then(Value::as_str) {
                None | Some("") => causes.push(required(format!("{at}.name"))),
                Some(n) => {
                    for m in meta::validate_label(n) {
                        causes.push(invalid_value(format!("{at}.name"), &json!(n), &m));
                    }
                    if names.contains(&n) {
                        causes.push(Cause {
                            reason: "FieldValueDuplicate".into(),
                            field: format!("{at}.name"),
                            message: format!("Duplicate value: \"{n}\""),
                        });
                    }
                    names.push(n);
                }
            }
            if c.get("image")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push(required(format!("{at}.image")));
            }
            if let Some(ports) = c.get("ports").and_then(Value::as_array) {
                for (j, p) in ports.iter().enumerate() {
                    let f = format!("{at}.ports[{j}].containerPort");
                    match p.get("containerPort").and_then(Value::as_i64) {
                        None => causes.push(required(f)),
                        Some(n) if !(1..=65535).contains(&n) => causes.push(invalid_value(
                            f,
                            &json!(n),
                            "must be between 1 and 65535, inclusive",
                        )),
                        _ => {}
                    }
                }
            }
        }
    }
    if let Some(rp) = pod.pointer("/spec/restartPolicy").and_then(Value::as_str)
        && !matches!(rp, "Always" | "OnFailure" | "Never")
    {
        causes.push(Cause {
            reason: "FieldValueNotSupported".into(),
            field: "spec.restartPolicy".into(),
            message: format!("Unsupported value: \"{rp}\": supported values: \"Always\", \"OnFailure\", \"Never\""),
        });
    }
    causes
}

/// Pod spec fields an update may change (kube-apiserver's `ValidatePodUpdate`).
pub(crate) fn validate_pod_update(new: &Value, old: &Value) -> Vec<Cause> {
    let strip = |p: &Value| -> Value {
        let mut s = p.get("spec").cloned().unwrap_or(json!({}));
        if let Some(m) = s.as_object_mut() {
            m.remove("activeDeadlineSeconds");
            m.remove("tolerations");
            m.remove("terminationGracePeriodSeconds");
            for list in ["containers", "initContainers"] {
                if let Some(Value::Array(cs)) = m.get_mut(list) {
                    for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                        c.remove("image");
                    }
                }
            }
        }
        s
    };
    if strip(new) != strip(old) {
        return vec![forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        )];
    }
    Vec::new()
}

/// Namespace defaults: the `kubernetes` finalizer, phase Active and the
/// `kubernetes.io/metadata.name` label.
pub(crate) fn default_namespace(ns: &mut Value) {
    let name = meta::name_of(ns).to_string();
    let m = meta::meta_mut(ns);
    let labels = m.entry("labels").or_insert_with(|| json!({}));
    if let Some(l) = labels.as_object_mut() {
        l.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
    // As the namespace strategy's PrepareForCreate: the finalizers asked for, plus `kubernetes`.
    let mut finalizers: Vec<Value> = ns
        .pointer("/spec/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !finalizers.iter().any(|f| f.as_str() == Some("kubernetes")) {
        finalizers.push(json!("kubernetes"));
    }
    ns["spec"] = json!({"finalizers": finalizers});
    ns["status"] = json!({"phase": "Active"});
}

/// The finalizer names a namespace's `spec.finalizers` may hold (core validation's
/// `validateKubeFinalizerName`): one without a `/` only if standard. On create the field is
/// `spec.finalizers`; `/finalize` names the index. (The qualified-name syntax is not checked.)
pub(crate) fn validate_namespace_finalizers(ns: &Value, indexed: bool) -> Vec<Cause> {
    const STANDARD: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];
    let mut causes = Vec::new();
    let list = ns.pointer("/spec/finalizers").and_then(Value::as_array);
    for (i, f) in list.into_iter().flatten().enumerate() {
        let field = if indexed {
            format!("spec.finalizers[{i}]")
        } else {
            "spec.finalizers".to_string()
        };
        let name = f.as_str().unwrap_or("");
        if !name.contains('/') && !STANDARD.contains(&name) {
            causes.push(invalid_value(
                field,
                f,
                "name is neither a standard finalizer name nor is it fully qualified",
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_defaults_and_qos() {
        let mut p = json!({"spec": {"containers": [{"name": "a", "image": "x:1", "ports": [{"containerPort": 80}]}]}});
        default_pod(&mut p);
        assert_eq!(p["spec"]["restartPolicy"], "Always");
        assert_eq!(
            p["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(p["spec"]["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(p["spec"]["tolerations"].as_array().unwrap().len(), 2);
        assert_eq!(qos_class(&p), "BestEffort");
        p["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
        assert_eq!(qos_class(&p), "Guaranteed");
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
        assert_eq!(qos_class(&p), "Burstable");
    }

    #[test]
    fn pod_validation() {
        let p =
            json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 70000}]}]}});
        let c = validate_pod(&p);
        let fields: Vec<&str> = c.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.containers[0].image",
                "spec.containers[0].ports[0].containerPort"
            ]
        );
        assert!(!validate_pod(&json!({"spec": {}})).is_empty());
        let old = json!({"spec": {"containers": [{"name": "a", "image": "x"}]}});
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("y");
        assert!(validate_pod_update(&new, &old).is_empty());
        new["spec"]["nodeName"] = json!("n");
        assert_eq!(validate_pod_update(&new, &old).len(), 1);
    }
}
