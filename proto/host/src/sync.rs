//! Locks whose data outlives a panicking holder.
//!
//! A panic while a `std::sync::Mutex` is held poisons it, and `lock()` then fails for every later
//! caller. Every lock in gpuwarden guards data that is consistent between statements (counters,
//! maps, whole values replaced at once), so a later holder takes the data as the panicking one
//! left it rather than spreading one task's panic to every thread: [`Lock::locked`] says so once.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// [`Mutex::lock`] that takes the data even after a holder panicked.
pub trait Lock<T: ?Sized> {
    /// Locks, blocking until the lock is free; a poisoned lock is taken as it is.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Lock<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::Lock;

    #[test]
    fn a_panicking_holder_leaves_the_data_to_the_next() {
        let shared = Arc::new(Mutex::new(1));
        let held = Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            let mut n = held.locked();
            *n = 2;
            panic!("while holding the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.locked(), 2);
    }
}
