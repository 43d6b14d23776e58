//! Renders the kustomize overlays and the Helm chart under deploy/ without kustomize or helm
//! (neither is installed in CI): shared by the crds, activator and subsetter tests (included by
//! path).
//!
//! - kustomize: the subset the overlays use — `resources` (files, or directories with their
//!   own kustomization.yaml), `components` (directories whose kustomization.yaml is a
//!   `Component`: its resources join, and its patches and images apply to, what the including
//!   kustomization has gathered so far, before that one's own patches and images, as
//!   kustomize orders them), `patches` with a `target` and a `path` or an inline `patch` that
//!   is a JSON 6902 operation list (applied with the json-patch crate, the semantics kustomize
//!   uses for them) or a `$patch: delete` (the targets are removed), and `images` (`name` →
//!   `newName`/`newTag`). Any other field of a kustomization.yaml fails the render, so nothing
//!   is silently skipped.
//! - Helm: the templates are Go text/template, rendered with the `gtmpl` crate plus the
//!   few Helm (sprig) functions the chart uses — `quote`, `toYaml`, `nindent`, `splitList`,
//!   `last` — implemented here with Helm's semantics. A function not implemented here fails
//!   the render.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use gtmpl::{Context, FuncError, Template, Value as Tv};
use serde_json::{Map, Value};

pub fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

pub fn chart_dir() -> PathBuf {
    deploy_dir().join("helm/local-activator")
}

/// The namespace the chart is rendered into by the tests (the one deploy/base uses).
pub const RELEASE_NAMESPACE: &str = "local-activator";

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_docs(&text, &path.display().to_string())
}

/// The non-empty documents of a multi-document YAML text.
pub fn parse_docs(text: &str, what: &str) -> Vec<Value> {
    let docs: Vec<Value> =
        serde_saphyr::from_str_multiple(text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// (group, kind, namespace, name) of an object.
pub fn id(o: &Value) -> (String, String, String, String) {
    let api = o["apiVersion"].as_str().unwrap_or_default();
    let group = api.rsplit_once('/').map_or("", |(g, _)| g);
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        group.to_string(),
        s(&o["kind"]),
        s(&o["metadata"]["namespace"]),
        s(&o["metadata"]["name"]),
    )
}

/// `kustomize build <dir>` for the subset described at the top of this file.
pub fn kustomize(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    build(dir, "Kustomization", &mut out);
    out
}

/// `docs` with the kustomize Component in `dir` applied, as by a kustomization that lists it
/// under `components` after the resources `docs` were built from.
pub fn with_component(mut docs: Vec<Value>, dir: &Path) -> Vec<Value> {
    build(dir, "Component", &mut docs);
    docs
}

/// One kustomization.yaml of `kind` (a Kustomization, or a Component applied to `out`).
fn build(dir: &Path, kind: &str, out: &mut Vec<Value>) {
    let k = yaml_docs(&dir.join("kustomization.yaml"));
    assert_eq!(k.len(), 1, "{}: one kustomization", dir.display());
    let k = &k[0];
    assert_eq!(k["kind"], kind, "{}", dir.display());
    for key in k.as_object().unwrap().keys() {
        assert!(
            [
                "apiVersion",
                "kind",
                "resources",
                "components",
                "patches",
                "images"
            ]
            .contains(&key.as_str()),
            "{}: kustomization field {key} is not supported by this renderer",
            dir.display()
        );
    }
    for r in k["resources"].as_array().into_iter().flatten() {
        let p = dir.join(r.as_str().unwrap());
        let docs = if p.is_dir() {
            kustomize(&p)
        } else {
            yaml_docs(&p)
        };
        for d in docs {
            assert!(
                !out.iter().any(|o| id(o) == id(&d)),
                "{}: {:?} twice",
                dir.display(),
                id(&d)
            );
            out.push(d);
        }
    }
    for c in k["components"].as_array().into_iter().flatten() {
        build(&dir.join(c.as_str().unwrap()), "Component", out);
    }
    for p in k["patches"].as_array().into_iter().flatten() {
        let (what, ops) = match (p["path"].as_str(), p["patch"].as_str()) {
            (Some(file), None) => (file.to_string(), yaml_docs(&dir.join(file))),
            (None, Some(text)) => {
                let what = format!("{}: an inline patch", dir.display());
                let docs = parse_docs(text, &what);
                (what, docs)
            }
            _ => panic!("{}: patches: a path or an inline patch", dir.display()),
        };
        let target = p["target"].as_object().expect("patches: a target");
        for key in target.keys() {
            assert!(
                ["group", "version", "kind", "name", "namespace"].contains(&key.as_str()),
                "target field {key} is not supported by this renderer"
            );
        }
        assert_eq!(ops.len(), 1, "{what}: one document");
        let fits = |o: &Value| {
            let api = o["apiVersion"].as_str().unwrap_or_default().to_string();
            let (group, version) = api.rsplit_once('/').unwrap_or(("", &api));
            target.iter().all(|(k, v)| {
                let v = v.as_str().unwrap();
                match k.as_str() {
                    "group" => group == v,
                    "version" => version == v,
                    "kind" => o["kind"] == v,
                    "name" => o["metadata"]["name"] == v,
                    "namespace" => o["metadata"]["namespace"] == v,
                    _ => unreachable!(),
                }
            })
        };
        let before = out.len();
        if ops[0]["$patch"] == "delete" {
            out.retain(|o| !fits(o));
            assert!(out.len() < before, "{what} deletes nothing");
            continue;
        }
        assert!(ops[0].is_array(), "{what}: a JSON 6902 operation list");
        let patch: json_patch::Patch =
            serde_json::from_value(ops[0].clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut matched = 0;
        for o in out.iter_mut().filter(|o| fits(o)) {
            json_patch::patch(o, &patch).unwrap_or_else(|e| panic!("{what}: {e}"));
            matched += 1;
        }
        assert!(matched > 0, "{what} patches nothing");
    }
    for i in k["images"].as_array().into_iter().flatten() {
        for key in i.as_object().unwrap().keys() {
            assert!(
                ["name", "newName", "newTag"].contains(&key.as_str()),
                "images field {key} is not supported by this renderer"
            );
        }
        let name = i["name"].as_str().expect("images: a name");
        let mut matched = 0;
        for spec in out
            .iter_mut()
            .filter_map(|o| o.pointer_mut("/spec/template/spec"))
        {
            for list in ["initContainers", "containers"] {
                let containers = spec.get_mut(list).and_then(Value::as_array_mut);
                for c in containers.into_iter().flatten() {
                    let image = c["image"].as_str().unwrap_or_default().to_string();
                    // name[:tag]: the tag is after the last ':' unless that is a port's.
                    let (repo, tag) = match image.rsplit_once(':') {
                        Some((r, t)) if !t.contains('/') => (r, Some(t)),
                        _ => (image.as_str(), None),
                    };
                    if repo != name {
                        continue;
                    }
                    let repo = i["newName"].as_str().unwrap_or(repo);
                    let tag = i["newTag"].as_str().or(tag);
                    c["image"] = match tag {
                        Some(t) => format!("{repo}:{t}"),
                        None => repo.to_string(),
                    }
                    .into();
                    matched += 1;
                }
            }
        }
        assert!(
            matched > 0,
            "{}: image {name} is in no container",
            dir.display()
        );
    }
}

/// Helm's value merging (`-f a.yaml -f b.yaml`): maps merge key by key, the later file wins;
/// a null removes the key.
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(k);
                } else if let Some(bv) = b.get_mut(k) {
                    merge(bv, v);
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// The chart's values.yaml merged with `files` (relative to the chart) in order.
pub fn values(files: &[&str]) -> Value {
    let mut v = yaml_docs(&chart_dir().join("values.yaml")).remove(0);
    for f in files {
        let over = yaml_docs(&chart_dir().join(f)).remove(0);
        merge(&mut v, &over);
    }
    v
}

fn to_tv(v: &Value) -> Tv {
    match v {
        Value::Null => Tv::Nil,
        Value::Bool(b) => Tv::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Tv::from(u),
            (_, Some(i)) => Tv::from(i),
            _ => Tv::from(n.as_f64().unwrap()),
        },
        Value::String(s) => Tv::String(s.clone()),
        Value::Array(a) => Tv::Array(a.iter().map(to_tv).collect()),
        Value::Object(o) => Tv::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), to_tv(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn from_tv(v: &Tv) -> Result<Value, FuncError> {
    Ok(match v {
        Tv::NoValue | Tv::Nil => Value::Null,
        Tv::Bool(b) => Value::Bool(*b),
        Tv::String(s) => Value::String(s.clone()),
        Tv::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Value::from(u),
            (_, Some(i), _) => Value::from(i),
            (_, _, Some(f)) => Value::from(f),
            _ => return Err(FuncError::UnableToConvertFromValue),
        },
        Tv::Array(a) => Value::Array(a.iter().map(from_tv).collect::<Result<_, _>>()?),
        Tv::Object(o) | Tv::Map(o) => {
            let mut m = Map::new();
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            for k in keys {
                m.insert(k.clone(), from_tv(&o[k])?);
            }
            Value::Object(m)
        }
        Tv::Function(_) => return Err(FuncError::UnableToConvertFromValue),
    })
}

fn args<const N: usize>(name: &str, a: &[Tv]) -> Result<[Tv; N], FuncError> {
    <[Tv; N]>::try_from(a.to_vec()).map_err(|_| FuncError::ExactlyXArgs(name.into(), N))
}

fn as_text(v: &Tv) -> String {
    match v {
        Tv::String(s) => s.clone(),
        Tv::NoValue | Tv::Nil => String::new(),
        other => other.to_string(),
    }
}

/// sprig `quote`: the argument as a Go-quoted string.
fn quote(a: &[Tv]) -> Result<Tv, FuncError> {
    let [v] = args("quote", a)?;
    Ok(Tv::String(
        serde_json::to_string(&as_text(&v)).map_err(|e| FuncError::Generic(e.to_string()))?,
    ))
}

/// Helm `toYaml`: YAML without the trailing newline.
fn to_yaml(a: &[Tv]) -> Result<Tv, FuncError> {
    let [v] = args("toYaml", a)?;
    let text =
        serde_saphyr::to_string(&from_tv(&v)?).map_err(|e| FuncError::Generic(e.to_string()))?;
    Ok(Tv::String(text.trim_end_matches('\n').to_string()))
}

/// sprig `nindent N s`: a newline, then `s` with every line indented by N spaces.
fn nindent(a: &[Tv]) -> Result<Tv, FuncError> {
    let [n, s] = args("nindent", a)?;
    let Tv::Number(n) = n else {
        return Err(FuncError::UnableToConvertFromValue);
    };
    let pad = " ".repeat(n.as_u64().ok_or(FuncError::UnableToConvertFromValue)? as usize);
    let body: Vec<String> = as_text(&s)
        .split('\n')
        .map(|l| format!("{pad}{l}"))
        .collect();
    Ok(Tv::String(format!("\n{}", body.join("\n"))))
}

/// sprig `splitList sep s`.
fn split_list(a: &[Tv]) -> Result<Tv, FuncError> {
    let [sep, s] = args("splitList", a)?;
    Ok(Tv::Array(
        as_text(&s)
            .split(&as_text(&sep))
            .map(|p| Tv::String(p.to_string()))
            .collect(),
    ))
}

/// sprig `last list`.
fn last(a: &[Tv]) -> Result<Tv, FuncError> {
    let [l] = args("last", a)?;
    match l {
        Tv::Array(v) => Ok(v.last().cloned().unwrap_or(Tv::Nil)),
        _ => Err(FuncError::UnableToConvertFromValue),
    }
}

/// Renders one template text with `values` (what `helm template` does per file).
pub fn render_template(text: &str, values: &Value, namespace: &str) -> String {
    let mut t = Template::default();
    t.add_func("quote", quote);
    t.add_func("toYaml", to_yaml);
    t.add_func("nindent", nindent);
    t.add_func("splitList", split_list);
    t.add_func("last", last);
    t.parse(text)
        .unwrap_or_else(|e| panic!("parsing the template: {e}"));
    let ctx = serde_json::json!({
        "Values": values,
        "Release": { "Name": "local-activator", "Namespace": namespace, "Service": "Helm" },
        "Chart": yaml_docs(&chart_dir().join("Chart.yaml")).remove(0),
    });
    let out = t
        .render(&Context::from(to_tv(&ctx)))
        .unwrap_or_else(|e| panic!("rendering: {e}"));
    assert!(
        !out.contains("<no value>"),
        "the template names a value that is not set:\n{out}"
    );
    out
}

/// `helm template -n <namespace>` of the chart with `values`: every document of every
/// template (CRDs, which Helm installs from crds/ untemplated, are in [`chart_crds`]).
pub fn helm_template(values: &Value, namespace: &str) -> Vec<Value> {
    let dir = chart_dir().join("templates");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "yaml")
                && !p.file_name().unwrap().to_string_lossy().starts_with('_')
        })
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let rendered = render_template(&text, values, namespace);
        out.extend(parse_docs(&rendered, &f.display().to_string()));
    }
    out
}

/// The chart's crds/ directory.
pub fn chart_crds() -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir().join("crds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().flat_map(|f| yaml_docs(f)).collect()
}

/// The workload `kind`/`name` among `docs`.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Its first container.
pub fn first_container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

/// The renderings the tests check: (what, documents).
pub fn all_renderings() -> Vec<(String, Vec<Value>)> {
    let d = deploy_dir();
    let mut out = vec![
        ("deploy/ (base)".to_string(), kustomize(&d)),
        (
            "overlays/small".to_string(),
            kustomize(&d.join("overlays/small")),
        ),
        (
            "overlays/large".to_string(),
            kustomize(&d.join("overlays/large")),
        ),
    ];
    for (name, files) in [
        ("chart (defaults)", &[][..]),
        ("chart values-small", &["values-small.yaml"][..]),
        ("chart values-large", &["values-large.yaml"][..]),
    ] {
        out.push((
            name.to_string(),
            helm_template(&values(files), RELEASE_NAMESPACE),
        ));
    }
    out
}
