//! The activator's own readiness check of a starting pod. A pod is usable when the watch says
//! Ready *or* this check passes first: kubelets report readiness late (a status write after
//! their own probe period), so checking ourselves lets the first request in as soon as the
//! app can serve it.
//!
//! The check is the template's `readinessProbe`, run the way the kubelet runs it, so that a
//! pod is never taken before the kubelet would take it:
//! - `httpGet` over HTTP or HTTPS (the kubelet does not check the certificate either): a 2xx
//!   or 3xx status passes ([`http`], [`tls`]);
//! - `grpc`: the standard `grpc.health.v1.Health/Check` answering SERVING ([`grpc`]);
//! - `tcpSocket`, or no probe at all: a connection accepted;
//! - `exec` runs inside the container, which the activator cannot do: such a pod waits for
//!   the watch's Ready, and only a pod that was usable and stopped answering is checked (with
//!   a connect to its serving port) to take it back.

mod grpc;
mod http;
mod tls;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpStream;

pub use grpc::GrpcCheck;
pub use http::HttpCheck;

/// Upper bound on one check (connect, handshake and the answer).
const CHECK_LIMIT: Duration = Duration::from_secs(1);

/// How a pod of one template is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A connection accepted on this port.
    Connect(u16),
    Http(HttpCheck),
    Grpc(GrpcCheck),
    /// An `exec` probe: the watch decides; a connect to this (serving) port re-admits a pod
    /// that stopped answering.
    WatchOnly(u16),
}

impl Check {
    /// The first container's `readinessProbe`, its ports resolved against the container's
    /// (a number, or the name of one of them). A probe whose port does not resolve, or
    /// without a port, is checked with a connect to `serving_port`, as before probes were
    /// followed.
    pub fn of_template(template: &Value, serving_port: u16) -> Self {
        let container = &template["spec"]["containers"][0];
        let probe = &container["readinessProbe"];
        let port = |p: &Value| port_of(container, p);
        let fallback = Self::Connect(serving_port);
        if probe["exec"].is_object() {
            return Self::WatchOnly(serving_port);
        }
        if probe["httpGet"].is_object() {
            return HttpCheck::of_probe(&probe["httpGet"], port).map_or(fallback, Self::Http);
        }
        if probe["grpc"].is_object() {
            return GrpcCheck::of_probe(&probe["grpc"]).map_or(fallback, Self::Grpc);
        }
        if probe["tcpSocket"].is_object() {
            return port(&probe["tcpSocket"]["port"]).map_or(fallback, Self::Connect);
        }
        fallback
    }

    /// Whether a pod the watch has not called Ready yet may be checked at all.
    pub fn before_ready(&self) -> bool {
        !matches!(self, Self::WatchOnly(_))
    }

    /// One check of the pod at `ip`, bounded by [`CHECK_LIMIT`].
    pub async fn run(&self, ip: IpAddr) -> bool {
        let once = async {
            match self {
                Self::Connect(port) | Self::WatchOnly(port) => {
                    TcpStream::connect(SocketAddr::new(ip, *port)).await.is_ok()
                }
                Self::Http(h) => h.run(ip).await,
                Self::Grpc(g) => g.run(ip).await,
            }
        };
        tokio::time::timeout(CHECK_LIMIT, once)
            .await
            .unwrap_or(false)
    }
}

/// A probe's `port`: a number, or the name of one of the container's ports; None for 0,
/// out of range or a name that does not resolve.
fn port_of(container: &Value, port: &Value) -> Option<u16> {
    let n = match port {
        Value::Number(n) => n.as_u64()?,
        Value::String(name) => container["ports"]
            .as_array()?
            .iter()
            .find(|p| p["name"].as_str() == Some(name))
            .and_then(|p| p["containerPort"].as_u64())?,
        _ => return None,
    };
    u16::try_from(n).ok().filter(|p| *p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::net::TcpListener;

    pub(super) fn template(probe: Value) -> Value {
        json!({"spec": {"containers": [{
            "name": "app",
            "ports": [{"containerPort": 8080, "name": "http"}, {"containerPort": 9901, "name": "admin"}],
            "readinessProbe": probe,
        }]}})
    }

    #[test]
    fn each_probe_kind_is_followed() {
        let of = |p: Value| Check::of_template(&template(p), 8080);
        assert_eq!(of(json!(null)), Check::Connect(8080));
        assert_eq!(
            of(json!({"tcpSocket": {"port": "admin"}})),
            Check::Connect(9901)
        );
        assert_eq!(
            of(json!({"tcpSocket": {"port": 7000}})),
            Check::Connect(7000)
        );
        assert_eq!(
            of(json!({"exec": {"command": ["cat", "/ready"]}})),
            Check::WatchOnly(8080)
        );
        assert!(matches!(
            of(json!({"httpGet": {"port": 8080}})),
            Check::Http(_)
        ));
        assert!(matches!(
            of(json!({"httpGet": {"port": "admin", "scheme": "HTTPS"}})),
            Check::Http(h) if h.tls && h.port == 9901
        ));
        assert!(matches!(
            of(json!({"grpc": {"port": 9000, "service": "app"}})),
            Check::Grpc(g) if g.port == 9000 && g.service == "app"
        ));
        // What cannot be followed is a connect to the serving port.
        for fallback in [
            json!({"tcpSocket": {"port": "nope"}}),
            json!({"httpGet": {"port": 70000}}),
            json!({"httpGet": {"port": 8080, "scheme": "FTP"}}),
            json!({"grpc": {"port": "named"}}),
            json!({"grpc": {}}),
        ] {
            assert_eq!(of(fallback.clone()), Check::Connect(8080), "{fallback}");
        }
        assert!(!of(json!({"exec": {}})).before_ready());
        assert!(of(json!(null)).before_ready());
    }

    #[tokio::test]
    async fn a_connect_check_passes_while_the_port_is_open() {
        let open = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = open.local_addr().unwrap();
        assert!(Check::Connect(a.port()).run(a.ip()).await);
        assert!(Check::WatchOnly(a.port()).run(a.ip()).await);
        drop(open);
        assert!(!Check::Connect(a.port()).run(a.ip()).await);
    }
}
