//! The subsetter's command line. In the library so that the deploy manifests can be checked
//! against it (a test parses the Deployment's args and env with it). The flags become the
//! controller's [`Config`] and the Lease's [`LeaseConfig`] here, in one place each.

use std::time::Duration;

use clap::Parser;

use crate::cluster::config::Config;
use crate::cluster::leader::{DEFAULT_RELEASE_TIMEOUT, LeaseConfig};
use crate::pure::rebalance;

/// Environment variables the binary reads outside these flags.
pub const OTHER_ENV: &[&str] = &["RUST_LOG", "KUBECONFIG"];

#[derive(Parser, Debug)]
#[command(about = "Gives each Revision a subset of N activators (ActivationEndpoints)")]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Only Revisions of this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Only Revisions of namespaces whose labels match this selector (Kubernetes syntax, e.g.
    /// `!local-activator.dev/subsetter`); the others are left to another subsetter. Default:
    /// every namespace.
    #[arg(long, env = "NAMESPACE_SELECTOR")]
    pub namespace_selector: Option<String>,
    /// Only activator pods of this namespace (default: all namespaces).
    #[arg(long, env = "ACTIVATOR_NAMESPACE")]
    pub activator_namespace: Option<String>,
    /// maxNodeSelection: the most activators a revision gets without spec.activators (its N is
    /// computed from targetBurstCapacity / containerConcurrency within [2, this], or this).
    #[arg(long, alias = "max-node-selection", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    pub default_activators: u16,
    /// Subset policy: random or least-loaded.
    #[arg(long, default_value = "random")]
    pub policy: String,
    /// Least-loaded prefers activators whose node already holds the revision's images
    /// (`Node.status.images`), within its balance bound; `--image-locality=false` turns it off.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub image_locality: bool,
    /// After an API server or etcd outage, an activator whose Node turns NotReady within this
    /// many seconds is kept as a member until then (its kubelet has not renewed its lease
    /// since the outage yet), and moved only if still NotReady; 0: moved as any lost node.
    #[arg(long, default_value_t = crate::pure::settle::OUTAGE_HOLD.as_secs())]
    pub outage_hold_seconds: u64,
    /// An activator lost while its Node is Ready (a DaemonSet rolling update, a restart) stays
    /// a member this many seconds after its old pod is gone (held while that pod terminates,
    /// up to its grace period) for its replacement on the node, rather than every subset it is
    /// in moving; a Node NotReady or deleted ends the hold at once; 3 or less: moved after the
    /// 3 s settle.
    #[arg(long, default_value_t = crate::pure::replacements::REPLACEMENT_HOLD.as_secs())]
    pub replacement_hold_seconds: u64,
    /// Run without leader election (tests, a single replica).
    #[arg(long)]
    pub no_leader_election: bool,
    #[arg(long, default_value = "local-activator-subsetter")]
    pub lease_name: String,
    /// Namespace of the Lease (default: this pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Identity in the Lease (default: this pod's name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    #[arg(long, default_value_t = 5)]
    pub lease_grace_seconds: u64,
    /// API writes a second (status, labels, creates), across all revisions; 0: no limit.
    #[arg(long, default_value_t = 100.0)]
    pub write_qps: f64,
    /// Writes that may go at once after a quiet spell.
    #[arg(long, default_value_t = 200)]
    pub write_burst: u32,
    /// Reconciles running at once (each holds at most one API request in flight); 0: no
    /// bound.
    #[arg(long, default_value_t = crate::cluster::reconciler::DEFAULT_CONCURRENCY)]
    pub concurrency: u16,
    /// How often to look for uneven load and move members (0: never).
    #[arg(long, default_value_t = 60)]
    pub rebalance_interval_seconds: u64,
    /// Rebalance only while the most loaded activator has more than this × the mean members.
    #[arg(long, default_value_t = 1.2)]
    pub rebalance_threshold: f64,
    /// Members moved per interval at most (each move costs the app a cold start).
    #[arg(long, default_value_t = 10)]
    pub rebalance_max_moves: usize,
    /// Also keep an EndpointSlice `<revision>-activationendpoints` per revision listing its
    /// activators, for an ingress that wants one (kube-proxy ignores it).
    #[arg(long)]
    pub endpoint_slices: bool,
    /// A ConfigMap in the subsetter's namespace whose keys (policy, maxNodeSelection,
    /// writeQPS, writeBurst, imageLocality) override these flags while it exists; re-read when it changes.
    #[arg(long, env = "SETTINGS_CONFIG_MAP")]
    pub settings_config_map: Option<String>,
    /// `/metrics` and `/healthz`.
    #[arg(long, env = "ADMIN_ADDR", default_value = "0.0.0.0:9091")]
    pub admin_addr: std::net::SocketAddr,
    /// The directory (`crds::directory`): Host and revision lookups for activators that
    /// cannot reach the API server, answered from this replica's caches.
    #[arg(long, env = "DIRECTORY_ADDR", default_value = "0.0.0.0:9092")]
    pub directory_addr: std::net::SocketAddr,
    /// The cluster's hop secret (the Secret the activators mount): an activator proves with
    /// it that it may open a membership stream (docs/member-stream.md). Unset: streams are
    /// open to any caller on the cluster network (a warning says so).
    #[arg(long, env = "HOP_SECRET_FILE")]
    pub hop_secret_file: Option<std::path::PathBuf>,
    /// Serve the directory and the membership streams only, never reconcile: the activators'
    /// source of memberships beside a replacement subsetter that writes the
    /// ActivationEndpoints itself (docs/member-stream.md).
    #[arg(long, env = "DIRECTORY_ONLY")]
    pub directory_only: bool,
    /// Membership streams this replica holds at most; beyond, a caller is sent to another.
    #[arg(long, env = "MAX_MEMBER_STREAMS", default_value_t = 10_000)]
    pub max_member_streams: usize,
}

impl Args {
    /// Who may open a membership stream, and how many: the hop secret read from its file
    /// (whitespace around it is not part of it; a file that does not exist is no secret).
    pub fn stream_access(&self) -> crate::Result<crate::cluster::member_stream::StreamAccess> {
        let secret = match &self.hop_secret_file {
            // Mounted optionally, as on the activators: no Secret, no proof asked.
            Some(path) if !path.exists() => None,
            Some(path) => {
                let bad = |reason: String| crate::Error::HopSecret {
                    path: path.display().to_string(),
                    reason,
                };
                let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
                let s = text.trim();
                if s.is_empty() {
                    return Err(bad("it is empty".into()));
                }
                Some(std::sync::Arc::from(s.as_bytes()))
            }
            None => None,
        };
        Ok(crate::cluster::member_stream::StreamAccess {
            secret,
            max_streams: self.max_member_streams,
            ..Default::default()
        })
    }

    /// The controller's configuration: every flag it takes, the rest its defaults.
    /// `pod_name` (`POD_NAME`, read once by the binary) names this replica in its Events.
    pub fn config(&self, pod_name: Option<String>) -> Config {
        Config {
            namespace: self.namespace.clone(),
            namespace_selector: self.namespace_selector.clone(),
            activator_namespace: self.activator_namespace.clone(),
            default_activators: usize::from(self.default_activators),
            write_qps: self.write_qps,
            write_burst: self.write_burst,
            concurrency: self.concurrency,
            endpoint_slices: self.endpoint_slices,
            image_locality: self.image_locality,
            outage_hold: Duration::from_secs(self.outage_hold_seconds),
            replacement_hold: Duration::from_secs(self.replacement_hold_seconds),
            rebalance_interval: Duration::from_secs(self.rebalance_interval_seconds),
            rebalance: rebalance::Limits {
                threshold: self.rebalance_threshold,
                max_moves: self.rebalance_max_moves,
            },
            settings_config_map: self
                .settings_config_map
                .clone()
                .map(|name| (name, self.lease_namespace.clone())),
            event_instance: pod_name,
            ..Config::default()
        }
    }

    /// The Lease this replica competes for, under its identity (`--identity`, `POD_NAME`, or
    /// one made of the process id).
    pub fn lease(&self) -> LeaseConfig {
        LeaseConfig {
            name: self.lease_name.clone(),
            namespace: self.lease_namespace.clone(),
            identity: self
                .identity
                .clone()
                .unwrap_or_else(|| format!("subsetter-{}", std::process::id())),
            duration_seconds: self.lease_duration_seconds,
            grace_seconds: self.lease_grace_seconds,
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Runs the subset policy on a synthetic cluster (no API server) and prints what it costs.
    Bench {
        #[arg(long, default_value_t = 100_000)]
        revisions: usize,
        #[arg(long, default_value_t = 5_000)]
        activators: usize,
        #[arg(long, default_value_t = 3)]
        members: usize,
        /// random, least-loaded, or knative-hash (Knative's subsetting, re-implemented as a
        /// baseline; at most 2,048 activators).
        #[arg(long, default_value = "least-loaded")]
        policy: String,
        /// Seed of the random policy and of the nodes' images.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Distinct images; revision i runs image i mod this. 500 at a share of 0.1 gives
        /// each node about 50 images, a kubelet's nodeStatusMaxImages.
        #[arg(long, default_value_t = 500)]
        images: usize,
        /// The share of nodes holding each image (drawn per node and image).
        #[arg(long, default_value_t = 0.1)]
        image_share: f64,
        /// Least-loaded prefers nodes holding the revision's image (as `--image-locality`
        /// of the controller).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        image_locality: bool,
        /// Also write the figures as JSON here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Reads a cluster's ActivationEndpoints and reports every breach of the contract
    /// (docs/activation-endpoints-contract.md); exits 1 when there is one.
    VerifyContract {
        /// The cluster's kubeconfig (default: KUBECONFIG, then ~/.kube/config, then in-cluster).
        #[arg(long)]
        kubeconfig: Option<std::path::PathBuf>,
    },
}
