//! The directory port (`crds::directory`): every replica, leader or standby, answers Host and
//! revision lookups from its caches, so an activator that cannot reach the API server still
//! routes a warm revision it has never seen; and a starting activator's memberships, so its
//! start does not make the API server scan every subset. GET (or HEAD) only; a path is parsed strictly and
//! anything else is answered with a status and a short reason, never looked up.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use crds::ActivationEndpoints;
use crds::directory::{BadQuery, DirectoryQuery, MembersAnswer};
use crds::member_stream::Held;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};

use crate::cluster::caches::Caches;
use crate::cluster::member_stream::{self, MemberHub, StreamAccess, SyncSource, serve::Body};

/// What a lookup reads: the replica's caches (a trait so the answers are tested without a
/// cluster).
pub trait Lookup: SyncSource + Send + Sync + 'static {
    fn answer(&self, q: &DirectoryQuery) -> Option<crds::directory::DirectoryAnswer>;
    /// A node's memberships (`crds::directory::MembersAnswer`), or why this replica cannot
    /// answer them.
    fn members(&self, node: &str) -> Result<MembersAnswer, &'static str>;
    /// The subsets carrying a host's label (`crds::directory::HOST_CLAIMS_PATH`).
    fn host_claims(&self, host: &str) -> Result<MembersAnswer, &'static str>;
    /// The membership streams open on this replica.
    fn hub(&self) -> &Arc<MemberHub>;
}

impl SyncSource for Caches {
    fn synced(&self) -> bool {
        self.is_synced()
    }
    fn member_sync(
        &self,
        node: &str,
        since: Option<u64>,
    ) -> Result<(u64, Vec<Held>, Vec<ActivationEndpoints>), &'static str> {
        Caches::member_sync(self, node, since)
    }
}

impl Lookup for Caches {
    fn answer(&self, q: &DirectoryQuery) -> Option<crds::directory::DirectoryAnswer> {
        self.directory(q)
    }
    fn members(&self, node: &str) -> Result<MembersAnswer, &'static str> {
        Caches::members(self, node)
    }
    fn host_claims(&self, host: &str) -> Result<MembersAnswer, &'static str> {
        Caches::host_claims(self, host)
    }
    fn hub(&self) -> &Arc<MemberHub> {
        &self.hub
    }
}

/// Binds `addr` and serves until the returned task is aborted or the process exits; streams
/// are open to every caller ([`serve_streams`] says to whom).
pub async fn serve<L: Lookup>(
    addr: SocketAddr,
    lookup: Arc<L>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_streams(addr, lookup, StreamAccess::default()).await
}

/// [`serve`], with membership streams answered as `access` says.
pub async fn serve_streams<L: Lookup>(
    addr: SocketAddr,
    lookup: Arc<L>,
    access: StreamAccess,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let access = Arc::new(access);
    crate::cluster::admin::serve_with("directory", addr, move |req, _peer| {
        let (lookup, access) = (Arc::clone(&lookup), Arc::clone(&access));
        async move { respond(req, &*lookup, &access).await }
    })
    .await
}

/// The answer to one request: a stream, or a lookup's whole answer.
async fn respond<B>(req: Request<B>, lookup: &dyn Lookup, access: &StreamAccess) -> Response<Body> {
    let (path, query) = (req.uri().path(), req.uri().query());
    match crds::member_stream::parse_stream(path, query) {
        Some(_) if req.method() != Method::GET => {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
            r.headers_mut()
                .insert(hyper::header::ALLOW, "GET".parse().expect("static"));
            r.map(whole)
        }
        Some(Err(e)) => text(StatusCode::BAD_REQUEST, format!("{e}\n")).map(whole),
        Some(Ok(q)) => {
            member_stream::serve::respond(q, req.headers(), lookup, lookup.hub(), access).await
        }
        None => answer(req.method(), path, lookup).map(whole),
    }
}

fn whole(b: Full<Bytes>) -> Body {
    b.map_err(|never| match never {}).boxed_unsync()
}

/// The answer to one request.
pub fn answer(method: &Method, path: &str, lookup: &dyn Lookup) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
        r.headers_mut()
            .insert(hyper::header::ALLOW, "GET, HEAD".parse().expect("static"));
        return r;
    }
    if let Some(node) = crds::directory::parse_members(path) {
        return match node {
            Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            Ok(_) if !lookup.synced() => unsynced(),
            Ok(node) => match lookup.members(&node) {
                Ok(m) => json(&m),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            },
        };
    }
    if let Some(host) = crds::directory::parse_host_claims(path) {
        return match host {
            Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            Ok(_) if !lookup.synced() => unsynced(),
            Ok(host) => match lookup.host_claims(&host) {
                Ok(m) => json(&m),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            },
        };
    }
    let q = match DirectoryQuery::parse(path) {
        Ok(q) => q,
        Err(e @ BadQuery::UnknownPath) => return text(StatusCode::NOT_FOUND, format!("{e}\n")),
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    if !lookup.synced() {
        return unsynced();
    }
    let Some(found) = lookup.answer(&q) else {
        let what = match &q {
            DirectoryQuery::Host(h) => format!("no revision serves host {h}\n"),
            DirectoryQuery::Revision { namespace, name } => {
                format!("no revision {namespace}/{name}\n")
            }
        };
        return text(StatusCode::NOT_FOUND, what);
    };
    json(&found)
}

fn unsynced() -> Response<Full<Bytes>> {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "caches not synced: the API server has not answered the first lists\n".into(),
    )
}

fn json(found: &impl serde::Serialize) -> Response<Full<Bytes>> {
    match serde_json::to_vec(found) {
        Ok(body) => {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding: {e}\n"),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::directory::DirectoryAnswer;
    use crds::{ActivationEndpoints, Revision};
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Fixed {
        synced: bool,
        hub: Arc<MemberHub>,
    }

    fn fixed(synced: bool) -> Fixed {
        Fixed {
            synced,
            hub: MemberHub::new(Arc::default()),
        }
    }

    fn member(name: &str, rv: &str, node: &str) -> ActivationEndpoints {
        let mut a = ActivationEndpoints::new(name, Default::default());
        a.metadata.namespace = Some("ns".into());
        a.metadata.resource_version = Some(rv.into());
        a.metadata.labels = Some([(crds::contract::member_label(node), "true".into())].into());
        a
    }

    impl SyncSource for Fixed {
        fn synced(&self) -> bool {
            self.synced
        }
        fn member_sync(
            &self,
            node: &str,
            since: Option<u64>,
        ) -> Result<(u64, Vec<Held>, Vec<ActivationEndpoints>), &'static str> {
            if node != "n1" {
                return Err("no numeric resourceVersion seen yet");
            }
            let all = [member("a", "40", "n1"), member("b", "42", "n1")];
            let held = all
                .iter()
                .map(|o| Held {
                    namespace: "ns".into(),
                    name: o.metadata.name.clone().unwrap(),
                    resource_version: o.metadata.resource_version.clone().unwrap(),
                })
                .collect();
            let newer = all
                .into_iter()
                .filter(|o| {
                    since.is_none_or(|s| {
                        o.metadata
                            .resource_version
                            .as_deref()
                            .unwrap()
                            .parse::<u64>()
                            .unwrap()
                            > s
                    })
                })
                .collect();
            Ok((42.max(self.hub.version()), held, newer))
        }
    }

    fn revision() -> Revision {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "local-activator.dev/v1alpha1",
            "kind": "Revision",
            "metadata": {"name": "app", "namespace": "ns"},
            "spec": {"hosts": ["app.example"], "port": 8080,
                     "template": {"spec": {"containers": [{"name": "app", "image": "x"}]}}}
        }))
        .expect("a valid Revision")
    }

    impl Lookup for Fixed {
        fn hub(&self) -> &Arc<MemberHub> {
            &self.hub
        }
        fn host_claims(&self, host: &str) -> Result<MembersAnswer, &'static str> {
            let mut a = member("app", "42", "n1");
            a.metadata
                .labels
                .get_or_insert_default()
                .insert(crds::contract::host_label(host), String::new());
            Ok(MembersAnswer {
                resource_version: "42".into(),
                items: if host == "app.example" {
                    vec![a]
                } else {
                    vec![]
                },
            })
        }
        fn answer(&self, q: &DirectoryQuery) -> Option<DirectoryAnswer> {
            let hit = match q {
                DirectoryQuery::Host(h) => h == "app.example",
                DirectoryQuery::Revision { namespace, name } => namespace == "ns" && name == "app",
            };
            hit.then(|| DirectoryAnswer {
                revision: revision(),
                endpoints: Some(ActivationEndpoints::new("app", Default::default())),
            })
        }
        fn members(&self, node: &str) -> Result<MembersAnswer, &'static str> {
            match node {
                "n1" => Ok(MembersAnswer {
                    resource_version: "42".into(),
                    items: vec![ActivationEndpoints::new("app", Default::default())],
                }),
                _ => Err("no numeric resourceVersion seen yet"),
            }
        }
    }

    #[tokio::test]
    async fn answers_a_nodes_members_or_why_not() {
        let l = fixed(true);
        let r = answer(&Method::GET, "/v1/members/n1", &l);
        assert_eq!(r.status(), StatusCode::OK);
        let got: MembersAnswer = serde_json::from_slice(&body(r).await).expect("json");
        assert_eq!((got.resource_version.as_str(), got.items.len()), ("42", 1));
        let r = answer(&Method::GET, "/v1/members/n2", &l);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(body(r).await.starts_with(b"no numeric resourceVersion"));
        for bad in ["/v1/members/", "/v1/members/N1", "/v1/members/a/b"] {
            assert_eq!(
                answer(&Method::GET, bad, &l).status(),
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        let cold = fixed(false);
        assert_eq!(
            answer(&Method::GET, "/v1/members/n1", &cold).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    async fn body(r: Response<Full<Bytes>>) -> Bytes {
        r.into_body().collect().await.expect("full body").to_bytes()
    }

    #[tokio::test]
    async fn answers_hosts_and_revisions_from_the_caches() {
        let l = fixed(true);
        for path in ["/v1/hosts/APP.example:80", "/v1/revisions/ns/app"] {
            let r = answer(&Method::GET, path, &l);
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            let got: DirectoryAnswer = serde_json::from_slice(&body(r).await).expect("json");
            assert_eq!(got.revision, revision());
            assert!(got.endpoints.is_some());
        }
        let r = answer(&Method::GET, "/v1/host-claims/App.Example", &l);
        assert_eq!(r.status(), StatusCode::OK);
        let got: MembersAnswer = serde_json::from_slice(&body(r).await).expect("json");
        assert_eq!(got.items.len(), 1);
        assert_eq!(
            answer(&Method::GET, "/v1/host-claims/a_b", &l).status(),
            StatusCode::BAD_REQUEST
        );
        let miss = answer(&Method::GET, "/v1/hosts/other.example", &l);
        assert_eq!(miss.status(), StatusCode::NOT_FOUND);
        assert!(body(miss).await.starts_with(b"no revision serves host"));
    }

    #[tokio::test]
    async fn refuses_what_is_not_a_lookup() {
        let l = fixed(true);
        let cases = [
            (
                Method::POST,
                "/v1/hosts/app.example",
                StatusCode::METHOD_NOT_ALLOWED,
            ),
            (Method::GET, "/v1/hosts/a_b", StatusCode::BAD_REQUEST),
            (Method::GET, "/v1/revisions/ns", StatusCode::BAD_REQUEST),
            (Method::GET, "/v1/revisions/NS/app", StatusCode::BAD_REQUEST),
            (Method::GET, "/", StatusCode::NOT_FOUND),
            (Method::GET, "/v1/hosts/../../etc", StatusCode::BAD_REQUEST),
        ];
        for (m, p, want) in cases {
            assert_eq!(answer(&m, p, &l).status(), want, "{m} {p}");
        }
        let cold = fixed(false);
        assert_eq!(
            answer(&Method::GET, "/v1/hosts/app.example", &cold).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    /// Over a real socket: hostile bytes get an HTTP error or a closed connection, and the
    /// server keeps answering lookups after them.
    #[tokio::test]
    async fn survives_hostile_bytes() {
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), Arc::new(fixed(true)))
            .await
            .expect("bind");
        let hostile: [&[u8]; 4] = [
            b"GET /v1/hosts/app.example HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"GET /v1/hosts/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
            b"\x00\x01\x02garbage\r\n\r\n",
            b"GET /v1/hosts/app.example HTTP/1.1\nHost: x\nConnection: close\n\n",
        ];
        for bytes in hostile {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(bytes).await.expect("write");
            let mut out = Vec::new();
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out))
                    .await;
            assert!(
                out.is_empty()
                    || out.starts_with(b"HTTP/1.1 4")
                    || out.starts_with(b"HTTP/1.1 200"),
                "{:?} -> {:?}",
                String::from_utf8_lossy(bytes),
                String::from_utf8_lossy(&out)
            );
        }
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /v1/revisions/ns/app HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&out)
        );
        task.abort();
    }

    /// Reads one line of a raw HTTP/1.1 response's chunked body (the test sends one frame
    /// per chunk or more): good enough to see frames arrive in order.
    async fn line(r: &mut tokio::io::BufReader<tokio::net::TcpStream>) -> String {
        use tokio::io::AsyncBufReadExt;
        loop {
            let mut l = String::new();
            let n = tokio::time::timeout(std::time::Duration::from_secs(10), r.read_line(&mut l))
                .await
                .expect("a line in time")
                .expect("read");
            assert!(n > 0, "the stream ended");
            if l.starts_with('{') {
                return l;
            }
        }
    }

    async fn open(
        addr: SocketAddr,
        path: &str,
        extra: &str,
    ) -> tokio::io::BufReader<tokio::net::TcpStream> {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: d\r\n{extra}\r\n").as_bytes())
            .await
            .expect("write");
        tokio::io::BufReader::new(s)
    }

    /// Over a real socket: a first state, then each change to the node, then bookmarks; a
    /// resume gets only what is newer; no proof, no stream.
    #[tokio::test]
    async fn streams_a_nodes_memberships() {
        let lookup = Arc::new(fixed(true));
        let access = StreamAccess {
            secret: Some(Arc::from(&b"s3cret"[..])),
            bookmark: std::time::Duration::from_millis(200),
            ..StreamAccess::default()
        };
        let (addr, task) = serve_streams("127.0.0.1:0".parse().unwrap(), lookup.clone(), access)
            .await
            .expect("bind");
        let proof = "Authorization: Bearer s3cret\r\n";
        let label = crds::contract::member_label("n1");
        let mut r = open(addr, "/v1/member-stream/n1", proof).await;
        let first = line(&mut r).await;
        match crds::member_stream::Frame::read(first.trim_end().as_bytes(), &label) {
            Ok(crds::member_stream::Frame::Sync {
                resource_version,
                held,
                items,
            }) => {
                assert_eq!(
                    (resource_version.as_str(), held.len(), items.len()),
                    ("42", 2, 2)
                );
            }
            other => panic!("{other:?}"),
        }
        let l: Arc<str> = Arc::from(label.as_str());
        let key = crds::ObjectKey::new("ns", "c");
        // Not newer than the first state: not sent again.
        lookup.hub.changed(
            41,
            &key,
            Some(&member("c", "41", "n1")),
            &[],
            std::slice::from_ref(&l),
        );
        lookup.hub.changed(
            43,
            &key,
            Some(&member("c", "43", "n1")),
            &[],
            std::slice::from_ref(&l),
        );
        lookup.hub.advance(43);
        let next = line(&mut r).await;
        assert!(
            next.contains(r#""type":"APPLY""#) && next.contains(r#""resourceVersion":"43""#),
            "{next}"
        );
        let beat = line(&mut r).await;
        assert_eq!(
            beat.trim_end(),
            r#"{"type":"BOOKMARK","resourceVersion":"43"}"#
        );
        // A resume from 41 gets b (42) only, and names both.
        let mut r2 = open(addr, "/v1/member-stream/n1?since=41", proof).await;
        let sync = line(&mut r2).await;
        match crds::member_stream::Frame::read(sync.trim_end().as_bytes(), &label) {
            Ok(crds::member_stream::Frame::Sync { held, items, .. }) => {
                assert_eq!((held.len(), items.len()), (2, 1));
            }
            other => panic!("{other:?}"),
        }
        // Ahead of this replica: sent elsewhere.
        let mut ahead = open(addr, "/v1/member-stream/n1?since=99", proof).await;
        let mut head = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut ahead, &mut head)
            .await
            .unwrap();
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        for (path, extra, want) in [
            ("/v1/member-stream/n1", "", "HTTP/1.1 401"),
            (
                "/v1/member-stream/n1",
                "Authorization: Bearer nope\r\n",
                "HTTP/1.1 401",
            ),
            ("/v1/member-stream/N1", proof, "HTTP/1.1 400"),
            ("/v1/member-stream/n1?since=x", proof, "HTTP/1.1 400"),
        ] {
            let mut c = open(addr, path, extra).await;
            let mut head = String::new();
            tokio::io::AsyncBufReadExt::read_line(&mut c, &mut head)
                .await
                .unwrap();
            assert!(head.starts_with(want), "{path} {extra:?}: {head}");
        }
        assert_eq!(lookup.hub.streams(), 2);
        drop((r, r2));
        // The server notices the closed connections at its next write (a bookmark).
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            lookup.hub.alive_at_most(0),
        )
        .await
        .expect("closed streams leave the hub");
        assert_eq!(lookup.hub.streams(), 0, "closed streams leave the hub");
        task.abort();
    }
}
