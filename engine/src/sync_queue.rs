//! A partition's group commit: appenders that need their records durable queue here, one of
//! them leads an fdatasync for all, and the others wait for its outcome.
//!
//! A waiter sleeps on its own condition variable. When an fdatasync ends, its leader wakes
//! exactly the waiters it made durable. If others wait still, the leader runs the next
//! fdatasync for them at once (the partition bounds how many in a row), and then wakes one of
//! them (the one with the lowest end) to lead instead: waking a sleeping thread takes tens of
//! microseconds on a virtual machine, time the disk would sit idle.
//!
//! *Invariants:* at most one leader at a time (`syncing`); nothing is called durable that no
//! fdatasync covered; no appender is woken for nothing, and none is left asleep with no
//! fdatasync coming: a waiter registers and sleeps under the same lock a leader takes to wake,
//! a leader that stops leading wakes someone while waiters remain, a failed fdatasync wakes
//! every waiter, and an appender that finds the engine poisoned wakes every waiter too (each
//! then finds the poison). The loom models (`loom_models.rs`) check these over every
//! interleaving of three appenders.

use crate::Offset;
use crate::sync::{Condvar, Mutex};

#[cfg(loom)]
use loom::sync::Arc;
#[cfg(not(loom))]
use std::sync::Arc;

#[derive(Debug)]
pub(crate) struct SyncQueue {
    queue: Mutex<Queue>,
    /// A deliberate bug, for the loom model that proves it can fail.
    #[cfg(loom)]
    pub(crate) bug: Option<QueueBug>,
}

/// The deliberate bugs the loom models switch on (never on outside them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QueueBug {
    /// A leader that stops leading wakes nobody to lead next.
    NoHandOff,
    /// An appender that finds the engine poisoned leaves the other waiters asleep.
    PoisonLeavesWaiters,
}

#[derive(Debug)]
struct Queue {
    /// A leader is running an fdatasync.
    syncing: bool,
    /// Appenders waiting for the running fdatasync or to lead the next one.
    waiters: Vec<Waiter>,
    /// Every offset below this one is durable.
    synced: Offset,
    /// When `synced` last moved, on the engine clock.
    last_sync_ms: i64,
}

#[derive(Debug)]
struct Waiter {
    end: Offset,
    wake: Arc<Condvar>,
}

/// What [`SyncQueue::wait_turn`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Every offset below the end asked for is durable.
    Durable,
    /// The caller leads: it runs fdatasyncs, ending each with [`SyncQueue::end_round`],
    /// until that says to stop.
    Lead,
}

impl SyncQueue {
    pub fn new(synced: Offset, now_ms: i64) -> SyncQueue {
        let queue = Queue { syncing: false, waiters: Vec::new(), synced, last_sync_ms: now_ms };
        SyncQueue {
            queue: Mutex::new(queue),
            #[cfg(loom)]
            bug: None,
        }
    }

    /// Every offset below this one is durable, and when that last changed.
    pub fn synced(&self) -> (Offset, i64) {
        let queue = self.queue.lock();
        (queue.synced, queue.last_sync_ms)
    }

    /// Wait until every offset below `end` is durable, or until the caller is to lead the next
    /// fdatasync. `check` (the engine's poison) is asked before each wait; its error is
    /// returned at once.
    pub fn wait_turn<E>(&self, end: Offset, check: impl Fn() -> Result<(), E>) -> Result<Turn, E> {
        let mut queue = self.queue.lock();
        loop {
            if queue.synced >= end {
                return Ok(Turn::Durable);
            }
            if let Err(error) = check() {
                // Whoever this wakes finds the error too; none is left waiting for a leader
                // that will not come (this appender may have been woken to lead).
                if !self.has_bug(QueueBug::PoisonLeavesWaiters) {
                    for waiter in queue.waiters.drain(..) {
                        waiter.wake.notify_one();
                    }
                }
                return Err(error);
            }
            if !queue.syncing {
                queue.syncing = true;
                return Ok(Turn::Lead);
            }
            let wake = Arc::new(Condvar::new());
            queue.waiters.push(Waiter { end, wake: Arc::clone(&wake) });
            wake.wait(&mut queue);
            // Woken waiters were taken off the list; after a spurious wake-up, leave it too.
            queue.waiters.retain(|w| !Arc::ptr_eq(&w.wake, &wake));
        }
    }

    /// A leader's fdatasync ended: `durable` is the offset it made durable, `None` if it
    /// failed. `mark` runs under the queue's lock before anyone is woken; it returns the time
    /// to record the new synced offset at, or `None` if it may not be called durable (the
    /// engine was poisoned meanwhile). Wakes the waiters it covered (every waiter if it
    /// failed). Returns whether the caller leads the next fdatasync: only if `may_continue`,
    /// it succeeded, and waiters remain; otherwise leadership is handed to one of them.
    pub fn end_round(
        &self,
        durable: Option<Offset>,
        may_continue: bool,
        mark: impl FnOnce(Offset) -> Option<i64>,
    ) -> bool {
        let mut queue = self.queue.lock();
        assert!(queue.syncing, "only a leader ends a round");
        if let Some(offset) = durable {
            Self::record(&mut queue, offset, mark);
        }
        Self::wake_covered(&mut queue, durable.is_none());
        let more = may_continue && durable.is_some() && !queue.waiters.is_empty();
        if !more {
            queue.syncing = false;
            let next = queue.waiters.iter().enumerate().min_by_key(|(_, w)| w.end).map(|(i, _)| i);
            if let Some(next) = next.filter(|_| !self.has_bug(QueueBug::NoHandOff)) {
                queue.waiters.swap_remove(next).wake.notify_one();
            }
        }
        more
    }

    /// Outside a round (a roll's seal, a committed transaction's sync): every offset below
    /// `offset` is durable. `mark` as in [`SyncQueue::end_round`].
    pub fn mark_durable(&self, offset: Offset, mark: impl FnOnce(Offset) -> Option<i64>) {
        let mut queue = self.queue.lock();
        Self::record(&mut queue, offset, mark);
        Self::wake_covered(&mut queue, false);
    }

    fn record(queue: &mut Queue, offset: Offset, mark: impl FnOnce(Offset) -> Option<i64>) {
        if let Some(now_ms) = mark(offset)
            && offset > queue.synced
        {
            queue.synced = offset;
            queue.last_sync_ms = now_ms;
        }
    }

    /// Wake every waiter now durable, or, when an fdatasync failed, every waiter.
    fn wake_covered(queue: &mut Queue, failed: bool) {
        let synced = queue.synced;
        queue.waiters.retain(|w| {
            let wake = failed || w.end <= synced;
            if wake {
                w.wake.notify_one();
            }
            !wake
        });
    }

    #[cfg(loom)]
    fn has_bug(&self, kind: QueueBug) -> bool {
        self.bug == Some(kind)
    }

    #[cfg(not(loom))]
    #[allow(clippy::unused_self)]
    fn has_bug(&self, _kind: QueueBug) -> bool {
        false
    }
}
