//! Taking a lock whether or not it is poisoned. A panic while one of the subsetter's locks
//! was held would otherwise poison it, and every later reconcile, watch event or directory
//! lookup that takes it would panic too: one bug would stop the controller. These take the
//! guard anyway and carry on with what the panicking holder left.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `m` locked, poisoned or not.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `m` locked for reading, poisoned or not.
pub(crate) fn read<T: ?Sized>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

/// `m` locked for writing, poisoned or not.
pub(crate) fn write<T: ?Sized>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}
