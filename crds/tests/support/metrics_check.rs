//! Shared by the activator's and the subsetter's `tests/observability.rs` (included by path):
//! the Grafana dashboard, the Prometheus rules and the docs name only metrics the code
//! registers, and docs/metrics.md describes each registered metric with its type and labels.
//!
//! Names are checked the way Prometheus stores them after scraping the OpenMetrics text that
//! `prometheus-client` writes: a counter family `x` is the series `x_total`; a histogram `x` is
//! `x_bucket`, `x_sum` and `x_count`; a gauge `x` is `x`. So `rate(activator_requests[5m])`
//! (the family name of a counter) is refused, `rate(activator_requests_total[5m])` accepted.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The project's metric name prefixes (one per binary's registry).
pub const PREFIXES: [&str; 2] = ["activator_", "subsetter_"];

/// Series from outside the project the dashboard and the rules may use: Prometheus' own `up`,
/// and kube-state-metrics for the DaemonSet and the subsetter Deployment.
pub const EXTERNAL: &[&str] = &[
    "up",
    "kube_daemonset_status_desired_number_scheduled",
    "kube_daemonset_status_number_available",
    "kube_daemonset_status_number_unavailable",
    "kube_deployment_status_replicas_available",
    "kube_pod_container_status_restarts_total",
];

/// A metric family of an exposition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Family {
    /// `counter`, `gauge`, `histogram`, ...
    pub kind: String,
    /// The label names its samples carry (a histogram's `le` left out).
    pub labels: BTreeSet<String>,
    /// Whether the exposition had a sample of it (a labelled family has none until used).
    pub sampled: bool,
}

/// The families of a text exposition (`# TYPE` lines and the samples after them).
pub fn families(exposition: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                panic!("bad TYPE line: {line}");
            };
            out.insert(
                name.to_owned(),
                Family {
                    kind: kind.to_owned(),
                    ..Family::default()
                },
            );
            current = Some(name.to_owned());
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let sample = &line[..name_end];
        let family = current
            .as_ref()
            .filter(|f| sample.starts_with(f.as_str()))
            .unwrap_or_else(|| panic!("sample {sample} outside its family's TYPE"));
        let f = out.get_mut(family).unwrap();
        f.sampled = true;
        if line[name_end..].starts_with('{') {
            for l in label_names(&line[name_end..]) {
                if !(f.kind == "histogram" && l == "le") {
                    f.labels.insert(l);
                }
            }
        }
    }
    out
}

/// The label names of `{a="x",b="y\"z"} 1`.
fn label_names(s: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = s.chars().skip(1).peekable();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let name = name.trim().trim_start_matches(',').trim();
        if name.is_empty() || name.starts_with('}') {
            break;
        }
        names.push(name.to_owned());
        assert_eq!(chars.next(), Some('"'), "label value of {name} in {s}");
        let mut escaped = false;
        for c in chars.by_ref() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => break,
                _ => {}
            }
        }
        match chars.next() {
            Some(',') => {}
            _ => break,
        }
    }
    names
}

/// The series names Prometheus stores for a family.
pub fn series(name: &str, f: &Family) -> Vec<String> {
    match f.kind.as_str() {
        "counter" => vec![format!("{name}_total")],
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{name}{s}"))
            .collect(),
        "summary" => vec![
            name.to_owned(),
            format!("{name}_sum"),
            format!("{name}_count"),
        ],
        "info" => vec![format!("{name}_info")],
        _ => vec![name.to_owned()],
    }
}

/// The name the docs list a family under: the series for counters and gauges, the family
/// name for a histogram (its `_bucket`, `_sum` and `_count` are implied).
pub fn doc_name(name: &str, f: &Family) -> String {
    match f.kind.as_str() {
        "histogram" | "summary" => name.to_owned(),
        _ => series(name, f).remove(0),
    }
}

/// Every name a query or a doc may use for these families.
pub fn known_names(fams: &BTreeMap<String, Family>) -> BTreeSet<String> {
    fams.iter()
        .flat_map(|(n, f)| {
            let mut v = series(n, f);
            v.push(doc_name(n, f));
            v
        })
        .collect()
}

/// PromQL keywords and aggregation operators that are not followed by `(` directly.
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects: identifiers outside label matchers
/// (`{...}`), ranges (`[...]`), strings and grouping lists (`by (...)`), that are neither
/// functions (followed by `(`) nor keywords; Grafana's `$variables` are skipped. An
/// unbalanced bracket or quote is an error.
pub fn promql_names(expr: &str) -> Result<Vec<String>, String> {
    let c: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut parens = 0i32;
    let mut i = 0;
    let ident_start = |ch: char| ch.is_ascii_alphabetic() || ch == '_' || ch == ':';
    let ident_char = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    // The index after the closing `close` of the group opened at `i`, strings skipped.
    let skip_group = |mut i: usize, open: char, close: char| -> Result<usize, String> {
        let mut depth = 0;
        while i < c.len() {
            match c[i] {
                '"' | '\'' | '`' => i = skip_string(&c, i)?,
                ch if ch == open => depth += 1,
                ch if ch == close => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(i + 1);
                    }
                }
                _ => {}
            }
            i += 1;
        }
        Err(format!("unclosed {open} in {expr}"))
    };
    while i < c.len() {
        let ch = c[i];
        match ch {
            '"' | '\'' | '`' => i = skip_string(&c, i)? + 1,
            '{' => i = skip_group(i, '{', '}')?,
            '[' => i = skip_group(i, '[', ']')?,
            '}' | ']' => return Err(format!("unopened {ch} in {expr}")),
            '(' => {
                parens += 1;
                i += 1;
            }
            ')' => {
                parens -= 1;
                if parens < 0 {
                    return Err(format!("unopened ) in {expr}"));
                }
                i += 1;
            }
            '$' => {
                // $var, ${var}, $__rate_interval
                i += 1;
                if i < c.len() && c[i] == '{' {
                    i = skip_group(i, '{', '}')?;
                } else {
                    while i < c.len() && ident_char(c[i]) {
                        i += 1;
                    }
                }
            }
            ch if ch.is_ascii_digit()
                || (ch == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                // 0.99, 1e3, 5m (a duration after offset), 0x1f
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                    i += 1;
                }
            }
            ch if ident_start(ch) => {
                let start = i;
                while i < c.len() && ident_char(c[i]) {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                let mut j = i;
                while j < c.len() && c[j].is_whitespace() {
                    j += 1;
                }
                let lower = word.to_ascii_lowercase();
                if matches!(
                    lower.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    // A list of label names, not metrics.
                    if c.get(j) == Some(&'(') {
                        i = skip_group(j, '(', ')')?;
                    }
                } else if c.get(j) == Some(&'(') || KEYWORDS.contains(&lower.as_str()) {
                    // A function, or an operator.
                } else {
                    names.push(word);
                }
            }
            _ => i += 1,
        }
    }
    if parens != 0 {
        return Err(format!("unbalanced parentheses in {expr}"));
    }
    Ok(names)
}

/// The index of the quote closing the string that opens at `i`.
fn skip_string(c: &[char], i: usize) -> Result<usize, String> {
    let q = c[i];
    let mut j = i + 1;
    while j < c.len() {
        match c[j] {
            '\\' if q != '`' => j += 1,
            ch if ch == q => return Ok(j),
            _ => {}
        }
        j += 1;
    }
    Err(format!(
        "unclosed string in {}",
        c.iter().collect::<String>()
    ))
}

/// Where a query or name came from, and the query or name.
pub type Found = (String, String);

/// The problems with the names `queries` use, for the families of the binary whose names
/// start with `prefix`: a name of this binary that it does not register (or a counter named
/// without `_total`), or a name of no project binary that is neither in [`EXTERNAL`] nor a
/// recording rule's. Names of the other binary are left to its own test.
pub fn check_queries(
    queries: &[Found],
    fams: &BTreeMap<String, Family>,
    prefix: &str,
    recorded: &BTreeSet<String>,
) -> Vec<String> {
    let known: BTreeSet<String> = fams.iter().flat_map(|(n, f)| series(n, f)).collect();
    let mut problems = Vec::new();
    for (at, q) in queries {
        let names = match promql_names(q) {
            Ok(n) => n,
            Err(e) => {
                problems.push(format!("{at}: {e}"));
                continue;
            }
        };
        for n in names {
            let ok = if n.starts_with(prefix) {
                known.contains(&n)
            } else if PREFIXES.iter().any(|p| n.starts_with(p)) {
                true
            } else {
                EXTERNAL.contains(&n.as_str()) || recorded.contains(&n)
            };
            if !ok {
                problems.push(format!("{at}: {n} is not a registered metric ({q})"));
            }
        }
    }
    problems
}

/// The `activator_...`/`subsetter_...` words of a text (docs), with their line numbers.
pub fn words_with_prefix(text: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(pos) = rest.find(prefix) {
            let before = rest[..pos].chars().next_back();
            let tail = &rest[pos..];
            let end = tail
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                .unwrap_or(tail.len());
            let word = &tail[..end];
            let glued = before.is_some_and(|b| b.is_ascii_alphanumeric() || b == '_');
            if !glued && word.len() > prefix.len() {
                out.push((no + 1, word.to_owned()));
            }
            rest = &tail[end.max(1)..];
        }
    }
    out
}

/// The problems with a doc's metric names: every word with `prefix` must name a registered
/// series, or a histogram by its family name.
pub fn check_doc_names(
    doc: &str,
    text: &str,
    fams: &BTreeMap<String, Family>,
    prefix: &str,
) -> Vec<String> {
    let known = known_names(fams);
    words_with_prefix(text, prefix)
        .into_iter()
        .filter(|(_, w)| !known.contains(w))
        .map(|(line, w)| format!("{doc}:{line}: {w} is not a registered metric"))
        .collect()
}

/// The rows of a metrics reference table: `| \`name\` | type | labels | meaning |`, keyed by
/// name, with the type and the label names (backticked words of the labels cell).
pub fn reference_rows(text: &str, prefix: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut rows = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "", name, type, labels, meaning, ""
        if cells.len() < 6 || !cells[0].is_empty() {
            continue;
        }
        let Some(name) = cells[1]
            .strip_prefix('`')
            .and_then(|s| s.strip_suffix('`'))
            .filter(|n| n.starts_with(prefix))
        else {
            continue;
        };
        let labels = cells[3]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        rows.insert(name.to_owned(), (cells[2].to_owned(), labels));
    }
    rows
}

/// The problems of a metrics reference against the families: each family listed once under
/// its [`doc_name`], with its type and exactly its labels; no row for a metric that does not
/// exist. Every family must have been sampled, so its labels are known.
pub fn check_reference(text: &str, fams: &BTreeMap<String, Family>, prefix: &str) -> Vec<String> {
    let rows = reference_rows(text, prefix);
    let mut problems = Vec::new();
    let mut listed = BTreeSet::new();
    for (name, f) in fams {
        let doc = doc_name(name, f);
        listed.insert(doc.clone());
        if !f.sampled {
            problems.push(format!(
                "{name} has no sample in the test's exposition: use it in the test so its labels are checked"
            ));
        }
        match rows.get(&doc) {
            None => problems.push(format!("{doc} ({}) has no row", f.kind)),
            Some((kind, labels)) => {
                if *kind != f.kind {
                    problems.push(format!(
                        "{doc}: the row says {kind}, the code registers a {}",
                        f.kind
                    ));
                }
                if *labels != f.labels {
                    problems.push(format!(
                        "{doc}: the row lists labels {labels:?}, the samples carry {:?}",
                        f.labels
                    ));
                }
            }
        }
    }
    for name in rows.keys() {
        if !listed.contains(name) {
            problems.push(format!(
                "{name} has a row but is not registered under that name"
            ));
        }
    }
    problems
}

/// The PromQL of the Grafana dashboard: every panel's targets (rows' panels too) and the
/// template variables' queries (`label_values(<query>, <label>)` gives its query).
pub fn dashboard_queries(dashboard: &Value) -> Vec<Found> {
    fn panels(list: &Value, out: &mut Vec<Found>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?");
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((format!("panel {title:?}"), e.to_owned()));
                }
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or("");
        let q = match q
            .strip_prefix("label_values(")
            .and_then(|s| s.strip_suffix(')'))
        {
            Some(args) => args.rsplit_once(',').map_or(args, |(q, _)| q).to_owned(),
            None => q.to_owned(),
        };
        if !q.is_empty() {
            out.push((format!("variable {}", v["name"]), q));
        }
    }
    out
}

/// The PromQL of a PrometheusRule (or a plain rules file: `groups` at the top), and the
/// names its recording rules define.
pub fn rule_queries(rules: &Value) -> (Vec<Found>, BTreeSet<String>) {
    let groups = if rules["spec"]["groups"].is_array() {
        &rules["spec"]["groups"]
    } else {
        &rules["groups"]
    };
    let mut out = Vec::new();
    let mut recorded = BTreeSet::new();
    for g in groups.as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?");
            if let Some(rec) = r["record"].as_str() {
                recorded.insert(rec.to_owned());
            }
            out.push((
                format!("rule {name}"),
                r["expr"].as_str().unwrap_or("").to_owned(),
            ));
        }
    }
    (out, recorded)
}

/// A file of the workspace, by its path from the workspace root.
pub fn read(rel: &str) -> String {
    let path = format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The dashboard, the rules and the docs checked against the families of the binary whose
/// metric names start with `prefix`; every problem found, none when all is well.
pub fn check_all(fams: &BTreeMap<String, Family>, prefix: &str) -> Vec<String> {
    let dashboard: Value =
        serde_json::from_str(&read("deploy/observability/grafana-dashboard.json")).unwrap();
    let rules: Value =
        serde_saphyr::from_str(&read("deploy/observability/prometheus-rules.yaml")).unwrap();
    let (mut queries, recorded) = rule_queries(&rules);
    queries.extend(dashboard_queries(&dashboard));
    assert!(queries.len() > 10, "too few queries found: {queries:?}");
    let mut problems = check_queries(&queries, fams, prefix, &recorded);
    let reference = read("docs/metrics.md");
    problems.extend(check_reference(&reference, fams, prefix));
    for doc in [
        "docs/metrics.md",
        "docs/operations.md",
        "docs/observability.md",
        "docs/configuration.md",
        "docs/installation.md",
        "docs/comparison.md",
        "docs/activator.md",
        "docs/subsetter.md",
        "docs/benchmarks.md",
    ] {
        problems.extend(check_doc_names(doc, &read(doc), fams, prefix));
    }
    // Every PromQL example in the docs too (```promql blocks).
    for doc in ["docs/metrics.md", "docs/operations.md"] {
        let text = read(doc);
        let blocks: Vec<Found> = text
            .split("```promql")
            .skip(1)
            .filter_map(|b| b.split("```").next())
            .flat_map(|b| {
                b.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
            })
            .map(|l| (doc.to_owned(), l.to_owned()))
            .collect();
        problems.extend(check_queries(&blocks, fams, prefix, &recorded));
    }
    problems
}
