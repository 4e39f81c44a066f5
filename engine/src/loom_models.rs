//! The loom models of the engine's concurrent parts, run by `scripts/loom` (the engine built
//! with `--cfg loom`, so the parts below use loom's atomics, locks and condition variables and
//! loom explores every interleaving of the model's threads). The only place under `src/` with
//! threads besides the runtime (`tests/tidy.rs` exempts it): loom's, simulated.
//!
//! - `watermark`: a visible high watermark covers the bytes written before it (and the model
//!   catches a publish without Release), a waiter wakes for the publish that covers it, and
//!   concurrent publishes never move it back.
//! - `group_commit`: the group commit's queue (`sync_queue.rs`) with three appenders over a
//!   model disk: one fdatasync at a time, nothing acknowledged before an fdatasync covered it,
//!   nobody left asleep (loom reports a deadlock), also when an fdatasync fails or the engine
//!   is poisoned meanwhile; a leader that hands off to nobody, and a poisoned appender that
//!   leaves the others asleep, are caught.

use crate::Offset;
use crate::watermark::Watermark;
use loom::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

/// Run the ignored model `test` (one with a deliberate bug) in a child process, which must fail
/// with loom's deadlock report.
fn deadlock_in_a_child(test: &str) {
    let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--ignored", "--test-threads=1"])
        .output()
        .expect("run the test binary");
    let printed = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{test}: the deliberate bug was not found");
    assert!(printed.contains("deadlock"), "{test} failed, but not with a deadlock:\n{printed}");
}

/// A reader that sees the published watermark sees the data written before it.
fn publication(ordering: Ordering) {
    loom::model(move || {
        let mark = Arc::new(Watermark::new(Offset::ZERO));
        let data = Arc::new(AtomicU64::new(0));
        let writer = {
            let (mark, data) = (Arc::clone(&mark), Arc::clone(&data));
            thread::spawn(move || {
                data.store(42, Ordering::Relaxed); // the segment bytes
                mark.publish_with(Offset::new(1), ordering);
            })
        };
        if mark.get() == Offset::new(1) {
            assert_eq!(data.load(Ordering::Relaxed), 42, "a visible offset without its bytes");
        }
        writer.join().unwrap();
    });
}

#[test]
fn a_visible_watermark_covers_written_bytes() {
    publication(Ordering::Release);
}

/// The model can fail: published with a relaxed store, loom finds the reader that sees
/// the watermark before the bytes.
#[test]
fn a_relaxed_publish_is_caught() {
    let caught = std::panic::catch_unwind(|| publication(Ordering::Relaxed)).is_err();
    assert!(caught, "loom did not find the missing Release");
}

#[test]
fn a_waiter_wakes_for_the_publish_that_covers_it() {
    loom::model(|| {
        let mark = Arc::new(Watermark::new(Offset::ZERO));
        let waiter = {
            let mark = Arc::clone(&mark);
            thread::spawn(move || mark.wait_past(Offset::new(1), Duration::MAX))
        };
        mark.publish(Offset::new(1));
        mark.publish(Offset::new(2));
        assert!(waiter.join().unwrap());
    });
}

#[test]
fn concurrent_publishes_never_move_it_back() {
    loom::model(|| {
        let mark = Arc::new(Watermark::new(Offset::ZERO));
        let publishers: Vec<_> = [3, 5]
            .into_iter()
            .map(|o| {
                let mark = Arc::clone(&mark);
                thread::spawn(move || mark.publish(Offset::new(o)))
            })
            .collect();
        let first = mark.get();
        let second = mark.get();
        assert!(second >= first);
        for p in publishers {
            p.join().unwrap();
        }
        assert_eq!(mark.get(), Offset::new(5));
    });
}

mod group_commit {
    use crate::Offset;
    use crate::sync_queue::{QueueBug, SyncQueue, Turn};
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
    use loom::thread;

    /// A file's written end, its durable end, and the engine's poison.
    #[derive(Default)]
    struct Disk {
        written: AtomicU64,
        durable: AtomicU64,
        in_flight: AtomicUsize,
        fsyncs: AtomicUsize,
        /// The fdatasync with this number (from 1) fails.
        fail: Option<usize>,
        poisoned: AtomicBool,
    }

    #[derive(Debug)]
    struct Poisoned;

    impl Disk {
        fn check(&self) -> Result<(), Poisoned> {
            if self.poisoned.load(SeqCst) { Err(Poisoned) } else { Ok(()) }
        }

        /// An fdatasync of everything written before `target`; never two at once.
        fn fdatasync(&self, target: u64) -> bool {
            assert_eq!(self.in_flight.fetch_add(1, SeqCst), 0, "two fdatasyncs at once");
            let number = self.fsyncs.fetch_add(1, SeqCst) + 1;
            let ok = self.fail != Some(number);
            if ok {
                self.durable.fetch_max(target, SeqCst);
            } else {
                self.poisoned.store(true, SeqCst);
            }
            self.in_flight.fetch_sub(1, SeqCst);
            ok
        }
    }

    /// `Partition::append` then `sync_to` in miniature: write one record, then wait for an
    /// fdatasync that covers it or lead rounds of them (at most `rounds` in a row).
    fn append(queue: &SyncQueue, disk: &Disk, rounds: u32) -> Result<(), Poisoned> {
        let end = disk.written.fetch_add(1, SeqCst) + 1;
        if queue.wait_turn(Offset::new(end), || disk.check())? == Turn::Lead {
            for led in 1.. {
                disk.check().inspect_err(|_| {
                    queue.end_round(None, false, |_| None);
                })?;
                let target = disk.written.load(SeqCst);
                let durable = disk.fdatasync(target).then_some(Offset::new(target));
                let mark = |_| (!disk.poisoned.load(SeqCst)).then_some(0);
                let more = queue.end_round(durable, led < rounds, mark);
                durable.ok_or(Poisoned)?;
                if !more {
                    disk.check()?;
                    break;
                }
            }
        }
        assert!(disk.durable.load(SeqCst) >= end, "acknowledged before an fdatasync covered it");
        Ok(())
    }

    /// Three appenders, leaders handing off after `rounds`; the model's own thread appends
    /// too, or with `poison`, poisons the engine meanwhile (another appender's write failed).
    fn appenders(rounds: u32, fail: Option<usize>, poison: bool, bug: Option<QueueBug>) {
        loom::model(move || {
            let mut queue = SyncQueue::new(Offset::ZERO, 0);
            queue.bug = bug;
            let queue = Arc::new(queue);
            let disk = Arc::new(Disk { fail, ..Disk::default() });
            let others: Vec<_> = (0..if poison { 3 } else { 2 })
                .map(|_| {
                    let (queue, disk) = (Arc::clone(&queue), Arc::clone(&disk));
                    thread::spawn(move || append(&queue, &disk, rounds).is_ok())
                })
                .collect();
            if poison {
                // Another appender's write failed: the engine is poisoned meanwhile.
                disk.poisoned.store(true, SeqCst);
            } else {
                let _ = append(&queue, &disk, rounds);
            }
            let succeeded: Vec<bool> = others.into_iter().map(|t| t.join().unwrap()).collect();
            if fail.is_none() && !poison {
                assert!(succeeded.iter().all(|ok| *ok), "an append failed with no fault");
            }
        });
    }

    #[test]
    fn appenders_share_fdatasyncs_and_all_return() {
        appenders(1, None, false, None);
        appenders(2, None, false, None);
    }

    #[test]
    fn a_failed_fdatasync_wakes_every_waiter() {
        appenders(2, Some(1), false, None);
    }

    #[test]
    fn a_poison_meanwhile_leaves_nobody_asleep() {
        appenders(1, None, true, None);
    }

    /// The models can fail: each deliberate bug is found, as a deadlock (loom's report of one
    /// aborts the process, so each runs in a child process: `deadlock_in_a_child`).
    #[test]
    fn a_missing_hand_off_is_caught() {
        super::deadlock_in_a_child("loom_models::group_commit::bug_no_hand_off");
    }

    #[test]
    fn a_poisoned_appender_that_leaves_waiters_asleep_is_caught() {
        super::deadlock_in_a_child("loom_models::group_commit::bug_poison_leaves_waiters");
    }

    #[test]
    #[ignore = "a deliberate bug: run in a child process by a_missing_hand_off_is_caught"]
    fn bug_no_hand_off() {
        appenders(1, None, false, Some(QueueBug::NoHandOff));
    }

    #[test]
    #[ignore = "a deliberate bug: run in a child process by a_poisoned_appender_that_leaves_waiters_asleep_is_caught"]
    fn bug_poison_leaves_waiters() {
        appenders(1, None, true, Some(QueueBug::PoisonLeavesWaiters));
    }
}
