//! Whether the API server is answering at all, for the request path's reads and the cold
//! start's create: a call that has had no answer for [`SUSPECT_AFTER`] asks `/readyz`, and
//! when that is not answered OK either (the API server stopped, its packets dropped, or etcd
//! down: `/readyz` fails its etcd check while reads from the watch cache still answer), the
//! call is given up at once. A healthy but busy API server answers `/readyz` and its callers
//! keep waiting as before; a request is never held for a call's whole limit by a control
//! plane that is gone.
//!
//! One probe at a time, its answer reused for [`PROBE_TTL`]: a burst of stalled calls costs
//! the API server one `/readyz`, not one each.
//!
//! A `/readyz` that is not answered within [`PROBE_LIMIT`] says "down" only if no write or
//! quorum read has succeeded for [`QUIET`] either ([`Heard`], marked by the counting client):
//! an API server that is overloaded — a thousand first requests at once on a 2-core control
//! plane — still gets work done through etcd and is waited for; one whose packets are
//! dropped answers nothing, and one whose etcd is down answers only from its watch cache
//! (reads naming a resourceVersion, watches: those do not count) while its `/readyz` hangs on
//! the etcd check. A refused connection or a `/readyz` that is not OK says "down" at once.
//!
//! Before any probe: a request of this client that could not connect, with no response
//! since, says "down" for [`UNREACHABLE_FOR`] (the counting client marks both). During an
//! outage the watches' retries keep that fresh, so a cold start is refused and a lookup sent
//! to the directory without first waiting out [`SUSPECT_AFTER`] and a probe.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use keep_serving::Locked;
use kube::Client;
use tokio::time::Instant;

/// With `/readyz` unanswered: down only if no response came back for this long.
pub const QUIET: Duration = Duration::from_secs(2);

/// What the counting client saw of the API server (kept where the counting client is, in
/// `ops::api_count`, below the caches).
pub use crate::ops::api_count::Heard;

/// How long a failed connect, with no response since, says "down" without a probe.
pub const UNREACHABLE_FOR: Duration = Duration::from_secs(2);

/// How long a call may go unanswered before the API server's health is asked.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(400);
/// Upper bound on the `/readyz` probe.
pub const PROBE_LIMIT: Duration = Duration::from_millis(500);
/// How long a probe's answer is reused.
pub const PROBE_TTL: Duration = Duration::from_secs(1);

/// Why a call was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaveUp {
    /// The API server does not answer `/readyz` OK: the control plane is out of reach.
    Down,
    /// It does, but the call had no answer within its limit.
    Limit,
}

type Pending = Shared<BoxFuture<'static, bool>>;

/// The API server's health, probed on demand.
#[derive(Clone)]
pub struct ApiHealth {
    client: Option<Client>,
    heard: Heard,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    last: Option<(Instant, bool)>,
    pending: Option<Pending>,
}

impl ApiHealth {
    /// `heard` must be marked by `client`'s responses (`api_count::counted`).
    pub fn new(client: Client, heard: Heard) -> Self {
        Self {
            client: Some(client),
            heard,
            state: Arc::default(),
        }
    }

    /// Always answering (no probe is made): for tests without an API server.
    pub fn assume_up() -> Self {
        Self {
            client: None,
            heard: Heard::default(),
            state: Arc::default(),
        }
    }

    /// Whether `/readyz` answers OK within [`PROBE_LIMIT`] (a recent answer is reused).
    pub async fn answering(&self) -> bool {
        let Some(client) = &self.client else {
            return true;
        };
        let probe = {
            let mut st = self.state.locked();
            if let Some((at, up)) = st.last
                && at.elapsed() < PROBE_TTL
            {
                return up;
            }
            st.pending
                .get_or_insert_with(|| {
                    let (client, state) = (client.clone(), self.state.clone());
                    let heard = self.heard.clone();
                    async move {
                        let up = match probe(&client).await {
                            Probe::Ok => true,
                            Probe::NotOk => false,
                            Probe::NoAnswer => heard.within(QUIET),
                        };
                        let mut st = state.locked();
                        st.last = Some((Instant::now(), up));
                        st.pending = None;
                        up
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        probe.await
    }

    /// Whether the API server is known not to answer: a request could not connect lately
    /// with no response since (the watches retrying during an outage see this first, so a
    /// request path call is given up before it is made), or a probe less than
    /// [`PROBE_TTL`] old found it not answering.
    pub fn known_down(&self) -> bool {
        if self.client.is_some() && self.heard.unreachable_within(UNREACHABLE_FOR) {
            return true;
        }
        let st = self.state.locked();
        st.last
            .is_some_and(|(at, up)| !up && at.elapsed() < PROBE_TTL)
    }

    /// `call`'s answer within `limit`, or given up as soon as the API server is found not to
    /// be answering (asked once the call has waited [`SUSPECT_AFTER`]; a recent answer that
    /// it is not gives up at once).
    pub async fn within<T>(
        &self,
        limit: Duration,
        call: impl Future<Output = T>,
    ) -> Result<T, GaveUp> {
        // Found down a moment ago: not another wait (a lookup then goes to the directory at
        // once; the next probe, a second later, sees the API server back).
        if self.known_down() {
            return Err(GaveUp::Down);
        }
        let started = Instant::now();
        let mut call = std::pin::pin!(call);
        if let Ok(v) = tokio::time::timeout(SUSPECT_AFTER.min(limit), &mut call).await {
            return Ok(v);
        }
        let by = started + limit;
        tokio::select! {
            v = &mut call => return Ok(v),
            up = self.answering() => if !up {
                tracing::debug!("the API server is not answering /readyz: giving up a call");
                return Err(GaveUp::Down);
            },
            _ = tokio::time::sleep_until(by) => return Err(GaveUp::Limit),
        }
        tokio::time::timeout_at(by, call)
            .await
            .map_err(|_| GaveUp::Limit)
    }
}

/// What `/readyz` said.
enum Probe {
    Ok,
    /// An answer that is not OK (etcd down), or no connection (refused, reset).
    NotOk,
    /// Nothing within [`PROBE_LIMIT`]: gone, or only slow.
    NoAnswer,
}

async fn probe(client: &Client) -> Probe {
    let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
        return Probe::NotOk;
    };
    match tokio::time::timeout(PROBE_LIMIT, client.request_text(req)).await {
        Ok(Ok(_)) => Probe::Ok,
        Ok(Err(_)) => Probe::NotOk,
        Err(_) => Probe::NoAnswer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_answering_api_server_keeps_the_call_waiting() {
        let h = ApiHealth::assume_up();
        let slow = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            7
        };
        assert_eq!(h.within(Duration::from_secs(10), slow).await, Ok(7));
        let stuck = std::future::pending::<()>();
        assert_eq!(
            h.within(Duration::from_secs(2), stuck).await,
            Err(GaveUp::Limit)
        );
    }

    /// A client whose API server refuses every connection: `/readyz` fails and a stalled
    /// call is given up long before its limit.
    #[tokio::test]
    async fn an_unreachable_api_server_gives_the_call_up() {
        // A port that was just free: connecting is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let cfg = kube::Config::new(format!("http://127.0.0.1:{port}").parse().expect("url"));
        let client = Client::try_from(cfg).expect("client");
        let h = ApiHealth::new(client, Heard::default());
        let stuck = std::future::pending::<()>();
        assert_eq!(
            h.within(Duration::from_secs(60), stuck).await,
            Err(GaveUp::Down)
        );
        // The answer is reused: no second probe within the TTL, and the next call is given
        // up without waiting.
        assert!(h.known_down());
        assert!(!h.answering().await);
        let never_polled = async { panic!("a call given up at once is not made") };
        assert_eq!(
            h.within(Duration::from_secs(60), never_polled).await,
            Err(GaveUp::Down)
        );
    }

    /// An API server that takes connections and answers nothing (`/readyz` unanswered).
    fn silent_api_server() -> (Client, tokio::task::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let cfg = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        (Client::try_from(cfg).expect("client"), task)
    }

    /// Overloaded, not gone: `/readyz` goes unanswered but other calls came back lately, so
    /// a slow call is waited for up to its limit.
    #[tokio::test]
    async fn an_unanswered_readyz_with_answers_lately_keeps_the_call_waiting() {
        let (client, _server) = silent_api_server();
        let heard = Heard::default();
        heard.mark();
        let h = ApiHealth::new(client, heard);
        let slow = async {
            tokio::time::sleep(SUSPECT_AFTER + PROBE_LIMIT + Duration::from_millis(200)).await;
            7
        };
        assert_eq!(h.within(Duration::from_secs(10), slow).await, Ok(7));
        assert!(!h.known_down());
    }

    /// Gone without a word (packets dropped): nothing heard for [`QUIET`] and `/readyz`
    /// unanswered, so the call is given up.
    #[tokio::test]
    async fn an_unanswered_readyz_and_nothing_heard_gives_the_call_up() {
        let (client, _server) = silent_api_server();
        let h = ApiHealth::new(client, Heard::default());
        let stuck = std::future::pending::<()>();
        assert_eq!(
            h.within(Duration::from_secs(60), stuck).await,
            Err(GaveUp::Down)
        );
        assert!(h.known_down());
    }

    /// The watches' retries found nothing listening: a call is given up before it is made,
    /// with no probe; any response clears it.
    #[tokio::test]
    async fn a_recent_refused_connection_gives_the_call_up_at_once() {
        let (client, _server) = silent_api_server();
        let heard = Heard::default();
        heard.unreachable();
        let h = ApiHealth::new(client, heard.clone());
        assert!(h.known_down());
        let never_polled = async { panic!("a call given up at once is not made") };
        assert_eq!(
            h.within(Duration::from_secs(60), never_polled).await,
            Err(GaveUp::Down)
        );
        heard.answered();
        assert!(!h.known_down());
        // Without a client (tests) nothing is ever down.
        let heard = Heard::default();
        heard.unreachable();
        let mut h = ApiHealth::assume_up();
        h.heard = heard;
        assert!(!h.known_down());
    }
}
