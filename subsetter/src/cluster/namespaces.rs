//! Which namespaces' Revisions this subsetter reconciles (`--namespace-selector`), so that
//! two subsetters can share a cluster: the installed one leaves alone the namespaces another
//! claims (a test rig's, a canary's), as sharded controllers do with a label selector.
//!
//! The selection gates the triggers (`controller.rs`), the one way a reconcile starts: the
//! Revision and ActivationEndpoints caches stay cluster-wide (a namespace that becomes
//! selected is reconciled from them at once, without a relist), and a Revision outside the
//! selection is never written to. [`Selection`] is pure; [`watch_namespaces`] feeds it.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use crds::backoff::resilient;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use crate::cluster::error::{Error, Result};
use keep_serving::ReadWriteLocked;

/// The namespaces selected, as the namespace watch last said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// No selector: every namespace.
    All,
    /// A selector whose first list has not arrived: nothing yet (what arrives decides).
    Pending,
    Only(HashSet<String>),
}

impl Selection {
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Pending => false,
            Self::Only(set) => set.contains(namespace),
        }
    }

    /// The namespace watch's relist ended with `now`: the namespaces that became selected.
    pub fn relisted(&mut self, now: HashSet<String>) -> Vec<String> {
        let added = match self {
            Self::Only(before) => now.difference(before).cloned().collect(),
            Self::All | Self::Pending => now.iter().cloned().collect(),
        };
        *self = Self::Only(now);
        added
    }

    /// A namespace matches the selector (created, or labelled to match): whether it is new.
    pub fn selected(&mut self, namespace: &str) -> bool {
        match self {
            Self::Only(set) => set.insert(namespace.to_owned()),
            // Before the first list: the relist reports it.
            Self::Pending | Self::All => false,
        }
    }

    /// A namespace stops matching (deleted, or labelled not to match).
    pub fn deselected(&mut self, namespace: &str) {
        if let Self::Only(set) = self {
            set.remove(namespace);
        }
    }
}

/// The selection, shared between the namespace watch and the triggers.
#[derive(Clone)]
pub struct Selected(Arc<RwLock<Selection>>);

impl Selected {
    pub fn new(selector: Option<&str>) -> Self {
        let s = match selector {
            None => Selection::All,
            Some(_) => Selection::Pending,
        };
        Self(Arc::new(RwLock::new(s)))
    }

    pub fn allows(&self, namespace: &str) -> bool {
        self.0.read_locked().allows(namespace)
    }

    fn update<T>(&self, f: impl FnOnce(&mut Selection) -> T) -> T {
        f(&mut self.0.write_locked())
    }
}

/// Refuses a selector the API server refuses, with its reason: the namespace watch would
/// otherwise retry it forever and the subsetter never be ready. An API server that does not
/// answer is no reason to refuse (the watch waits for it): logged, Ok.
pub async fn check_selector(api: &Api<Namespace>, selector: &str) -> Result<()> {
    let lp = ListParams::default().labels(selector).limit(1);
    match api.list_metadata(&lp).await {
        Err(kube::Error::Api(e)) if e.code == 400 => Err(Error::NamespaceSelector {
            selector: selector.to_owned(),
            reason: e.message,
        }),
        Err(e) => {
            warn!(error = %e, %selector, "could not check the namespace selector yet");
            Ok(())
        }
        Ok(_) => Ok(()),
    }
}

/// Keeps `selected` from a watch of the Namespaces matching `selector` (the API server
/// filters; one that stops matching arrives as a delete). Calls `synced` once the first list
/// is in, and `added` with each namespace that becomes selected (its Revisions are then
/// triggered from the cache).
pub async fn watch_namespaces(
    api: Api<Namespace>,
    selector: String,
    selected: Selected,
    synced: impl Fn(),
    added: impl Fn(Vec<String>),
) {
    let cfg = watcher::Config::default().labels(&selector);
    let mut events = std::pin::pin!(resilient(watcher::watcher(api, cfg)));
    let mut relist: Option<HashSet<String>> = None;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, %selector, "Namespace watch");
                continue;
            }
        };
        match event {
            Event::Init => relist = Some(HashSet::new()),
            Event::InitApply(ns) => {
                if let Some(seen) = &mut relist {
                    seen.insert(ns.name_any());
                }
            }
            Event::InitDone => {
                let now = relist.take().unwrap_or_default();
                let count = now.len();
                let new = selected.update(|s| s.relisted(now));
                info!(%selector, namespaces = count, "namespaces selected");
                synced();
                if !new.is_empty() {
                    added(new);
                }
            }
            Event::Apply(ns) => {
                let name = ns.name_any();
                if selected.update(|s| s.selected(&name)) {
                    info!(namespace = %name, "namespace selected");
                    added(vec![name]);
                }
            }
            Event::Delete(ns) => {
                let name = ns.name_any();
                info!(namespace = %name, "namespace no longer selected");
                selected.update(|s| s.deselected(&name));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn no_selector_allows_every_namespace() {
        assert!(Selection::All.allows("anything"));
    }

    #[test]
    fn a_selector_allows_nothing_until_its_first_list() {
        let mut s = Selection::Pending;
        assert!(!s.allows("a"));
        assert!(!s.selected("a"), "reported by the relist instead");
        let mut added = s.relisted(set(&["a", "b"]));
        added.sort();
        assert_eq!(added, ["a", "b"]);
        assert!(s.allows("a") && s.allows("b") && !s.allows("c"));
    }

    #[test]
    fn a_relist_reports_only_what_it_adds_and_forgets_what_it_lacks() {
        let mut s = Selection::Only(set(&["a", "b"]));
        assert_eq!(s.relisted(set(&["b", "c"])), ["c"]);
        assert!(!s.allows("a") && s.allows("b") && s.allows("c"));
    }

    #[test]
    fn namespaces_come_and_go() {
        let mut s = Selection::Only(set(&[]));
        assert!(s.selected("a"));
        assert!(!s.selected("a"), "already selected: nothing to trigger");
        assert!(s.allows("a"));
        s.deselected("a");
        assert!(!s.allows("a"));
        assert!(s.selected("a"));
    }
}
