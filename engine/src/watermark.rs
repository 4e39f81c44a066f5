//! A partition's high watermark: the end of what readers may see. Published by appenders
//! (after the bytes it covers are written, and in `sync` mode fdatasynced), read without a
//! lock by every fetch, and waited on by followers.
//!
//! *Invariant:* a reader that sees watermark `h` also sees every byte written before `h` was
//! published (Release store, Acquire load), and the watermark never goes back. A waiter is
//! never left asleep past a publish that covers it (the value changes and the notification
//! happen under the lock the waiter checks it under).
//!
//! Under `--cfg loom` the same code runs on loom's primitives: `loom_models` below checks those
//! three properties over every interleaving (`loom_models.rs`, `scripts/loom`). Loom has no time,
//! so under it a wait has no timeout.

use crate::Offset;
use std::time::Duration;

use crate::sync::{Condvar, Mutex};
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub(crate) struct Watermark {
    /// The value, changed only under this lock (waiters check it under the lock too).
    value: Mutex<u64>,
    changed: Condvar,
    /// `value` mirrored for lock-free reads.
    mirror: AtomicU64,
}

impl Watermark {
    pub fn new(offset: Offset) -> Watermark {
        Watermark {
            value: Mutex::new(offset.get()),
            changed: Condvar::new(),
            mirror: AtomicU64::new(offset.get()),
        }
    }

    pub fn get(&self) -> Offset {
        Offset::new(self.mirror.load(Ordering::Acquire))
    }

    /// Move the watermark up to `offset` (never down) and wake every waiter.
    pub fn publish(&self, offset: Offset) {
        self.publish_with(offset, Ordering::Release);
    }

    /// `publish` with the mirror's store ordering given (the loom models break it on purpose).
    pub(crate) fn publish_with(&self, offset: Offset, ordering: Ordering) {
        let mut value = self.value.lock();
        if offset.get() > *value {
            *value = offset.get();
            self.mirror.store(offset.get(), ordering);
            self.changed.notify_all();
        }
    }

    /// Wait until the watermark is past `offset`, at most `timeout`; whether it is.
    pub fn wait_past(&self, offset: Offset, timeout: Duration) -> bool {
        let mut value = self.value.lock();
        self.changed.wait_while_for(&mut value, |v| *v <= offset.get(), timeout);
        *value > offset.get()
    }

    /// Wait for the next publish, at most `timeout` (a reader beside another process's
    /// writer, which publishes nothing here, just sleeps).
    pub fn wait_change(&self, timeout: Duration) {
        let mut value = self.value.lock();
        self.changed.wait_for(&mut value, timeout);
    }
}
