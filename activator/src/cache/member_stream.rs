//! This node's memberships streamed from a directory replica (`crds::member_stream`), not
//! watched on the API server: the API server then offers no membership write to any
//! activator (docs/member-stream.md).
//!
//! One stream to one replica at a time, chosen at random, resumed from the newest version
//! held (on another replica when this one goes), given up after a maximum age so that the
//! replicas share the activators again after one was away. Each sync is held to what this
//! node holds: a replica behind it is not taken, and a sync that does not agree with the
//! copies held asks for a first state. With no replica reachable the memberships held keep
//! serving; only after [`Tuning::fallback_after`] (jittered over a wide window, so that
//! 5,000 nodes never go together) does the API server's watch take over, counted, until a
//! replica answers again.
//!
//! The stream's events are the watch's: a first state as `Init`, `InitApply`s and
//! `InitDone`; later states as `Apply`s and `Delete`s of what changed. So the reflector and
//! `endpoints.rs` downstream do not know where the memberships come from.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use crds::ActivationEndpoints;
use crds::member_stream::{Frame, MAX_FRAME_BYTES, StreamError, key_of, resync, stream_path};
use futures::StreamExt;
use futures::stream::BoxStream;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use kube::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::directory::Directory;

/// A replica's answer that it never streams (it watches one namespace): the watch at once.
const NOT_SERVED: &str = "this replica does not stream memberships (it watches one namespace)";

/// While the API server's watch stands in, how often a replica is asked again, and how long
/// that one try may take (the watch's events wait meanwhile).
const PROBE_EVERY: Duration = Duration::from_secs(10);
const PROBE_LIMIT: Duration = Duration::from_secs(2);

/// The membership events, as the watch gives them.
pub type Events = BoxStream<'static, Result<Event<ActivationEndpoints>, watcher::Error>>;

/// How a stream lives.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// A stream is given up this long after it opened (±25 %), and resumed from its version
    /// on a replica drawn again.
    pub max_age: Duration,
    /// No frame for this long (a replica beats every 10 s): the stream is taken for dead.
    pub idle: Duration,
    /// How long no replica may answer before the API server's watch takes over: this plus a
    /// uniform draw of up to `fallback_spread`.
    pub fallback_after: Duration,
    pub fallback_spread: Duration,
    /// The same bound before a first state (the activator not Ready yet, its start
    /// waiting): a start is paced by the DaemonSet's rollout, not a moment all nodes share.
    pub start_fallback_after: Duration,
    pub start_fallback_spread: Duration,
    /// The first wait after a failure, doubling (jittered) to `retry_cap`.
    pub retry_first: Duration,
    pub retry_cap: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(600),
            idle: Duration::from_secs(35),
            fallback_after: Duration::from_secs(120),
            fallback_spread: Duration::from_secs(600),
            start_fallback_after: Duration::from_secs(10),
            start_fallback_spread: Duration::from_secs(20),
            retry_first: Duration::from_millis(200),
            retry_cap: Duration::from_secs(10),
        }
    }
}

/// What the stream counts (registered in the activator's metrics).
pub use crate::ops::metrics::DirectoryCounters as StreamCounters;

/// What the stream needs.
pub struct Source {
    pub node: String,
    pub directory: Directory,
    /// `Bearer <hop secret>`, the proof a replica asks of an activator.
    pub proof: Option<http::HeaderValue>,
    /// This node's memberships as the reflector holds them: what a resume is checked against.
    pub held: Store<ActivationEndpoints>,
    /// The fallback's watch.
    pub api: Api<ActivationEndpoints>,
    pub fallback: watcher::Config,
    /// Told the host labels of each [`Frame::Hosts`].
    pub hosts_moved: Option<tokio::sync::mpsc::UnboundedSender<Vec<String>>>,
    pub tuning: Tuning,
    pub counters: StreamCounters,
}

/// The memberships as events, from streams (or the bounded fallback).
pub fn events(source: Source) -> Events {
    let m = Machine {
        label: crds::contract::member_label(&source.node),
        pending: Default::default(),
        version: None,
        started: false,
        reading: None,
        unreachable_since: None,
        fallback_at: None,
        api_watch: None,
        retry: crds::backoff::WatchBackoff::new(source.tuning.retry_first, source.tuning.retry_cap),
        last_failed: None,
        next_probe: Instant::now(),
        source,
    };
    futures::stream::unfold(m, |mut m| async move {
        let item = m.next().await;
        Some((item, m))
    })
    .boxed()
}

/// An open stream.
struct Reading {
    body: hyper::body::Incoming,
    buf: BytesMut,
    until: Instant,
    conn: tokio::task::JoinHandle<()>,
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

struct Machine {
    source: Source,
    label: String,
    pending: std::collections::VecDeque<Event<ActivationEndpoints>>,
    /// The newest version whose changes are all held.
    version: Option<u64>,
    /// Whether a first state was given (a later sync gives only what changed).
    started: bool,
    reading: Option<Reading>,
    /// Since when no replica has answered, and when the fallback begins.
    unreachable_since: Option<Instant>,
    fallback_at: Option<Instant>,
    api_watch: Option<BoxStream<'static, Result<Event<ActivationEndpoints>, watcher::Error>>>,
    retry: crds::backoff::WatchBackoff,
    last_failed: Option<SocketAddr>,
    /// While the watch stands in: when a replica is asked again.
    next_probe: Instant,
}

/// What reading a stream gave.
enum Read {
    Frame(Frame),
    /// The stream ended (its age, or the replica closed it): resume at once.
    Ended,
    Failed(String),
}

impl Machine {
    async fn next(&mut self) -> Result<Event<ActivationEndpoints>, watcher::Error> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Ok(ev);
            }
            if self.reading.is_none() {
                if let Some(item) = self.open_or_fall_back().await {
                    return item;
                }
                continue;
            }
            let read = match self.read().await {
                Read::Frame(f) => match self.take(f) {
                    Ok(()) => continue,
                    Err(e) => Read::Failed(e),
                },
                other => other,
            };
            match read {
                Read::Frame(_) => {}
                Read::Ended => self.reading = None,
                Read::Failed(e) => {
                    self.source.counters.failed.inc();
                    debug!(error = %e, "membership stream failed; resuming elsewhere");
                    self.reading = None;
                    tokio::time::sleep(self.retry.next_wait()).await;
                }
            }
        }
    }

    /// Opens a stream; while none opens, waits (or, past the bound, follows the API
    /// server's watch, whose items are returned, asking a replica again every
    /// [`PROBE_EVERY`]).
    async fn open_or_fall_back(
        &mut self,
    ) -> Option<Result<Event<ActivationEndpoints>, watcher::Error>> {
        if let Some(w) = &mut self.api_watch
            && Instant::now() < self.next_probe
        {
            return match tokio::time::timeout_at(self.next_probe, w.next()).await {
                Ok(Some(item)) => {
                    // Its first state given, a stream afterwards gives only what changed.
                    if matches!(item, Ok(Event::InitDone)) {
                        self.started = true;
                    }
                    Some(item)
                }
                Ok(None) => {
                    self.api_watch = None;
                    None
                }
                Err(_) => None,
            };
        }
        let limit = if self.api_watch.is_some() {
            PROBE_LIMIT
        } else {
            self.source.tuning.idle
        };
        self.next_probe = Instant::now() + PROBE_EVERY;
        let not_served = match self.open(limit).await {
            Ok(r) => {
                if self.api_watch.take().is_some() {
                    info!("a directory replica answers again: memberships streamed, not watched");
                }
                self.source.counters.opened.inc();
                self.unreachable_since = None;
                self.fallback_at = None;
                self.reading = Some(r);
                return None;
            }
            Err(e) => {
                self.source.counters.failed.inc();
                debug!(error = %e, "no membership stream");
                e.ends_with(NOT_SERVED)
            }
        };
        if self.fall_back_if_due(not_served) {
            return None;
        }
        if self.api_watch.is_none() {
            tokio::time::sleep(self.retry.next_wait()).await;
        }
        None
    }

    /// Starts the API server's watch once no replica has streamed for the bound (at once for
    /// a replica that never streams); true when it just started.
    fn fall_back_if_due(&mut self, not_served: bool) -> bool {
        let now = Instant::now();
        let since = *self.unreachable_since.get_or_insert(now);
        let t = &self.source.tuning;
        // Before a first state the activator is not Ready: its start waits a shorter bound
        // (a DaemonSet rollout paces starts), one already serving the long one. A replica
        // that never streams is the configuration, not an outage: the watch at once.
        let (after, spread) = if not_served {
            (Duration::ZERO, Duration::ZERO)
        } else if self.started {
            (t.fallback_after, t.fallback_spread)
        } else {
            (t.start_fallback_after, t.start_fallback_spread)
        };
        let at = *self.fallback_at.get_or_insert_with(|| {
            let spread = spread.as_millis() as u64;
            since + after + Duration::from_millis(rand::random_range(0..=spread))
        });
        if now >= at && self.api_watch.is_none() {
            warn!("no directory replica streams memberships: the API server's watch takes over");
            self.source.counters.fallbacks.inc();
            // With the same bounded back-off as every other watch (crds::backoff): through an
            // API server outage it retries about once a second, not at once.
            self.api_watch = Some(
                crds::backoff::resilient(watcher::watcher(
                    self.source.api.clone(),
                    self.source.fallback.clone(),
                ))
                .boxed(),
            );
            // Its list replaces the held state: a stream afterwards starts from a first state.
            self.version = None;
            self.next_probe = Instant::now() + PROBE_EVERY;
            return true;
        }
        false
    }

    /// A replica drawn at random (not the one that failed last, when there are others).
    async fn open(&mut self, limit: Duration) -> Result<Reading, String> {
        let replicas = self.source.directory.replicas();
        let choices: Vec<_> = replicas
            .iter()
            .filter(|a| replicas.len() == 1 || Some(**a) != self.last_failed)
            .collect();
        let Some(&&addr) = choices.get(rand::random_range(0..choices.len().max(1))) else {
            return Err("no directory replica is known".into());
        };
        let path = stream_path(&self.source.node, self.version);
        let (proof, max_age) = (self.source.proof.clone(), self.source.tuning.max_age);
        let opened = connect(addr, path, proof, max_age);
        match tokio::time::timeout(limit, opened).await {
            Ok(Ok(r)) => {
                debug!(replica = %addr, version = ?self.version, "membership stream opened");
                Ok(r)
            }
            Ok(Err(e)) => {
                self.last_failed = Some(addr);
                Err(format!("{addr}: {e}"))
            }
            Err(_) => {
                self.last_failed = Some(addr);
                Err(format!(
                    "{addr}: no answer within {:?}",
                    self.source.tuning.idle
                ))
            }
        }
    }

    /// The next frame of the open stream.
    async fn read(&mut self) -> Read {
        let idle = self.source.tuning.idle;
        let Some(r) = self.reading.as_mut() else {
            return Read::Ended;
        };
        loop {
            if let Some(at) = r.buf.iter().position(|b| *b == b'\n') {
                let line = r.buf.split_to(at + 1);
                return match Frame::read(&line[..at], &self.label) {
                    Ok(f) => Read::Frame(f),
                    Err(e) => Read::Failed(e.to_string()),
                };
            }
            if r.buf.len() > MAX_FRAME_BYTES {
                return Read::Failed(format!("a frame over {MAX_FRAME_BYTES} bytes"));
            }
            let deadline = r.until.min(Instant::now() + idle);
            match tokio::time::timeout_at(deadline, r.body.frame()).await {
                Err(_) if Instant::now() >= r.until => return Read::Ended,
                Err(_) => return Read::Failed(format!("nothing for {idle:?}")),
                Ok(None) => return Read::Ended,
                Ok(Some(Err(e))) => return Read::Failed(format!("reading: {e}")),
                Ok(Some(Ok(frame))) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            r.buf.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                }
            }
        }
    }

    /// Takes one frame: events for what it changes, and the version it brings. Err: the
    /// stream is not to be read on (a sync behind what is held, or refused).
    fn take(&mut self, f: Frame) -> Result<(), String> {
        let newer = |v: u64, held: Option<u64>| held.is_none_or(|h| v > h);
        match f {
            Frame::Sync {
                resource_version,
                held,
                items,
            } => {
                let at =
                    crds::member_stream::version(&resource_version).map_err(|e| e.to_string())?;
                if let Some(held) = self.version
                    && at < held
                {
                    // Older than what is held: not taken; another replica is asked.
                    return Err(format!("a sync at {at}, behind the {held} held"));
                }
                let now: BTreeMap<_, _> = self
                    .source
                    .held
                    .state()
                    .iter()
                    .map(|o| (key_of(o), (**o).clone()))
                    .collect();
                match resync(&now, held, items) {
                    Ok(state) => self.replace(now, state, at),
                    Err(e @ StreamError::Missing(_)) => {
                        info!(error = %e, "membership sync disagrees with the copies held: a first state");
                        self.source.counters.doubted.inc();
                        self.version = None;
                        self.reading = None;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Frame::Apply { object } => {
                let v = rv(&object);
                if newer(v, self.version) {
                    self.version = Some(v);
                    self.pending.push_back(Event::Apply(*object));
                }
            }
            Frame::Left {
                namespace,
                name,
                resource_version,
            } => {
                let v =
                    crds::member_stream::version(&resource_version).map_err(|e| e.to_string())?;
                if newer(v, self.version) {
                    self.version = Some(v);
                    let mut gone = ActivationEndpoints::new(&name, Default::default());
                    gone.metadata.namespace = Some(namespace);
                    gone.metadata.resource_version = Some(resource_version);
                    self.pending.push_back(Event::Delete(gone));
                }
            }
            Frame::Hosts {
                resource_version,
                labels,
            } => {
                if let Some(tx) = &self.source.hosts_moved {
                    let _ = tx.send(labels);
                }
                self.bookmark(&resource_version);
            }
            Frame::Bookmark { resource_version } => self.bookmark(&resource_version),
        }
        Ok(())
    }

    fn bookmark(&mut self, v: &str) {
        if let Ok(v) = crds::member_stream::version(v) {
            self.version = Some(self.version.map_or(v, |h| h.max(v)));
        }
    }

    /// The state a sync gave, as events: a first state whole, a later one as its changes.
    fn replace(
        &mut self,
        now: BTreeMap<crds::ObjectKey, ActivationEndpoints>,
        state: Vec<ActivationEndpoints>,
        at: u64,
    ) {
        self.version = Some(at);
        self.retry = crds::backoff::WatchBackoff::new(
            self.source.tuning.retry_first,
            self.source.tuning.retry_cap,
        );
        if !self.started {
            self.started = true;
            info!(
                subsets = state.len(),
                resource_version = at,
                "memberships streamed from the directory"
            );
            self.pending.push_back(Event::Init);
            self.pending.extend(state.into_iter().map(Event::InitApply));
            self.pending.push_back(Event::InitDone);
            return;
        }
        let mut gone = now;
        for o in state {
            let same = gone
                .remove(&key_of(&o))
                .is_some_and(|h| h.metadata.resource_version == o.metadata.resource_version);
            if !same {
                self.pending.push_back(Event::Apply(o));
            }
        }
        self.pending.extend(gone.into_values().map(Event::Delete));
    }
}

/// Opens `path` on the replica at `addr`: a stream, given up after about `max_age`.
async fn connect(
    addr: SocketAddr,
    path: String,
    proof: Option<http::HeaderValue>,
    max_age: Duration,
) -> Result<Reading, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::get(path).header(http::header::HOST, addr.to_string());
    if let Some(p) = proof {
        req = req.header(http::header::AUTHORIZATION, p);
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("request: {e}"))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    if resp.status() == http::StatusCode::NOT_IMPLEMENTED {
        return Err(NOT_SERVED.into());
    }
    if resp.status() != http::StatusCode::OK {
        return Err(format!("answered {}", resp.status()));
    }
    let ndjson = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == crds::member_stream::CONTENT_TYPE.as_bytes());
    if !ndjson {
        return Err("not a membership stream".into());
    }
    let age = max_age.mul_f64(0.75 + rand::random::<f64>() * 0.5);
    Ok(Reading {
        body: resp.into_body(),
        buf: BytesMut::new(),
        until: Instant::now() + age,
        conn,
    })
}

fn rv(o: &ActivationEndpoints) -> u64 {
    o.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::member_stream::{Frame, Held};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const NODE: &str = "n1";

    fn ae(name: &str, rv: &str, node: &str) -> ActivationEndpoints {
        let mut a = ActivationEndpoints::new(name, Default::default());
        a.metadata.namespace = Some("ns".into());
        a.metadata.resource_version = Some(rv.into());
        a.metadata.labels = Some([(crds::contract::member_label(node), String::new())].into());
        a
    }

    fn chunked(status: &str, ctype: &str, body: &[u8]) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out.extend_from_slice(b"\r\n");
        out
    }

    fn good_sync() -> Vec<u8> {
        Frame::Sync {
            resource_version: "10".into(),
            held: vec![Held {
                namespace: "ns".into(),
                name: "a".into(),
                resource_version: "9".into(),
            }],
            items: vec![ae("a", "9", NODE)],
        }
        .line()
    }

    /// A replica whose first connection gets `hostile` (then is closed) and every later one
    /// a good first state, the stream kept open.
    async fn replica(hostile: Vec<u8>) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let mut first = true;
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf).await;
                if std::mem::take(&mut first) {
                    let _ = s.write_all(&hostile).await;
                    continue;
                }
                let ok = chunked("200 OK", crds::member_stream::CONTENT_TYPE, &good_sync());
                let _ = s.write_all(&ok).await;
                tokio::spawn(async move {
                    // Kept open, silent: the client's idle limit is far away.
                    let _ = s.read(&mut buf).await;
                });
            }
        });
        addr
    }

    /// The first state a replica streams to `source`, after whatever it sent first.
    async fn first_state(addr: SocketAddr) -> (Vec<ActivationEndpoints>, StreamCounters) {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let directory = Directory::start(
            &super::super::directory::DirectorySource::Static(vec![addr]),
            client.clone(),
            stop,
        )
        .unwrap();
        let (held, _writer) = kube::runtime::reflector::store();
        let counters = StreamCounters::default();
        let source = Source {
            node: NODE.into(),
            directory,
            proof: None,
            held,
            api: Api::all(client),
            fallback: watcher::Config::default(),
            hosts_moved: None,
            tuning: Tuning {
                retry_first: Duration::from_millis(5),
                retry_cap: Duration::from_millis(20),
                ..Tuning::default()
            },
            counters: counters.clone(),
        };
        let mut events = events(source);
        let mut got = Vec::new();
        let all = async {
            while let Some(ev) = events.next().await {
                match ev.expect("no error is passed on") {
                    Event::InitApply(o) => got.push(o),
                    Event::InitDone => return,
                    Event::Init => {}
                    other => panic!("{other:?} before the first state"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .expect("a first state");
        (got, counters)
    }

    /// Hostile answers are failures, nothing of them is taken, and the next stream's state
    /// is.
    #[tokio::test]
    async fn a_hostile_replica_gives_nothing_and_the_next_stream_is_taken() {
        let ndjson = crds::member_stream::CONTENT_TYPE;
        let other_node = Frame::Sync {
            resource_version: "10".into(),
            held: vec![],
            items: vec![ae("x", "9", "n2")],
        }
        .line();
        let huge = vec![b'{'; crds::member_stream::MAX_FRAME_BYTES + 10];
        let hostile: Vec<Vec<u8>> = vec![
            chunked("200 OK", "text/plain", &good_sync()),
            chunked(
                "200 OK",
                ndjson,
                b"{\"type\":\"SYNC\",\"resourceVersion\":\"x\"}\n",
            ),
            chunked("200 OK", ndjson, b"\xff\xfe garbage\n"),
            chunked("200 OK", ndjson, &other_node),
            chunked("200 OK", ndjson, &huge),
            chunked("401 Unauthorized", "text/plain", b"no\n"),
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{".to_vec(),
            b"garbage\r\n\r\n".to_vec(),
        ];
        for (i, h) in hostile.into_iter().enumerate() {
            let (state, counters) = first_state(replica(h).await).await;
            let names: Vec<_> = state.iter().map(|o| o.metadata.name.clone()).collect();
            assert_eq!(names, [Some("a".to_string())], "case {i}");
            assert!(counters.failed.get() >= 1, "case {i}: counted as a failure");
        }
    }
}
