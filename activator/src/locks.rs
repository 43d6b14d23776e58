//! Locks that survive a panic elsewhere: a task that panicked while holding one leaves its
//! data as it was, and every piece of state here stays usable (a throttle, a cache, a list),
//! so the next holder takes it rather than panicking in turn and taking the node's traffic
//! down with it. One spelling of that rule instead of the idiom written out at every site.

use std::sync::{Mutex, MutexGuard};

pub(crate) trait Locked<T> {
    /// The guard, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}
