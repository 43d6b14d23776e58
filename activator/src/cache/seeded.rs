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
//! Whatever goes wrong falls back to what the activator did before, the watcher's own list:
//! no directory, no answer, an answer that does not hold to the query, a version the API
//! server no longer has (410), or a watch that fails. The fallback lists afresh and replaces
//! the store, so nothing seeded survives a doubt.

use std::time::Duration;

use crds::ActivationEndpoints;
use crds::directory::MembersAnswer;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use kube::Api;
use kube::api::{WatchEvent, WatchParams};
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

/// The watch `cfg` asks for, its first state from `directory` when it answers `node`'s
/// memberships, else listed.
pub fn watch(
    api: Api<ActivationEndpoints>,
    cfg: watcher::Config,
    node: String,
    directory: Option<Directory>,
) -> Events {
    let Some(directory) = directory else {
        return watcher::watcher(api, cfg).boxed();
    };
    stream::once(async move {
        match directory.members(&node, REPLICAS_WAIT).await {
            Ok(m) => {
                info!(
                    subsets = m.items.len(),
                    resource_version = %m.resource_version,
                    "memberships from the directory; watching from its version"
                );
                seeded(api, cfg, m)
            }
            Err(e) => {
                info!(error = %e, "memberships not from the directory: listing them");
                watcher::watcher(api, cfg).boxed()
            }
        }
    })
    .flatten()
    .boxed()
}

/// The answer as a list's events, then the watch from its version, then (once that watch
/// cannot go on) the watcher's own list and watch.
fn seeded(api: Api<ActivationEndpoints>, cfg: watcher::Config, m: MembersAnswer) -> Events {
    let listed = std::iter::once(Event::Init)
        .chain(m.items.into_iter().map(Event::InitApply))
        .chain(std::iter::once(Event::InitDone))
        .map(Ok);
    let follow = follow(api.clone(), cfg.label_selector.clone(), m.resource_version);
    let fallback = stream::once(async move {
        info!("the watch from the directory's version ended: listing the memberships");
        watcher::watcher(api, cfg)
    })
    .flatten();
    stream::iter(listed).chain(follow).chain(fallback).boxed()
}

/// Where [`follow`] is.
struct Following {
    api: Api<ActivationEndpoints>,
    params: WatchParams,
    /// The newest version seen: the next watch starts there.
    version: String,
    events: Option<BoxStream<'static, kube::Result<WatchEvent<ActivationEndpoints>>>>,
    /// Whether the open watch has said anything (an event or a bookmark).
    said: bool,
}

/// Watches from `version` on, reopening each watch the server ends from the newest version
/// seen (bookmarks included), until one cannot go on: an error, a 410, a watch refused, or
/// one that ends having said nothing. Then it ends, and its caller lists.
fn follow(
    api: Api<ActivationEndpoints>,
    labels: Option<String>,
    version: String,
) -> impl futures::Stream<Item = Result<Event<ActivationEndpoints>, watcher::Error>> + Send {
    let mut params = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
    if let Some(l) = labels {
        params = params.labels(&l);
    }
    let start = Following {
        api,
        params,
        version,
        events: None,
        said: false,
    };
    stream::unfold(Some(start), |st| async move {
        let mut st = st?;
        loop {
            if st.events.is_none() {
                match st.api.watch(&st.params, &st.version).await {
                    Ok(events) => {
                        st.events = Some(events.boxed());
                        st.said = false;
                    }
                    Err(e) => {
                        debug!(error = %e, version = %st.version, "the watch from the directory's version was refused");
                        return None;
                    }
                }
            }
            let events = st.events.as_mut()?;
            let next = match tokio::time::timeout(WATCH_IDLE, events.next()).await {
                Err(_) => {
                    st.events = None;
                    continue;
                }
                Ok(None) if st.said => {
                    st.events = None;
                    continue;
                }
                Ok(None) => return None,
                Ok(Some(Err(e))) => {
                    debug!(error = %e, "the watch from the directory's version failed");
                    return None;
                }
                Ok(Some(Ok(ev))) => ev,
            };
            st.said = true;
            let ev = match next {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => Event::Apply(o),
                WatchEvent::Deleted(o) => Event::Delete(o),
                WatchEvent::Bookmark(b) => {
                    st.version = b.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(e) => {
                    info!(code = e.code, reason = %e.reason, "the watch from the directory's version ended");
                    return None;
                }
            };
            if let Event::Apply(o) | Event::Delete(o) = &ev
                && let Some(v) = &o.metadata.resource_version
            {
                st.version.clone_from(v);
            }
            return Some((Ok(ev), Some(st)));
        }
    })
}
