//! The Grafana dashboard, the Prometheus rules and the docs name only metrics the subsetter
//! registers (or the activator's, checked by its own test), and docs/metrics.md lists every
//! one of them with its type and labels. The exposition is what `/metrics` serves
//! (`Metrics::encode`). The checker's own tests are in activator/tests/observability.rs.

#[path = "../../crds/tests/support/metrics_check.rs"]
mod metrics_check;

use metrics_check::{check_all, families};
use subsetter::metrics::{Metrics, ReplacedBy};

#[test]
fn the_dashboard_the_rules_and_the_docs_name_only_the_subsetters_metrics() {
    let m = Metrics::default();
    // The labelled family used once, so its labels show.
    m.members_replaced
        .get_or_create(&ReplacedBy { reason: "lost" })
        .inc();
    m.reconcile_seconds.observe(0.01);
    let fams = families(&m.encode());
    assert!(fams.len() >= 15, "{fams:?}");
    let problems = check_all(&fams, "subsetter_");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
