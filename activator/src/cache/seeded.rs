//! The membership watch's first state from the directory, not from a list.
//!
//! A label-selected list of ActivationEndpoints is a scan of every object in the API server's
//! watch cache (custom resources have no label index): at 100,000 revisions about 0.2 s of
//! API server CPU for each activator that starts, and a DaemonSet rollout starts every one
//! (docs/membership-watch-cost.md). The subsetter's replicas hold the same objects in memory
//! and answer a node's memberships with a version (`crds::directory::MembersAnswer`); the
//! watch then starts from that version, which the API server serves from its cache's recent
//! events, filtered by the same label: the start costs the API server the events since the
//! version, not the objects.
//!
//! Why it is the same state: the answer is every object carrying the node's member label as
//! the replica's watch last showed them all, and no object in it is newer than its version.
//! A watch from that version replays every change after it (including ones the answer
//! already has, which change nothing once replayed, since each event carries the whole
//! object), so once the replay is read the store is what a list would have given.
//!
//! Whatever makes the answer doubtful falls back to a list: no directory answer, an answer
//! that does not hold to the query, or a version the API server no longer has (410) or will
//! not watch from before the watch has said anything. The list replaces the store, so
//! nothing seeded survives a doubt.
//!
//! The same holds later on. A watch the API server ends is reopened from the newest version
//! it showed (bookmarks included), as kube-runtime's watcher does. But when that version has
//! left the API server's cache (410 Expired), the watcher's answer is a list, and on a busy
//! real API server that is common: in the real-API-server run at 1,000 nodes, its watch
//! cache closed the activators' watches as "unresponsive" about 150,000 times in 15 minutes
//! of bulk creation, and 544 reopened ones were told their version had expired. Here the
//! next state after a 410 comes from the directory again (a list only if it gives none), so
//! a membership watch lists only when the directory cannot answer
//! (docs/membership-watch-cost.md).

use std::time::Duration;

use crds::ActivationEndpoints;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use tracing::{debug, info};

use super::directory::Directory;

/// The membership watch's events.
pub type Events = BoxStream<'static, Result<Event<ActivationEndpoints>, watcher::Error>>;

/// How long a start waits for the directory's replicas to be known (their watch starts with
/// the activator's).
const REPLICAS_WAIT: Duration = Duration::from_secs(5);

/// The watch's server-side timeout (kube-runtime's watcher asks the same).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// A watch that says nothing, bookmarks included, for this long is taken for dead and
/// reopened from its version (kube-runtime's watcher: the timeout and a margin).
const WATCH_IDLE: Duration = Duration::from_secs(WATCH_TIMEOUT_SECS as u64 + 5);

/// The watch `cfg` asks for (its label selector; a list from the API server's cache, in one
/// page), each first state from `directory` when it answers `node`'s memberships, else
/// listed. Without a directory, kube-runtime's watcher.
pub fn watch(
    api: Api<ActivationEndpoints>,
    cfg: watcher::Config,
    node: String,
    directory: Option<Directory>,
) -> Events {
    let Some(directory) = directory else {
        return watcher::watcher(api, cfg).boxed();
    };
    let mut list = ListParams::default().match_any();
    let mut params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
    if let Some(l) = &cfg.label_selector {
        list = list.labels(l);
        params = params.labels(l);
    }
    let machine = Machine {
        api,
        list,
        params,
        node,
        directory,
        phase: Phase::Ask,
    };
    stream::unfold(machine, |mut m| async move {
        let item = m.step().await;
        Some((item, m))
    })
    .boxed()
}

/// The membership watch: where it is, and what it needs to go on.
struct Machine {
    api: Api<ActivationEndpoints>,
    list: ListParams,
    params: WatchParams,
    node: String,
    directory: Directory,
    phase: Phase,
}

enum Phase {
    /// Ask the directory for a first state.
    Ask,
    /// List one.
    List,
    /// Hand out a first state's events, then watch from its version.
    Seed {
        events: std::vec::IntoIter<Event<ActivationEndpoints>>,
        then: Following,
    },
    Watch(Following),
}

/// A watch from a first state's version on.
struct Following {
    /// The newest version seen: a reopened watch starts there.
    version: String,
    events: Option<BoxStream<'static, kube::Result<WatchEvent<ActivationEndpoints>>>>,
    /// Whether the open watch has said anything (an event or a bookmark).
    said: bool,
    /// The version is the directory's and no watch from it has said anything yet: a watch
    /// that ends or fails now casts doubt on the answer, and the next state is listed.
    unconfirmed: bool,
}

/// What the open watch gave.
enum Next {
    /// Boxed: an object is large beside the other variants.
    Event(Box<Event<ActivationEndpoints>>),
    /// An error to pass on (and be backed off); the watch reopens from its version.
    Retry(watcher::Error),
    /// The version has left the API server's cache: a new first state is needed.
    Expired(Box<Status>),
    /// The directory's version did not hold.
    Doubted,
}

impl Machine {
    /// The next item: an event of a first state or of the watch, or an error.
    async fn step(&mut self) -> Result<Event<ActivationEndpoints>, watcher::Error> {
        loop {
            match &mut self.phase {
                Phase::Ask => match self.directory.members(&self.node, REPLICAS_WAIT).await {
                    Ok(m) => {
                        info!(
                            subsets = m.items.len(),
                            resource_version = %m.resource_version,
                            "memberships from the directory; watching from its version"
                        );
                        self.phase = seed(m.items, m.resource_version, true);
                    }
                    Err(e) => {
                        info!(error = %e, "memberships not from the directory: listing them");
                        self.phase = Phase::List;
                    }
                },
                Phase::List => match self.api.list(&self.list).await {
                    Ok(l) => {
                        // A list's version is what the watch needs; a server that gives none
                        // cannot be watched from it (kube-runtime's watcher fails the same).
                        let Some(v) = l.metadata.resource_version.filter(|v| !v.is_empty()) else {
                            return Err(watcher::Error::NoResourceVersion);
                        };
                        self.phase = seed(l.items, v, false);
                    }
                    Err(e) => return Err(watcher::Error::InitialListFailed(e)),
                },
                Phase::Seed { events, then } => match events.next() {
                    Some(ev) => return Ok(ev),
                    None => {
                        let then = std::mem::replace(then, Following::new(String::new(), false));
                        self.phase = Phase::Watch(then);
                    }
                },
                Phase::Watch(f) => match f.next(&self.api, &self.params).await {
                    Next::Event(ev) => return Ok(*ev),
                    Next::Retry(e) => return Err(e),
                    Next::Expired(e) => {
                        info!("the membership watch's version expired: a new first state");
                        self.phase = Phase::Ask;
                        return Err(watcher::Error::WatchError(e));
                    }
                    Next::Doubted => {
                        info!(
                            "the watch from the directory's version ended: listing the memberships"
                        );
                        self.phase = Phase::List;
                    }
                },
            }
        }
    }
}

/// A first state (`items` at `version`) as a list's events, then the watch from `version`.
fn seed(items: Vec<ActivationEndpoints>, version: String, from_directory: bool) -> Phase {
    let events: Vec<_> = std::iter::once(Event::Init)
        .chain(items.into_iter().map(Event::InitApply))
        .chain(std::iter::once(Event::InitDone))
        .collect();
    Phase::Seed {
        events: events.into_iter(),
        then: Following::new(version, from_directory),
    }
}

impl Following {
    fn new(version: String, from_directory: bool) -> Self {
        Self {
            version,
            events: None,
            said: false,
            unconfirmed: from_directory,
        }
    }

    /// Watches from the newest version seen, reopening each watch the server ends or that
    /// falls silent (kube-runtime's watcher does the same), until the version expires or,
    /// while it is the directory's and unconfirmed, anything goes wrong.
    async fn next(&mut self, api: &Api<ActivationEndpoints>, params: &WatchParams) -> Next {
        loop {
            let events = match &mut self.events {
                Some(e) => e,
                None => match api.watch(params, &self.version).await {
                    Ok(events) => {
                        self.said = false;
                        self.events.insert(events.boxed())
                    }
                    Err(_) if self.unconfirmed => return Next::Doubted,
                    Err(kube::Error::Api(e)) if e.code == 410 => return Next::Expired(e),
                    Err(e) => {
                        debug!(error = %e, version = %self.version, "the membership watch was refused");
                        return Next::Retry(watcher::Error::WatchStartFailed(e));
                    }
                },
            };
            let next = match tokio::time::timeout(WATCH_IDLE, events.next()).await {
                Err(_) => {
                    self.events = None;
                    continue;
                }
                Ok(None) if !self.said && self.unconfirmed => return Next::Doubted,
                Ok(None) => {
                    self.events = None;
                    continue;
                }
                Ok(Some(Err(_))) if self.unconfirmed => return Next::Doubted,
                Ok(Some(Err(e))) => {
                    self.events = None;
                    return Next::Retry(watcher::Error::WatchFailed(e));
                }
                Ok(Some(Ok(ev))) => ev,
            };
            let ev = match next {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => Event::Apply(o),
                WatchEvent::Deleted(o) => Event::Delete(o),
                WatchEvent::Bookmark(b) => {
                    self.confirmed();
                    self.version = b.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(e) if self.unconfirmed => {
                    info!(code = e.code, reason = %e.reason, "the watch from the directory's version ended");
                    return Next::Doubted;
                }
                WatchEvent::Error(e) if e.code == 410 => return Next::Expired(e),
                WatchEvent::Error(e) => {
                    self.events = None;
                    return Next::Retry(watcher::Error::WatchError(e));
                }
            };
            self.confirmed();
            if let Event::Apply(o) | Event::Delete(o) = &ev
                && let Some(v) = &o.metadata.resource_version
            {
                self.version.clone_from(v);
            }
            return Next::Event(Box::new(ev));
        }
    }

    /// The open watch said something: its version held.
    fn confirmed(&mut self) {
        self.said = true;
        self.unconfirmed = false;
    }
}
