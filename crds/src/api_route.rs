//! How an in-cluster component reaches the API server: straight to an address behind the
//! `default/kubernetes` Service, with the Service's virtual IP as the fallback, instead of
//! through the virtual IP alone.
//!
//! Why: the virtual IP is kube-proxy's rule, and kube-proxy learns the API server's
//! addresses from the API server. A stopping API server takes its address out of
//! `default/kubernetes` (the lease endpoint reconciler), kube-proxy turns the virtual IP into
//! a REJECT rule, and when the API server is back kube-proxy sees it only once its own
//! watches come out of client-go's back-off (0.8 s doubling to 30 s, jittered up to twice
//! that). Measured on the repo's cluster after a 20 s outage: the virtual IP answered 11 s
//! after `/readyz` did, and every activator watch resumed only then. The kubelet and
//! kube-proxy themselves use a fixed address for this reason; a node-level data plane that
//! must resume within seconds does the same.
//!
//! The address is read once at start (`get` of the Endpoints named `kubernetes`, the one
//! RBAC grant this needs) and TLS is verified against the virtual IP, as in-cluster
//! configuration does: the API server's serving certificate names that IP. Requests go to
//! the direct address; one that cannot connect switches later requests to the other route
//! (so an API server moved to a new address is still reached, through the virtual IP), and
//! back the same way. The failed request itself is not retried: its caller's own retry (the
//! watches' back-off, a lookup's fallback) covers it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Endpoints;
use kube::{Api, Client, Config};

/// The Service (and Endpoints) through which pods reach the API server.
pub const SERVICE_NAMESPACE: &str = "default";
pub const SERVICE_NAME: &str = "kubernetes";
/// How long the start-up read of the Endpoints may take before the virtual IP alone is used.
pub const READ_LIMIT: Duration = Duration::from_secs(5);

/// A client for `config`: when `config` is in-cluster (its server is the Service's virtual
/// IP from `KUBERNETES_SERVICE_HOST`), one that goes straight to an API server address and
/// falls back to the virtual IP; otherwise (a kubeconfig, a test) the plain client.
/// Nothing here fails that the plain client would not: a failed read of the Endpoints is
/// logged and the virtual IP used. Every request but a watch gets at most
/// [`crate::bounded::DEFAULT_ANSWER_LIMIT`] for its answer ([`crate::bounded`]).
pub async fn client(config: Config) -> Result<Client, kube::Error> {
    let routed = routed(config).await?;
    Ok(crate::bounded::bounded(
        routed,
        crate::bounded::DEFAULT_ANSWER_LIMIT,
    ))
}

async fn routed(config: Config) -> Result<Client, kube::Error> {
    let via_service = Client::try_from(config.clone())?;
    let service_host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
    let Some(vip) = service_host.filter(|h| config.cluster_url.host() == Some(h.as_str())) else {
        return Ok(via_service);
    };
    let read = tokio::time::timeout(READ_LIMIT, read_addresses(&via_service)).await;
    let addrs = match read {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reading {SERVICE_NAMESPACE}/{SERVICE_NAME}: using the Service's virtual IP only");
            return Ok(via_service);
        }
        Err(_) => {
            tracing::warn!(
                "reading {SERVICE_NAMESPACE}/{SERVICE_NAME} took over {READ_LIMIT:?}: using the Service's virtual IP only"
            );
            return Ok(via_service);
        }
    };
    if addrs.is_empty() {
        tracing::warn!(
            "{SERVICE_NAMESPACE}/{SERVICE_NAME} lists no address: using the Service's virtual IP only"
        );
        return Ok(via_service);
    }
    // Spread the nodes over the API servers, as the virtual IP does per connection.
    let addr = addrs[rand::random_range(0..addrs.len())];
    let direct = Client::try_from(direct_config(&config, addr, &vip)?)?;
    tracing::info!(%addr, %vip, "reaching the API server at its address, the Service's virtual IP as fallback");
    Ok(failover([direct, via_service]))
}

/// The API server's addresses, from the Endpoints of the `kubernetes` Service (the one
/// call this module makes; RBAC grants it by name).
pub async fn read_addresses(client: &Client) -> Result<Vec<SocketAddr>, kube::Error> {
    let eps: Api<Endpoints> = Api::namespaced(client.clone(), SERVICE_NAMESPACE);
    Ok(eps
        .get_opt(SERVICE_NAME)
        .await?
        .as_ref()
        .map(addresses)
        .unwrap_or_default())
}

/// `config` pointed at `addr`, with TLS verified against `vip` (the name in-cluster
/// configuration verifies).
pub fn direct_config(config: &Config, addr: SocketAddr, vip: &str) -> Result<Config, kube::Error> {
    let mut c = config.clone();
    let host = match addr.ip() {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    let scheme = config.cluster_url.scheme_str().unwrap_or("https");
    c.cluster_url = format!("{scheme}://{host}:{}", addr.port())
        .parse()
        .map_err(|e: http::uri::InvalidUri| kube::Error::Service(Box::new(e)))?;
    c.tls_server_name = Some(vip.trim_matches(['[', ']']).to_string());
    Ok(c)
}

/// The ready addresses an Endpoints object lists, each with its `https` port (or its only
/// port), in the order listed.
pub fn addresses(ep: &Endpoints) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for s in ep.subsets.iter().flatten() {
        let ports = s.ports.as_deref().unwrap_or_default();
        let port = ports
            .iter()
            .find(|p| p.name.as_deref() == Some("https"))
            .or_else(|| (ports.len() == 1).then(|| &ports[0]))
            .and_then(|p| u16::try_from(p.port).ok());
        let Some(port) = port else { continue };
        for a in s.addresses.iter().flatten() {
            if let Ok(ip) = a.ip.parse::<IpAddr>() {
                out.push(SocketAddr::new(ip, port));
            }
        }
    }
    out
}

/// One client over two routes: requests go to the current one; a request that could not
/// connect makes the other current.
pub fn failover(routes: [Client; 2]) -> Client {
    let ns = routes[0].default_namespace().to_string();
    let current = Arc::new(AtomicUsize::new(0));
    let routes = Arc::new(routes);
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (routes, current) = (routes.clone(), current.clone());
        async move {
            let i = current.load(Ordering::Relaxed);
            let resp = routes[i].send(req).await;
            if let Err(e) = &resp
                && could_not_connect(e)
                && current
                    .compare_exchange(i, 1 - i, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                tracing::debug!(error = %e, route = 1 - i, "the API server route could not connect: switching");
            }
            resp
        }
    });
    Client::new(svc, ns)
}

/// Whether `e` says no connection was made (refused, unreachable, timed out connecting): the
/// request never reached an API server.
pub fn could_not_connect(e: &kube::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper_util::client::legacy::Error>()
            && h.is_connect()
        {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
            )
        {
            return true;
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn endpoints(v: serde_json::Value) -> Endpoints {
        serde_json::from_value(v).expect("endpoints")
    }

    #[test]
    fn addresses_take_the_https_port_or_the_only_one() {
        let ep = endpoints(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "subsets": [
                {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
                 "ports": [{"name": "metrics", "port": 9000}, {"name": "https", "port": 6443}]},
                {"addresses": [{"ip": "fd00::3"}], "ports": [{"port": 443}]},
                // Two ports, neither named https: which one is the API is unknown.
                {"addresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 1}, {"port": 2}]},
                {"addresses": [{"ip": "not an ip"}], "ports": [{"port": 443}]},
            ]
        }));
        let want: Vec<SocketAddr> = vec![
            "10.0.0.1:6443".parse().unwrap(),
            "10.0.0.2:6443".parse().unwrap(),
            "[fd00::3]:443".parse().unwrap(),
        ];
        assert_eq!(addresses(&ep), want);
        assert!(addresses(&endpoints(serde_json::json!({"metadata": {}}))).is_empty());
    }

    #[test]
    fn the_direct_config_verifies_tls_against_the_virtual_ip() {
        let mut cfg = Config::new("https://10.96.0.1:443".parse().unwrap());
        cfg.default_namespace = "x".into();
        let d = direct_config(&cfg, "10.88.255.1:6443".parse().unwrap(), "10.96.0.1").unwrap();
        assert_eq!(d.cluster_url.to_string(), "https://10.88.255.1:6443/");
        assert_eq!(d.tls_server_name.as_deref(), Some("10.96.0.1"));
        assert_eq!(d.default_namespace, "x");
        let d = direct_config(&cfg, "[fd00::1]:6443".parse().unwrap(), "[fd00::10]").unwrap();
        assert_eq!(d.cluster_url.to_string(), "https://[fd00::1]:6443/");
        assert_eq!(d.tls_server_name.as_deref(), Some("fd00::10"));
    }

    /// An HTTP server answering every request `200 {"who": name}`, and how many it answered.
    async fn server(name: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let body = format!("{{\"who\":\"{name}\"}}");
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        (addr, served)
    }

    fn plain(addr: SocketAddr) -> Client {
        let cfg = Config::new(format!("http://{addr}").parse().unwrap());
        Client::try_from(cfg).unwrap()
    }

    async fn who(c: &Client) -> Result<String, kube::Error> {
        let req = http::Request::get("/who").body(Vec::new()).unwrap();
        c.request_text(req).await
    }

    /// A port nothing listens on: connecting is refused.
    fn refused() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
    }

    #[tokio::test]
    async fn a_refused_route_hands_later_requests_to_the_other() {
        let (fallback, served) = server("fallback").await;
        let c = failover([plain(refused()), plain(fallback)]);
        let first = who(&c).await;
        let e = first.expect_err("the first request goes to the refused route");
        assert!(could_not_connect(&e), "a refused connection: {e:?}");
        assert_eq!(who(&c).await.unwrap(), "{\"who\":\"fallback\"}");
        assert_eq!(who(&c).await.unwrap(), "{\"who\":\"fallback\"}");
        assert_eq!(served.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_answering_route_is_kept_and_an_http_error_switches_nothing() {
        let (direct, served) = server("direct").await;
        let (fallback, unused) = server("fallback").await;
        let c = failover([plain(direct), plain(fallback)]);
        for _ in 0..3 {
            assert_eq!(who(&c).await.unwrap(), "{\"who\":\"direct\"}");
        }
        assert_eq!(served.load(Ordering::SeqCst), 3);
        assert_eq!(unused.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn both_routes_refused_every_request_says_it_could_not_connect() {
        let c = failover([plain(refused()), plain(refused())]);
        for _ in 0..4 {
            assert!(could_not_connect(&who(&c).await.unwrap_err()));
        }
    }
}
