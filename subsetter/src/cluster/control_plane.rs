//! Signs of a control-plane outage, for the hold that keeps members through its aftermath
//! (`usable_activators.rs`). An API server that stops is seen by the watches: they fail. An
//! etcd that stops is not: a kube-apiserver without etcd keeps its watches open and answers
//! reads from its cache; only writes, quorum reads and its health checks fail. The
//! controller-manager marks Nodes NotReady after either (after a 30 s etcd outage on the
//! repo's cluster, a node for ~4 s, its activator pod unready with it), and without a sign
//! of the outage the subsetter took that for a lost node and moved its members: each move a
//! cold start. So `/readyz` is asked every [`PROBE_EVERY`]: an answer that is not OK (etcd
//! down: its etcd check fails), no connection, or none within [`PROBE_LIMIT`] is a sign of
//! an outage, as a failed watch is.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;
use tracing::{info, warn};

use keep_serving::Locked;

/// How often `/readyz` is asked: one small request a second per replica, whatever the
/// cluster's size.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long `/readyz` may take. kube-apiserver answers it from its own checks (its etcd
/// check gives up after 2 s, `--etcd-healthcheck-timeout`), and API Priority and Fairness
/// exempts it: no answer in this time is an API server in trouble, not a busy one.
pub const PROBE_LIMIT: Duration = Duration::from_secs(5);

/// Until when an outage's aftermath lasts: `hold` after its last sign (a watch that failed
/// for want of the API server, or a failed `/readyz`).
#[derive(Clone, Debug)]
pub(crate) struct Aftermath {
    until: Arc<Mutex<Option<Instant>>>,
    hold: Duration,
}

impl Aftermath {
    pub(crate) fn new(hold: Duration) -> Self {
        Self {
            until: Arc::default(),
            hold,
        }
    }

    /// A sign of an outage now: the aftermath lasts at least `hold` from here.
    pub(crate) fn sign(&self) {
        let end = Instant::now() + self.hold;
        let mut until = self.until.locked();
        *until = Some(until.map_or(end, |t| t.max(end)));
    }

    /// When the aftermath ends, if it lasts now.
    pub(crate) fn ends(&self) -> Option<Instant> {
        self.until.locked().filter(|t| *t > Instant::now())
    }
}

/// Asks `/readyz` every [`PROBE_EVERY`] until dropped, and gives `aftermath` a sign for each
/// answer that is not OK (counted in `failures`). Logs when the answers turn bad and good.
pub(crate) async fn probe(client: Client, aftermath: Aftermath, failures: Counter) {
    let mut failing_since: Option<Instant> = None;
    loop {
        let ok = matches!(
            tokio::time::timeout(PROBE_LIMIT, readyz(&client)).await,
            Ok(true)
        );
        match (ok, failing_since) {
            (false, None) => {
                warn!(
                    "the API server does not answer /readyz OK: an outage (etcd or the API \
                     server); Nodes turning NotReady after it are its aftermath"
                );
                failing_since = Some(Instant::now());
            }
            (true, Some(since)) => {
                info!(
                    failed_for_s = since.elapsed().as_secs_f64(),
                    "the API server answers /readyz OK again"
                );
                failing_since = None;
            }
            _ => {}
        }
        if !ok {
            aftermath.sign();
            failures.inc();
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// Whether `/readyz` answers 200. (Not retried: kube's client retries 503 and 504 by itself,
/// never a 500, which is what a failed check answers.)
async fn readyz(client: &Client) -> bool {
    match http::Request::get("/readyz").body(Vec::new()) {
        Ok(req) => client.request_text(req).await.is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_aftermath_lasts_the_hold_from_the_last_sign() {
        let a = Aftermath::new(Duration::from_secs(60));
        assert_eq!(a.ends(), None, "no sign, no aftermath");
        a.sign();
        let first = a.ends().expect("an aftermath after a sign");
        tokio::time::advance(Duration::from_secs(30)).await;
        a.sign();
        let second = a.ends().expect("still in it");
        assert_eq!(
            second - first,
            Duration::from_secs(30),
            "extended by the later sign"
        );
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(a.ends(), None, "over a hold after the last sign");
    }

    #[tokio::test(start_paused = true)]
    async fn no_hold_means_no_aftermath() {
        let a = Aftermath::new(Duration::ZERO);
        a.sign();
        assert_eq!(a.ends(), None);
    }
}
