//! The subsetter's container in every rendering of deploy/ (base, the small and large
//! overlays, the Helm chart with its default, small and large values) runs a command line the
//! subsetter's own parser accepts; the chart and the overlay of each size run the same one;
//! and the chart has a value for every flag that reaches the command line.

#[path = "../../crds/tests/support/chart_args.rs"]
mod chart_args;
// Only `check` is used here.
#[allow(dead_code)]
#[path = "../../crds/tests/support/manifest_check.rs"]
mod manifest_check;
#[path = "../../crds/tests/support/render.rs"]
mod render;

use subsetter::cli::{Args, OTHER_ENV};

const BIN: &str = "subsetter";
const KIND: &str = "Deployment";

#[test]
fn every_rendering_runs_args_and_env_the_subsetter_accepts() {
    for (what, docs) in render::all_renderings() {
        let c = render::first_container(render::find(&docs, KIND, BIN));
        assert_eq!(c["name"], BIN, "{what}");
        manifest_check::check::<Args>(BIN, c, OTHER_ENV, &["POD_NAME", "POD_NAMESPACE"]);
    }
}

#[test]
fn the_chart_and_the_overlay_of_each_size_run_the_same_command_line() {
    let r = render::all_renderings();
    let parsed = |i: usize| {
        let c = render::first_container(render::find(&r[i].1, KIND, BIN));
        chart_args::parsed::<Args>(BIN, c)
    };
    // all_renderings: base, small, large, then the chart with default, small, large values.
    for i in 0..3 {
        assert_eq!(parsed(i), parsed(i + 3), "{} vs {}", r[i].0, r[i + 3].0);
    }
    assert_ne!(
        parsed(0),
        parsed(1),
        "the small overlay changes the subsetter"
    );
    assert_ne!(
        parsed(0),
        parsed(2),
        "the large overlay changes the subsetter"
    );
}

#[test]
fn the_chart_has_a_value_for_every_subsetter_flag() {
    let keys = chart_args::values_cover_every_flag::<Args>(BIN, KIND);
    for k in [
        "writeQps",
        "writeBurst",
        "endpointSlices",
        "settingsConfigMap",
    ] {
        assert!(keys.contains(&k.to_string()), "{k} in {keys:?}");
    }
}

#[test]
fn every_rendering_probes_readiness_on_the_admin_port() {
    for (what, docs) in render::all_renderings() {
        let c = render::first_container(render::find(&docs, KIND, BIN));
        let get = &c["readinessProbe"]["httpGet"];
        assert_eq!(get["path"], "/readyz", "{what}");
        assert_eq!(get["port"], "admin", "{what}");
    }
}
