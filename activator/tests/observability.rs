//! The Grafana dashboard, the Prometheus rules and the docs name only metrics the activator
//! registers (or the subsetter's, checked by its own test), and docs/metrics.md lists every
//! one of them with its type and labels. The exposition is the one `/metrics` serves: the
//! registry `Activator::start` gives the admin port, encoded the same way.

#[path = "../../crds/tests/support/metrics_check.rs"]
mod metrics_check;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use activator::ops::metrics::{Metrics, Outcome, Phase, PodReason, Route};
use metrics_check::{Family, check_all, check_queries, check_reference, families, promql_names};

/// The activator's exposition with every labelled family used once, so its labels show.
fn exposition() -> String {
    let m = Arc::new(Metrics::default());
    m.requests
        .get_or_create(&Outcome {
            route: Route::Warm,
            code: 200,
        })
        .inc();
    m.observe_phase(Phase::PodReadySeen, Duration::from_millis(3));
    m.pod_created(PodReason::Cold);
    m.pod_deleted(PodReason::Idle);
    m.api_requests
        .get_or_create(&activator::ops::api_count::ApiRequest {
            verb: "create".into(),
            resource: "pods".into(),
            from: "etcd",
        })
        .inc();
    m.observe_ready_lead(None);
    m.prepull
        .failed(activator::ops::metrics::PullFailReason::NotFound);
    m.pod_address
        .get_or_create(&activator::ops::metrics::AddressFrom {
            source: activator::ops::metrics::AddressSource::Agent,
        })
        .inc();
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &m.registry()).unwrap();
    out
}

#[test]
fn the_dashboard_the_rules_and_the_docs_name_only_the_activators_metrics() {
    let fams = families(&exposition());
    assert!(fams.len() >= 10, "{fams:?}");
    let problems = check_all(&fams, "activator_");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn fams() -> BTreeMap<String, Family> {
    families(
        "# HELP activator_requests Requests.\n\
         # TYPE activator_requests counter\n\
         activator_requests_total{route=\"warm\",code=\"200\"} 1\n\
         # TYPE activator_cold_start_phase_seconds histogram\n\
         activator_cold_start_phase_seconds_sum{phase=\"first_byte\"} 0.1\n\
         activator_cold_start_phase_seconds_count{phase=\"first_byte\"} 1\n\
         activator_cold_start_phase_seconds_bucket{le=\"0.5\",phase=\"first_byte\"} 1\n\
         # TYPE activator_queued_requests gauge\n\
         activator_queued_requests 0\n\
         # EOF\n",
    )
}

fn problems(q: &str) -> Vec<String> {
    check_queries(
        &[("test".into(), q.into())],
        &fams(),
        "activator_",
        &BTreeSet::from(["activator:cold_start:p99".to_owned()]),
    )
}

#[test]
fn the_exposition_parser_reads_types_and_label_names() {
    let f = fams();
    assert_eq!(f["activator_requests"].kind, "counter");
    assert_eq!(
        f["activator_requests"].labels,
        BTreeSet::from(["code".to_owned(), "route".to_owned()])
    );
    // `le` is the histogram's own.
    assert_eq!(
        f["activator_cold_start_phase_seconds"].labels,
        BTreeSet::from(["phase".to_owned()])
    );
    assert!(f["activator_queued_requests"].labels.is_empty());
}

#[test]
fn the_checker_accepts_the_series_prometheus_stores() {
    for q in [
        "sum(rate(activator_requests_total{route=\"refused\",code=~\"5..\"}[$__rate_interval]))",
        "histogram_quantile(0.99, sum by (le, phase) (rate(activator_cold_start_phase_seconds_bucket[5m])))",
        "rate(activator_cold_start_phase_seconds_sum[5m]) / rate(activator_cold_start_phase_seconds_count[5m])",
        "max without (pod) (activator_queued_requests) > bool 10 and on (instance) up == 1",
        "sum by (pod) (activator_queued_requests{pod=~\"$pod\"}) offset 5m",
        "activator:cold_start:p99 > 2",
        "subsetter_anything_the_other_test_checks",
    ] {
        assert_eq!(problems(q), Vec::<String>::new(), "{q}");
    }
}

#[test]
fn the_checker_refuses_wrong_names_and_bad_syntax() {
    // A counter by its family name: Prometheus stores only activator_requests_total.
    assert_eq!(problems("rate(activator_requests[5m])").len(), 1);
    // A histogram has no series of its bare name.
    assert_eq!(problems("activator_cold_start_phase_seconds > 1").len(), 1);
    // A typo, with and without the prefix.
    assert_eq!(problems("sum(activator_queue_requests)").len(), 1);
    assert_eq!(problems("sum(activatr_queued_requests)").len(), 1);
    // Unbalanced.
    assert_eq!(problems("sum(rate(activator_requests_total[5m])").len(), 1);
    assert_eq!(problems("activator_requests_total{code=\"5").len(), 1);
}

#[test]
fn the_tokenizer_skips_functions_labels_and_grouping() {
    assert_eq!(
        promql_names(
            "histogram_quantile(0.9, sum without(pod) (rate(a_bucket{x=\"b c\"}[1m]))) / on(le) group_left(z) b"
        )
        .unwrap(),
        ["a_bucket", "b"]
    );
}

#[test]
fn the_reference_check_wants_each_metric_with_its_type_and_labels() {
    let good = "\
| metric | type | labels | meaning |
|---|---|---|---|
| `activator_requests_total` | counter | `route`, `code` | r |
| `activator_cold_start_phase_seconds` | histogram | `phase` | c |
| `activator_queued_requests` | gauge | | q |
";
    assert_eq!(
        check_reference(good, &fams(), "activator_"),
        Vec::<String>::new()
    );
    let bad = "\
| `activator_requests` | counter | `route` | r |
| `activator_cold_start_phase_seconds` | gauge | `phase` | c |
| `activator_queued_requests` | gauge | | q |
| `activator_gone_total` | counter | | g |
";
    let p = check_reference(bad, &fams(), "activator_");
    // requests_total missing, requests not a series, the wrong type, a row for nothing.
    assert_eq!(p.len(), 4, "{p:#?}");
}
