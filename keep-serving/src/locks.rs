//! Locks that survive a panic elsewhere. A task that panics while holding one poisons it, and
//! every later `lock().unwrap()` would panic in turn. The data behind the product's locks
//! stays usable as the panicking holder left it (a throttle, a cache, a list, a queue), so the
//! next holder takes the guard and carries on. The names differ from the std methods because
//! inherent methods (`lock`, `read`, `write`) win over a trait's.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A [`Mutex`] taken whether or not it is poisoned.
pub trait Locked<T: ?Sized> {
    /// The guard, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An [`RwLock`] taken whether or not it is poisoned.
pub trait ReadWriteLocked<T: ?Sized> {
    /// The read guard, poisoned or not.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// The write guard, poisoned or not.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWriteLocked<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Panics on another thread while holding whatever `hold` takes, so the lock is poisoned.
    fn poison(hold: impl FnOnce() + Send + 'static) {
        let joined = std::thread::spawn(hold).join();
        assert!(joined.is_err(), "the holder panicked");
    }

    #[test]
    fn a_poisoned_mutex_is_still_taken_with_what_the_holder_left() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let held = m.clone();
        poison(move || {
            let mut guard = held.lock().unwrap();
            guard.push(2);
            panic!("while holding the mutex");
        });
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), vec![1, 2]);
        m.locked().push(3);
        assert_eq!(*m.locked(), vec![1, 2, 3]);
    }

    #[test]
    fn a_poisoned_rwlock_is_still_read_and_written() {
        let l = std::sync::Arc::new(RwLock::new(1));
        let held = l.clone();
        poison(move || {
            let mut guard = held.write().unwrap();
            *guard = 2;
            panic!("while holding the write lock");
        });
        assert!(l.is_poisoned());
        assert_eq!(*l.read_locked(), 2);
        *l.write_locked() = 3;
        assert_eq!(*l.read_locked(), 3);
    }

    #[test]
    fn unpoisoned_locks_are_taken_as_usual() {
        let m = Mutex::new(1);
        *m.locked() += 1;
        assert_eq!(*m.locked(), 2);
        let l = RwLock::new("a");
        assert_eq!(*l.read_locked(), "a");
        *l.write_locked() = "b";
        assert_eq!(*l.read_locked(), "b");
    }
}
