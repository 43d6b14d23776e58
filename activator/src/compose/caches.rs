//! What the activator knows of the API, started in one place: the kube client with its
//! requests counted, the watches of this node's subsets and pods, the directory, and the
//! Revisions read on demand. A whole activator ([`super::Activator`]) and a watch-only one
//! ([`super::watch_only::WatchOnly`]) start the same watches from here.

use std::sync::Arc;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use crate::cache::api_health::{ApiHealth, Heard};
use crate::cache::directory::Directory;
use crate::cache::endpoints::{EndpointsCache, MemberEvent, MemberSource, Streamed};
use crate::cache::hosts::HostCache;
use crate::cache::member_stream::StreamCounters;
use crate::cache::pods::PodCache;
use crate::cache::revisions::RevisionCache;
use crate::config::ActivatorConfig;
use crate::ops::api_count;
use crate::ops::metrics::Metrics;

/// The kube client with its requests counted, and whether the API server answers.
pub(super) fn counted_client(client: kube::Client, metrics: &Metrics) -> (kube::Client, ApiHealth) {
    let heard = Heard::default();
    let client = api_count::counted(client, metrics.api_requests.clone(), heard.clone());
    // Calls on the request path give up as soon as the API server is found not to answer.
    let api = ApiHealth::new(client.clone(), heard);
    (client, api)
}

/// The watched caches of one node, and the Revisions they lead to.
pub(super) struct Watches {
    pub revisions: RevisionCache,
    pub endpoints: EndpointsCache,
    pub pods: PodCache,
    pub directory: Option<Directory>,
}

impl Watches {
    /// Starts the watches `cfg` (its node, its subset TTL, its directory source) asks for,
    /// stopped by `stop`; the receiver tells of this node's memberships.
    pub fn start(
        cfg: &ActivatorConfig,
        client: &kube::Client,
        stop: &CancellationToken,
        streams: StreamCounters,
        hosts_moved: Option<UnboundedSender<Vec<String>>>,
    ) -> (Self, UnboundedReceiver<MemberEvent>) {
        let (member_of_tx, member_of) = tokio::sync::mpsc::unbounded_channel();
        let directory = Directory::start(&cfg.directory, client.clone(), stop.child_token());
        let revisions = RevisionCache::new(
            client.clone(),
            directory.clone(),
            streams.revisions_read.clone(),
        );
        let source = match directory.clone() {
            Some(directory) if cfg.members_streamed => MemberSource::Streamed(Box::new(Streamed {
                directory,
                proof: cfg.hop.bearer(),
                hosts_moved,
                tuning: cfg.member_stream.clone(),
                counters: streams,
            })),
            Some(directory) if cfg.members_from_directory => MemberSource::Seeded(directory),
            _ => MemberSource::Watch,
        };
        let endpoints = EndpointsCache::start(
            client.clone(),
            &cfg.node_name,
            cfg.endpoints_ttl,
            stop.child_token(),
            member_of_tx,
            source,
        );
        let pods = PodCache::start(client.clone(), &cfg.node_name, stop.child_token());
        let watches = Self {
            revisions,
            endpoints,
            pods,
            directory,
        };
        (watches, member_of)
    }
}

/// What the activator knows of the API: the watches, and the Host lookups.
pub(super) struct Caches {
    pub revisions: RevisionCache,
    pub hosts: Option<HostCache>,
    pub endpoints: EndpointsCache,
    pub pods: PodCache,
    pub directory: Option<Directory>,
}

impl Caches {
    /// Starts the watches (stopped by `stop`); the receiver tells of this node's memberships.
    pub fn start(
        cfg: &ActivatorConfig,
        client: &kube::Client,
        metrics: &Arc<Metrics>,
        stop: &CancellationToken,
    ) -> (Self, UnboundedReceiver<MemberEvent>) {
        let (moved_tx, moved) = tokio::sync::mpsc::unbounded_channel();
        let moved_tx = cfg.host_routing.then_some(moved_tx);
        let (watches, member_of) =
            Watches::start(cfg, client, stop, metrics.from_directory.clone(), moved_tx);
        // Off, no Host lookup is ever made (requests must name their revision by headers).
        let hosts = cfg.host_routing.then(|| {
            let hosts = HostCache::new(
                client.clone(),
                watches.directory.clone(),
                metrics.from_directory.host_claims_read.clone(),
                cfg.host_ttl,
                cfg.host_miss_ttl,
                metrics.clone(),
            );
            hosts.follow_moves(moved);
            hosts
        });
        let Watches {
            revisions,
            endpoints,
            pods,
            directory,
        } = watches;
        let caches = Self {
            revisions,
            hosts,
            endpoints,
            pods,
            directory,
        };
        (caches, member_of)
    }

    /// The caches [`super::Activator::cached_objects`] counts.
    pub fn counted(&self) -> Counted {
        (
            self.revisions.clone(),
            self.hosts.clone(),
            self.endpoints.clone(),
            self.pods.clone(),
        )
    }
}

/// The caches [`super::Activator::cached_objects`] counts.
pub(super) type Counted = (RevisionCache, Option<HostCache>, EndpointsCache, PodCache);
