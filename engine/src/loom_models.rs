//! The loom models of the engine's concurrent parts, run by `scripts/loom` (the engine built
//! with `--cfg loom`, so the parts below use loom's atomics, locks and condition variables and
//! loom explores every interleaving of the model's threads). The only place under `src/` with
//! threads besides the runtime (`tests/tidy.rs` exempts it): loom's, simulated.
//!
//! - `watermark`: a visible high watermark covers the bytes written before it (and the model
//!   catches a publish without Release), a waiter wakes for the publish that covers it, and
//!   concurrent publishes never move it back.
//! - `write_path`: the whole engine, three appenders to one partition in `sync` mode: the
//!   driver role of `write_path.rs` passes between waiters, nobody is left asleep with work
//!   queued (loom reports a deadlock), each gets its own offset, all of it visible; a driver
//!   that hands out answers without waking the waiters is caught.
//! - `segment_swap`: the whole engine (on `PreadIo`, in a fresh directory per interleaving):
//!   a compaction pass swaps cleaned segments into the list while a reader reads the partition
//!   and an appender rolls a new segment. Every read is a subsequence of what was appended,
//!   in offset order, holding the latest record of every key; a swap split into two lock
//!   sections is caught.
//! - `transactions`: the whole engine: two processors' commits (`commit_transaction`) over
//!   the same two partitions, handed from one to the other, beside a reader. No deadlock, a
//!   transaction's records are visible only once its commit is, and both partitions take the
//!   two transactions in the same order; transactions that take their partitions in any
//!   order but name order are caught (a deadlock).

use crate::Offset;
use crate::watermark::Watermark;
use loom::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

/// Run the ignored model `test` (one with a deliberate bug) in a child process, which must fail
/// with loom's deadlock report.
fn deadlock_in_a_child(test: &str) {
    fails_in_a_child(test, "deadlock");
}

/// Run the ignored model `test` (one with a deliberate bug) in a child process, which must fail
/// printing `expected`.
fn fails_in_a_child(test: &str, expected: &str) {
    let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--ignored", "--test-threads=1"])
        .output()
        .expect("run the test binary");
    let printed = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{test}: the deliberate bug was not found");
    assert!(printed.contains(expected), "{test} failed, but not with {expected:?}:\n{printed}");
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

mod write_path {
    //! The write path's driver role over the whole engine: three appenders to one partition in
    //! `sync` mode, each waiting for its answer. Whoever waits drives; nobody is left asleep
    //! with work queued (loom reports a deadlock), every appender gets its own offset, and all
    //! of it is durable and visible at the end. A driver that hands out answers without waking
    //! the waiters is caught.
    use super::deadlock_in_a_child;
    use super::whole_engine::{directory, open, read_all};
    use crate::sync::bugs::{self, Bug};
    use crate::{Durability, Record, TopicConfig};
    use loom::thread;

    fn model() {
        loom::model(|| {
            let root = directory();
            let engine = open(root.path(), Durability::Sync);
            engine.create_topic("t", TopicConfig::default()).expect("create");
            let appenders: Vec<_> = (0..2u8)
                .map(|n| {
                    let engine = engine.clone();
                    thread::spawn(move || {
                        let value = [n];
                        let appended = engine.append("t", 0, &[Record::new(None, &value)]);
                        appended.expect("appended").base_offset.get()
                    })
                })
                .collect();
            let mine = engine.append("t", 0, &[Record::new(None, b"main")]).expect("appended");
            let mut offsets = vec![mine.base_offset.get()];
            offsets.extend(appenders.into_iter().map(|h| h.join().expect("appender")));
            offsets.sort_unstable();
            assert_eq!(offsets, [0, 1, 2], "each appender its own offset");
            assert_eq!(read_all(&engine, "t").len(), 3, "all of it visible");
        });
    }

    #[test]
    fn waiters_take_turns_driving_and_all_return() {
        model();
    }

    #[test]
    fn a_driver_that_wakes_nobody_is_caught() {
        deadlock_in_a_child("loom_models::write_path::bug_driver_wakes_nobody");
    }

    #[test]
    #[ignore = "a deliberate bug: run in a child process by a_driver_that_wakes_nobody_is_caught"]
    fn bug_driver_wakes_nobody() {
        bugs::set(Bug::DriverWakesNobody);
        model();
    }
}

mod whole_engine {
    use crate::io::PreadIo;
    use crate::{Clock, Durability, Engine, Options};
    use std::path::Path;

    pub struct Fixed;

    impl Clock for Fixed {
        fn now_ms(&self) -> i64 {
            1_000_000
        }
    }

    pub fn directory() -> tempfile::TempDir {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }
            .expect("a temporary directory")
    }

    pub fn open(root: &Path, durability: Durability) -> Engine<PreadIo> {
        let options = Options { durability, ..Options::default() };
        Engine::open(PreadIo::new(), std::sync::Arc::new(Fixed), root, options).expect("open").0
    }

    /// Records read: (offset, key, value).
    pub type Read = [(u64, Option<Vec<u8>>, Vec<u8>)];

    /// Every visible record of a partition: (offset, key, value).
    pub fn read_all(engine: &Engine<PreadIo>, topic: &str) -> Vec<(u64, Option<Vec<u8>>, Vec<u8>)> {
        let mut from = crate::Offset::ZERO;
        let mut out = Vec::new();
        loop {
            let fetch = engine.read(topic, 0, from, 1 << 20).expect("read");
            if fetch.is_empty() {
                return out;
            }
            for record in fetch.records().filter(|r| r.offset() >= from) {
                let key = record.key().map(<[u8]>::to_vec);
                out.push((record.offset().get(), key, record.value().to_vec()));
            }
            assert!(fetch.next_offset() > from, "a fetch that does not move on");
            from = fetch.next_offset();
        }
    }
}

mod segment_swap {
    use super::whole_engine::{directory, open, read_all};
    use crate::sync::bugs::{self, Bug};
    use crate::{Cleanup, Durability, Record, TopicConfig};
    use loom::sync::Arc;
    use loom::thread;

    /// A value that fills most of a minimal segment, so every append rolls.
    fn value(n: u8) -> Vec<u8> {
        vec![b'0' + n; 3000]
    }

    fn model() {
        loom::model(|| {
            let root = directory();
            let engine = Arc::new(open(root.path(), Durability::Os));
            let config = TopicConfig {
                segment_bytes: 4096,
                cleanup: Cleanup::Compact,
                min_compaction_lag_ms: 0,
                min_cleanable_dirty_ratio: 0.0,
                ..TopicConfig::default()
            };
            engine.create_topic("t", config).expect("create");
            let appended = [(b"a", 1), (b"b", 1), (b"a", 2), (b"b", 2), (b"a", 3)];
            for (key, n) in &appended[..4] {
                engine.append("t", 0, &[Record::new(Some(*key), &value(*n))]).expect("append");
            }
            let compactor = {
                let engine = Arc::clone(&engine);
                thread::spawn(move || engine.compact_partition("t", 0).expect("compact"))
            };
            let writer = {
                let engine = Arc::clone(&engine);
                thread::spawn(move || {
                    let (key, n) = appended[4];
                    engine.append("t", 0, &[Record::new(Some(key), &value(n))]).expect("append")
                })
            };
            let check = |read: &super::whole_engine::Read, latest: &[(u64, &[u8])]| {
                let mut last = None;
                for (offset, key, value_read) in read {
                    assert!(last < Some(*offset), "offsets out of order: {read:?}");
                    last = Some(*offset);
                    let (key_appended, n) = appended[usize::try_from(*offset).unwrap()];
                    assert_eq!(key.as_deref(), Some(&key_appended[..]), "offset {offset}: key");
                    assert!(*value_read == value(n), "offset {offset}: a value not appended");
                }
                for (offset, key) in latest {
                    let found =
                        read.iter().any(|(o, k, _)| o == offset && k.as_deref() == Some(key));
                    assert!(found, "the latest record of a key is missing: offset {offset}");
                }
            };
            // While compaction swaps and the appender rolls: the latest of `a` and `b` then.
            let during = read_all(&engine, "t");
            check(&during, &[(3, b"b")]);
            assert!(during.iter().any(|(o, ..)| *o == 2 || *o == 4), "no record of key a");
            compactor.join().unwrap();
            writer.join().unwrap();
            check(&read_all(&engine, "t"), &[(3, b"b"), (4, b"a")]);
        });
    }

    #[test]
    fn readers_see_whole_swaps() {
        model();
    }

    #[test]
    fn a_split_swap_is_caught() {
        super::fails_in_a_child("loom_models::segment_swap::bug_split_swap", "OffsetMismatch");
    }

    #[test]
    #[ignore = "a deliberate bug: run in a child process by a_split_swap_is_caught"]
    fn bug_split_swap() {
        bugs::set(Bug::SplitSwap);
        model();
    }
}

mod transactions {
    use super::whole_engine::{directory, open, read_all};
    use crate::sync::bugs::{self, Bug};
    use crate::{Durability, GroupCommit, Offset, Record, TopicConfig, TransactionWrite};
    use loom::sync::Arc;
    use loom::thread;

    fn model() {
        loom::model(|| {
            let root = directory();
            let engine = Arc::new(open(root.path(), Durability::Sync));
            for topic in ["a", "b", "in"] {
                engine.create_topic(topic, TopicConfig::default()).expect("create");
            }
            // Processor `n` commits its output to `a` and `b` (in the order given) with its
            // input position, as group `gn`.
            let processors: Vec<_> = [(1, ["a", "b"]), (2, ["b", "a"])]
                .into_iter()
                .map(|(n, topics)| {
                    let engine = Arc::clone(&engine);
                    thread::spawn(move || {
                        let value = [b'0' + n];
                        let records = [Record::new(None, &value)];
                        let writes = topics.map(|topic| TransactionWrite {
                            topic,
                            partition: 0,
                            records: &records,
                        });
                        let group = format!("g{n}");
                        let offsets = [("in", 0, Offset::new(u64::from(n)))];
                        let commit = GroupCommit { group: &group, offsets: &offsets };
                        engine.commit_transaction(&writes, Some(commit)).expect("commit");
                    })
                })
                .collect();
            // A record shown means its transaction committed.
            for topic in ["a", "b"] {
                for (_, _, value) in read_all(&engine, topic) {
                    let group = format!("g{}", char::from(value[0]));
                    let committed = engine.committed_offset(&group, "in", 0);
                    assert!(committed.is_some(), "{topic}: a record of {group} before its commit");
                }
            }
            for processor in processors {
                processor.join().unwrap();
            }
            let order = |topic| -> Vec<Vec<u8>> {
                read_all(&engine, topic).into_iter().map(|(_, _, value)| value).collect()
            };
            assert_eq!(order("a").len(), 2);
            assert_eq!(
                order("a"),
                order("b"),
                "the partitions took the transactions in different orders"
            );
        });
    }

    #[test]
    fn commits_hand_partitions_over_without_deadlock() {
        model();
    }

    #[test]
    fn partitions_taken_out_of_order_are_caught() {
        super::deadlock_in_a_child("loom_models::transactions::bug_unordered_transaction");
    }

    #[test]
    #[ignore = "a deliberate bug: run in a child process by partitions_taken_out_of_order_are_caught"]
    fn bug_unordered_transaction() {
        bugs::set(Bug::UnorderedTransaction);
        model();
    }
}
