//! The activator's container in every rendering of deploy/ (base, the small and large
//! overlays, the Helm chart with its default, small and large values) runs a command line the
//! activator's own parser accepts; the chart and the overlay of each size run the same one;
//! the chart has a value for every flag that reaches the command line; and each rendering's
//! grace period covers the drain its command line asks for.
//!
//! The node agent (deploy/components/node-agent, on in overlays/local; the chart's
//! `nodeAgent.enabled`, on in values-local.yaml): where it is on, its container holds the only
//! hostPath (the runtime socket) with root and nothing else, the activator container keeps its
//! non-root, capability-less, read-only-root securityContext and is told the agent's socket;
//! where it is off (base, small, large, the chart's defaults) there is neither.

#[path = "../../crds/tests/support/chart_args.rs"]
mod chart_args;
// Only `check` is used here.
#[allow(dead_code)]
#[path = "../../crds/tests/support/manifest_check.rs"]
mod manifest_check;
#[path = "../../crds/tests/support/render.rs"]
mod render;

use activator::cli::{Args, OTHER_ENV};
use clap::Parser;
use serde_json::{Value, json};

const BIN: &str = "activator";
const KIND: &str = "DaemonSet";

#[test]
fn every_rendering_runs_args_and_env_the_activator_accepts() {
    for (what, docs) in render::all_renderings() {
        let c = render::first_container(render::find(&docs, KIND, BIN));
        assert_eq!(c["name"], BIN, "{what}");
        manifest_check::check::<Args>(
            BIN,
            c,
            OTHER_ENV,
            &["NODE_NAME", "POD_NAME", "POD_NAMESPACE", "POD_IP"],
        );
    }
}

#[test]
fn the_chart_and_the_overlay_of_each_size_run_the_same_command_line() {
    let r = render::all_renderings();
    let parsed = |i: usize| {
        let c = render::first_container(render::find(&r[i].1, KIND, BIN));
        chart_args::parsed::<Args>(BIN, c)
    };
    // all_renderings: base, small, large, then the chart with default, small, large values.
    for i in 0..3 {
        assert_eq!(parsed(i), parsed(i + 3), "{} vs {}", r[i].0, r[i + 3].0);
    }
    assert_ne!(
        parsed(0),
        parsed(1),
        "the small overlay changes the activator"
    );
}

#[test]
fn the_chart_has_a_value_for_every_activator_flag() {
    let keys = chart_args::values_cover_every_flag::<Args>(BIN, KIND);
    assert!(keys.contains(&"ioThreads".to_string()), "{keys:?}");
}

#[test]
fn every_renderings_grace_period_covers_its_drain() {
    for (what, docs) in render::all_renderings() {
        let ds = render::find(&docs, KIND, BIN);
        let c = render::first_container(ds);
        let mut argv = vec![BIN.to_string(), "--node-name=n".to_string()];
        argv.extend(
            c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a.as_str().unwrap().to_string()),
        );
        let args = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{what}: {e}"));
        let (delay, drain) = (args.shutdown_delay, args.config().drain_timeout);
        let grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or_else(|| panic!("{what}: no terminationGracePeriodSeconds"));
        // SIGTERM serves on for the shutdown delay, drains for at most the drain timeout,
        // then flushes traces (5 s).
        assert!(
            grace > delay.as_secs() + drain.as_secs() + 5,
            "{what}: terminationGracePeriodSeconds {grace} does not cover --shutdown-delay \
             {delay:?} + --drain-timeout {drain:?}"
        );
    }
}

const AGENT: &str = "node-agent";
/// The agent's socket: its `--listen`, the activator's `NODE_AGENT_SOCKET`.
const AGENT_SOCKET: &str = "/run/local-activator/agent.sock";
/// The node's runtime socket, a hostPath mounted at the same path in the agent alone.
const CRI_SOCKET: &str = "/run/containerd/containerd.sock";

/// The renderings with the node agent: (what, documents).
fn renderings_with_the_agent() -> Vec<(String, Vec<Value>)> {
    let d = render::deploy_dir();
    let mut enabled = render::values(&[]);
    enabled["nodeAgent"]["enabled"] = true.into();
    vec![
        (
            "deploy/ (base) + components/node-agent".to_string(),
            render::with_component(render::kustomize(&d), &d.join("components/node-agent")),
        ),
        (
            "overlays/local".to_string(),
            render::kustomize(&d.join("overlays/local")),
        ),
        (
            "chart nodeAgent.enabled".to_string(),
            render::helm_template(&enabled, render::RELEASE_NAMESPACE),
        ),
        (
            "chart values-local".to_string(),
            render::helm_template(
                &render::values(&["values-local.yaml"]),
                render::RELEASE_NAMESPACE,
            ),
        ),
    ]
}

fn pod_spec(docs: &[Value]) -> &Value {
    &render::find(docs, KIND, BIN)["spec"]["template"]["spec"]
}

fn containers(docs: &[Value]) -> &[Value] {
    pod_spec(docs)["containers"].as_array().unwrap()
}

fn container<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    containers(docs)
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The value of env var `name` in container `c`.
fn env<'a>(c: &'a Value, name: &str) -> Option<&'a Value> {
    c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .map(|e| &e["value"])
}

/// The names of the pod's volumes of type `kind` (hostPath, emptyDir, ...).
fn volumes_of(docs: &[Value], kind: &str) -> Vec<String> {
    pod_spec(docs)["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get(kind).is_some())
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

/// Container `c`'s mount of volume `volume`.
fn mount<'a>(c: &'a Value, volume: &str) -> Option<&'a Value> {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == volume)
}

/// The value of `--flag=value` in container `c`'s args.
fn arg<'a>(c: &'a Value, flag: &str) -> Option<&'a str> {
    c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|a| a.as_str().unwrap().strip_prefix(&format!("{flag}=")))
}

#[test]
fn the_node_agent_runs_as_root_with_nothing_else() {
    for (what, docs) in renderings_with_the_agent() {
        let names: Vec<&Value> = containers(&docs).iter().map(|c| &c["name"]).collect();
        // The activator stays first: the other tests (and the overlays' patches) find it there.
        assert_eq!(names, [BIN, AGENT], "{what}");
        let a = container(&docs, AGENT);
        assert_eq!(
            a["securityContext"],
            json!({
                "runAsUser": 0,
                "runAsNonRoot": false,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": { "drop": ["ALL"] },
                "seccompProfile": { "type": "RuntimeDefault" },
            }),
            "{what}"
        );
        assert_eq!(
            a["resources"],
            json!({ "requests": { "cpu": "10m", "memory": "16Mi" }, "limits": { "memory": "64Mi" } }),
            "{what}"
        );
        // No port: the agent listens on its unix socket only.
        assert!(a.get("ports").is_none(), "{what}: {a}");
        let image = a["image"].as_str().unwrap();
        assert!(
            image == "ghcr.io/local-activator/node-agent:latest"
                || image == "localhost/local-activator/node-agent:dev",
            "{what}: {image}"
        );
        assert_eq!(arg(a, "--listen"), Some(AGENT_SOCKET), "{what}");
        // The activator image's user: the only peer the agent answers.
        assert_eq!(arg(a, "--client-uid"), Some("65532"), "{what}");
    }
}

#[test]
fn with_the_agent_the_daemonset_is_a_daemonset_with_no_field_it_drops() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    for (what, docs) in renderings_with_the_agent() {
        let ds = render::find(&docs, KIND, BIN);
        let typed: DaemonSet =
            serde_json::from_value(ds.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        // A misplaced or misspelt field would be dropped by the typed parse.
        assert_eq!(
            &serde_json::to_value(&typed).unwrap(),
            ds,
            "{what}: fields DaemonSet does not know"
        );
    }
}

#[test]
fn only_the_node_agent_mounts_a_host_path_the_runtime_socket() {
    for (what, docs) in renderings_with_the_agent() {
        let host = volumes_of(&docs, "hostPath");
        assert_eq!(host.len(), 1, "{what}: hostPath volumes {host:?}");
        let v = pod_spec(&docs)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == host[0].as_str())
            .unwrap();
        assert_eq!(
            v["hostPath"],
            json!({ "path": CRI_SOCKET, "type": "Socket" }),
            "{what}"
        );
        for c in containers(&docs) {
            let m = mount(c, &host[0]);
            if c["name"] == AGENT {
                let m = m.unwrap_or_else(|| panic!("{what}: the agent does not mount {host:?}"));
                assert_eq!(m["mountPath"], CRI_SOCKET, "{what}");
                assert_eq!(
                    arg(c, "--cri-endpoint"),
                    Some(format!("unix://{CRI_SOCKET}").as_str()),
                    "{what}"
                );
            } else {
                assert!(m.is_none(), "{what}: {} mounts {m:?}", c["name"]);
            }
        }
    }
}

#[test]
fn the_activator_keeps_its_securitycontext_and_is_told_the_agents_socket() {
    let base = render::kustomize(&render::deploy_dir());
    let want = &container(&base, BIN)["securityContext"];
    assert_eq!(
        want,
        &json!({
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "capabilities": { "drop": ["ALL"] },
        })
    );
    for (what, docs) in renderings_with_the_agent() {
        let c = container(&docs, BIN);
        assert_eq!(&c["securityContext"], want, "{what}");
        let agent = container(&docs, AGENT);
        let listen = arg(agent, "--listen").unwrap();
        assert_eq!(env(c, "NODE_AGENT_SOCKET"), Some(&json!(listen)), "{what}");
        // Both containers mount the one in-memory emptyDir at the socket's directory; the
        // activator read-only (connect(2) needs the socket's mode, not a writable mount).
        let dir = listen.rsplit_once('/').unwrap().0;
        let shared = volumes_of(&docs, "emptyDir");
        assert_eq!(shared.len(), 1, "{what}: emptyDirs {shared:?}");
        let v = pod_spec(&docs)["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == shared[0].as_str())
            .unwrap();
        assert_eq!(v["emptyDir"]["medium"], "Memory", "{what}");
        let m = mount(c, &shared[0]).unwrap_or_else(|| panic!("{what}: no shared mount"));
        assert_eq!(
            (&m["mountPath"], &m["readOnly"]),
            (&json!(dir), &json!(true)),
            "{what}"
        );
        let m = mount(agent, &shared[0]).unwrap_or_else(|| panic!("{what}: no shared mount"));
        assert_eq!(m["mountPath"], dir, "{what}");
        assert_ne!(
            m["readOnly"], true,
            "{what}: the agent creates its socket there"
        );
    }
}

#[test]
fn with_the_agent_the_activator_runs_args_and_env_it_accepts() {
    for (what, docs) in renderings_with_the_agent() {
        let c = container(&docs, BIN);
        manifest_check::check::<Args>(
            BIN,
            c,
            OTHER_ENV,
            &[
                "NODE_NAME",
                "POD_NAME",
                "POD_NAMESPACE",
                "POD_IP",
                "NODE_AGENT_SOCKET",
            ],
        );
        let parsed = chart_args::parsed::<Args>(BIN, c);
        assert!(
            parsed.contains(&format!("node_agent_socket: Some({AGENT_SOCKET:?})")),
            "{what}: {parsed}"
        );
    }
}

#[test]
fn the_charts_node_agent_is_the_components() {
    let r = renderings_with_the_agent();
    let (component, chart) = (&r[0].1, &r[2].1);
    // The activator's command line compared parsed (the chart writes flags as args).
    assert_eq!(
        chart_args::parsed::<Args>(BIN, container(component, BIN)),
        chart_args::parsed::<Args>(BIN, container(chart, BIN))
    );
    let without_args = |docs: &[Value]| {
        let mut ds = render::find(docs, KIND, BIN).clone();
        ds["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("args");
        ds
    };
    assert_eq!(without_args(component), without_args(chart));
}

#[test]
fn without_the_agent_there_is_no_agent_and_no_host_path() {
    for (what, docs) in render::all_renderings() {
        let names: Vec<&Value> = containers(&docs).iter().map(|c| &c["name"]).collect();
        assert_eq!(names, [BIN], "{what}");
        assert!(volumes_of(&docs, "hostPath").is_empty(), "{what}");
        assert!(
            env(container(&docs, BIN), "NODE_AGENT_SOCKET").is_none(),
            "{what}"
        );
        // No workload of any rendering mounts the host.
        for d in &docs {
            let vols = &d["spec"]["template"]["spec"]["volumes"];
            assert!(
                !vols.to_string().contains("hostPath"),
                "{what}: {:?} has a hostPath",
                render::id(d)
            );
        }
    }
}

/// The pre-pull's read of pull secrets is opt-in: the default chart grants no Secret or
/// ServiceAccount read to anyone; `activator.flags.prepullSecrets` adds exactly `get` on both,
/// bound to the activator's ServiceAccount, and turns the flag on.
#[test]
fn pull_secret_rbac_is_rendered_only_when_opted_in() {
    let reads_secrets = |docs: &[Value]| -> Vec<String> {
        docs.iter()
            .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
            .filter(|d| {
                d["rules"].as_array().into_iter().flatten().any(|r| {
                    r["resources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|x| x == "secrets" || x == "serviceaccounts")
                })
            })
            .map(|d| {
                d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    for (what, docs) in render::all_renderings() {
        assert!(
            reads_secrets(&docs).is_empty(),
            "{what} grants Secret reads"
        );
    }
    let mut on = render::values(&[]);
    on["activator"]["flags"]["prepullSecrets"] = true.into();
    let docs = render::helm_template(&on, render::RELEASE_NAMESPACE);
    assert_eq!(
        reads_secrets(&docs),
        ["local-activator:activator-pull-secrets"]
    );
    let role = render::find(
        &docs,
        "ClusterRole",
        "local-activator:activator-pull-secrets",
    );
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets", "serviceaccounts"], "verbs": ["get"]}])
    );
    let binding = render::find(
        &docs,
        "ClusterRoleBinding",
        "local-activator:activator-pull-secrets",
    );
    assert_eq!(binding["subjects"][0]["name"], "activator");
    assert_eq!(
        binding["roleRef"]["name"],
        "local-activator:activator-pull-secrets"
    );
    let c = render::first_container(render::find(&docs, KIND, BIN));
    let mut argv = vec![BIN.to_string(), "--node-name=n".to_string()];
    argv.extend(
        c["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    assert!(Args::try_parse_from(&argv).unwrap().prepull_secrets);
}
