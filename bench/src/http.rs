//! A minimal HTTP/1.1 client over one keep-alive connection (hyper's connection API), for the
//! load generator, the cold requests and the activator's admin port.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::Error;

/// Headers that name a revision, as an ingress sets them (the contracts, docs/architecture.md).
pub fn revision_headers(namespace: &str, name: &str) -> Vec<(String, String)> {
    vec![
        (
            crds::contract::HEADER_REVISION_NAMESPACE.to_string(),
            namespace.to_string(),
        ),
        (
            crds::contract::HEADER_REVISION_NAME.to_string(),
            name.to_string(),
        ),
    ]
}

/// One answer, body read in full.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// One HTTP/1.1 connection that requests are sent on one after another.
pub struct Conn {
    target: SocketAddr,
    sender: http1::SendRequest<Empty<Bytes>>,
    headers: Vec<(String, String)>,
}

impl Conn {
    /// Connects (TCP_NODELAY) and performs the HTTP/1.1 handshake; the connection is driven
    /// by a task of the current runtime.
    pub async fn connect(target: SocketAddr, headers: &[(String, String)]) -> Result<Self, Error> {
        let err = |m: String| Error::Http {
            target: target.to_string(),
            message: m,
        };
        let stream = TcpStream::connect(target)
            .await
            .map_err(|e| err(format!("connect: {e}")))?;
        stream.set_nodelay(true).map_err(|e| err(e.to_string()))?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| err(format!("handshake: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self {
            target,
            sender,
            headers: headers.to_vec(),
        })
    }

    /// GET `path`, reading the whole answer.
    pub async fn get(&mut self, path: &str) -> Result<Reply, Error> {
        let err = |m: String| Error::Http {
            target: self.target.to_string(),
            message: m,
        };
        let mut req = Request::get(path).header(http::header::HOST, self.target.to_string());
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let req = req.body(Empty::new()).map_err(|e| err(e.to_string()))?;
        self.sender
            .ready()
            .await
            .map_err(|e| err(format!("connection: {e}")))?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| err(format!("request: {e}")))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| err(format!("body: {e}")))?
            .to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

/// One GET on a new connection, bounded by `limit`.
pub async fn get(
    target: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    limit: Duration,
) -> Result<Reply, Error> {
    let once = async {
        let mut c = Conn::connect(target, headers).await?;
        c.get(path).await
    };
    tokio::time::timeout(limit, once)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("GET http://{target}{path}"),
            secs: limit.as_secs(),
        })?
}
