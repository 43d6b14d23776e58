//! The deploy manifests match the binary: every arg of the subsetter's container parses with its
//! own command line, and every env var it sets is one the binary reads.

use clap::CommandFactory;
use clap::Parser;
use serde_json::Value;

fn container() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/base/subsetter.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap();
    let workload = docs
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the workload");
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "subsetter")
        .expect("the container")
        .clone()
}

#[test]
fn the_manifest_args_and_env_are_the_binarys() {
    let c = container();
    let args: Vec<String> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    // The downward API fills these at run time; give them values so that required flags
    // that fall back to env parse.
    let mut argv = vec!["subsetter".to_string()];
    argv.extend(args.clone());
    let declared: Vec<String> = subsetter::cli::Args::command()
        .get_arguments()
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    let mut with_required = argv.clone();
    for a in subsetter::cli::Args::command().get_arguments() {
        let given = args
            .iter()
            .any(|x| x.starts_with(&format!("--{}", a.get_id())));
        if let Some(long) = a.get_long().filter(|_| a.is_required_set() && !given) {
            with_required.push(format!("--{long}=x"));
        }
    }
    if let Err(e) = subsetter::cli::Args::try_parse_from(&with_required) {
        panic!("the manifest's args {args:?} do not parse: {e}");
    }
    for env in c["env"].as_array().into_iter().flatten() {
        let name = env["name"].as_str().unwrap();
        assert!(
            declared.iter().any(|d| d == name)
                || subsetter::cli::OTHER_ENV.contains(&name)
                || name.starts_with("OTEL_"),
            "env {name} is set in the manifest but the binary does not read it (reads {declared:?})"
        );
    }
    // And the manifest sets what the binary needs from the downward API.
    for needed in ["POD_NAME", "POD_NAMESPACE"] {
        assert!(
            c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["name"] == *needed),
            "the manifest does not set {needed}"
        );
    }
}
