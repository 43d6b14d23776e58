//! Shared by the activator's and the subsetter's `tests/manifests.rs` (included by path): the
//! deploy manifests match a binary's own command line.

use clap::{CommandFactory, Parser};
use serde_json::Value;

/// The documents of `deploy/<rel>`.
pub fn docs(rel: &str) -> Vec<Value> {
    let path = format!("{}/../deploy/{rel}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_str_multiple(&text).unwrap()
}

/// The workload of `kind` in `deploy/<rel>`.
pub fn workload(rel: &str, kind: &str) -> Value {
    docs(rel)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {rel}"))
}

/// The container `name` of `kind` in `deploy/<rel>`.
pub fn container(rel: &str, kind: &str, name: &str) -> Value {
    workload(rel, kind)["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
        .clone()
}

/// Every arg of `c` parses with `A` (required flags the downward API fills at run time get a
/// placeholder), every env var `c` sets is one `A` reads (or in `other_env`, or `OTEL_*`),
/// and `c` sets each of `needed`.
pub fn check<A: Parser + CommandFactory>(
    bin: &str,
    c: &Value,
    other_env: &[&str],
    needed: &[&str],
) {
    let args: Vec<String> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let cmd = A::command();
    let mut argv = vec![bin.to_string()];
    argv.extend(args.iter().cloned());
    for a in cmd.get_arguments() {
        let given = args
            .iter()
            .any(|x| x.starts_with(&format!("--{}", a.get_id())));
        if let Some(long) = a.get_long().filter(|_| a.is_required_set() && !given) {
            argv.push(format!("--{long}=x"));
        }
    }
    if let Err(e) = A::try_parse_from(&argv) {
        panic!("the manifest's args {args:?} do not parse: {e}");
    }
    let declared: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    let env: Vec<&Value> = c["env"].as_array().into_iter().flatten().collect();
    for e in &env {
        let name = e["name"].as_str().unwrap();
        assert!(
            declared.iter().any(|d| d == name)
                || other_env.contains(&name)
                || name.starts_with("OTEL_"),
            "env {name} is set in the manifest but the binary does not read it (reads {declared:?})"
        );
    }
    for n in needed {
        assert!(
            env.iter().any(|e| e["name"] == *n),
            "the manifest does not set {n}"
        );
    }
}
