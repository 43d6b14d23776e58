//! `loadtest object-cost`: what one object of a kind costs a real API server and its etcd
//! (docs/revision-cost.md). Three kinds, each in a namespace of its own, created in bulk and
//! in alternating batches in one run:
//!
//! - `revision`: a Revision with minScale 0 (no pod is ever started for it) and what the
//!   subsetter writes for it: its ActivationEndpoints with status, and the Revision's status;
//! - `app`: a Deployment with replicas 0 and a Service selecting its pods, what any
//!   Kubernetes app pays, and what the controllers write for them (the ReplicaSet, the
//!   Endpoints, the EndpointSlice, their statuses);
//! - `configmap`: a bare ConfigMap as large as a Revision, for reference.
//!
//! Each batch waits until what the controllers write for it is written, and the figures of
//! the batch (API server writes by verb and resource from its `/metrics`, its RSS from `/proc`
//! here and Go heap in use from `/metrics`, etcd's db size in use and bytes put from etcd's
//! `/metrics`) are added to its kind's. At the end a sample of each stored resource is read
//! back: its JSON as the API server answers a GET, with and without `managedFields`, its
//! labels, and its value as etcd stores it (`etcdctl get`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;
use serde_json::{Value, json};

use crate::activator_metrics;
use crate::apiserver_metrics::{Snapshot, local_process};
use crate::error::Error;

/// A kind of app whose cost is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Revision,
    App,
    Configmap,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Revision => "revision",
            Kind::App => "app",
            Kind::Configmap => "configmap",
        }
    }

    /// What the kind stores per unit: (resource, API path prefix of the namespace, etcd key
    /// prefix of the namespace). The API server's own names for each.
    fn stored(self) -> &'static [(&'static str, &'static str, &'static str)] {
        match self {
            Kind::Revision => &[
                (
                    "revisions",
                    "/apis/local-activator.dev/v1alpha1",
                    "/registry/local-activator.dev/revisions",
                ),
                (
                    "activationendpoints",
                    "/apis/local-activator.dev/v1alpha1",
                    "/registry/local-activator.dev/activationendpoints",
                ),
            ],
            Kind::App => &[
                ("deployments", "/apis/apps/v1", "/registry/deployments"),
                ("replicasets", "/apis/apps/v1", "/registry/replicasets"),
                ("services", "/api/v1", "/registry/services/specs"),
                ("endpoints", "/api/v1", "/registry/services/endpoints"),
                (
                    "endpointslices",
                    "/apis/discovery.k8s.io/v1",
                    "/registry/endpointslices",
                ),
            ],
            Kind::Configmap => &[("configmaps", "/api/v1", "/registry/configmaps")],
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub kinds: Vec<Kind>,
    /// Units of each kind (a revision, an app, a ConfigMap).
    pub count: usize,
    /// Batches per kind; the kinds alternate batch by batch.
    pub rounds: usize,
    /// Creates in flight.
    pub concurrency: usize,
    /// Labels on the namespaces (e.g. `local-activator.dev/subsetter=<name>` so that a
    /// subsetter run for the measurement, not the installed one, reconciles them).
    pub namespace_labels: BTreeMap<String, String>,
    /// etcd's client URL as `host:port`, plain HTTP (its `/metrics`, and `etcdctl`'s endpoint).
    pub etcd: Option<String>,
    /// The headless Service (`clusterIP: None`) of `app`, or one with a cluster IP (each then
    /// takes an address of the service range, which is small on the repo's cluster).
    pub cluster_ip: bool,
    /// Objects of each stored resource read back for their sizes.
    pub sample: usize,
    /// How long one batch may take to settle.
    pub settle_timeout: Duration,
    /// Seconds of quiet after each batch settled, before reading the figures.
    pub quiet: Duration,
    /// Leave the namespaces in place.
    pub keep: bool,
}

/// The figures of one reading, for deltas.
#[derive(Debug, Clone, Default)]
struct Reading {
    writes: BTreeMap<(String, String, bool), f64>,
    rss: Option<f64>,
    heap: Option<f64>,
    /// Go 1.21's `go_gc_heap_live_bytes`: the heap marked live by the last GC.
    live: Option<f64>,
    gcs: Option<f64>,
    etcd_in_use: Option<f64>,
    etcd_put_bytes: Option<f64>,
    etcd_puts: Option<f64>,
    etcd_keys: Option<f64>,
}

/// An unlabelled sample of `name` (a float as Go's exposition writes it).
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(name)?.strip_prefix(' ')?;
        v.trim().parse().ok()
    })
}

const MUTATING: &[&str] = &[
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// `apiserver_request_total` of the mutating verbs, by (verb, resource with its
/// subresource, refused: an answer of 400 or above).
pub fn writes(text: &str) -> BTreeMap<(String, String, bool), f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let labels: BTreeMap<&str, &str> = labels
            .split("\",")
            .filter_map(|kv| {
                let (k, v) = kv.split_once("=\"")?;
                Some((k.trim_start_matches(','), v.trim_end_matches('"')))
            })
            .collect();
        let verb = labels.get("verb").copied().unwrap_or_default();
        if !MUTATING.contains(&verb) {
            continue;
        }
        let resource = match labels.get("subresource").copied() {
            Some(sub) if !sub.is_empty() => {
                format!("{}/{sub}", labels.get("resource").copied().unwrap_or(""))
            }
            _ => labels.get("resource").copied().unwrap_or("").to_string(),
        };
        let refused = labels
            .get("code")
            .and_then(|c| c.parse::<u16>().ok())
            .is_some_and(|c| c >= 400);
        *out.entry((verb.to_string(), resource, refused))
            .or_default() += value;
    }
    out
}

async fn read(client: &Client, etcd: Option<&str>) -> Result<Reading, Error> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let text = client.request_text(req).await?;
    let snap = Snapshot::parse(&text);
    let writes = writes(&text);
    let etcd_text = match etcd.and_then(|e| e.parse::<std::net::SocketAddr>().ok()) {
        Some(addr) => activator_metrics::fetch(addr, "/metrics").await,
        None => None,
    };
    let e = |name| etcd_text.as_deref().and_then(|t| gauge(t, name));
    Ok(Reading {
        writes,
        rss: local_process("kube-apiserver")
            .map(|p| p.0 as f64)
            .or(Some(snap.rss_bytes)),
        heap: gauge(&text, "go_memstats_heap_inuse_bytes"),
        live: gauge(&text, "go_gc_heap_live_bytes"),
        gcs: gauge(&text, "go_gc_duration_seconds_count"),
        etcd_in_use: e("etcd_mvcc_db_total_size_in_use_in_bytes"),
        etcd_put_bytes: e("etcd_debugging_mvcc_total_put_size_in_bytes"),
        etcd_puts: e("etcd_mvcc_put_total"),
        etcd_keys: e("etcd_debugging_mvcc_keys_total"),
    })
}

/// The mutating requests between two readings, by "VERB resource" ("… refused" for
/// answers of 400 and above), added to `to`.
fn add_writes(to: &mut BTreeMap<String, f64>, before: &Reading, after: &Reading) {
    for (k, v) in &after.writes {
        let d = v - before.writes.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            let refused = if k.2 { " refused" } else { "" };
            *to.entry(format!("{} {}{refused}", k.0, k.1)).or_default() += d;
        }
    }
}

/// Per unit, the leases of nodes and of elections (which renew whatever a batch does) and
/// what rounds to less than 0.05 per unit left out.
fn per_unit(writes: &BTreeMap<String, f64>, units: usize) -> Vec<(String, f64)> {
    writes
        .iter()
        .filter(|(k, _)| !k.contains(" leases"))
        .map(|(k, v)| (k.clone(), v / units.max(1) as f64))
        .filter(|(_, v)| *v >= 0.05)
        .collect()
}

/// One kind's figures, summed over its batches.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KindFigures {
    pub kind: &'static str,
    pub units: usize,
    pub failed: usize,
    pub secs: f64,
    /// Mutating requests by "VERB resource", all clients, in this kind's batches.
    pub writes: BTreeMap<String, f64>,
    pub rss_delta: f64,
    pub heap_delta: Option<f64>,
    /// The live heap marked by the GC (read after a GC that followed the batch).
    pub live_delta: Option<f64>,
    /// Each batch's live heap delta per unit: on a shared API server another client's
    /// objects come and go within a batch, and the median of the batches is the figure
    /// least moved by them.
    pub live_per_unit_by_batch: Vec<f64>,
    pub etcd_in_use_delta: Option<f64>,
    pub etcd_put_bytes: Option<f64>,
    pub etcd_puts: Option<f64>,
    pub etcd_keys: Option<f64>,
    /// Each stored resource's sampled sizes.
    pub stored: Vec<StoredFigures>,
    /// Deleting the kind's namespace: how long until it was gone, and the mutating requests
    /// meanwhile (all clients), as `writes`.
    pub deleting_secs: Option<f64>,
    pub deleting: BTreeMap<String, f64>,
}

/// The sizes of one resource, averaged over the objects read back.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StoredFigures {
    pub resource: &'static str,
    pub sampled: usize,
    /// The JSON a GET answers (compact, as the server writes it).
    pub json_bytes: f64,
    /// Of that, `metadata.managedFields` (the answer's size less the answer without them).
    pub managed_fields_bytes: f64,
    pub labels: f64,
    pub label_bytes: f64,
    /// The value etcd holds (JSON for custom resources, protobuf for built-in ones).
    pub etcd_bytes: Option<f64>,
}

impl KindFigures {
    fn add(&mut self, before: &Reading, after: &Reading) {
        add_writes(&mut self.writes, before, after);
        let d = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| b - a);
        let sum = |acc: &mut Option<f64>, v: Option<f64>| {
            if let Some(v) = v {
                *acc = Some(acc.unwrap_or(0.0) + v);
            }
        };
        self.rss_delta += d(before.rss, after.rss).unwrap_or(0.0);
        sum(&mut self.heap_delta, d(before.heap, after.heap));
        sum(&mut self.live_delta, d(before.live, after.live));
        sum(
            &mut self.etcd_in_use_delta,
            d(before.etcd_in_use, after.etcd_in_use),
        );
        sum(
            &mut self.etcd_put_bytes,
            d(before.etcd_put_bytes, after.etcd_put_bytes),
        );
        sum(&mut self.etcd_puts, d(before.etcd_puts, after.etcd_puts));
        sum(&mut self.etcd_keys, d(before.etcd_keys, after.etcd_keys));
    }

    /// Per unit.
    pub fn per(&self, v: f64) -> f64 {
        v / self.units.max(1) as f64
    }

    /// Mutating requests per unit by resource, the leases of nodes and of elections (which
    /// renew whatever the batch does) left out.
    pub fn writes_per_unit(&self) -> Vec<(String, f64)> {
        per_unit(&self.writes, self.units)
    }

    /// The median of the batches' live heap per unit.
    pub fn live_median(&self) -> Option<f64> {
        let mut v = self.live_per_unit_by_batch.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let m = v.len() / 2;
        Some(if v.len().is_multiple_of(2) {
            (v[m - 1] + v[m]) / 2.0
        } else {
            v[m]
        })
    }

    pub fn writes_total_per_unit(&self) -> f64 {
        self.writes_per_unit().iter().map(|(_, v)| v).sum()
    }

    pub fn lines(&self) -> Vec<String> {
        let mib = |b: f64| b / (1024.0 * 1024.0);
        let opt =
            |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map(f).unwrap_or_else(|| "n/a".into());
        let mut out = vec![format!(
            "{}: {} units ({} failed) in {:.1} s; per unit: {:.2} writes [{}]; kube-apiserver live heap {} B, heap in use {} B, RSS {:.0} B (total {:.1} MiB live, {:.1} MiB in use, {:.1} MiB RSS); etcd db in use {} B, put {} B in {} puts, keys {}",
            self.kind,
            self.units,
            self.failed,
            self.secs,
            self.writes_total_per_unit(),
            self.writes_per_unit()
                .iter()
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            opt(self.live_delta.map(|v| self.per(v)), &|v| format!("{v:.0}")),
            opt(self.heap_delta.map(|v| self.per(v)), &|v| format!("{v:.0}")),
            self.per(self.rss_delta),
            self.live_delta.map(mib).unwrap_or(0.0),
            self.heap_delta.map(mib).unwrap_or(0.0),
            mib(self.rss_delta),
            opt(self.etcd_in_use_delta.map(|v| self.per(v)), &|v| format!(
                "{v:.0}"
            )),
            opt(self.etcd_put_bytes.map(|v| self.per(v)), &|v| format!(
                "{v:.0}"
            )),
            opt(self.etcd_puts.map(|v| self.per(v)), &|v| format!("{v:.2}")),
            opt(self.etcd_keys.map(|v| self.per(v)), &|v| format!("{v:.2}")),
        )];
        out.push(format!(
            "  live heap per unit by batch: [{}], median {}",
            self.live_per_unit_by_batch
                .iter()
                .map(|v| format!("{v:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            opt(self.live_median(), &|v| format!("{v:.0} B")),
        ));
        if let Some(secs) = self.deleting_secs {
            let w = per_unit(&self.deleting, self.units);
            out.push(format!(
                "  deleting its namespace: {secs:.1} s; per unit: {:.2} requests [{}]",
                w.iter().map(|(_, v)| v).sum::<f64>(),
                w.iter()
                    .map(|(k, v)| format!("{k} {v:.2}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        for s in &self.stored {
            out.push(format!(
                "  {:<20} {:>2} read: GET json {:.0} B, of it managedFields {:.0} B; {:.1} labels ({:.0} B); in etcd {} B",
                s.resource,
                s.sampled,
                s.json_bytes,
                s.managed_fields_bytes,
                s.labels,
                s.label_bytes,
                opt(s.etcd_bytes, &|v| format!("{v:.0}")),
            ));
        }
        out
    }
}

fn namespace_of(kind: Kind) -> String {
    format!("cost-{}-{}", kind.name(), std::process::id())
}

fn name_of(kind: Kind, i: usize) -> String {
    match kind {
        Kind::Revision => format!("rev-{i:05}"),
        Kind::App => format!("app-{i:05}"),
        Kind::Configmap => format!("cm-{i:05}"),
    }
}

fn template(name: &str) -> Value {
    json!({
        "metadata": { "labels": { "app": name } },
        "spec": { "containers": [{
            "name": "app",
            "image": "registry.local/hello:1",
            "ports": [{ "containerPort": 8080 }],
        }]},
    })
}

/// The objects one unit of `kind` is made of, as (API path of their collection, body).
fn unit(kind: Kind, ns: &str, i: usize, opts: &Options, cm_pad: usize) -> Vec<(String, Value)> {
    let name = name_of(kind, i);
    match kind {
        Kind::Revision => vec![(
            format!("/apis/local-activator.dev/v1alpha1/namespaces/{ns}/revisions"),
            json!({
                "apiVersion": "local-activator.dev/v1alpha1",
                "kind": "Revision",
                "metadata": { "name": name },
                "spec": {
                    "hosts": [format!("{name}.{ns}.example.com")],
                    "minScale": 0,
                    "template": template(&name),
                },
            }),
        )],
        Kind::App => {
            let mut svc = json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": { "name": name },
                "spec": {
                    "selector": { "app": name },
                    "ports": [{ "port": 80, "targetPort": 8080 }],
                },
            });
            if !opts.cluster_ip {
                svc["spec"]["clusterIP"] = json!("None");
            }
            vec![
                (
                    format!("/apis/apps/v1/namespaces/{ns}/deployments"),
                    json!({
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "metadata": { "name": name, "labels": { "app": name } },
                        "spec": {
                            "replicas": 0,
                            "selector": { "matchLabels": { "app": name } },
                            "template": template(&name),
                        },
                    }),
                ),
                (format!("/api/v1/namespaces/{ns}/services"), svc),
            ]
        }
        Kind::Configmap => vec![(
            format!("/api/v1/namespaces/{ns}/configmaps"),
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": { "name": name },
                "data": { "v": "x".repeat(cm_pad) },
            }),
        )],
    }
}

fn json_error(e: serde_json::Error) -> Error {
    Error::Kube(kube::Error::SerdeError(e))
}

async fn send(client: &Client, req: http::Request<Vec<u8>>) -> Result<String, kube::Error> {
    client.request_text(req).await
}

async fn post(client: &Client, path: &str, body: &Value) -> Result<String, kube::Error> {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).map_err(kube::Error::SerdeError)?)
        .map_err(kube::Error::HttpError)?;
    send(client, req).await
}

async fn get(client: &Client, path: &str) -> Result<String, kube::Error> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    send(client, req).await
}

async fn list(client: &Client, path: &str) -> Result<Vec<Value>, Error> {
    let v: Value = serde_json::from_str(&get(client, path).await?).map_err(json_error)?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// Whether every one of the `n` units of `kind` in `ns` has what its controllers write.
async fn settled(client: &Client, kind: Kind, ns: &str, n: usize) -> Result<bool, Error> {
    let count = |items: &[Value], f: &dyn Fn(&Value) -> bool| items.iter().filter(|o| f(o)).count();
    let observed = |o: &Value| {
        o["status"]["observedGeneration"].as_i64().is_some()
            && o["status"]["observedGeneration"] == o["metadata"]["generation"]
    };
    Ok(match kind {
        Kind::Revision => {
            let g = "/apis/local-activator.dev/v1alpha1/namespaces";
            let aes = list(client, &format!("{g}/{ns}/activationendpoints")).await?;
            let revs = list(client, &format!("{g}/{ns}/revisions")).await?;
            count(&aes, &|o| {
                o["status"]["observedGeneration"].is_i64()
                    && o["status"]["activators"]
                        .as_array()
                        .is_some_and(|a| !a.is_empty())
            }) >= n
                && count(&revs, &observed) >= n
        }
        Kind::App => {
            let deps = list(
                client,
                &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
            )
            .await?;
            let rss = list(
                client,
                &format!("/apis/apps/v1/namespaces/{ns}/replicasets"),
            )
            .await?;
            let eps = list(client, &format!("/api/v1/namespaces/{ns}/endpoints")).await?;
            let slices = list(
                client,
                &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
            )
            .await?;
            count(&deps, &observed) >= n
                && count(&rss, &observed) >= n
                && eps.len() >= n
                && slices.len() >= n
        }
        Kind::Configmap => true,
    })
}

/// Creates units `range` of `kind`, waits until they settled; the number that failed.
async fn batch(
    client: &Client,
    kind: Kind,
    range: std::ops::Range<usize>,
    opts: &Options,
    cm_pad: usize,
) -> Result<usize, Error> {
    let ns = namespace_of(kind);
    let objects: Vec<(String, Value)> = range
        .clone()
        .flat_map(|i| unit(kind, &ns, i, opts, cm_pad))
        .collect();
    let results: Vec<Result<String, kube::Error>> = futures::stream::iter(objects)
        .map(|(path, body)| async move { post(client, &path, &body).await })
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        tracing::warn!(error = %e, failed, kind = kind.name(), "creates failed");
    }
    let t = Instant::now();
    while !settled(client, kind, &ns, range.end - failed).await? {
        if t.elapsed() > opts.settle_timeout {
            return Err(Error::Timeout {
                what: format!("{} units of {} to settle", range.end, kind.name()),
                secs: opts.settle_timeout.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(failed)
}

/// A GET answer's figures: (its bytes, managedFields bytes, labels, label bytes).
pub fn sizes(answer: &str) -> Result<(usize, usize, usize, usize), serde_json::Error> {
    let mut v: Value = serde_json::from_str(answer)?;
    let labels = v["metadata"]["labels"]
        .as_object()
        .map(|l| {
            (
                l.len(),
                l.iter()
                    .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                    .sum(),
            )
        })
        .unwrap_or((0, 0));
    let whole = serde_json::to_vec(&v)?.len();
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("managedFields");
    }
    let without = serde_json::to_vec(&v)?.len();
    Ok((answer.trim_end().len(), whole - without, labels.0, labels.1))
}

/// The size of the value etcd holds at `key` (`etcdctl get --print-value-only`, less its
/// newline).
async fn etcd_value_bytes(endpoint: &str, key: &str) -> Option<usize> {
    let out = tokio::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &format!("http://{endpoint}"),
            "get",
            key,
            "--print-value-only",
        ])
        .output()
        .await
        .ok()?;
    (out.status.success() && !out.stdout.is_empty()).then(|| out.stdout.len() - 1)
}

async fn read_back(
    client: &Client,
    kind: Kind,
    opts: &Options,
) -> Result<Vec<StoredFigures>, Error> {
    let ns = namespace_of(kind);
    let mut out = Vec::new();
    for &(resource, api, etcd_prefix) in kind.stored() {
        let path = format!("{api}/namespaces/{ns}/{resource}");
        let names: Vec<String> = list(client, &format!("{path}?limit={}", opts.sample.max(1)))
            .await?
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        let mut f = StoredFigures {
            resource,
            ..Default::default()
        };
        let mut etcd = Vec::new();
        for name in &names {
            let answer = get(client, &format!("{path}/{name}")).await?;
            let (json, mf, labels, label_bytes) = sizes(&answer).map_err(json_error)?;
            f.sampled += 1;
            f.json_bytes += json as f64;
            f.managed_fields_bytes += mf as f64;
            f.labels += labels as f64;
            f.label_bytes += label_bytes as f64;
            let key = format!("{etcd_prefix}/{ns}/{name}");
            if let Some(e) = &opts.etcd
                && let Some(b) = etcd_value_bytes(e, &key).await
            {
                etcd.push(b as f64);
            }
        }
        let n = f.sampled.max(1) as f64;
        f.json_bytes /= n;
        f.managed_fields_bytes /= n;
        f.labels /= n;
        f.label_bytes /= n;
        f.etcd_bytes = (!etcd.is_empty()).then(|| etcd.iter().sum::<f64>() / etcd.len() as f64);
        out.push(f);
    }
    Ok(out)
}

/// Runs the measurement and deletes its namespaces after (unless `keep`).
pub async fn run(client: Client, opts: &Options) -> Result<Vec<KindFigures>, Error> {
    if opts.kinds.is_empty() || opts.count == 0 || opts.rounds == 0 {
        return Err(Error::Options(
            "--kinds, --count and --rounds must not be empty or 0".into(),
        ));
    }
    for &kind in &opts.kinds {
        let mut ns = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": namespace_of(kind) },
        });
        if !opts.namespace_labels.is_empty() {
            ns["metadata"]["labels"] = json!(opts.namespace_labels);
        }
        post(&client, "/api/v1/namespaces", &ns).await?;
    }
    let mut result = measure(&client, opts).await;
    if !opts.keep {
        for (k, &kind) in opts.kinds.iter().enumerate() {
            match delete_namespace(&client, kind, opts).await {
                Ok((secs, writes)) => {
                    if let Ok(figures) = result.as_mut() {
                        figures[k].deleting_secs = Some(secs);
                        figures[k].deleting = writes;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "deleting a namespace"),
            }
        }
    }
    result
}

/// Deletes `kind`'s namespace and waits until it is gone: how long that took and the
/// mutating requests meanwhile.
async fn delete_namespace(
    client: &Client,
    kind: Kind,
    opts: &Options,
) -> Result<(f64, BTreeMap<String, f64>), Error> {
    let path = format!("/api/v1/namespaces/{}", namespace_of(kind));
    let before = read(client, opts.etcd.as_deref()).await?;
    let t = Instant::now();
    let req = http::Request::delete(&path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    send(client, req).await?;
    loop {
        match get(client, &path).await {
            Err(kube::Error::Api(s)) if s.code == 404 => break,
            Err(e) => return Err(e.into()),
            Ok(_) if t.elapsed() > opts.settle_timeout => {
                return Err(Error::Timeout {
                    what: format!("namespace {path} to go"),
                    secs: opts.settle_timeout.as_secs(),
                });
            }
            Ok(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let after = read(client, opts.etcd.as_deref()).await?;
    let mut writes = BTreeMap::new();
    add_writes(&mut writes, &before, &after);
    Ok((secs, writes))
}

async fn measure(client: &Client, opts: &Options) -> Result<Vec<KindFigures>, Error> {
    let mut figures: Vec<KindFigures> = opts
        .kinds
        .iter()
        .map(|k| KindFigures {
            kind: k.name(),
            ..Default::default()
        })
        .collect();
    let per_round = opts.count.div_ceil(opts.rounds);
    // The ConfigMap is padded to the size of a Revision as stored, read once one exists.
    let mut cm_pad = 1000;
    for r in 0..opts.rounds {
        let range = r * per_round..((r + 1) * per_round).min(opts.count);
        if range.is_empty() {
            break;
        }
        for (k, &kind) in opts.kinds.iter().enumerate() {
            let before = read(client, opts.etcd.as_deref()).await?;
            let t = Instant::now();
            let failed = batch(client, kind, range.clone(), opts, cm_pad).await?;
            let secs = t.elapsed().as_secs_f64();
            tokio::time::sleep(opts.quiet).await;
            let after = after_a_gc(client, opts).await?;
            let f = &mut figures[k];
            f.add(&before, &after);
            if let (Some(a), Some(b)) = (before.live, after.live) {
                f.live_per_unit_by_batch
                    .push((b - a) / range.len().saturating_sub(failed).max(1) as f64);
            }
            f.units += range.len() - failed;
            f.failed += failed;
            f.secs += secs;
            tracing::info!(target: "loadtest::figures", round = r, kind = kind.name(), secs, failed, "batch settled");
            if kind == Kind::Revision && r == 0 {
                let ns = namespace_of(kind);
                let path = format!(
                    "/apis/local-activator.dev/v1alpha1/namespaces/{ns}/revisions/{}",
                    name_of(kind, 0)
                );
                if let Ok(answer) = get(client, &path).await {
                    let (json, mf, _, _) = sizes(&answer).map_err(json_error)?;
                    // A ConfigMap's own metadata and envelope are about 250 bytes.
                    cm_pad = (json - mf).saturating_sub(250).max(1);
                }
            }
        }
    }
    for (k, &kind) in opts.kinds.iter().enumerate() {
        figures[k].stored = read_back(client, kind, opts).await?;
    }
    Ok(figures)
}

/// A reading taken once the API server ran a GC after this call (its live heap then counts
/// what the batch left), or after 60 s without one.
async fn after_a_gc(client: &Client, opts: &Options) -> Result<Reading, Error> {
    let first = read(client, opts.etcd.as_deref()).await?;
    let t = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = read(client, opts.etcd.as_deref()).await?;
        if r.gcs.is_none() || r.gcs > first.gcs || t.elapsed() > Duration::from_secs(60) {
            return Ok(r);
        }
    }
}

/// The ratio line: a revision's figures over an app's.
pub fn ratios(rev: &KindFigures, app: &KindFigures) -> String {
    let r = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b.abs() > 0.0 => format!("{:.2}", a / b),
        _ => "n/a".into(),
    };
    let bytes = |f: &KindFigures, etcd: bool| {
        f.stored
            .iter()
            .map(|s| {
                if etcd {
                    s.etcd_bytes.unwrap_or(0.0)
                } else {
                    s.json_bytes
                }
            })
            .sum::<f64>()
    };
    format!(
        "revision / (Deployment + Service): writes {}, live heap (median of batches) {}, live heap {}, heap in use {}, RSS {}, etcd db in use {}, etcd bytes put {}, GET json bytes {}, etcd value bytes {}",
        r(
            Some(rev.writes_total_per_unit()),
            Some(app.writes_total_per_unit())
        ),
        r(rev.live_median(), app.live_median()),
        r(
            rev.live_delta.map(|v| rev.per(v)),
            app.live_delta.map(|v| app.per(v))
        ),
        r(
            rev.heap_delta.map(|v| rev.per(v)),
            app.heap_delta.map(|v| app.per(v))
        ),
        r(Some(rev.per(rev.rss_delta)), Some(app.per(app.rss_delta))),
        r(
            rev.etcd_in_use_delta.map(|v| rev.per(v)),
            app.etcd_in_use_delta.map(|v| app.per(v))
        ),
        r(
            rev.etcd_put_bytes.map(|v| rev.per(v)),
            app.etcd_put_bytes.map(|v| app.per(v))
        ),
        r(Some(bytes(rev, false)), Some(bytes(app, false))),
        r(Some(bytes(rev, true)), Some(bytes(app, true))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_is_read_in_go_float_form_and_only_by_its_whole_name() {
        let text = "# HELP x\ngo_memstats_heap_inuse_bytes 1.38723328e+08\ngo_memstats_heap_inuse_bytes_total 7\n";
        assert_eq!(
            gauge(text, "go_memstats_heap_inuse_bytes"),
            Some(1.38723328e8)
        );
        assert_eq!(gauge(text, "go_memstats_heap"), None);
    }

    #[test]
    fn writes_are_read_by_verb_resource_and_refusal() {
        let text = concat!(
            "apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"local-activator.dev\",resource=\"activationendpoints\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1alpha1\"} 2247\n",
            "apiserver_request_total{code=\"403\",component=\"apiserver\",dry_run=\"\",group=\"local-activator.dev\",resource=\"activationendpoints\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1alpha1\"} 8962\n",
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 1.2e+06\n",
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"\",verb=\"GET\",version=\"v1\"} 5\n",
        );
        let w = writes(text);
        let key = |v: &str, r: &str, refused| (v.to_string(), r.to_string(), refused);
        assert_eq!(
            w.get(&key("POST", "activationendpoints", false)),
            Some(&2247.0)
        );
        assert_eq!(
            w.get(&key("POST", "activationendpoints", true)),
            Some(&8962.0)
        );
        assert_eq!(w.get(&key("PATCH", "pods/status", false)), Some(&1.2e6));
        assert_eq!(w.len(), 3, "reads are not writes");
    }

    #[test]
    fn sizes_split_out_managed_fields_and_count_labels() {
        let answer = r#"{"metadata":{"name":"a","labels":{"k":"v","host.x/1":""},"managedFields":[{"manager":"m"}]},"spec":{}}"#;
        let (json, mf, labels, label_bytes) = sizes(answer).unwrap();
        assert_eq!(json, answer.len());
        assert_eq!(mf, r#","managedFields":[{"manager":"m"}]"#.len());
        assert_eq!((labels, label_bytes), (2, 2 + 8));
    }

    #[test]
    fn deltas_add_up_per_unit_and_leave_leases_out() {
        let key = |v: &str, r: &str, refused| (v.to_string(), r.to_string(), refused);
        let mut before = Reading::default();
        before.writes.insert(key("POST", "revisions", false), 10.0);
        before.heap = Some(100.0);
        let mut after = before.clone();
        after.writes.insert(key("POST", "revisions", false), 20.0);
        after
            .writes
            .insert(key("PATCH", "activationendpoints/status", false), 10.0);
        after.writes.insert(key("PUT", "leases", false), 5.0);
        after
            .writes
            .insert(key("POST", "activationendpoints", true), 3.0);
        after.heap = Some(1100.0);
        let mut f = KindFigures {
            units: 10,
            ..Default::default()
        };
        f.add(&before, &after);
        assert_eq!(f.writes_total_per_unit(), 2.3);
        assert!(f.writes.contains_key("POST activationendpoints refused"));
        assert_eq!(f.heap_delta.map(|h| f.per(h)), Some(100.0));
        assert_eq!(f.etcd_in_use_delta, None, "not read: not made up");
        f.live_per_unit_by_batch = vec![5.0, -100.0, 7.0, 6.0];
        assert_eq!(f.live_median(), Some(5.5));
    }

    #[test]
    fn an_app_is_a_deployment_at_zero_and_a_headless_service() {
        let opts = Options {
            kinds: vec![Kind::App],
            count: 1,
            rounds: 1,
            concurrency: 1,
            namespace_labels: BTreeMap::new(),
            etcd: None,
            cluster_ip: false,
            sample: 1,
            settle_timeout: Duration::from_secs(1),
            quiet: Duration::ZERO,
            keep: false,
        };
        let objs = unit(Kind::App, "ns", 3, &opts, 0);
        assert_eq!(objs[0].1["spec"]["replicas"], 0);
        assert_eq!(objs[1].1["spec"]["clusterIP"], "None");
        assert_eq!(objs[1].1["spec"]["selector"]["app"], "app-00003");
        let rev = unit(Kind::Revision, "ns", 3, &opts, 0);
        assert_eq!(rev[0].1["spec"]["minScale"], 0);
    }
}
