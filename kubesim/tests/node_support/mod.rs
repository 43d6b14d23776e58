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

use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar, Namespace, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::wait::{Condition, await_condition};

pub async fn ensure_namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// A pod bound to `node` (as the activator creates them: no scheduler involved).
pub fn pod(name: &str, node: &str, port: Option<i32>, env: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("example.com/app:1".into()),
                ports: port.map(|p| {
                    vec![ContainerPort {
                        container_port: p,
                        ..Default::default()
                    }]
                }),
                env: Some(
                    env.iter()
                        .map(|(k, v)| EnvVar {
                            name: (*k).into(),
                            value: Some((*v).into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

pub fn pod_condition(pod: &Pod, type_: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

pub fn node_condition(node: &Node, type_: &str) -> Option<(String, Option<String>)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

pub fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key && t.effect == effect))
}

pub fn is_pod_ready() -> impl Condition<Pod> {
    |p: Option<&Pod>| p.is_some_and(|p| pod_condition(p, "Ready").as_deref() == Some("True"))
}

/// Waits (event-driven, via a watch) until `cond` holds for the object, at most [`LIMIT`].
pub async fn wait_for<K>(api: &Api<K>, name: &str, cond: impl Condition<K>) -> Option<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::time::timeout(LIMIT, await_condition(api.clone(), name, cond))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {name}"))
        .expect("watch failed")
}
