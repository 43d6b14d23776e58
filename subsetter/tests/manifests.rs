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
