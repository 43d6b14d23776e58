//! Helpers shared by the node tests (`#[path]`-included, not a test target of its own).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

pub async fn send(
    client: &HttpClient,
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Answer, hyper_util::client::legacy::Error> {
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Ok(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

pub async fn get(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
) -> Result<Answer, hyper_util::client::legacy::Error> {
    send(client, "GET", addr, path, &[], "").await
}

/// Whether a fresh TCP connection to `addr` is refused (nothing listening).
pub async fn refused(addr: SocketAddr) -> bool {
    matches!(
        tokio::net::TcpStream::connect(addr).await,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// Upper bound for anything a test awaits, so a broken build fails instead of hanging.
pub const LIMIT: Duration = Duration::from_secs(30);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kubesim=info".into()),
        )
        .with_test_writer()
        .try_init();
}
