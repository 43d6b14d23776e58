//! Per-node configuration: identity, capacity, labels, taints and the simulated start delays.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerImage, Taint};

use super::addresses::{MAX_NODES, MAX_PODS_PER_NODE, node_ip};
use super::error::NodeError;
pub use crate::delay::{Delay, parse_duration};

/// The simulated delays between a pod being admitted and it turning Ready.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartDelays {
    pub image_pull: Delay,
    pub container_start: Delay,
    /// From the container running to its readiness probe passing.
    pub readiness: Delay,
    /// The period of the kubelet's PLEG relist (a real kubelet's is 1 s). A real kubelet
    /// reports a started container — the pod's IP, Running, and Ready once its probe passed —
    /// only when its next relist notices it, so the report lags the app by 0..period,
    /// depending on where in the node's relist cycle the container started. ZERO: reported
    /// as soon as the app is bound. A distribution is sampled once per node start (the
    /// node's period then stays fixed, as a kubelet's does).
    pub relist: Delay,
}

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub name: String,
    /// Decides the node's loopback address (see [`node_ip`]).
    pub index: usize,
    /// Capacity `pods`; at most [`MAX_PODS_PER_NODE`] (the size of a node's address block).
    pub max_pods: u32,
    pub cpu: String,
    pub memory: String,
    /// Added to the standard labels (hostname, os, instance type).
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// What the node reports in `status.images` (the images a real kubelet finds in its
    /// runtime, up to nodeStatusMaxImages): the subsetter prefers members holding a
    /// revision's image. Given, not pulled: a simulated pull adds nothing here.
    pub images: Vec<ContainerImage>,
    pub delays: StartDelays,
    pub lease_duration: Duration,
    pub lease_renew_interval: Duration,
    /// How often the Ready condition's heartbeat is re-posted when nothing changed (the real
    /// kubelet's nodeStatusReportFrequency, 5 minutes); leases carry the frequent heartbeat.
    pub status_report_interval: Duration,
    /// Serve the node agent's protocol (crate `node-agent`) on this unix socket: a pod's IP
    /// by UID from its admission (the sandbox), before the kubelet reports it. See
    /// [`super::agent`].
    pub agent_socket: Option<PathBuf>,
}

impl NodeConfig {
    pub fn new(name: impl Into<String>, index: usize) -> Self {
        NodeConfig {
            name: name.into(),
            index,
            max_pods: 110,
            cpu: "16".into(),
            memory: "64Gi".into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            images: Vec::new(),
            delays: StartDelays::default(),
            lease_duration: Duration::from_secs(40),
            lease_renew_interval: Duration::from_secs(10),
            status_report_interval: Duration::from_secs(300),
            agent_socket: None,
        }
    }

    /// `node-0007` for index 7: the naming the fleet helpers and the binary use.
    pub fn numbered(index: usize) -> Self {
        Self::new(node_name(index), index)
    }

    pub fn ip(&self) -> Ipv4Addr {
        node_ip(self.index)
    }

    pub fn with_max_pods(mut self, max_pods: u32) -> Self {
        self.max_pods = max_pods;
        self
    }

    pub fn with_delays(mut self, delays: StartDelays) -> Self {
        self.delays = delays;
        self
    }

    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn with_taint(mut self, taint: Taint) -> Self {
        self.taints.push(taint);
        self
    }

    /// The node holds an image known by `names` (e.g. `registry:5000/app@sha256:…` and
    /// `registry:5000/app:v1`, as containerd reports them).
    pub fn with_image<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
        size_bytes: i64,
    ) -> Self {
        self.images.push(ContainerImage {
            names: Some(names.into_iter().map(Into::into).collect()),
            size_bytes: Some(size_bytes),
        });
        self
    }

    pub fn with_lease(mut self, duration: Duration, renew_interval: Duration) -> Self {
        self.lease_duration = duration;
        self.lease_renew_interval = renew_interval;
        self
    }

    pub fn with_agent_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.agent_socket = Some(path.into());
        self
    }

    pub fn validate(&self) -> Result<(), NodeError> {
        let invalid = |m: String| Err(NodeError::InvalidConfig(format!("node {}: {m}", self.name)));
        if self.name.is_empty() {
            return invalid("empty name".into());
        }
        if self.index >= MAX_NODES {
            return invalid(format!("index {} >= {MAX_NODES}", self.index));
        }
        if self.max_pods as usize > MAX_PODS_PER_NODE {
            return invalid(format!(
                "max_pods {} > {MAX_PODS_PER_NODE} (addresses per node)",
                self.max_pods
            ));
        }
        if self.lease_renew_interval.is_zero() || self.lease_duration.is_zero() {
            return invalid("zero lease duration or renew interval".into());
        }
        if self.status_report_interval.is_zero() {
            return invalid("zero status report interval".into());
        }
        if let Some(path) = &self.agent_socket
            && path.as_os_str().len() >= MAX_SOCKET_PATH
        {
            // Caught here rather than as a bind error in the middle of the fleet's start.
            return invalid(format!(
                "agent socket path {} is {} bytes; a unix socket path has fewer than {MAX_SOCKET_PATH}",
                path.display(),
                path.as_os_str().len()
            ));
        }
        Ok(())
    }
}

/// `sun_path`'s size on Linux, its terminating NUL included.
const MAX_SOCKET_PATH: usize = 108;

pub fn node_name(index: usize) -> String {
    format!("node-{index:04}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates() {
        assert!(NodeConfig::numbered(3).validate().is_ok());
        assert!(
            NodeConfig::numbered(3)
                .with_max_pods(300)
                .validate()
                .is_err()
        );
        assert!(NodeConfig::numbered(MAX_NODES).validate().is_err());
        assert_eq!(NodeConfig::numbered(7).name, "node-0007");
        let long = format!("/tmp/{}/node-0003.sock", "d".repeat(100));
        assert!(
            NodeConfig::numbered(3)
                .with_agent_socket(long)
                .validate()
                .is_err()
        );
        assert!(
            NodeConfig::numbered(3)
                .with_agent_socket("/tmp/kubesim-agents-1-0/node-0003.sock")
                .validate()
                .is_ok()
        );
    }
}
