//! `bench revisions`: the activator's memory with R revisions in the cluster, O of which list
//! its node in their ActivationEndpoints.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crds::ActivatorMember;
use futures::StreamExt;

use crate::Error;
use crate::cluster::{BenchCluster, ClusterOptions, NAMESPACE, create_revision};
use crate::http::{get, revision_headers};
use crate::process::{activator_binary, mib, spawn_activator};

/// `bench revisions`' knobs.
#[derive(Debug, Clone)]
pub struct RevisionsOptions {
    /// R: revisions in the cluster.
    pub revisions: usize,
    /// O: those listing this activator's node.
    pub own: usize,
    /// Members per subset (this node plus others, or others only).
    pub members: usize,
    /// Creates in flight at once.
    pub create_concurrency: usize,
    /// Requests sent afterwards, one each to this many of its own revisions.
    pub requests: usize,
    pub activator_bin: Option<PathBuf>,
}

impl Default for RevisionsOptions {
    fn default() -> Self {
        Self {
            revisions: 100_000,
            own: 300,
            members: 3,
            create_concurrency: 64,
            requests: 5,
            activator_bin: None,
        }
    }
}

/// What `bench revisions` measured.
#[derive(Debug, Clone)]
pub struct RevisionsReport {
    pub revisions: usize,
    pub own: usize,
    pub members: usize,
    pub created_in: Duration,
    /// The bench process (API server with every object, the simulated node) after creating.
    pub bench_rss: u64,
    pub ready_in: Duration,
    pub rss_ready: u64,
    pub rss_after: u64,
    /// Requests to its own revisions: (status or error, latency).
    pub answers: Vec<(String, Duration)>,
    /// API requests while the activator started, by (verb, resource).
    pub startup_requests: BTreeMap<(String, String), u64>,
}

/// Indices of the revisions that list this node: O of R, spread evenly.
pub fn own_indices(revisions: usize, own: usize) -> Vec<usize> {
    let own = own.min(revisions);
    (0..own).map(|i| i * revisions / own.max(1)).collect()
}

pub async fn run(opts: &RevisionsOptions) -> Result<RevisionsReport, Error> {
    if opts.revisions == 0 || opts.members == 0 {
        return Err(Error::Options(
            "--revisions and --members must be positive".into(),
        ));
    }
    let bin = activator_binary(opts.activator_bin.as_deref())?;
    let cluster = BenchCluster::start(ClusterOptions::default()).await?;
    let ip = cluster.node_ip();
    let data = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let admin = SocketAddr::from((ip, crate::cluster::free_port(ip)?));
    let me = cluster.member(data);
    let own = own_indices(opts.revisions, opts.own);
    let own_set: std::collections::HashSet<usize> = own.iter().copied().collect();
    // Other members are nodes that do not exist: nothing ever connects to them (requests go
    // only to this node's own revisions, which it serves itself).
    let other = |i: usize, j: usize| ActivatorMember {
        node: format!("node-far-{:04}", (i * 7 + j * 131) % 5000),
        address: "127.0.0.1:9".into(),
        pod: format!("local-activator-far-{:04}", (i * 7 + j * 131) % 5000),
        max_pods: 0,
        min_pods: 0,
    };
    let began = Instant::now();
    let mut done = 0usize;
    let mut creates = futures::stream::iter(0..opts.revisions)
        .map(|i| {
            let mut members = Vec::with_capacity(opts.members);
            if own_set.contains(&i) {
                members.push(me.clone());
            }
            let mut j = 0;
            while members.len() < opts.members {
                members.push(other(i, j));
                j += 1;
            }
            let client = cluster.client.clone();
            async move { create_revision(&client, &format!("r-{i:06}"), &members, |_| {}).await }
        })
        .buffer_unordered(opts.create_concurrency.max(1));
    while let Some(r) = creates.next().await {
        r?;
        done += 1;
        if done.is_multiple_of(10_000) {
            tracing::info!(
                done,
                secs = began.elapsed().as_secs_f64(),
                "revisions created"
            );
        }
    }
    drop(creates);
    let created_in = began.elapsed();
    let bench_rss = kubesim::node::process::rss_bytes().unwrap_or(0);
    tracing::info!(
        revisions = opts.revisions,
        secs = created_in.as_secs_f64(),
        "all created; starting the activator"
    );

    let before = cluster.api.stats().requests;
    let mut activator = spawn_activator(
        &bin,
        &cluster.kubeconfig,
        cluster.node_name(),
        data,
        admin,
        cluster.dir.path().join("activator.log"),
    )?;
    let ready_in = activator.wait_ready(Duration::from_secs(600)).await?;
    let after = cluster.api.stats().requests;
    let startup_requests = after
        .into_iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(&k).copied().unwrap_or(0);
            (d > 0).then_some(((k.verb, k.resource), d))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_ready = activator.memory().map(|m| m.rss).unwrap_or(0);

    let mut answers = Vec::new();
    for &i in own.iter().take(opts.requests) {
        let name = format!("r-{i:06}");
        let t = Instant::now();
        let r = get(
            data,
            "/",
            &revision_headers(NAMESPACE, &name),
            Duration::from_secs(60),
        )
        .await;
        let what = match r {
            Ok(reply) => reply.status.as_u16().to_string(),
            Err(e) => e.to_string(),
        };
        answers.push((what, t.elapsed()));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = activator.memory().map(|m| m.rss).unwrap_or(0);
    activator.stop().await;
    cluster.shutdown().await;
    Ok(RevisionsReport {
        revisions: opts.revisions,
        own: own.len(),
        members: opts.members,
        created_in,
        bench_rss,
        ready_in,
        rss_ready,
        rss_after,
        answers,
        startup_requests,
    })
}

impl fmt::Display for RevisionsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "revisions: R = {} revisions (+ {} ActivationEndpoints, {} members each), O = {} \
             list this node; created in {:.1} s ({:.0} revisions/s); bench process (API server \
             + node) RSS {:.0} MiB",
            self.revisions,
            self.revisions,
            self.members,
            self.own,
            self.created_in.as_secs_f64(),
            self.revisions as f64 / self.created_in.as_secs_f64().max(1e-9),
            mib(self.bench_rss)
        )?;
        writeln!(
            f,
            "activator: ready in {:.2} s, RSS {:.1} MiB at ready (+2 s), {:.1} MiB after {} \
             requests",
            self.ready_in.as_secs_f64(),
            mib(self.rss_ready),
            mib(self.rss_after),
            self.answers.len()
        )?;
        let answers: Vec<String> = self
            .answers
            .iter()
            .map(|(w, d)| format!("{w} in {:.1} ms", d.as_secs_f64() * 1e3))
            .collect();
        writeln!(f, "requests to its own revisions: {}", answers.join(", "))?;
        let reqs: Vec<String> = self
            .startup_requests
            .iter()
            .map(|((v, r), n)| format!("{v} {r} {n}"))
            .collect();
        writeln!(f, "API requests while it started: {}", reqs.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_revisions_spread_evenly() {
        assert_eq!(own_indices(10, 5), vec![0, 2, 4, 6, 8]);
        assert_eq!(own_indices(3, 5), vec![0, 1, 2]);
        assert_eq!(own_indices(100_000, 300).len(), 300);
        assert_eq!(own_indices(5, 0), Vec::<usize>::new());
    }
}
