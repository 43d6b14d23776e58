//! Counts every request the activator sends to the API server, by verb and resource
//! (`activator_api_requests_total`). The cold path is meant to make one request, the pod
//! create: this is how a load test (on kubesim or a real cluster, where the activators are
//! pods) checks it, and how an operator sees what each activator costs the API server.
//! `from` says what of the API server answers: `etcd` for writes and quorum reads (a GET or
//! LIST without resourceVersion), `cache` for reads naming one and for watches (the API
//! server's watch cache): a burst of cold starts queues the former behind etcd's commits.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Uri};
use kube::Client;
use tokio::time::Instant;

use keep_serving::Locked;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// `from`: answered by etcd (a write, a quorum read) or by the API server's watch cache.
const ETCD: &str = "etcd";
const CACHE: &str = "cache";

/// The labels of `activator_api_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequest {
    /// Kubernetes' verb: get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// The resource, with its subresource: `pods`, `pods/status`, `revisions`.
    pub resource: String,
    /// `etcd` or `cache` (see the module's comment).
    pub from: &'static str,
}

/// What the counting client saw of the API server (`cache::api_health` reads it): when a write or quorum read last
/// succeeded, and when a request last could not connect at all with no response since.
#[derive(Clone, Default)]
pub struct Heard(Arc<Mutex<Seen>>);

#[derive(Default)]
struct Seen {
    succeeded: Option<Instant>,
    unreachable: Option<Instant>,
}

impl Heard {
    /// A write or quorum read succeeded (and so the API server answered).
    pub fn mark(&self) {
        let mut s = self.0.locked();
        s.succeeded = Some(Instant::now());
        s.unreachable = None;
    }

    /// Any response came back, whatever its status: the API server is reachable.
    pub fn answered(&self) {
        self.0.locked().unreachable = None;
    }

    /// A request could not connect (refused, unreachable): nothing listens there now.
    pub fn unreachable(&self) {
        self.0.locked().unreachable = Some(Instant::now());
    }

    /// Whether something was heard within `d`.
    pub fn within(&self, d: Duration) -> bool {
        self.0.locked().succeeded.is_some_and(|at| at.elapsed() < d)
    }

    /// Whether a request failed to connect within `d`, with no response since. During an
    /// outage the watches retry at least every second ([`crds::backoff::CAP`]) and keep
    /// this fresh; one stray failure stops counting after `d`.
    pub fn unreachable_within(&self, d: Duration) -> bool {
        self.0
            .locked()
            .unreachable
            .is_some_and(|at| at.elapsed() < d)
    }
}

/// `client`, with every request it sends counted in `counts` first, and every success of a
/// write or quorum read marked in `heard` (`api_health`: an API server that gets work done
/// through etcd is slow, not gone).
pub fn counted(client: Client, counts: Family<ApiRequest, Counter>, heard: Heard) -> Client {
    let default_ns = client.default_namespace().to_string();
    let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
        let (client, counts, heard) = (client.clone(), counts.clone(), heard.clone());
        async move {
            let what = classify(req.method(), req.uri());
            counts.get_or_create(&what).inc();
            let resp = client.send(req).await;
            // Only a success that went through etcd says the API server can do its work: the
            // watch cache keeps answering reads and watches while etcd is down, and a write
            // then fails with a 5xx after seconds.
            match &resp {
                Ok(r) if what.from == ETCD && r.status().is_success() => heard.mark(),
                Ok(_) => heard.answered(),
                // Not a slow answer: nothing listened (api_health's fast "down").
                Err(e) if crds::api_route::could_not_connect(e) => heard.unreachable(),
                Err(_) => {}
            }
            resp
        }
    });
    Client::new(svc, default_ns)
}

/// The verb and resource of a request to the Kubernetes API (pure).
pub fn classify(method: &Method, uri: &Uri) -> ApiRequest {
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/<group>/<version>/...
    let rest: &[&str] = match segs.as_slice() {
        ["api", _v, rest @ ..] => rest,
        ["apis", _g, _v, rest @ ..] => rest,
        _ => &[],
    };
    // namespaces/<ns>/<resource>... (but namespaces/<name> is a namespace itself)
    let rest = match rest {
        ["namespaces", _ns, r @ ..] if !r.is_empty() => r,
        r => r,
    };
    let (resource, named) = match rest {
        [] => (String::from("unknown"), false),
        [r] => ((*r).to_string(), false),
        [r, _name] => ((*r).to_string(), true),
        [r, _name, sub, ..] => {
            let mut s = String::with_capacity(r.len() + sub.len() + 1);
            let _ = write!(s, "{r}/{sub}");
            (s, true)
        }
    };
    let param = |k: &str| {
        uri.query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
        })
    };
    let watch = matches!(param("watch"), Some("true" | "1"));
    let names_version = param("resourceVersion").is_some_and(|v| !v.is_empty());
    let verb = match *method {
        Method::GET if watch => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    let from = match verb {
        "watch" => CACHE,
        "get" | "list" if names_version => CACHE,
        _ => ETCD,
    };
    ApiRequest {
        verb: verb.into(),
        resource,
        from,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: Method, uri: &str) -> (String, String) {
        let r = classify(&method, &uri.parse().unwrap());
        (r.verb, r.resource)
    }

    fn from(method: Method, uri: &str) -> &'static str {
        classify(&method, &uri.parse().unwrap()).from
    }

    #[test]
    fn reads_naming_a_resource_version_and_watches_are_the_caches() {
        let rev = "/apis/serving.local-activator.dev/v1alpha1/namespaces/apps/revisions/web";
        assert_eq!(from(Method::GET, rev), "etcd");
        assert_eq!(
            from(Method::GET, &format!("{rev}?&resourceVersion=")),
            "etcd"
        );
        assert_eq!(
            from(Method::GET, &format!("{rev}?&resourceVersion=0")),
            "cache"
        );
        assert_eq!(
            from(
                Method::GET,
                "/api/v1/pods?&resourceVersionMatch=NotOlderThan&resourceVersion=9"
            ),
            "cache"
        );
        assert_eq!(from(Method::GET, "/api/v1/pods?&labelSelector=a"), "etcd");
        assert_eq!(
            from(Method::GET, "/api/v1/pods?&watch=true&resourceVersion=5"),
            "cache"
        );
        assert_eq!(from(Method::POST, "/api/v1/namespaces/apps/pods?"), "etcd");
        assert_eq!(
            from(
                Method::PATCH,
                "/api/v1/namespaces/apps/pods/p?&resourceVersion=3"
            ),
            "etcd"
        );
    }

    fn p(verb: &str, resource: &str) -> (String, String) {
        (verb.into(), resource.into())
    }

    #[test]
    fn verbs_and_resources_of_the_activators_calls() {
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/apps/pods?"),
            p("create", "pods")
        );
        assert_eq!(
            c(
                Method::GET,
                "/apis/serving.local-activator.dev/v1alpha1/namespaces/apps/revisions/web"
            ),
            p("get", "revisions")
        );
        assert_eq!(
            c(
                Method::GET,
                "/apis/serving.local-activator.dev/v1alpha1/activationendpoints?&labelSelector=x&resourceVersion=0"
            ),
            p("list", "activationendpoints")
        );
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/pods?&watch=true&fieldSelector=spec.nodeName%3Dn1"
            ),
            p("watch", "pods")
        );
        assert_eq!(
            c(Method::DELETE, "/api/v1/namespaces/apps/pods/web-1"),
            p("delete", "pods")
        );
        assert_eq!(
            c(Method::PATCH, "/api/v1/namespaces/apps/pods/web-1/status"),
            p("patch", "pods/status")
        );
        assert_eq!(
            c(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/apps/events"
            ),
            p("create", "events")
        );
        // A namespace is itself a named object of /api/v1/namespaces.
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/apps"),
            p("get", "namespaces")
        );
        assert_eq!(c(Method::GET, "/version"), p("list", "unknown"));
    }

    use std::time::Duration;

    /// A client whose API server answers every request with `status`.
    fn answering(status: u16) -> Client {
        let svc = tower::service_fn(move |_req: Request<kube::client::Body>| async move {
            let resp = http::Response::builder()
                .status(status)
                .body(kube::client::Body::from(b"{}".to_vec()))
                .expect("a response");
            Ok::<_, std::convert::Infallible>(resp)
        });
        Client::new(svc, "default")
    }

    async fn send(client: &Client, method: Method, uri: &str) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Vec::new())
            .expect("a request");
        let _ = client.request_text(req).await;
    }

    /// Only a success through etcd says the API server works: a cache read or a watch while
    /// etcd is down still answers, and a write that fails answers 5xx.
    #[tokio::test]
    async fn heard_is_marked_by_successes_through_etcd_only() {
        let pods = "/api/v1/namespaces/a/pods";
        let ok_heard = Heard::default();
        let ok = counted(answering(201), Family::default(), ok_heard.clone());
        send(&ok, Method::GET, &format!("{pods}/p?resourceVersion=0")).await;
        send(&ok, Method::GET, &format!("{pods}?watch=true")).await;
        assert!(
            !ok_heard.within(Duration::from_secs(60)),
            "cache answers do not count"
        );
        send(&ok, Method::POST, pods).await;
        assert!(
            ok_heard.within(Duration::from_secs(60)),
            "a write that succeeded counts"
        );

        let failed_heard = Heard::default();
        let failed = counted(answering(500), Family::default(), failed_heard.clone());
        send(&failed, Method::POST, pods).await;
        send(&failed, Method::GET, &format!("{pods}/p")).await;
        assert!(
            !failed_heard.within(Duration::from_secs(60)),
            "a 5xx does not count"
        );
    }

    /// A request that could not connect says "unreachable" until any response comes back,
    /// a 404 included (api_health's fast "down").
    #[tokio::test]
    async fn a_refused_connection_marks_unreachable_until_any_answer() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let cfg = kube::Config::new(format!("http://127.0.0.1:{port}").parse().expect("url"));
        let heard = Heard::default();
        let down = counted(
            Client::try_from(cfg).expect("client"),
            Family::default(),
            heard.clone(),
        );
        let pod = "/api/v1/namespaces/a/pods/p";
        send(&down, Method::GET, pod).await;
        assert!(heard.unreachable_within(Duration::from_secs(60)));
        let up = counted(answering(404), Family::default(), heard.clone());
        send(&up, Method::GET, pod).await;
        assert!(!heard.unreachable_within(Duration::from_secs(60)));
    }
}
