//! RBAC derived from the code: the activator and the subsetter run through their paths
//! against kubesim, each with its own identity (kubesim counts every request under its
//! `Impersonate-User`), and the ClusterRoles/Roles of deploy/base grant
//! (a) every call each one made — verb, API group, resource or subresource, namespace or
//!     cluster scope — and
//! (b) nothing else: every granted (group, resource, verb) was used, or is in `NOT_TRIGGERED`
//!     with the reason this test cannot make the call.
//!
//! Paths run: leader election (Lease) with a standby watching it, the settings ConfigMap (created,
//! changed), EndpointSlices on, subsets for new Revisions (ActivationEndpoints, Revision status), a
//! Host lookup, a Route's status, a cold start on a member and a forward from a non-member, scale out under
//! concurrency, idle to zero, a revision whose pods are refused (the activator's Event) and a one-
//! member subset (the subsetter's Degraded Event), a node dying (repair), an ActivationEndpoints
//! another Revision controls under a new Revision's name (the foreign-owner delete).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use activator::{Activator, ActivatorConfig};
use anyhow::{Context as _, Result, bail};
use crds::contract::{
    ADMIN_PORT, APP_NAME_LABEL, APP_NAME_VALUE, COMPONENT_LABEL, COMPONENT_VALUE, DATA_PORT,
    REVISION_LABEL,
};
use crds::{ActivationEndpoints, Revision};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use kubesim::api::{ApiServer, ApiServerConfig, UserRequestKey};
use kubesim::node::objects::EXTERNAL_ANNOTATION;
use kubesim::node::reserve::reserve_nodes;
use kubesim::node::{Fleet, FleetOptions, NodeConfig, NodeLifecycleController};
use serde_json::{Value, json};
use subsetter::leader::{LeaseConfig, run_as_leader};
use subsetter::{Config, Random, Subsetter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The namespace deploy/base installs into, and the two service accounts' user names there.
const SYSTEM_NS: &str = "local-activator";
const ACTIVATOR: &str = "system:serviceaccount:local-activator:activator";
const SUBSETTER: &str = "system:serviceaccount:local-activator:subsetter";
const APPS: &str = "apps";
const SETTINGS: &str = "subsetter-settings";
/// A hang detector, not a timing.
const WAIT: Duration = Duration::from_secs(60);

/// Granted calls this test cannot make, each with the reason it is granted anyway:
/// (service account, group, resource, verb).
const NOT_TRIGGERED: &[(&str, &str, &str, &str, &str)] = &[
    (
        ACTIVATOR,
        "local-activator.dev",
        "revisions/finalizers",
        "update",
        "not a call: app pods carry a controller ownerReference to their Revision with \
         blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement admission plugin \
         (on in many clusters, not in kubesim) allows only to who may update the owner's \
         finalizers",
    ),
    (
        ACTIVATOR,
        "",
        "pods",
        "get",
        "the scheduler re-reads a pod by name when its create answered 409 AlreadyExists or \
         its answer was lost (a timeout, a cut connection), to adopt it; neither happens \
         against a healthy kubesim (pod names are per node, so activators never collide)",
    ),
    (
        SUBSETTER,
        "discovery.k8s.io",
        "endpointslices",
        "create",
        "the slice is written by server-side apply, a PATCH (counted as patch); kube-apiserver \
         also authorizes create when that apply creates the object, which kubesim does not \
         model",
    ),
    (
        ACTIVATOR,
        "events.k8s.io",
        "events",
        "patch",
        "kube's Recorder patches an event's series when the same event repeats within its \
         6-minute cache; the activator's EventSink lets a (revision, reason) through once a \
         60 s window, so only a test that waits over a minute sees it (activator/tests/events.rs \
         covers the series on the Recorder directly)",
    ),
    (
        SUBSETTER,
        "local-activator.dev",
        "activationendpoints",
        "get",
        "the subsetter reads a subset back by name when its create answered 409 AlreadyExists \
         (an earlier create landed but its answer was lost, or its watch had not shown it yet), \
         to take it over; seen once in a CI run of this test, not in most",
    ),
    (
        SUBSETTER,
        "events.k8s.io",
        "events",
        "patch",
        "as for the activator: a repeat of the same Degraded event within the Recorder's cache",
    ),
];

/// Who is bound to what in deploy/base: rules a service account has cluster-wide (ClusterRole
/// through a ClusterRoleBinding) and in one namespace (through a RoleBinding).
#[derive(Debug, Default)]
struct Grants {
    cluster: Vec<Value>,
    namespaced: Vec<(String, Value)>,
}

fn base_docs() -> Vec<Value> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/base");
    let mut out = Vec::new();
    for f in ["activator-rbac.yaml", "subsetter.yaml"] {
        let text = std::fs::read_to_string(format!("{dir}/{f}")).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap();
        out.extend(docs.into_iter().filter(|d| !d.is_null()));
    }
    out
}

fn grants(docs: &[Value], user: &str) -> Grants {
    let role = |kind: &str, name: &str, ns: Option<&str>| -> Vec<Value> {
        docs.iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"] == name
                    && ns.is_none_or(|n| d["metadata"]["namespace"] == n)
            })
            .unwrap_or_else(|| panic!("no {kind} {name}"))["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let binds_user = |b: &Value| {
        b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && format!(
                    "system:serviceaccount:{}:{}",
                    s["namespace"].as_str().unwrap_or_default(),
                    s["name"].as_str().unwrap_or_default()
                ) == user
        })
    };
    let mut g = Grants::default();
    for b in docs.iter().filter(|d| binds_user(d)) {
        let rr = &b["roleRef"];
        let name = rr["name"].as_str().unwrap();
        match (b["kind"].as_str().unwrap(), rr["kind"].as_str().unwrap()) {
            ("ClusterRoleBinding", "ClusterRole") => {
                g.cluster.extend(role("ClusterRole", name, None))
            }
            ("RoleBinding", kind) => {
                let ns = b["metadata"]["namespace"].as_str().unwrap().to_string();
                let rules = if kind == "Role" {
                    role("Role", name, Some(&ns))
                } else {
                    role("ClusterRole", name, None)
                };
                g.namespaced
                    .extend(rules.into_iter().map(|r| (ns.clone(), r)));
            }
            other => panic!("binding {other:?}"),
        }
    }
    for r in g.cluster.iter().chain(g.namespaced.iter().map(|(_, r)| r)) {
        // Calls are counted without the object's name: a rule narrowed by name is modelled
        // only for the one such grant, the API server's own Endpoints (crds::api_route).
        let by_name_ok = r
            .get("resourceNames")
            .is_none_or(|n| *n == json!(["kubernetes"]) && strs(&r["resources"]) == ["endpoints"]);
        assert!(
            by_name_ok && r.get("nonResourceURLs").is_none(),
            "this check does not model resourceNames or nonResourceURLs: {r}"
        );
    }
    g
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn rule_allows(rule: &Value, group: &str, resource: &str, verb: &str) -> bool {
    let has = |field: &str, x: &str| strs(&rule[field]).iter().any(|v| *v == x || *v == "*");
    has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
}

/// What RBAC's authorizer decides for one request of `user`.
fn allowed(g: &Grants, k: &UserRequestKey) -> bool {
    g.cluster
        .iter()
        .any(|r| rule_allows(r, &k.group, &k.resource, &k.verb))
        || g.namespaced.iter().any(|(ns, r)| {
            k.namespace.as_deref() == Some(ns) && rule_allows(r, &k.group, &k.resource, &k.verb)
        })
}

/// The calls of `user` no rule grants, and the granted (scope, group, resource, verb) nobody
/// used and `NOT_TRIGGERED` does not explain.
fn compare(g: &Grants, user: &str, calls: &BTreeSet<UserRequestKey>) -> (Vec<String>, Vec<String>) {
    let denied = calls
        .iter()
        .filter(|k| k.user == user && !allowed(g, k))
        .map(|k| format!("{k:?}"))
        .collect();
    let explained = |group: &str, resource: &str, verb: &str| {
        NOT_TRIGGERED
            .iter()
            .any(|(u, gr, r, v, _)| *u == user && *gr == group && *r == resource && *v == verb)
    };
    let used = |ns: Option<&str>, group: &str, resource: &str, verb: &str| {
        calls.iter().any(|k| {
            k.user == user
                && k.group == group
                && k.resource == resource
                && k.verb == verb
                && ns.is_none_or(|n| k.namespace.as_deref() == Some(n))
        })
    };
    let mut unused = Vec::new();
    let rules = g
        .cluster
        .iter()
        .map(|r| (None, r))
        .chain(g.namespaced.iter().map(|(ns, r)| (Some(ns.as_str()), r)));
    for (ns, rule) in rules {
        for group in strs(&rule["apiGroups"]) {
            for resource in strs(&rule["resources"]) {
                for verb in strs(&rule["verbs"]) {
                    if !used(ns, group, resource, verb) && !explained(group, resource, verb) {
                        unused.push(format!(
                            "{} {group}/{resource} {verb}",
                            ns.map_or("cluster-wide".to_string(), |n| format!("in {n}"))
                        ));
                    }
                }
            }
        }
    }
    (denied, unused)
}

#[test]
fn the_comparison_flags_a_denied_call_and_an_unused_grant() {
    let docs: Vec<Value> = serde_json::from_value(json!([
        {"kind": "ClusterRole", "metadata": {"name": "c"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]}]},
        {"kind": "ClusterRoleBinding", "metadata": {"name": "c"},
         "roleRef": {"kind": "ClusterRole", "name": "c"},
         "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "x"}]},
        {"kind": "Role", "metadata": {"name": "r", "namespace": "x"},
         "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]},
        {"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "x"},
         "roleRef": {"kind": "Role", "name": "r"},
         "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "x"}]},
    ]))
    .unwrap();
    let user = "system:serviceaccount:x:sa";
    let g = grants(&docs, user);
    let key = |verb: &str, group: &str, resource: &str, ns: Option<&str>| UserRequestKey {
        user: user.into(),
        verb: verb.into(),
        group: group.into(),
        resource: resource.into(),
        namespace: ns.map(String::from),
    };
    let calls = BTreeSet::from([
        key("get", "", "pods", Some("apps")),
        key("get", "", "pods/log", Some("apps")),
        // The Role is in x only.
        key("get", "coordination.k8s.io", "leases", Some("y")),
    ]);
    let (denied, unused) = compare(&g, user, &calls);
    assert_eq!(denied.len(), 2, "{denied:?}");
    assert!(denied[0].contains("pods/log") || denied[1].contains("pods/log"));
    assert_eq!(
        unused,
        [
            "cluster-wide /pods delete",
            "in x coordination.k8s.io/leases get"
        ]
    );
    let calls = BTreeSet::from([
        key("get", "", "pods", None),
        key("delete", "", "pods", Some("a")),
        key("get", "coordination.k8s.io", "leases", Some("x")),
    ]);
    assert_eq!(compare(&g, user, &calls), (vec![], vec![]));
}

// ---- the system run ------------------------------------------------------------------------

/// Waits until the objects `api` lists with `lp` satisfy `done` (a watch, no polling).
async fn wait_list<K>(
    api: Api<K>,
    labels: &str,
    what: &str,
    done: impl Fn(&[Arc<K>]) -> bool,
) -> Result<Vec<Arc<K>>>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().labels(labels);
    let stream = reflector(writer, watcher(api, cfg));
    let wait = async {
        let mut stream = std::pin::pin!(stream);
        // The store holds the whole list once the first InitDone went through it.
        let mut listed = false;
        while let Some(ev) = stream.next().await {
            listed |= matches!(ev, Ok(watcher::Event::InitDone));
            if listed && ev.is_ok() {
                let state = reader.state();
                if done(&state) {
                    return Ok(state);
                }
            }
        }
        bail!("the watch ended")
    };
    tokio::time::timeout(WAIT, wait)
        .await
        .with_context(|| format!("timed out waiting for {what}"))?
}

/// One HTTP/1.1 request to an activator's data port; the response's status.
async fn request(addr: SocketAddr, headers: &[(&str, &str)]) -> Result<u16> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut req = String::from("GET / HTTP/1.1\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out)).await??;
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {text:?}"))?;
    Ok(status)
}

fn revision(name: &str, spec: Value) -> Result<Revision> {
    let mut r = Revision::new(name, serde_json::from_value(spec)?);
    r.metadata.namespace = Some(APPS.into());
    Ok(r)
}

fn echo_template(delay_ms: u32) -> Value {
    json!({"spec": {"containers": [{
        "name": "app",
        "image": "kubesim/echo:latest",
        "ports": [{"containerPort": 8080, "name": "http"}],
        "env": [{"name": "SIM_DELAY_MS", "value": delay_ms.to_string()}],
    }]}})
}

fn activator_pod(name: &str, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": SYSTEM_NS,
            "labels": {APP_NAME_LABEL: APP_NAME_VALUE, COMPONENT_LABEL: COMPONENT_VALUE},
            "annotations": {EXTERNAL_ANNOTATION: "true"},
        },
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "containers": [{"name": "activator", "image": "ghcr.io/local-activator/activator:test",
                            "ports": [{"name": "http", "containerPort": DATA_PORT},
                                      {"name": "admin", "containerPort": ADMIN_PORT}]}],
        },
    }))?)
}

fn members(ae: &ActivationEndpoints) -> Vec<String> {
    ae.status
        .as_ref()
        .map(|s| s.activators.iter().map(|m| m.node.clone()).collect())
        .unwrap_or_default()
}

async fn wait_endpoints(
    client: &Client,
    name: &str,
    check: impl Fn(&ActivationEndpoints) -> bool,
) -> Result<ActivationEndpoints> {
    let api: Api<ActivationEndpoints> = Api::namespaced(client.clone(), APPS);
    let found = tokio::time::timeout(
        WAIT,
        await_condition(api, name, move |o: Option<&ActivationEndpoints>| {
            o.is_some_and(&check)
        }),
    )
    .await;
    let found =
        found.with_context(|| format!("timed out waiting for ActivationEndpoints {name}"))??;
    found.context("vanished")
}

async fn setup_cluster(server: &ApiServer) -> Result<Client> {
    let admin = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    for file in ["revisions.yaml", "activationendpoints.yaml", "routes.yaml"] {
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(format!("{dir}/{file}"))?)?;
        let name = crd.name_any();
        crds.create(&PostParams::default(), &crd).await?;
        tokio::time::timeout(
            WAIT,
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await??;
    }
    let nss: Api<Namespace> = Api::all(admin.clone());
    for ns in [SYSTEM_NS, APPS] {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    }
    Ok(admin)
}

fn start_subsetter(
    server: &ApiServer,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<subsetter::Result<()>>,
) {
    // What deploy/base runs (the Deployment passes no args: the flags' defaults) plus the two
    // optional features its RBAC grants for: EndpointSlices and the settings ConfigMap.
    let client = server.client_as(SUBSETTER);
    let config = Config {
        endpoint_slices: true,
        // As deploy/base runs it: the namespace watch is one of its calls.
        namespace_selector: Some(crds::contract::OTHER_SUBSETTERS_EXCLUDED.into()),
        settings_config_map: Some((SETTINGS.into(), SYSTEM_NS.into())),
        rebalance_interval: Duration::from_secs(1),
        ..Config::default()
    };
    let subsetter = Arc::new(Subsetter::new(
        client.clone(),
        config,
        Arc::new(Random::new()),
    ));
    let lease = lease_config();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        run_as_leader(
            client,
            lease,
            async move {
                let _ = stopped.await;
            },
            move |stop| {
                let s = Arc::clone(&subsetter);
                async move { s.run(stop).await }
            },
        )
        .await
    });
    (stop, task)
}

/// A replica that never becomes leader while [`start_subsetter`]'s holds the Lease: it only
/// waits, as a standby does, and does nothing if it ever leads.
fn start_standby(
    server: &ApiServer,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<subsetter::Result<()>>,
) {
    let client = server.client_as(SUBSETTER);
    let lease = LeaseConfig {
        identity: "subsetter-1".into(),
        ..lease_config()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_as_leader(
        client,
        lease,
        async move {
            let _ = stopped.await;
        },
        |stop| async move {
            stop.await;
            Ok(())
        },
    ));
    (stop, task)
}

fn lease_config() -> LeaseConfig {
    LeaseConfig {
        name: "local-activator-subsetter".into(),
        namespace: SYSTEM_NS.into(),
        identity: "subsetter-0".into(),
        duration_seconds: 15,
        grace_seconds: 5,
        release_timeout: subsetter::leader::DEFAULT_RELEASE_TIMEOUT,
    }
}

fn lease_watch_by_subsetter(k: &UserRequestKey) -> bool {
    k.user == SUBSETTER
        && k.verb == "watch"
        && k.group == "coordination.k8s.io"
        && k.resource == "leases"
}

/// Waits until kubesim has counted a request that `wanted` matches.
async fn wait_counted(server: &ApiServer, wanted: fn(&UserRequestKey) -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if server.stats().requests_by_user.keys().any(wanted) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("kubesim counted no such request in 30 s");
        }
        // kubesim's counters have no change notification; this polls them.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs the paths and returns every request kubesim counted, by user.
async fn run_paths() -> Result<BTreeSet<UserRequestKey>> {
    let server = ApiServer::start(ApiServerConfig::default()).await?;
    let admin = setup_cluster(&server).await?;

    // What both binaries do first in a pod (crds::api_route): read the API server's address.
    // kubesim has no such Endpoints; the read is what is checked.
    for user in [ACTIVATOR, SUBSETTER] {
        crds::api_route::read_addresses(&server.client_as(user)).await?;
    }

    let block = reserve_nodes(3)?;
    let configs: Vec<NodeConfig> = block.indices().map(NodeConfig::numbered).collect();
    let fleet = Fleet::start_with(admin.clone(), configs, FleetOptions::default()).await?;
    // Lifts the not-ready taint every new Node is admitted with, as on a real cluster.
    let lifecycle = NodeLifecycleController::start(admin.clone(), Duration::from_secs(40));
    let pods_sys: Api<Pod> = Api::namespaced(admin.clone(), SYSTEM_NS);
    let mut activators = Vec::new();
    let mut entries = BTreeMap::new();
    for node in fleet.nodes() {
        let ip = node.ip().into();
        let mut cfg = ActivatorConfig::new(
            node.name(),
            SocketAddr::new(ip, DATA_PORT),
            SocketAddr::new(ip, ADMIN_PORT),
        );
        cfg.pod_namespace = SYSTEM_NS.into();
        cfg.pool.scale_in_window = Duration::from_millis(300);
        cfg.host_ttl = Duration::from_millis(200);
        let pod = activator_pod(&cfg.pod_name, node.name())?;
        activators.push(Activator::start(cfg, server.client_as(ACTIVATOR)).await?);
        pods_sys.create(&PostParams::default(), &pod).await?;
        entries.insert(node.name().to_string(), SocketAddr::new(ip, DATA_PORT));
    }
    wait_list(
        pods_sys.clone(),
        &format!("{APP_NAME_LABEL}={APP_NAME_VALUE}"),
        "the activator pods to be Ready",
        |pods| {
            pods.iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
                .count()
                == 3
        },
    )
    .await?;

    let (stop_subsetter, subsetter_task) = start_subsetter(&server);

    // The settings ConfigMap appears (N = 2 without spec.activators) and changes later.
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), SYSTEM_NS);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": SETTINGS},
                                       "data": {"maxNodeSelection": "2"}}))?,
    )
    .await?;

    let revisions: Api<Revision> = Api::namespaced(admin.clone(), APPS);
    revisions
        .create(
            &PostParams::default(),
            &revision(
                "web",
                json!({"hosts": ["web.rbac.test"], "containerConcurrency": 1,
                       "idleTimeoutSeconds": 1, "template": echo_template(200)}),
            )?,
        )
        .await?;
    let ae = wait_endpoints(&admin, "web", |ae| members(ae).len() == 2).await?;
    // A second replica, now that the first holds the Lease: the standby that watches the
    // Lease to take it the moment it is released (deploy/base runs two replicas).
    let (stop_standby, standby_task) = start_standby(&server);
    let member = members(&ae)[0].clone();
    let outsider = entries
        .keys()
        .find(|n| !members(&ae).contains(n))
        .context("a non-member")?
        .clone();

    // A Host lookup and a cold start on a member, then a forward from a non-member.
    assert_eq!(
        request(entries[&member], &[("host", "web.rbac.test")]).await?,
        200
    );
    assert_eq!(
        request(
            entries[&outsider],
            &[("x-revision-namespace", APPS), ("x-revision-name", "web")]
        )
        .await?,
        200
    );
    // A Route over the host: the subsetter writes its status (what it serves).
    let routes: Api<crds::Route> = Api::namespaced(admin.clone(), APPS);
    routes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "local-activator.dev/v1alpha1", "kind": "Route",
                "metadata": {"name": "web", "namespace": APPS},
                "spec": {"hosts": ["web.rbac.test"],
                         "traffic": [{"revisionName": "web", "percent": 100}]},
            }))?,
        )
        .await?;
    tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(routes, "web", |o: Option<&crds::Route>| {
            o.and_then(|r| r.status.as_ref())
                .is_some_and(|s| s.summary.is_some())
        }),
    )
    .await??;
    // Scale out: containerConcurrency 1, four at once on one member.
    let burst = futures::future::join_all((0..4).map(|_| {
        request(
            entries[&member],
            &[("x-revision-namespace", APPS), ("x-revision-name", "web")],
        )
    }))
    .await;
    for r in burst {
        assert_eq!(r?, 200);
    }
    // Idle to zero: every pod of the revision is deleted again.
    let pods_apps: Api<Pod> = Api::namespaced(admin.clone(), APPS);
    let web_pods = format!("{REVISION_LABEL}=web");
    wait_list(pods_apps.clone(), &web_pods, "web to go to zero", |pods| {
        pods.is_empty()
    })
    .await?;

    // The EndpointSlice of the revision.
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), APPS);
    tokio::time::timeout(
        WAIT,
        await_condition(
            slices,
            "web-activationendpoints",
            |s: Option<&EndpointSlice>| s.is_some(),
        ),
    )
    .await??;

    // The settings change: N = 3.
    cms.patch(
        SETTINGS,
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"maxNodeSelection": "3"}})),
    )
    .await?;
    // Existing subsets keep their members (a move costs a cold start); a new revision gets 3.
    revisions
        .create(
            &PostParams::default(),
            &revision("wide", json!({"template": echo_template(0)}))?,
        )
        .await?;
    wait_endpoints(&admin, "wide", |ae| members(ae).len() == 3).await?;

    // A one-member subset (Degraded: the subsetter's Event) whose pods the API server refuses
    // (a container without an image: the activator's Event).
    revisions
        .create(
            &PostParams::default(),
            &revision(
                "broken",
                json!({"activators": 1,
                       "template": {"spec": {"containers": [{"name": "app"}]}}}),
            )?,
        )
        .await?;
    let ae = wait_endpoints(&admin, "broken", |ae| members(ae).len() == 1).await?;
    let status = request(
        entries[&members(&ae)[0]],
        &[
            ("x-revision-namespace", APPS),
            ("x-revision-name", "broken"),
        ],
    )
    .await?;
    assert!(
        status >= 500,
        "a revision without containers answered {status}"
    );
    let events: Api<Event> = Api::namespaced(admin.clone(), APPS);
    let reporters = |list: &[Arc<Event>]| -> BTreeSet<String> {
        list.iter()
            .filter_map(|e| e.reporting_controller.clone())
            .collect()
    };
    wait_list(events, "", "an event from each component", |list| {
        let r = reporters(list);
        r.contains(activator::ops::events::REPORTING_CONTROLLER) && r.len() >= 2
    })
    .await?;

    // A node dies: its activator pod turns not Ready and the node NotReady (the kubelet and
    // the node lifecycle controller would say so); the subsetter replaces it.
    let web = wait_endpoints(&admin, "web", |ae| members(ae).len() == 2).await?;
    let lost = members(&web)[0].clone();
    fleet.kill(&lost).await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch_status(
            &lost,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "NodeStatusUnknown",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await?;
    wait_endpoints(&admin, "web", |ae| {
        members(ae).len() == 2 && !members(ae).contains(&lost)
    })
    .await?;

    // An ActivationEndpoints left over under a new Revision's name, controlled by another
    // Revision (what a deleted and re-created Revision leaves until the garbage collector
    // runs): the subsetter deletes it, with a uid precondition, and writes its own.
    let decoy = revisions
        .create(
            &PostParams::default(),
            &revision("decoy", json!({"template": echo_template(0)}))?,
        )
        .await?;
    let aes: Api<ActivationEndpoints> = Api::namespaced(admin.clone(), APPS);
    let mut leftover = ActivationEndpoints::new("orphan", serde_json::from_value(json!({}))?);
    leftover.metadata.owner_references = Some(vec![
        decoy
            .controller_owner_ref(&())
            .context("the decoy's owner reference")?,
    ]);
    aes.create(&PostParams::default(), &leftover).await?;
    let orphan = revisions
        .create(
            &PostParams::default(),
            &revision(
                "orphan",
                json!({"activators": 1, "template": echo_template(0)}),
            )?,
        )
        .await?;
    let uid = orphan.uid();
    wait_endpoints(&admin, "orphan", move |ae| {
        members(ae).len() == 1
            && ae
                .owner_references()
                .iter()
                .any(|o| Some(&o.uid) == uid.as_ref())
    })
    .await?;

    // The standby's watch of the Lease is counted before it stops (its LIST comes first, and
    // the paths above may all finish before its WATCH is sent).
    wait_counted(&server, lease_watch_by_subsetter).await?;
    let _ = stop_standby.send(());
    standby_task.await??;
    let _ = stop_subsetter.send(());
    subsetter_task.await??;
    for a in activators {
        a.shutdown().await;
    }
    fleet.shutdown();
    drop(lifecycle);
    let stats = server.stats();
    server.shutdown().await;
    Ok(stats.requests_by_user.into_keys().collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_grants_exactly_the_calls_the_activator_and_the_subsetter_make() -> Result<()> {
    let calls = run_paths().await?;
    let docs = base_docs();
    let mut failures = Vec::new();
    for user in [ACTIVATOR, SUBSETTER] {
        let mine: Vec<&UserRequestKey> = calls.iter().filter(|k| k.user == user).collect();
        assert!(mine.len() >= 5, "{user} made {} kinds of calls", mine.len());
        for k in &mine {
            eprintln!(
                "{user}: {} {}/{} {}",
                k.verb,
                k.group,
                k.resource,
                k.namespace.as_deref().unwrap_or("(cluster-wide)")
            );
        }
        let (denied, unused) = compare(&grants(&docs, user), user, &calls);
        for d in denied {
            failures.push(format!("{user} is not granted {d}"));
        }
        for u in unused {
            failures.push(format!(
                "{user} is granted {u} but never called it (trim the RBAC, or add it to \
                 NOT_TRIGGERED with the reason)"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
