//! An activator's reads of the API for its node — the same watches and the same reads ahead
//! — without its serving, its pools or its pre-pull. A load test that cannot run thousands of
//! whole activators in one process runs one of these for every other node, so a real API
//! server carries what a DaemonSet of activators makes it carry: a label-selected
//! ActivationEndpoints watch and a field-selected pod watch per node (each listed from the
//! watch cache when it starts, the first from the directory when it answers), the directory's
//! watch when it has one, and a Revision read
//! for every subset the node joins (`node::warm`, which this follows with no pool).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::Client;
use tokio_util::sync::CancellationToken;

use super::caches::Watches;
use crate::cache::directory::Directory;
use crate::cache::endpoints::{EndpointsCache, MemberEvent};
use crate::cache::pods::PodCache;
use crate::cache::revisions::RevisionCache;
use crate::config::ActivatorConfig;
use crate::node::read_ahead::ReadAhead;
use crate::ops::metrics::DirectoryCounters;

/// When each membership (namespace, revision) first reached this node's caches.
type Joined = Arc<Mutex<HashMap<(String, String), Instant>>>;

/// The API reads of one node's activator, stopped when dropped.
pub struct WatchOnly {
    endpoints: EndpointsCache,
    pods: PodCache,
    revisions: RevisionCache,
    _directory: Option<Directory>,
    counters: DirectoryCounters,
    joined: Joined,
    stop: CancellationToken,
}

impl WatchOnly {
    /// Starts the watches `cfg` (its node, its subset TTL, its directory source) asks for, as
    /// [`super::Activator::start`] does ([`Watches::start`]).
    pub fn start(cfg: &ActivatorConfig, client: Client) -> Self {
        let stop = CancellationToken::new();
        let counters = DirectoryCounters::default();
        let (watches, mut member_of) = Watches::start(cfg, &client, &stop, counters.clone(), None);
        let Watches {
            revisions,
            endpoints,
            pods,
            directory,
        } = watches;
        // What `node::warm::keep_members_warm` reads for each membership, at its pace,
        // without the pools a minScale share would start.
        let mut ahead = ReadAhead::new(revisions.clone(), cfg.read_ahead, None, None);
        let done = stop.child_token();
        let joined = Joined::default();
        let first_seen = Arc::clone(&joined);
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = done.cancelled() => return,
                    _ = ahead.step() => continue,
                    m = member_of.recv() => match m { Some(m) => m, None => return },
                };
                match event {
                    MemberEvent::Member {
                        key, of, listed, ..
                    } => {
                        first_seen
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .entry((key.namespace.clone(), key.name.clone()))
                            .or_insert_with(Instant::now);
                        ahead.member(key, of, listed)
                    }
                    MemberEvent::Left(key) => ahead.left(key),
                }
            }
        });
        Self {
            endpoints,
            pods,
            revisions,
            _directory: directory,
            counters,
            joined,
            stop,
        }
    }

    /// Once the subset and pod watches have their first lists.
    pub async fn synced(&self) {
        self.endpoints.synced().await;
        self.pods.synced().await;
    }

    /// Membership streams opened so far (a first one, resumes, reconnects).
    pub fn streams_opened(&self) -> u64 {
        self.counters.opened.get()
    }

    /// Times the API server's member-label watch took over from the streams.
    pub fn member_fallbacks(&self) -> u64 {
        self.counters.fallbacks.get()
    }

    /// When a subset first listed this node for `namespace`/`revision`, as its caches saw it.
    pub fn joined_at(&self, namespace: &str, revision: &str) -> Option<Instant> {
        self.joined
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_string(), revision.to_string()))
            .copied()
    }

    /// (subsets listing this node, Revisions read for them, pods on the node) held now.
    pub fn counts(&self) -> (usize, usize, usize) {
        (
            self.endpoints.counts().0,
            self.revisions.len(),
            self.pods.counts().0,
        )
    }
}

impl Drop for WatchOnly {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
