//! The activator's own readiness check of a starting pod (a pod is usable when the watch says
//! Ready *or* this check passes first: kubelets report readiness late). It follows the
//! template's `readinessProbe.httpGet` when there is one — an app that opens its port before
//! it can serve is not taken as ready by a bare connect — and is a TCP connect to the serving
//! port otherwise.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Upper bound on one check (connect, and for HTTP the status line).
const CHECK_LIMIT: Duration = Duration::from_secs(1);

/// The template's HTTP readiness probe, resolved against its container's ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCheck {
    pub port: u16,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl HttpCheck {
    /// The first container's `readinessProbe.httpGet` over plain HTTP, its port a number or
    /// the name of one of the container's ports. None (a TCP connect checks) for no probe, an
    /// HTTPS one, or a port that does not resolve.
    pub fn of_template(template: &serde_json::Value) -> Option<Self> {
        let container = &template["spec"]["containers"][0];
        let get = &container["readinessProbe"]["httpGet"];
        if !get.is_object() {
            return None;
        }
        if get["scheme"]
            .as_str()
            .is_some_and(|s| !s.eq_ignore_ascii_case("HTTP"))
        {
            return None;
        }
        let port = match &get["port"] {
            serde_json::Value::Number(n) => u16::try_from(n.as_u64()?).ok()?,
            serde_json::Value::String(name) => container["ports"]
                .as_array()?
                .iter()
                .find(|p| p["name"].as_str() == Some(name))
                .and_then(|p| p["containerPort"].as_u64())
                .and_then(|p| u16::try_from(p).ok())?,
            _ => return None,
        };
        let path = match get["path"].as_str() {
            Some(p) if p.starts_with('/') => p.to_string(),
            Some(p) if !p.is_empty() => format!("/{p}"),
            _ => "/".to_string(),
        };
        // Only what can go on a request line and into a header verbatim.
        if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return None;
        }
        let headers = get["httpHeaders"]
            .as_array()
            .map(|hs| {
                hs.iter()
                    .filter_map(|h| Some((h["name"].as_str()?, h["value"].as_str()?)))
                    .filter(|(n, v)| {
                        !n.is_empty()
                            && n.bytes().all(|b| b.is_ascii_graphic() && b != b':')
                            && !v.bytes().any(|b| b == b'\r' || b == b'\n')
                    })
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            port: if port == 0 { return None } else { port },
            path,
            headers,
        })
    }

    fn request(&self, ip: IpAddr) -> String {
        let mut r = format!(
            "GET {} HTTP/1.1\r\nhost: {}\r\nuser-agent: local-activator-probe\r\n",
            self.path,
            SocketAddr::new(ip, self.port)
        );
        for (n, v) in &self.headers {
            r.push_str(n);
            r.push_str(": ");
            r.push_str(v);
            r.push_str("\r\n");
        }
        r.push_str("connection: close\r\n\r\n");
        r
    }
}

/// One check of the pod at `ip`: the HTTP probe answering 2xx or 3xx (as the kubelet counts
/// success), or without one a connection accepted on `serving_port`.
pub async fn check(ip: IpAddr, serving_port: u16, http: Option<&HttpCheck>) -> bool {
    let once = async {
        let Some(h) = http else {
            return TcpStream::connect(SocketAddr::new(ip, serving_port))
                .await
                .is_ok();
        };
        let Ok(mut s) = TcpStream::connect(SocketAddr::new(ip, h.port)).await else {
            return false;
        };
        if s.write_all(h.request(ip).as_bytes()).await.is_err() {
            return false;
        }
        let mut line = Vec::with_capacity(64);
        let mut b = [0u8; 256];
        while !line.contains(&b'\n') && line.len() < 1024 {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => break,
                Ok(n) => line.extend_from_slice(&b[..n]),
            }
        }
        status(&line).is_some_and(|c| (200..400).contains(&c))
    };
    tokio::time::timeout(CHECK_LIMIT, once)
        .await
        .unwrap_or(false)
}

/// The status code of an HTTP/1.x status line.
fn status(line: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    parts.next()?.strip_prefix("HTTP/1.")?;
    parts.next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::net::TcpListener;

    fn template(probe: serde_json::Value) -> serde_json::Value {
        json!({"spec": {"containers": [{
            "name": "app",
            "ports": [{"containerPort": 8080, "name": "http"}, {"containerPort": 9901, "name": "admin"}],
            "readinessProbe": probe,
        }]}})
    }

    #[test]
    fn the_templates_http_probe_is_followed() {
        let c = HttpCheck::of_template(&template(json!({"httpGet": {
            "path": "/ready", "port": "admin",
            "httpHeaders": [{"name": "x-check", "value": "1"}, {"name": "bad:name", "value": "x"}],
        }})))
        .unwrap();
        assert_eq!(
            c,
            HttpCheck {
                port: 9901,
                path: "/ready".into(),
                headers: vec![("x-check".into(), "1".into())],
            }
        );
        let c = HttpCheck::of_template(&template(json!({"httpGet": {"port": 8080}}))).unwrap();
        assert_eq!((c.port, c.path.as_str()), (8080, "/"));
        assert!(
            c.request("10.0.0.1".parse().unwrap())
                .starts_with("GET / HTTP/1.1\r\nhost: 10.0.0.1:8080\r\n")
        );
        for no in [
            json!({"tcpSocket": {"port": 8080}}),
            json!({"httpGet": {"port": 8080, "scheme": "HTTPS"}}),
            json!({"httpGet": {"port": "nope"}}),
            json!({"httpGet": {"port": 70000}}),
            json!({"httpGet": {"port": 8080, "path": "/a b"}}),
            json!(null),
        ] {
            assert_eq!(HttpCheck::of_template(&template(no.clone())), None, "{no}");
        }
        assert_eq!(status(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(status(b"SSH-2.0-OpenSSH\r\n"), None);
    }

    /// Answers each connection with the next status, then closes it.
    async fn server(statuses: Vec<u16>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            for code in statuses {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn an_open_port_is_not_ready_until_its_probe_answers_success() {
        let addr = server(vec![503, 302]).await;
        let h = HttpCheck {
            port: addr.port(),
            path: "/ready".into(),
            headers: vec![],
        };
        assert!(!check(addr.ip(), 1, Some(&h)).await, "503 is not ready");
        assert!(check(addr.ip(), 1, Some(&h)).await, "3xx counts as success");
        // Without an HTTP probe, an accepted connection is enough.
        let open = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = open.local_addr().unwrap();
        assert!(check(a.ip(), a.port(), None).await);
        drop(open);
        assert!(!check(a.ip(), a.port(), None).await);
    }
}
