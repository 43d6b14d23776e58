//! An in-process activator's metrics as `/metrics` would serve them, read back by name: the
//! scenarios and tests count what the activator counted (its API requests, its cold-start
//! phases) rather than keep a second count of their own. Pure logic over the exposition text.

use std::collections::BTreeMap;
use std::sync::Arc;

use activator::ops::metrics::Metrics;

/// The samples of `name` (a full sample name: `activator_api_requests_total`,
/// `activator_cold_start_phase_seconds_count`) with their labels, integer values only.
pub fn samples(m: &Arc<Metrics>, name: &str) -> Vec<(BTreeMap<String, String>, u64)> {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &m.registry()).is_err() {
        return Vec::new();
    }
    parse(&text, name)
}

/// The samples of `name` in an exposition read from an activator's `/metrics` (a real
/// cluster's activator pod).
pub fn parse(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, u64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let labels = labels
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.trim_matches('"').to_string()))
                })
                .collect();
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

/// The sum over its labels of counter `name` from a real activator's admin port (its pod IP,
/// [`crds::contract::ADMIN_PORT`]); None when it does not answer within 5 s. One small HTTP
/// request: cheap enough to poll while measuring the node.
pub async fn read_total(ip: std::net::IpAddr, name: &str) -> Option<u64> {
    let text = fetch((ip, crds::contract::ADMIN_PORT).into(), "/metrics").await?;
    Some(parse(&text, name).into_iter().map(|(_, v)| v).sum())
}

/// The whole answer (status line, headers, body) to `GET path` on an admin port at `addr`,
/// over HTTP/1.0 (the server closes when done); None when it does not answer within 5 s.
pub async fn fetch(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .await?;
        let mut text = String::new();
        s.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .ok()?
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_and_plain_samples_of_one_name_only() {
        let text = "# TYPE x counter\n\
                    activator_api_requests_total{verb=\"create\",resource=\"pods\"} 3\n\
                    activator_api_requests_total_other 9\n\
                    activator_adopted_revisions_total 2\n";
        let got = parse(text, "activator_api_requests_total");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0["verb"], "create");
        assert_eq!(got[0].0["resource"], "pods");
        assert_eq!(got[0].1, 3);
        let plain = parse(text, "activator_adopted_revisions_total");
        assert_eq!(plain, vec![(BTreeMap::new(), 2)]);
    }
}
