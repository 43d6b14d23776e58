//! The deploy manifests match the binary: every arg of the activator's container parses with
//! its own command line, every env var it sets is one the binary reads, and its probes and
//! grace period fit the admin port and the drain.

#[path = "../../crds/tests/support/manifest_check.rs"]
mod manifest_check;

use manifest_check::{check, workload};
use serde_json::Value;

const FILE: &str = "base/activator-daemonset.yaml";

fn container() -> Value {
    manifest_check::container(FILE, "DaemonSet", "activator")
}

#[test]
fn the_manifest_args_and_env_are_the_binarys() {
    check::<activator::cli::Args>(
        "activator",
        &container(),
        activator::cli::OTHER_ENV,
        &["NODE_NAME", "POD_NAME", "POD_NAMESPACE", "POD_IP"],
    );
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
    assert_eq!(
        probe("readinessProbe")["path"],
        activator::ops::admin::READYZ
    );
    assert_eq!(
        probe("livenessProbe")["path"],
        activator::ops::admin::HEALTHZ
    );
    for kind in ["readinessProbe", "livenessProbe"] {
        assert_eq!(probe(kind)["port"], "admin", "{kind}");
    }
    // SIGTERM drains for at most drain_timeout; the kubelet must not kill it sooner.
    let ds = workload(FILE, "DaemonSet");
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
