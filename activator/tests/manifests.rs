//! The deploy manifests match the binary: every arg of the activator's container parses with its
//! own command line, and every env var it sets is one the binary reads.

use clap::CommandFactory;
use clap::Parser;
use serde_json::Value;

fn container() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/activator-daemonset.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap();
    let workload = docs
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the workload");
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "activator")
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
    let mut argv = vec!["activator".to_string()];
    argv.extend(args.clone());
    let declared: Vec<String> = activator::cli::Args::command()
        .get_arguments()
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    let mut with_required = argv.clone();
    for a in activator::cli::Args::command().get_arguments() {
        let given = args
            .iter()
            .any(|x| x.starts_with(&format!("--{}", a.get_id())));
        if let Some(long) = a.get_long().filter(|_| a.is_required_set() && !given) {
            with_required.push(format!("--{long}=x"));
        }
    }
    if let Err(e) = activator::cli::Args::try_parse_from(&with_required) {
        panic!("the manifest's args {args:?} do not parse: {e}");
    }
    for env in c["env"].as_array().into_iter().flatten() {
        let name = env["name"].as_str().unwrap();
        assert!(
            declared.iter().any(|d| d == name)
                || activator::cli::OTHER_ENV.contains(&name)
                || name.starts_with("OTEL_"),
            "env {name} is set in the manifest but the binary does not read it (reads {declared:?})"
        );
    }
    // And the manifest sets what the binary needs from the downward API.
    for needed in ["NODE_NAME", "POD_NAME", "POD_NAMESPACE", "POD_IP"] {
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

#[test]
fn probes_hit_the_admin_ports_paths_and_the_grace_period_covers_the_drain() {
    let c = container();
    let admin_port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "admin")
        .expect("an admin port")["containerPort"]
        .as_u64()
        .unwrap();
    assert_eq!(admin_port, u64::from(crds::contract::ADMIN_PORT));
    let probe = |kind: &str| c[kind]["httpGet"].clone();
    assert_eq!(probe("readinessProbe")["path"], activator::admin::READYZ);
    assert_eq!(probe("livenessProbe")["path"], activator::admin::HEALTHZ);
    for kind in ["readinessProbe", "livenessProbe"] {
        assert_eq!(probe(kind)["port"], "admin", "{kind}");
    }
    // SIGTERM drains for at most drain_timeout; the kubelet must not kill it sooner.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/activator-daemonset.yaml"
    );
    let docs: Vec<Value> =
        serde_saphyr::from_str_multiple(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let cfg = activator::ActivatorConfig::new(
        "n",
        "127.0.0.1:8080".parse().unwrap(),
        "127.0.0.1:9090".parse().unwrap(),
    );
    assert!(
        grace > cfg.drain_timeout.as_secs() + 5,
        "terminationGracePeriodSeconds {grace} does not cover the drain ({:?})",
        cfg.drain_timeout
    );
}
