//! Which of the caches' watches have had their first list. Its own module, below the watches
//! that set it and the caches that wait for it, so neither imports the other.

/// One flag a watch; reconciles wait until [`Synced::all`].
#[derive(Default, Clone, Copy)]
pub(crate) struct Synced {
    pub(crate) endpoints: bool,
    pub(crate) pods: bool,
    pub(crate) nodes: bool,
    pub(crate) namespaces: bool,
    pub(crate) routes: bool,
    pub(crate) app_pods: bool,
}

impl Synced {
    /// Every watch has had its first list: an empty cache no longer reads as "none".
    pub(crate) fn all(self) -> bool {
        self.endpoints && self.pods && self.nodes && self.namespaces && self.routes && self.app_pods
    }
}
