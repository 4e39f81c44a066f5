//! Transactions (`Engine::commit_transaction`) on real files: readers see nothing of a
//! transaction until it commits, appends to its partitions wait for it, and afterwards all of
//! it is there, in order, with its consumer offsets; invalid arguments are refused before
//! anything is written; a transaction is kept across a reopen, and a deleted topic's
//! transactions do not speak for a new topic of the same name. (Atomicity across power loss
//! at every disk call is `sim/tests/transactions.rs`.)

mod common;

use chronik_engine::{CommitError, Durability, GroupCommit, Offset, Record, TransactionWrite};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn values(
    engine: &chronik_engine::Engine<impl chronik_engine::io::Io>,
    topic: &str,
) -> Vec<Vec<u8>> {
    let fetch = engine.read(topic, 0, Offset::ZERO, 1 << 20).unwrap();
    fetch.records().map(|r| r.value().to_vec()).collect()
}

#[test]
fn readers_and_appenders_wait_for_the_commit_then_see_all_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(dir.path(), Durability::Os);
    let engine = Arc::new(engine);
    engine.create_topic("t", common::small_segments(1)).unwrap();
    engine.create_topic("u", common::small_segments(1)).unwrap();
    engine.create_topic("other", common::small_segments(1)).unwrap();
    engine.append("t", 0, &[Record::new(None, b"before")]).unwrap();

    // The transaction writes two batches (t, u) and then fdatasyncs: hold its fdatasyncs
    // until this test lets them go.
    let writes = faults.writes();
    let held = Arc::new(AtomicBool::new(true));
    let gate = Arc::clone(&held);
    faults.hold_fdatasyncs_until(Some(Arc::new(move || !gate.load(Ordering::SeqCst))));
    let committer = {
        let engine = Arc::clone(&engine);
        std::thread::spawn(move || {
            let t = [Record::new(None, b"txn-t")];
            let u = [Record::new(None, b"txn-u")];
            let writes = [
                TransactionWrite { topic: "t", partition: 0, records: &t },
                TransactionWrite { topic: "u", partition: 0, records: &u },
            ];
            let offsets = [("other", 0, Offset::new(1))];
            let group = GroupCommit { group: "g", offsets: &offsets };
            engine.commit_transaction(&writes, Some(group))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while faults.writes() < writes + 2 {
        assert!(Instant::now() < deadline, "the transaction never wrote its batches");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Written, not committed: invisible, and an append to its partition waits.
    assert_eq!(values(&engine, "t"), vec![b"before".to_vec()]);
    assert_eq!(values(&engine, "u"), Vec::<Vec<u8>>::new());
    assert_eq!(engine.committed_offset("g", "other", 0), None);
    let append_done = Arc::new(AtomicBool::new(false));
    let appender = {
        let (engine, append_done) = (Arc::clone(&engine), Arc::clone(&append_done));
        std::thread::spawn(move || {
            let result = engine.append("t", 0, &[Record::new(None, b"after")]);
            append_done.store(true, Ordering::SeqCst);
            result
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(!append_done.load(Ordering::SeqCst), "an append went past an uncommitted transaction");

    // The held fdatasyncs go; the transaction commits.
    held.store(false, Ordering::SeqCst);
    faults.hold_fdatasyncs_until(None);
    let appended_offsets = committer.join().unwrap().unwrap();
    assert_eq!(appended_offsets.len(), 2);
    assert_eq!(appended_offsets[0].base_offset, Offset::new(1));
    let after = appender.join().unwrap().unwrap();
    assert_eq!(after.base_offset, Offset::new(2), "the waiting append comes after the transaction");
    assert_eq!(values(&engine, "t"), [b"before".to_vec(), b"txn-t".to_vec(), b"after".to_vec()]);
    assert_eq!(values(&engine, "u"), vec![b"txn-u".to_vec()]);
    assert_eq!(engine.committed_offset("g", "other", 0), Some(Offset::new(1)));

    drop(engine);
    let (engine, report) = common::open(dir.path(), Durability::Sync);
    assert!(report.partitions.iter().all(|p| p.rolled_back_records == 0), "{report:?}");
    assert_eq!(values(&engine, "t").len(), 3);
    assert_eq!(engine.committed_offset("g", "other", 0), Some(Offset::new(1)));
}

#[test]
fn bad_arguments_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(dir.path(), Durability::Sync);
    engine.create_topic("t", common::small_segments(2)).unwrap();
    let records = [Record::new(None, b"v")];
    let cases: Vec<(Vec<TransactionWrite<'_>>, Option<GroupCommit<'_>>)> = vec![
        (vec![TransactionWrite { topic: "missing", partition: 0, records: &records }], None),
        (vec![TransactionWrite { topic: "t", partition: 7, records: &records }], None),
        (
            vec![TransactionWrite { topic: "__consumer_offsets", partition: 0, records: &records }],
            None,
        ),
        (
            vec![TransactionWrite { topic: "t", partition: 0, records: &records }],
            Some(GroupCommit { group: "", offsets: &[("t", 0, Offset::ZERO)] }),
        ),
        (
            vec![TransactionWrite { topic: "t", partition: 0, records: &records }],
            Some(GroupCommit { group: "g", offsets: &[("t", 9, Offset::ZERO)] }),
        ),
    ];
    for (writes, group) in cases {
        let error = engine.commit_transaction(&writes, group).unwrap_err();
        assert!(
            matches!(
                error,
                CommitError::PartitionNotFound { .. } | CommitError::InvalidGroup { .. }
            ),
            "{error}"
        );
    }
    assert!(engine.poisoned().is_none());
    assert!(values(&engine, "t").is_empty());
    // Nothing to write and nothing to commit is a no-op; offsets alone commit.
    assert!(engine.commit_transaction(&[], None).unwrap().is_empty());
    let group = GroupCommit { group: "g", offsets: &[("t", 1, Offset::new(5))] };
    engine.commit_transaction(&[], Some(group)).unwrap();
    assert_eq!(engine.committed_offset("g", "t", 1), Some(Offset::new(5)));
}

#[test]
fn a_recreated_topic_does_not_inherit_the_deleted_ones_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(dir.path(), Durability::Sync);
    engine.create_topic("t", common::small_segments(1)).unwrap();
    let records: Vec<Record<'_>> = (0..5).map(|_| Record::new(None, b"old")).collect();
    engine
        .commit_transaction(
            &[TransactionWrite { topic: "t", partition: 0, records: &records }],
            None,
        )
        .unwrap();
    engine.delete_topic("t").unwrap();
    engine.create_topic("t", common::small_segments(1)).unwrap();
    engine.append("t", 0, &[Record::new(None, b"new")]).unwrap();
    drop(engine);
    let (engine, _) = common::open(dir.path(), Durability::Sync);
    assert_eq!(values(&engine, "t"), vec![b"new".to_vec()]);
}
