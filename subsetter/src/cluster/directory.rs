//! The directory port (`crds::directory`): every replica, leader or standby, answers Host and
//! revision lookups from its caches, so an activator that cannot reach the API server still
//! routes a warm revision it has never seen; and a starting activator's memberships, so its
//! start does not make the API server scan every subset. GET (or HEAD) only; a path is parsed strictly and
//! anything else is answered with a status and a short reason, never looked up.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use crds::directory::{BadQuery, DirectoryQuery, MembersAnswer};
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};

use crate::cluster::caches::Caches;

/// What a lookup reads: the replica's caches (a trait so the answers are tested without a
/// cluster).
pub trait Lookup: Send + Sync + 'static {
    fn synced(&self) -> bool;
    fn answer(&self, q: &DirectoryQuery) -> Option<crds::directory::DirectoryAnswer>;
    /// A node's memberships (`crds::directory::MembersAnswer`), or why this replica cannot
    /// answer them.
    fn members(&self, node: &str) -> Result<MembersAnswer, &'static str>;
}

impl Lookup for Caches {
    fn synced(&self) -> bool {
        self.is_synced()
    }
    fn answer(&self, q: &DirectoryQuery) -> Option<crds::directory::DirectoryAnswer> {
        self.directory(q)
    }
    fn members(&self, node: &str) -> Result<MembersAnswer, &'static str> {
        Caches::members(self, node)
    }
}

/// Binds `addr` and serves until the returned task is aborted or the process exits.
pub async fn serve<L: Lookup>(
    addr: SocketAddr,
    lookup: Arc<L>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    crate::cluster::admin::serve_plain("directory", addr, move |req| {
        answer(req.method(), req.uri().path(), &*lookup)
    })
    .await
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
        fn synced(&self) -> bool {
            self.synced
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
        let l = Fixed { synced: true };
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
        let cold = Fixed { synced: false };
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
        let l = Fixed { synced: true };
        for path in ["/v1/hosts/APP.example:80", "/v1/revisions/ns/app"] {
            let r = answer(&Method::GET, path, &l);
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            let got: DirectoryAnswer = serde_json::from_slice(&body(r).await).expect("json");
            assert_eq!(got.revision, revision());
            assert!(got.endpoints.is_some());
        }
        let miss = answer(&Method::GET, "/v1/hosts/other.example", &l);
        assert_eq!(miss.status(), StatusCode::NOT_FOUND);
        assert!(body(miss).await.starts_with(b"no revision serves host"));
    }

    #[tokio::test]
    async fn refuses_what_is_not_a_lookup() {
        let l = Fixed { synced: true };
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
        let cold = Fixed { synced: false };
        assert_eq!(
            answer(&Method::GET, "/v1/hosts/app.example", &cold).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    /// Over a real socket: hostile bytes get an HTTP error or a closed connection, and the
    /// server keeps answering lookups after them.
    #[tokio::test]
    async fn survives_hostile_bytes() {
        let (addr, task) = serve(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Fixed { synced: true }),
        )
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
}
