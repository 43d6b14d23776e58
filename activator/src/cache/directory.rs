//! The directory client (`crds::directory`): when the API server gives no answer, a Host or a
//! revision this activator has not seen is looked up at the subsetter's replicas, which keep
//! every Revision and subset in memory through an outage. Warm traffic then needs no API
//! server on any activator, member or not (docs/architecture.md, "The scale it must hold"), without each activator watching
//! every Revision: the steady state still reads the API server, and only an outage's misses
//! come here.
//!
//! The replicas are found by a label-selected watch of their pods in the activator's own
//! namespace (a handful of objects), whose last state outlives an outage; tests and the load
//! test, where the subsetter runs in-process, give fixed addresses.
//!
//! An answer is a subsetter's JSON and is read as hostile: at most
//! [`MAX_ANSWER_BYTES`](crds::directory::MAX_ANSWER_BYTES), parsed into the typed objects, a
//! host answer used only when its revision claims the host.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use crds::contract::normalize_host;
use crds::directory::{DirectoryAnswer, DirectoryQuery, MAX_ANSWER_BYTES, MembersAnswer};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

/// Upper bound on one replica's answer (connect, request, body).
pub const ASK_LIMIT: Duration = Duration::from_millis(800);

/// Upper bound on one replica's answer of a node's memberships: a few hundred subsets, and a
/// start is not a request waiting. Generous: the alternative is a list that scans every
/// subset on the API server, and a DaemonSet rollout asks the replicas a wave's worth at once
/// (3 s before: in a kubesim run, 702 of 1,000 stand-ins starting at once in one process
/// timed out at it; in the real-API-server run at 100,000 subsets, 965 of 988 rolled ones
/// listed, why unlogged).
pub const MEMBERS_LIMIT: Duration = Duration::from_secs(10);

/// Where the directory's replicas are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectorySource {
    /// No directory: a lookup the API server does not answer fails (503).
    Off,
    /// Fixed addresses.
    Static(Vec<SocketAddr>),
    /// The Ready pods matching `selector` in `namespace`, at `port`.
    Pods {
        namespace: String,
        selector: String,
        port: u16,
    },
}

/// Why the directory gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    #[error("no directory replica is known")]
    NoReplica,
    #[error("no directory replica answered: {0}")]
    Unanswered(String),
}

/// The directory's replicas and how to ask them.
#[derive(Clone)]
pub struct Directory {
    replicas: Arc<tokio::sync::watch::Sender<Vec<SocketAddr>>>,
    /// When no replica last answered: reads that have the API server to fall back on skip
    /// the directory for [`SKIP_AFTER_FAILURE`] after it, so a blackholed replica set costs
    /// a request at most one wait for it, not one each.
    failed_at: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// How long reads with a fallback skip the directory after no replica answered.
pub const SKIP_AFTER_FAILURE: Duration = Duration::from_secs(5);

impl Directory {
    /// None for [`DirectorySource::Off`]; the pod watch runs until `stop`.
    pub fn start(
        source: &DirectorySource,
        client: Client,
        stop: CancellationToken,
    ) -> Option<Self> {
        let replicas = Arc::new(tokio::sync::watch::Sender::new(Vec::new()));
        match source {
            DirectorySource::Off => return None,
            DirectorySource::Static(addrs) => {
                replicas.send_replace(addrs.clone());
            }
            DirectorySource::Pods {
                namespace,
                selector,
                port,
            } => watch_replicas(client, namespace, selector, *port, replicas.clone(), stop),
        }
        Some(Self {
            replicas,
            failed_at: Arc::default(),
        })
    }

    /// Whether reads with a fallback should ask the directory now (no replica failed them
    /// within [`SKIP_AFTER_FAILURE`]).
    pub fn worth_asking(&self) -> bool {
        let last = *self.failed_at.lock().unwrap_or_else(|e| e.into_inner());
        last.is_none_or(|t| t.elapsed() >= SKIP_AFTER_FAILURE)
    }

    fn failed(&self) {
        *self.failed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    }

    /// The replicas known now.
    pub fn replicas(&self) -> Vec<SocketAddr> {
        self.replicas.borrow().clone()
    }

    /// Asks the replicas in turn (from a random one) until one answers: `Ok(None)` when it
    /// knows no such host or revision.
    pub async fn lookup(
        &self,
        q: &DirectoryQuery,
    ) -> Result<Option<DirectoryAnswer>, DirectoryError> {
        let answer = self.first(ASK_LIMIT, |addr| ask(addr, q)).await;
        if answer.is_err() {
            self.failed();
        }
        checked(q, answer?).map_err(DirectoryError::Unanswered)
    }

    /// `node`'s memberships and a version to watch them from, from the first replica that
    /// answers them, waiting up to `wait` for a replica to be known (at an activator's start
    /// the replicas' watch has only begun). Each item must carry the node's member label.
    pub async fn members(
        &self,
        node: &str,
        wait: Duration,
    ) -> Result<MembersAnswer, DirectoryError> {
        let mut known = self.replicas.subscribe();
        let _ = tokio::time::timeout(wait, known.wait_for(|r| !r.is_empty())).await;
        let answer = self
            .first(MEMBERS_LIMIT, |addr| ask_members(addr, node))
            .await?;
        members_checked(node, answer).map_err(DirectoryError::Unanswered)
    }

    /// The subsets carrying `host`'s label, from the first replica that answers: what a
    /// label-selected list of the host finds, without its scan of every subset. Each item must
    /// carry the host's label.
    pub async fn host_claims(&self, host: &str) -> Result<MembersAnswer, DirectoryError> {
        if !self.worth_asking() {
            return Err(DirectoryError::Unanswered(
                "no replica answered a moment ago".into(),
            ));
        }
        let path = crds::directory::host_claims_path(host);
        let answer = self
            .first(ASK_LIMIT, |addr| {
                let path = path.clone();
                async move {
                    match get(addr, &path).await? {
                        (http::StatusCode::OK, body) => serde_json::from_slice(&body)
                            .map_err(|e| format!("an answer that is not a host's claims: {e}")),
                        (s, body) => Err(not_ok(s, &body)),
                    }
                }
            })
            .await;
        if answer.is_err() {
            self.failed();
        }
        claims_checked(host, answer?).map_err(DirectoryError::Unanswered)
    }

    /// The first answer of the replicas asked in turn (from a random one), each given `limit`.
    async fn first<T, F>(
        &self,
        limit: Duration,
        ask: impl Fn(SocketAddr) -> F,
    ) -> Result<T, DirectoryError>
    where
        F: Future<Output = Result<T, String>>,
    {
        let replicas = self.replicas();
        if replicas.is_empty() {
            return Err(DirectoryError::NoReplica);
        }
        let start = rand::random_range(0..replicas.len());
        let mut errors = Vec::new();
        for i in 0..replicas.len() {
            let addr = replicas[(start + i) % replicas.len()];
            match tokio::time::timeout(limit, ask(addr)).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => errors.push(format!("{addr}: {e}")),
                Err(_) => errors.push(format!("{addr}: no answer within {limit:?}")),
            }
        }
        Err(DirectoryError::Unanswered(errors.join("; ")))
    }
}

/// A members answer, held to the query: every item a named subset carrying `node`'s member
/// label (what the label-selected watch would select), the version a number (etcd's
/// revision, as the watch is started from it).
fn members_checked(node: &str, answer: MembersAnswer) -> Result<MembersAnswer, String> {
    let rv = &answer.resource_version;
    if rv.is_empty() || rv.len() > 20 || !rv.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "the directory answered a version that is not one: {:?}",
            rv.chars().take(32).collect::<String>()
        ));
    }
    let label = crds::contract::member_label(node);
    for ae in &answer.items {
        let named = ae
            .metadata
            .namespace
            .as_deref()
            .is_some_and(|n| !n.is_empty())
            && ae.metadata.name.as_deref().is_some_and(|n| !n.is_empty());
        if !named || !ae.labels().contains_key(&label) {
            return Err(format!(
                "the directory answered {}/{}, which does not list {node}",
                ae.metadata.namespace.as_deref().unwrap_or_default(),
                ae.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    Ok(answer)
}

/// A host-claims answer, held to the query: every item a named subset carrying the host's
/// label (what the label-selected list would select).
fn claims_checked(host: &str, answer: MembersAnswer) -> Result<MembersAnswer, String> {
    let label = crds::contract::host_label(host);
    for ae in &answer.items {
        let named = ae
            .metadata
            .namespace
            .as_deref()
            .is_some_and(|n| !n.is_empty())
            && ae.metadata.name.as_deref().is_some_and(|n| !n.is_empty());
        if !named || !ae.labels().contains_key(&label) {
            return Err(format!(
                "the directory answered {}/{}, which does not claim {host}",
                ae.metadata.namespace.as_deref().unwrap_or_default(),
                ae.metadata.name.as_deref().unwrap_or_default()
            ));
        }
    }
    Ok(answer)
}

/// A replica's answer, held to the query: the revision it names is the one asked for, or
/// one that claims the host asked for.
fn checked(
    q: &DirectoryQuery,
    answer: Option<DirectoryAnswer>,
) -> Result<Option<DirectoryAnswer>, String> {
    let Some(a) = answer else { return Ok(None) };
    let (ns, name) = (
        a.revision.metadata.namespace.as_deref().unwrap_or_default(),
        a.revision.metadata.name.as_deref().unwrap_or_default(),
    );
    let fits = match q {
        DirectoryQuery::Host(h) => a
            .revision
            .spec
            .hosts
            .iter()
            .any(|c| normalize_host(c) == *h),
        DirectoryQuery::Revision { namespace, name: n } => ns == namespace && name == n,
    };
    let endpoints_fit = a.endpoints.as_ref().is_none_or(|e| {
        e.metadata.namespace.as_deref() == Some(ns) && e.metadata.name.as_deref() == Some(name)
    });
    if fits && endpoints_fit {
        Ok(Some(a))
    } else {
        Err(format!(
            "the directory answered {ns}/{name}, which is not what was asked"
        ))
    }
}

/// One lookup: the revision, None for a 404.
async fn ask(addr: SocketAddr, q: &DirectoryQuery) -> Result<Option<DirectoryAnswer>, String> {
    match get(addr, &q.path()).await? {
        (http::StatusCode::OK, body) => serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| format!("an answer that is not a revision: {e}")),
        (http::StatusCode::NOT_FOUND, _) => Ok(None),
        (s, body) => Err(not_ok(s, &body)),
    }
}

/// One node's memberships.
async fn ask_members(addr: SocketAddr, node: &str) -> Result<MembersAnswer, String> {
    match get(addr, &crds::directory::members_path(node)).await? {
        (http::StatusCode::OK, body) => serde_json::from_slice(&body)
            .map_err(|e| format!("an answer that is not a node's memberships: {e}")),
        (s, body) => Err(not_ok(s, &body)),
    }
}

fn not_ok(s: http::StatusCode, body: &[u8]) -> String {
    format!(
        "{s}: {}",
        String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
    )
}

/// One GET over a fresh HTTP/1.1 connection (lookups are rare: an outage's misses, and a
/// start), its body read to at most [`MAX_ANSWER_BYTES`].
async fn get(addr: SocketAddr, path: &str) -> Result<(http::StatusCode, Bytes), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let conn = tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("request: {e}"))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    conn.abort();
    Ok((status, body))
}

/// Keeps `replicas` = the Ready pods matching `selector`, at `port`. An error keeps the last
/// state (an outage is when the directory is needed).
fn watch_replicas(
    client: Client,
    namespace: &str,
    selector: &str,
    port: u16,
    replicas: Arc<tokio::sync::watch::Sender<Vec<SocketAddr>>>,
    stop: CancellationToken,
) {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let cfg = watcher::Config::default().labels(selector).any_semantic();
    let events = crds::backoff::resilient(watcher(api, cfg));
    let mut known: std::collections::BTreeMap<String, SocketAddr> = Default::default();
    let mut relisted: Option<std::collections::BTreeMap<String, SocketAddr>> = None;
    super::spawn_watch("directory replica", events, stop, move |ev| {
        match ev {
            watcher::Event::Init => relisted = Some(Default::default()),
            watcher::Event::InitApply(pod) => {
                if let (Some(seen), Some(addr)) = (relisted.as_mut(), ready_addr(&pod, port)) {
                    seen.insert(pod.name_any(), addr);
                }
            }
            watcher::Event::InitDone => {
                if let Some(seen) = relisted.take() {
                    known = seen;
                }
            }
            watcher::Event::Apply(pod) => match ready_addr(&pod, port) {
                Some(a) => {
                    known.insert(pod.name_any(), a);
                }
                None => {
                    known.remove(&pod.name_any());
                }
            },
            watcher::Event::Delete(pod) => {
                known.remove(&pod.name_any());
            }
        }
        replicas.send_replace(known.values().copied().collect());
    });
}

/// A Ready pod's address at `port`.
fn ready_addr(pod: &Pod, port: u16) -> Option<SocketAddr> {
    let status = pod.status.as_ref()?;
    // After an outage the controller-manager marks every pod unready until its kubelet
    // reports again: a replica so marked still answers, and it is needed most then.
    let ready = crds::pod_ready::ready(pod);
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    (ready && pod.metadata.deletion_timestamp.is_none()).then_some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn answer(ns: &str, name: &str, hosts: &[&str]) -> DirectoryAnswer {
        DirectoryAnswer {
            revision: serde_json::from_value(serde_json::json!({
                "apiVersion": "local-activator.dev/v1alpha1",
                "kind": "Revision",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"hosts": hosts, "port": 8080,
                         "template": {"spec": {"containers": [{"name": "app", "image": "x"}]}}}
            }))
            .expect("a valid Revision"),
            endpoints: None,
        }
    }

    #[test]
    fn an_answer_must_be_what_was_asked() {
        let host = DirectoryQuery::Host("app.example".into());
        assert!(checked(&host, Some(answer("ns", "a", &["App.Example:80"]))).is_ok());
        assert!(checked(&host, Some(answer("ns", "a", &["other.example"]))).is_err());
        let rev = DirectoryQuery::Revision {
            namespace: "ns".into(),
            name: "a".into(),
        };
        assert!(checked(&rev, Some(answer("ns", "a", &[]))).is_ok());
        assert!(checked(&rev, Some(answer("ns", "b", &[]))).is_err());
        let mut wrong_subset = answer("ns", "a", &[]);
        wrong_subset.endpoints = Some(crds::ActivationEndpoints::new("b", Default::default()));
        assert!(checked(&rev, Some(wrong_subset)).is_err());
        assert!(matches!(checked(&rev, None), Ok(None)));
    }

    /// A replica that answers with the given raw bytes, then closes.
    async fn replica(raw: &'static [u8]) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(raw).await;
            }
        });
        addr
    }

    fn directory(addrs: Vec<SocketAddr>) -> Directory {
        Directory {
            replicas: Arc::new(tokio::sync::watch::Sender::new(addrs)),
            failed_at: Arc::default(),
        }
    }

    #[tokio::test]
    async fn hostile_replicas_are_errors_and_the_next_one_answers() {
        let good_body = serde_json::to_string(&answer("ns", "a", &["app.example"])).unwrap();
        let good: &'static [u8] = Box::leak(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{good_body}",
                good_body.len()
            )
            .into_bytes()
            .into_boxed_slice(),
        );
        let q = DirectoryQuery::Host("app.example".into());
        let hostile: [&'static [u8]; 5] = [
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{\"a\":",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            b"garbage\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n{",
        ];
        for raw in hostile {
            let bad = replica(raw).await;
            let only_bad = directory(vec![bad]).lookup(&q).await;
            assert!(only_bad.is_err(), "{:?}", String::from_utf8_lossy(raw));
            let good = replica(good).await;
            let got = directory(vec![bad, good])
                .lookup(&q)
                .await
                .expect("the good one");
            assert_eq!(
                got.expect("found").revision.metadata.name.as_deref(),
                Some("a")
            );
        }
        let missing = replica(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
        assert!(
            directory(vec![missing])
                .lookup(&q)
                .await
                .expect("answered")
                .is_none()
        );
        assert!(matches!(
            directory(vec![]).lookup(&q).await,
            Err(DirectoryError::NoReplica)
        ));
    }

    #[test]
    fn only_ready_pods_with_an_address_are_replicas() {
        let pod = |ready: &str, ip: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "s"},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}
            }))
            .unwrap()
        };
        assert_eq!(
            ready_addr(&pod("True", Some("10.0.0.1")), 9092),
            Some("10.0.0.1:9092".parse().unwrap())
        );
        assert_eq!(ready_addr(&pod("False", Some("10.0.0.1")), 9092), None);
        assert_eq!(ready_addr(&pod("True", None), 9092), None);
        // The controller-manager's mark after an outage: the Ready condition alone flipped.
        let mut marked = pod("False", Some("10.0.0.2"));
        marked.status.as_mut().unwrap().container_statuses = Some(vec![
            serde_json::from_value(
                serde_json::json!({"name": "s", "image": "x", "imageID": "", "restartCount": 0,
                "ready": true, "state": {"running": {}}}),
            )
            .unwrap(),
        ]);
        assert_eq!(
            ready_addr(&marked, 9092),
            Some("10.0.0.2:9092".parse().unwrap())
        );
        assert_eq!(ready_addr(&pod("True", Some("not-an-ip")), 9092), None);
    }
}
