//! The deploy manifests match the binary: every arg of the subsetter's container parses with
//! its own command line, and every env var it sets is one the binary reads.

#[path = "../../crds/tests/support/manifest_check.rs"]
mod manifest_check;

#[test]
fn the_manifest_args_and_env_are_the_binarys() {
    let c = manifest_check::container("base/subsetter.yaml", "Deployment", "subsetter");
    manifest_check::check::<subsetter::cli::Args>(
        "subsetter",
        &c,
        subsetter::cli::OTHER_ENV,
        &["POD_NAME", "POD_NAMESPACE"],
    );
}

/// Both replicas are probed for readiness (`/readyz`: their caches have synced, so a replica
/// that cannot reach the API server is not Ready) and liveness on the admin port.
#[test]
fn the_deployment_probes_readiness_and_liveness_on_the_admin_port() {
    let c = manifest_check::container("base/subsetter.yaml", "Deployment", "subsetter");
    for (kind, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[kind]["httpGet"];
        assert_eq!(get["path"], path, "{kind}: {c}");
        assert_eq!(get["port"], "admin", "{kind}");
    }
}
