//! The activator's container in every rendering of deploy/ (base, the small and large
//! overlays, the Helm chart with its default, small and large values) runs a command line the
//! activator's own parser accepts; the chart and the overlay of each size run the same one;
//! the chart has a value for every flag that reaches the command line; and each rendering's
//! grace period covers the drain its command line asks for.

#[path = "../../crds/tests/support/chart_args.rs"]
mod chart_args;
// Only `check` is used here.
#[allow(dead_code)]
#[path = "../../crds/tests/support/manifest_check.rs"]
mod manifest_check;
#[path = "../../crds/tests/support/render.rs"]
mod render;

use activator::cli::{Args, OTHER_ENV};
use clap::Parser;

const BIN: &str = "activator";
const KIND: &str = "DaemonSet";

#[test]
fn every_rendering_runs_args_and_env_the_activator_accepts() {
    for (what, docs) in render::all_renderings() {
        let c = render::first_container(render::find(&docs, KIND, BIN));
        assert_eq!(c["name"], BIN, "{what}");
        manifest_check::check::<Args>(
            BIN,
            c,
            OTHER_ENV,
            &["NODE_NAME", "POD_NAME", "POD_NAMESPACE", "POD_IP"],
        );
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
        "the small overlay changes the activator"
    );
}

#[test]
fn the_chart_has_a_value_for_every_activator_flag() {
    let keys = chart_args::values_cover_every_flag::<Args>(BIN, KIND);
    assert!(keys.contains(&"ioThreads".to_string()), "{keys:?}");
}

#[test]
fn every_renderings_grace_period_covers_its_drain() {
    for (what, docs) in render::all_renderings() {
        let ds = render::find(&docs, KIND, BIN);
        let c = render::first_container(ds);
        let mut argv = vec![BIN.to_string(), "--node-name=n".to_string()];
        argv.extend(
            c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a.as_str().unwrap().to_string()),
        );
        let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{what}: {e}"));
        let (delay, drain) = (args.shutdown_delay, args.config().drain_timeout);
        let grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no terminationGracePeriodSeconds"));
        // SIGTERM serves on for the shutdown delay, drains for at most the drain timeout,
        // then flushes traces (5 s).
        assert!(
            grace > delay.as_secs() + drain.as_secs() + 5,
            "{what}: terminationGracePeriodSeconds {grace} does not cover --shutdown-delay \
             {delay:?} + --drain-timeout {drain:?}"
        );
    }
}
