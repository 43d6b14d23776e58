//! HTTP/1.1 upgrades (websockets and the like) through the proxy: the upgrade request goes to
//! the app with its `Connection: upgrade` and `Upgrade` headers; when the app answers
//! `101 Switching Protocols`, the 101 goes back to the client and a task copies bytes both ways
//! between the two upgraded connections until either side closes.

use crate::http1::hop_by_hop::has_token;
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderMap, HeaderValue, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// The `Upgrade` value of a request the proxy passes on as an upgrade: HTTP/1.1 (HTTP/2 has no
/// 101; HTTP/1.0 no upgrades), `Connection` naming `upgrade`, and not `h2c` — the proxy speaks
/// HTTP/2 to the app itself when the revision asks for it, and an h2c upgrade's
/// `HTTP2-Settings` is a hop-by-hop header that cannot be passed on.
pub fn requested(version: Version, headers: &HeaderMap) -> Option<HeaderValue> {
    if version != Version::HTTP_11 || !has_token(headers, &CONNECTION, "upgrade") {
        return None;
    }
    let value = headers.get(UPGRADE)?;
    let asks_h2c = value
        .to_str()
        .map(|v| v.split(',').any(|p| p.trim().eq_ignore_ascii_case("h2c")))
        .unwrap_or(true);
    (!asks_h2c).then(|| value.clone())
}

/// Puts back what [`requested`] found, after the hop-by-hop headers were stripped.
pub fn restore(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, protocol);
}

/// A tunnel's life, put in the 101 response's extensions: the request path holds the pod's
/// slot until it ends, since an open websocket is a request in flight for the app.
#[derive(Clone, Debug)]
pub struct TunnelOpen(tokio_util::sync::CancellationToken);

impl TunnelOpen {
    /// Resolves once the tunnel has closed (or never opened).
    pub async fn closed(&self) {
        self.0.cancelled().await
    }
}

/// Joins the client's and the upstream's upgraded connections once both are ready, copying
/// bytes both ways until one side closes (or fails). Runs on its own task: the request's
/// deadline was for getting the 101, not for the tunnel's life.
pub fn tunnel(client: OnUpgrade, upstream: OnUpgrade, what: String) -> TunnelOpen {
    let open = tokio_util::sync::CancellationToken::new();
    let ended = open.clone().drop_guard();
    tokio::spawn(async move {
        let _ended = ended;
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(%what, error = %e, "upgrade did not complete");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((up, down)) => {
                tracing::debug!(%what, bytes_up = up, bytes_down = down, "upgraded connection closed")
            }
            Err(e) => tracing::debug!(%what, error = %e, "upgraded connection failed"),
        }
    });
    TunnelOpen(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn a_websocket_upgrade_is_recognised() {
        let h = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        assert_eq!(
            requested(Version::HTTP_11, &h),
            Some(HeaderValue::from_static("websocket"))
        );
    }

    #[test]
    fn not_upgrades() {
        let ws = headers(&[("connection", "upgrade"), ("upgrade", "websocket")]);
        assert_eq!(requested(Version::HTTP_2, &ws), None, "no 101 in HTTP/2");
        assert_eq!(requested(Version::HTTP_10, &ws), None);
        let no_conn = headers(&[("upgrade", "websocket")]);
        assert_eq!(requested(Version::HTTP_11, &no_conn), None);
        let h2c = headers(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
        ]);
        assert_eq!(requested(Version::HTTP_11, &h2c), None);
    }
}
