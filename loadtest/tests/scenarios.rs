//! Every scenario in a small configuration (seconds each), on the embedded kubesim: its
//! report has the documented keys with sane values, and its pictures are SVG.

use loadtest::scenario::{self, Ctx, Knobs, Report, Scenario};

fn small() -> Knobs {
    Knobs {
        nodes: Some(4),
        revisions: Some(3),
        activators: Some(2),
        start_delay_ms: Some(50),
        api_write_latency: Some("1ms".into()),
        ..Knobs::default()
    }
}

async fn run(scenario: Scenario, knobs: Knobs) -> (Report, serde_json::Value) {
    let report = scenario::run(scenario, &Ctx::new(knobs.or(small())))
        .await
        .unwrap_or_else(|e| panic!("{} failed: {e}", scenario.name()));
    assert!(!report.partial);
    assert!(report.target.contains("kubesim"), "{}", report.target);
    for (name, svg) in &report.plots {
        assert!(svg.starts_with("<svg"), "{name} is not SVG");
    }
    let dir = std::env::temp_dir().join(format!(
        "lt-test-{}-{}",
        scenario.name(),
        std::process::id()
    ));
    let written = report.write(None, None, Some(&dir)).unwrap();
    let json_path = dir.join(format!("{}.json", scenario.name()));
    assert!(written.contains(&json_path));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(json["scenario"], scenario.name());
    assert_eq!(json["plots"].as_array().unwrap().len(), report.plots.len());
    let _ = std::fs::remove_dir_all(&dir);
    (report, json["figures"].clone())
}

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_burst_wakes_every_revision_and_reports_each_phase() {
    let (_, f) = run(
        Scenario::ColdBurst,
        Knobs {
            clients: Some(12),
            ..Knobs::default()
        },
    )
    .await;
    assert_eq!(num(&f, "requests"), 24.0, "the burst and the same again");
    assert_eq!(num(&f, "errors"), 0.0, "{f}");
    assert!(
        num(&f, "cold_starts") >= 3.0,
        "one per revision at least: {f}"
    );
    let a = &f["burst"]["anatomy"];
    for seg in [
        "arrival_to_post_ms",
        "post_to_bound_ms",
        "bound_to_ready_ms",
        "ready_to_first_byte_ms",
        "total_ms",
    ] {
        assert!(a[seg]["p50"].as_f64().is_some(), "{seg} in {a}");
    }
    // The phases follow each other: the whole wait is at least the start delay.
    assert!(num(&a["total_ms"], "p50") >= 50.0, "{a}");
    assert!(num(&f["warm_again"]["warm_ms"], "count") >= 1.0, "{f}");
    // The floor: as many pods as the burst woke, each waiting for its node's start delay
    // too (a floor that stopped at "bound" would be faster than the start delay), and a ratio
    // that exists because neither side failed.
    let floor = &f["floor"];
    assert_eq!(num(floor, "pods"), num(&f, "pods"), "{floor}");
    // One pod per woken revision: 12 clients over the revisions, one primary each.
    assert_eq!(num(&f, "pods"), num(&f, "revisions_woken"), "{f}");
    assert_eq!(num(&f, "pods_per_woken_revision"), 1.0, "{f}");
    assert_eq!(floor["errors"].as_array().map(Vec::len), Some(0), "{floor}");
    assert!(num(&floor["ready_ms"], "p50") >= 50.0, "{floor}");
    assert!(
        num(&floor["first_byte_ms"], "p50") >= num(&floor["ready_ms"], "p50"),
        "{floor}"
    );
    for r in [&f["first_byte_over_floor"], &f["client_over_floor"]] {
        assert_eq!(r["valid"], true, "{r}");
        assert!(num(r, "p50") > 0.0, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_compares_the_activator_with_direct_in_one_run() {
    let (report, f) = run(
        Scenario::Steady,
        Knobs {
            rate: Some(100.0),
            duration_secs: Some(1.0),
            revisions: Some(1),
            ..Knobs::default()
        },
    )
    .await;
    assert_eq!(num(&f, "errors"), 0.0, "{}", report.text);
    let measured: Vec<&str> = ["direct", "nginx", "activator"]
        .into_iter()
        .filter(|t| f["targets"].get(*t).is_some())
        .collect();
    for target in &measured {
        let t = &f["targets"][target];
        assert_eq!(num(t, "sent"), 100.0, "{target}: {t}");
        // Every request is in the percentiles, and every one was answered.
        let l = &t["latency_ms"];
        assert_eq!(num(l, "count"), 100.0, "{target}: {l}");
        assert_eq!((num(l, "failed"), num(l, "incomplete")), (0.0, 0.0), "{l}");
    }
    // Each ratio is there, valid, with both sides' error counts (zero).
    for base in measured.iter().filter(|t| **t != "activator") {
        for key in [
            format!("activator_over_{base}"),
            format!("activator_over_{base}_from_send"),
        ] {
            let r = &f["ratios"][&key];
            assert_eq!(r["valid"], true, "{key}: {r}\n{}", report.text);
            assert_eq!(
                (num(r, "activator_errors"), num(r, "base_errors")),
                (0.0, 0.0)
            );
            assert!(
                num(r, "p50").is_finite() && num(r, "p99").is_finite(),
                "{r}"
            );
        }
    }
    // nginx is measured when installed, and said so when not.
    let nginx = f["nginx"].as_str().unwrap();
    assert!(
        nginx == "measured" || nginx.contains("not measured"),
        "{nginx}"
    );
    assert_eq!(f["targets"].get("nginx").is_some(), nginx == "measured");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_failure_counts_failed_requests_and_times_the_repair() {
    let (report, f) = run(
        Scenario::NodeFailure,
        Knobs {
            nodes: Some(5),
            revisions: Some(6),
            rate: Some(100.0),
            duration_secs: Some(4.0),
            node_grace_secs: Some(1.0),
            ..Knobs::default()
        },
    )
    .await;
    assert_eq!(f["killed"].as_array().unwrap().len(), 1);
    assert!(num(&f, "affected_revisions") >= 1.0, "{f}");
    assert_eq!(num(&f, "requests"), 400.0);
    assert_eq!(
        f["ingress"], "retry",
        "the default, so both models are reported"
    );
    // Every request is accounted for: each failed one left a sample, or was never sent.
    let failed = num(&f, "failed_requests");
    assert_eq!(
        failed,
        num(&f["samples"], "errors") + (400.0 - num(&f["samples"], "requests")),
        "{}",
        report.text
    );
    assert!(num(&f, "repaired_after_ms") > 0.0, "{}", report.text);
    let (none, retry) = (&f["by_ingress"]["none"], &f["by_ingress"]["retry"]);
    // What the scenario is for: once the subsets are repaired, nothing fails.
    assert_eq!(num(retry, "failed_after_repair"), 0.0, "{}", report.text);
    // A retry only ever saves a request, and with it only those in flight on the dead node
    // can be lost: a refused connection goes to another member.
    assert!(
        num(retry, "failed_requests") <= num(none, "failed_requests"),
        "{f}"
    );
    assert_eq!(
        num(retry, "failed_requests"),
        num(retry, "failed_in_flight_on_killed"),
        "{}",
        report.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxscale_never_sees_more_pods_than_max_scale() {
    let (report, f) = run(
        Scenario::Maxscale,
        Knobs {
            clients: Some(24),
            cycles: Some(2),
            max_scale: Some(2),
            app_delay_ms: Some(50),
            ..Knobs::default()
        },
    )
    .await;
    assert_eq!(num(&f, "errors"), 0.0, "{}", report.text);
    let most = num(&f, "max_pods_observed");
    assert!((1.0..=2.0).contains(&most), "{}", report.text);
    assert_eq!(num(&f, "max_scale"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_counts_member_changes_and_extra_cold_starts() {
    let (report, f) = run(
        Scenario::Churn,
        Knobs {
            rate: Some(50.0),
            duration_secs: Some(4.0),
            kill_nodes: Some(1),
            ..Knobs::default()
        },
    )
    .await;
    assert!(
        num(&f, "member_changes") >= 1.0,
        "a member left and was replaced: {}",
        report.text
    );
    assert!(f["extra_cold_starts"].as_u64().is_some());
    // A member leaving drains what it holds, and a request it refuses goes to another member
    // (ingress retry, the default): a move may cost at most what was in flight on it.
    assert_eq!(f["ingress"], "retry");
    assert!(
        num(&f, "failed_requests") <= num(&f, "in_flight_on_moved"),
        "{}",
        report.text
    );
    let (none, retry) = (&f["by_ingress"]["none"], &f["by_ingress"]["retry"]);
    assert!(
        num(retry, "failed_requests") <= num(none, "failed_requests"),
        "{f}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_revisions_go_to_zero_and_wake_cold_again() {
    let (report, f) = run(
        Scenario::Idle,
        Knobs {
            idle_timeout_secs: Some(1),
            cycles: Some(2),
            ..Knobs::default()
        },
    )
    .await;
    let cycles = f["cycles"].as_array().unwrap();
    assert_eq!(cycles.len(), 2, "{}", report.text);
    for c in cycles {
        assert_eq!(num(c, "cold"), 3.0, "every revision woke cold: {c}");
        assert_eq!(num(c, "errors"), 0.0, "{c}");
        assert!(
            num(c, "to_zero_ms") >= 1_000.0,
            "not before idleTimeoutSeconds: {c}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_samples_real_activators_against_every_node() {
    let (report, f) = run(
        Scenario::Scale,
        Knobs {
            nodes: Some(30),
            revisions: Some(200),
            sample_activators: Some(3),
            active_share: Some(0.05),
            rate: Some(50.0),
            duration_secs: Some(1.0),
            // The lost node turns NotReady in seconds, not kube-controller-manager's 40.
            node_grace_secs: Some(3.0),
            // The activator that leaves (its node Ready) is held this long for a replacement
            // that never comes, then repaired.
            replacement_hold_secs: Some(4.0),
            // 20 more at 40/s once the 200 are assigned: each created and seen with members.
            steady_creates: Some(20),
            steady_create_rate: Some(40.0),
            ..Knobs::default()
        },
    )
    .await;
    assert_eq!(num(&f, "assigned_revisions"), 200.0, "{}", report.text);
    let steady = &f["steady_creation"];
    assert_eq!(num(steady, "count"), 20.0, "{}", report.text);
    assert_eq!(num(steady, "failed"), 0.0, "{}", report.text);
    assert_eq!(num(steady, "unassigned"), 0.0, "{}", report.text);
    assert_eq!(
        num(&steady["assigned_ms"], "count"),
        20.0,
        "{}",
        report.text
    );
    assert!(steady["assigned_ms"]["max"].is_number(), "{}", report.text);
    // Paced: the 20 creates cannot have taken less than their schedule (19 intervals).
    assert!(num(steady, "took_s") >= 19.0 / 40.0, "{}", report.text);
    assert_eq!(num(&f, "sampled_activators"), 3.0);
    // An activator caches its own node's subsets, not the cluster's 200.
    let cached = &f["cached_per_activator"];
    assert!(num(cached, "subsets_mean") > 0.0, "{cached}");
    assert!(num(cached, "subsets_max") < 200.0, "{cached}");
    // May be 0: the active revisions were woken before the steady-state window. What it must
    // not be is a request to the API server per request served: the warm path never calls it.
    // Counted for the activators alone: the kubelets renew their leases at a quarter of the
    // 3 s grace here, which is most of the API's load.
    let steady = &f["api_requests_by_component"]["steady"];
    let activator: f64 = steady["activator"]
        .as_object()
        .map_or(0.0, |v| v.values().filter_map(|n| n.as_f64()).sum());
    assert!(
        activator < 50.0 / 2.0,
        "{activator} activator API requests for 50 warm requests: {}",
        report.text
    );
    assert!(steady["kubelet"].is_object(), "{}", report.text);
    let loss = &f["node_loss"];
    assert!(num(loss, "not_ready_ms") > 0.0, "{}", report.text);
    assert!(
        loss["repaired_after_not_ready_ms"].is_number(),
        "{}",
        report.text
    );
    assert!(
        num(&f["one_change"], "repaired_ms") > 0.0,
        "{}",
        report.text
    );
    assert_eq!(num(&f, "errors"), 0.0, "{}", report.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_stands_in_for_every_activator_and_rolls_them() {
    let (report, f) = run(
        Scenario::Scale,
        Knobs {
            nodes: Some(20),
            revisions: Some(100),
            sample_activators: Some(2),
            active_share: Some(0.05),
            rate: Some(20.0),
            duration_secs: Some(1.0),
            node_grace_secs: Some(3.0),
            stand_in_activators: Some(true),
            rollout_max_unavailable: Some(0.5),
            // Long enough for a wave's pods to be replaced on 20 simulated nodes; the
            // activator that leaves waits it out.
            replacement_hold_secs: Some(10.0),
            // A second directory replica, killed halfway through the creates: the stand-ins
            // that streamed from it resume on the subsetter's own.
            directory_replicas: Some(2),
            steady_creates: Some(10),
            steady_create_rate: Some(20.0),
            ..Knobs::default()
        },
    )
    .await;
    let kill = &f["replica_kill"];
    let streaming = num(kill, "streaming");
    assert_eq!(
        num(&kill["resumed_ms"], "count"),
        streaming,
        "{}",
        report.text
    );
    assert_eq!(num(&kill["resumed_ms"], "failed"), 0.0, "{}", report.text);
    assert_eq!(num(kill, "fallbacks"), 0.0, "{}", report.text);
    // Every steady revision's membership reached its members' stand-ins.
    let applied = &f["steady_creation"]["applied_ms"];
    assert!(num(applied, "count") >= 10.0, "{}", report.text);
    assert_eq!(num(applied, "failed"), 0.0, "{}", report.text);
    let s = &f["stand_ins"];
    assert_eq!(num(s, "nodes"), 20.0, "{}", report.text);
    // 100 revisions × 3 members over 20 nodes: each stand-in holds its node's subsets and has
    // read their Revisions ahead, as an activator would.
    assert!(num(s, "subsets_mean") > 0.0, "{}", report.text);
    assert!(num(s, "revisions_mean") > 0.0, "{}", report.text);
    // And exactly the subsets that list its node, rolled ones included.
    assert_eq!(num(s, "subsets_off"), 0.0, "{}", report.text);
    // 20 less the 2 sampled, the one that left and the one lost; half at a time.
    let r = &f["rollout"];
    assert_eq!(num(r, "activators"), 16.0, "{}", report.text);
    assert_eq!(num(r, "waves"), 2.0, "{}", report.text);
    // The rolled stand-ins' memberships came from the subsetter's directory, and their
    // watches from its version: no list, which on a real API server scans every subset.
    assert_eq!(num(r, "subset_lists"), 0.0, "{}", report.text);
    // Each stand-in's pod was deleted and a new one made Ready on its node, as a DaemonSet
    // does: the subsetter held each one for its replacement and wrote the new pod in place,
    // so no member moved.
    assert_eq!(r["pods_replaced"], true, "{}", report.text);
    assert_eq!(num(r, "replacement_holds"), 16.0, "{}", report.text);
    assert_eq!(num(r, "replacement_holds_expired"), 0.0, "{}", report.text);
    // Only the rebalancer may move members meanwhile (each move is two changes).
    let rebalanced = num(r, "members_rebalanced");
    assert_eq!(num(r, "members_left"), rebalanced, "{}", report.text);
    assert_eq!(
        num(r, "member_changes"),
        2.0 * rebalanced,
        "{}",
        report.text
    );
    assert!(num(r, "endpoints_events") > 0.0, "{}", report.text);
    assert_eq!(r["settled"], true, "{}", report.text);
    assert_eq!(num(&f, "errors"), 0.0, "{}", report.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_path_on_kubesim_measures_local_binding_and_says_what_it_cannot() {
    let (report, f) = run(
        Scenario::ControlPath,
        Knobs {
            cycles: Some(3),
            clients: Some(5),
            ..Knobs::default()
        },
    )
    .await;
    assert_eq!(num(&f["local_sequential_ms"], "count"), 3.0);
    assert_eq!(num(&f["local_burst_ms"], "count"), 5.0);
    assert!(f["deployment_sequential_ms"].is_null());
    assert!(report.text.contains("NOT measured"), "{}", report.text);
}

/// The warm hand-over and the Route, under load through every activator: nothing fails, the
/// host moves to v2 on every activator once v2's RoutesReady is True, the 10/90 split is
/// measured within ±7 points at 2,000 requests (the 95 % interval is about ±1.3), and the
/// rollback reaches every activator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_moves_the_host_warm_splits_it_and_rolls_it_back_without_a_failure() {
    let (report, f) = run(
        Scenario::Deploy,
        Knobs {
            clients: Some(4),
            before_secs: Some(1.0),
            after_secs: Some(1.0),
            settle_secs: Some(1.0),
            split_requests: Some(2000),
            hand_over_timeout_secs: Some(20),
            ..Knobs::default()
        },
    )
    .await;
    let text = &report.text;
    assert_eq!(num(&f, "failed"), 0.0, "{text}");
    let phases = f["phases"].as_array().unwrap();
    let names: Vec<&str> = phases
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["before", "deploy", "split", "rollback", "after"],
        "{text}"
    );
    for p in phases {
        assert!(num(p, "requests") > 0.0, "{p}\n{text}");
        assert_eq!(num(p, "failed"), 0.0, "{p}\n{text}");
        // The failures are counted beside the percentiles: none, so p99 is a number.
        assert!(p["latency_ms"]["p99"].is_number(), "{p}\n{text}");
    }
    let moves = f["moves"].as_array().unwrap();
    let of = |name: &str| moves.iter().find(|m| m["name"] == name).unwrap();
    let deploy = of("deploy");
    assert_eq!(
        deploy["decision_seen"], true,
        "RoutesReady=True on v2\n{text}"
    );
    assert_eq!(deploy["moved_everywhere"], true, "{text}");
    let activators = num(&f, "activators");
    assert_eq!(
        deploy["per_activator"].as_array().unwrap().len() as f64,
        activators
    );
    let split = &f["split"];
    assert_eq!(split["followed_everywhere"], true, "{text}");
    assert!(num(split, "requests") >= 2000.0, "{text}");
    assert_eq!(num(split, "failed"), 0.0, "{text}");
    for share in split["shares"].as_array().unwrap() {
        let off = num(share, "off_by_points");
        assert!(off.abs() <= 7.0, "{share}\n{text}");
    }
    let rollback = of("rollback");
    assert_eq!(rollback["moved_everywhere"], true, "{text}");
    for a in rollback["per_activator"].as_array().unwrap() {
        assert!(a["moved_ms"].is_number(), "{a}\n{text}");
    }
    // v1 alone before the deploy and after the rollback.
    for i in [0, 4] {
        let by = &phases[i]["answered_by"];
        assert!(by["v2"].is_null() && num(by, "v1") > 0.0, "{by}\n{text}");
    }
}
