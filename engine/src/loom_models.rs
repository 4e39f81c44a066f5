//! The loom models of the engine's concurrent parts, run by `scripts/loom` (the engine built
//! with `--cfg loom`, so the parts below use loom's atomics, locks and condition variables and
//! loom explores every interleaving of the model's threads). The only place under `src/` with
//! threads besides the runtime (`tests/tidy.rs` exempts it): loom's, simulated.
//!
//! - `watermark`: a visible high watermark covers the bytes written before it (and the model
//!   catches a publish without Release), a waiter wakes for the publish that covers it, and
//!   concurrent publishes never move it back.

use crate::Offset;
use crate::watermark::Watermark;
use loom::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

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
