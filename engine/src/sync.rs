//! The locks and condition variables of the engine's concurrent parts, behind one seam: in a
//! normal build they are `parking_lot`'s; built with `--cfg loom` (`scripts/loom`) they are
//! loom's, wrapped to the same API, so the loom models in `loom_models.rs` run the same code
//! over every interleaving loom explores. Loom has no time: under it a timed wait is a wait.

#[cfg(not(loom))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

#[cfg(loom)]
pub(crate) use model::{Condvar, Mutex, MutexGuard, RwLock};

#[cfg(loom)]
mod model {
    use std::fmt;
    use std::ops::{Deref, DerefMut};
    use std::time::Duration;

    /// A loom mutex with `parking_lot`'s API (no poisoning).
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    /// Holds its loom guard in an `Option` only so a condition variable can wait on it
    /// through `&mut`, as `parking_lot`'s does; it is `Some` whenever user code sees it.
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Mutex<T> {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().expect("loom: no poisoning")))
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Mutex<T> {
            Mutex::new(T::default())
        }
    }

    impl<T> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex")
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("a guard is held outside a wait")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("a guard is held outside a wait")
        }
    }

    /// A loom reader-writer lock with `parking_lot`'s API (no poisoning).
    pub struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub fn new(value: T) -> RwLock<T> {
            RwLock(loom::sync::RwLock::new(value))
        }

        pub fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().expect("loom: no poisoning")
        }

        pub fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().expect("loom: no poisoning")
        }

        /// Through the lock: loom's has no `get_mut`, and taking it uncontended is the same.
        pub fn get_mut(&mut self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.write()
        }
    }

    impl<T> fmt::Debug for RwLock<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("RwLock")
        }
    }

    #[derive(Debug)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        #[allow(clippy::new_without_default)]
        pub fn new() -> Condvar {
            Condvar(loom::sync::Condvar::new())
        }

        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let held = guard.0.take().expect("a guard is held outside a wait");
            guard.0 = Some(self.0.wait(held).expect("loom: no poisoning"));
        }

        /// No time under loom: waits until `condition` is false.
        pub fn wait_while_for<T>(
            &self,
            guard: &mut MutexGuard<'_, T>,
            mut condition: impl FnMut(&mut T) -> bool,
            _timeout: Duration,
        ) {
            while condition(&mut *guard) {
                self.wait(guard);
            }
        }

        /// No time under loom: waits for one notification.
        pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, _timeout: Duration) {
            self.wait(guard);
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

/// The deliberate bugs of the loom models that run the whole engine (`loom_models.rs`), in
/// code loom builds only. Process-global, so each model that switches one on runs alone in a
/// child process of its own.
#[cfg(loom)]
pub(crate) mod bugs {
    use std::sync::atomic::{AtomicU8, Ordering};

    static ACTIVE: AtomicU8 = AtomicU8::new(0);

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[repr(u8)]
    pub(crate) enum Bug {
        /// Compaction takes the old segments out of the list and puts the cleaned one in, in
        /// two lock sections instead of one.
        SplitSwap = 1,
        /// A transaction takes its partitions in the order of its writes, not in name order.
        UnorderedTransaction = 2,
        /// The write path's driver hands out answers and lets go of the role without waking
        /// the waiters.
        DriverWakesNobody = 3,
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn set(bug: Bug) {
        ACTIVE.store(bug as u8, Ordering::SeqCst);
    }

    pub(crate) fn active(bug: Bug) -> bool {
        ACTIVE.load(Ordering::SeqCst) == bug as u8
    }
}
