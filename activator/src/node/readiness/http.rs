//! `httpGet` readiness probes, over HTTP or HTTPS: one GET, `connection: close`, and the
//! status line read back.

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The template's HTTP readiness probe, resolved against its container's ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCheck {
    pub port: u16,
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// `scheme: HTTPS`: TLS without a certificate check, as the kubelet probes.
    pub tls: bool,
}

impl HttpCheck {
    /// A probe's `httpGet`, `port` resolving its port. None for a scheme other than HTTP or
    /// HTTPS, a port that does not resolve, or a path that cannot go on a request line.
    pub(super) fn of_probe(get: &Value, port: impl Fn(&Value) -> Option<u16>) -> Option<Self> {
        let tls = match get["scheme"].as_str() {
            None => false,
            Some(s) if s.eq_ignore_ascii_case("HTTP") => false,
            Some(s) if s.eq_ignore_ascii_case("HTTPS") => true,
            Some(_) => return None,
        };
        let port = port(&get["port"])?;
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
            port,
            path,
            headers,
            tls,
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

    /// The probe against the pod at `ip`: 2xx or 3xx passes (as the kubelet counts success).
    pub(super) async fn run(&self, ip: IpAddr) -> bool {
        let Ok(tcp) = TcpStream::connect(SocketAddr::new(ip, self.port)).await else {
            return false;
        };
        if !self.tls {
            return self.exchange(tcp, ip).await;
        }
        match super::tls::connect(tcp, ip).await {
            Ok(s) => self.exchange(s, ip).await,
            Err(e) => {
                tracing::debug!(%ip, error = %e, "readiness probe: TLS handshake failed");
                false
            }
        }
    }

    async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(&self, mut s: S, ip: IpAddr) -> bool {
        if s.write_all(self.request(ip).as_bytes()).await.is_err() {
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
    }
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
    use super::super::Check;
    use super::super::tests::template;
    use super::*;
    use serde_json::json;
    use std::sync::Arc;
    use tokio::net::TcpListener;

    fn http_of(probe: Value) -> Option<HttpCheck> {
        match Check::of_template(&template(probe), 8080) {
            Check::Http(h) => Some(h),
            _ => None,
        }
    }

    #[test]
    fn the_templates_http_probe_is_followed() {
        let c = http_of(json!({"httpGet": {
            "path": "/ready", "port": "admin",
            "httpHeaders": [{"name": "x-check", "value": "1"}, {"name": "bad:name", "value": "x"}],
        }}))
        .unwrap();
        assert_eq!(
            c,
            HttpCheck {
                port: 9901,
                path: "/ready".into(),
                headers: vec![("x-check".into(), "1".into())],
                tls: false,
            }
        );
        let c = http_of(json!({"httpGet": {"port": 8080, "path": "ready"}})).unwrap();
        assert_eq!((c.port, c.path.as_str()), (8080, "/ready"));
        assert!(
            c.request("10.0.0.1".parse().unwrap())
                .starts_with("GET /ready HTTP/1.1\r\nhost: 10.0.0.1:8080\r\n")
        );
        assert!(
            http_of(json!({"httpGet": {"port": 8080, "scheme": "https"}}))
                .unwrap()
                .tls
        );
        for no in [
            json!({"httpGet": {"port": "nope"}}),
            json!({"httpGet": {"port": 70000}}),
            json!({"httpGet": {"port": 0}}),
            json!({"httpGet": {"port": 8080, "path": "/a b"}}),
            json!({"httpGet": {"port": 8080, "scheme": "FTP"}}),
        ] {
            assert_eq!(http_of(no.clone()), None, "{no}");
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
                answer(&mut s, code).await;
            }
        });
        addr
    }

    async fn answer<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, code: u16) {
        let mut b = [0u8; 1024];
        let _ = s.read(&mut b).await;
        let _ = s
            .write_all(format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\n\r\n").as_bytes())
            .await;
        let _ = s.shutdown().await;
    }

    fn check(port: u16, tls: bool) -> Check {
        Check::Http(HttpCheck {
            port,
            path: "/ready".into(),
            headers: vec![],
            tls,
        })
    }

    #[tokio::test]
    async fn an_open_port_is_not_ready_until_its_probe_answers_success() {
        let addr = server(vec![503, 302]).await;
        let c = check(addr.port(), false);
        assert!(!c.run(addr.ip()).await, "503 is not ready");
        assert!(c.run(addr.ip()).await, "3xx counts as success");
    }

    /// A TLS server with a self-signed certificate (as apps serving HTTPS probes have),
    /// answering each connection with the next status.
    async fn tls_server(statuses: Vec<u16>) -> SocketAddr {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let cert =
            CertificateDer::from_pem_slice(include_bytes!("../../../testdata/probe-cert.pem"))
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(include_bytes!("../../../testdata/probe-key.pem"))
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            for code in statuses {
                let (s, _) = l.accept().await.unwrap();
                // A client that does not speak TLS fails here; the next one is served.
                if let Ok(mut s) = acceptor.accept(s).await {
                    answer(&mut s, code).await;
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn an_https_probe_speaks_tls_and_takes_any_certificate() {
        let addr = tls_server(vec![500, 200]).await;
        let c = check(addr.port(), true);
        assert!(!c.run(addr.ip()).await, "500 over TLS is not ready");
        assert!(
            c.run(addr.ip()).await,
            "200 over TLS, self-signed, is ready"
        );
        // Plain HTTP to a TLS port gets no status line back: not ready.
        let addr = tls_server(vec![200]).await;
        assert!(!check(addr.port(), false).run(addr.ip()).await);
        // And TLS to a plain HTTP port fails its handshake.
        let addr = server(vec![200]).await;
        assert!(!check(addr.port(), true).run(addr.ip()).await);
    }
}
