//! A failed fsync or write poisons the engine (fail-stop): the failing append reports the I/O
//! error, every later operation reports `Poisoned`, and a fresh open recovers every record that
//! was acknowledged before the failure.

mod common;

use chronik_engine::{AppendError, Durability, Offset, ReadError, Record, TopicConfig, TopicError};
use std::path::Path;

const TOPIC: &str = "fragile";

/// Append `count` acknowledged records, inject a fault with `inject`, and check the fallout.
fn poisoned_by(inject: impl Fn(&common::Faults), durability: Durability) {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), durability);
    engine.create_topic(TOPIC, TopicConfig::default().with_partitions(2)).unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..10u64 {
        let value = format!("acknowledged {i}");
        assert_eq!(common::append_value(&engine, TOPIC, i as u32 % 2, value.as_bytes()), i / 2);
        acknowledged.push((i as u32 % 2, value.into_bytes()));
    }
    if durability != Durability::Sync {
        // In the other modes, acknowledged is not durable: make these durable explicitly.
        engine.flush().unwrap();
    }

    inject(&faults);
    let error = engine.append(TOPIC, 0, &[Record::new(None, b"doomed")]).unwrap_err();
    assert!(matches!(error, AppendError::Io(_)), "{error:?}");
    check_poisoned(&engine);
    drop(engine);

    // A fresh engine over a healthy backend recovers; the failed append may or may not have
    // reached the disk, but every acknowledged record did.
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.partitions.iter().all(|p| p.damage.is_empty()), "{:?}", report.lines());
    assert!(engine.poisoned().is_none());
    for partition in 0..2 {
        let records = common::read_all(&engine, TOPIC, partition, 0, 1 << 20);
        let values: Vec<&[u8]> = records.iter().map(|r| r.value.as_slice()).collect();
        let expected: Vec<&[u8]> = acknowledged
            .iter()
            .filter(|(p, _)| *p == partition)
            .map(|(_, v)| v.as_slice())
            .collect();
        assert_eq!(values[..expected.len()], expected[..]);
        assert!(values.len() <= expected.len() + 1);
        if values.len() > expected.len() {
            assert_eq!(values[expected.len()], b"doomed");
        }
    }
    let next = engine.high_watermark(TOPIC, 0).unwrap();
    assert_eq!(common::append_value(&engine, TOPIC, 0, b"healthy again"), next.get());
}

fn check_poisoned(engine: &chronik_engine::Engine<common::FaultyIo>) {
    let reason = engine.poisoned().expect("the engine is poisoned").reason;
    assert!(reason.contains("injected"), "the reason names the failure: {reason}");
    // Every partition, not only the failed one, refuses work.
    for partition in 0..2 {
        let error = engine.append(TOPIC, partition, &[Record::new(None, b"x")]).unwrap_err();
        assert!(matches!(error, AppendError::Poisoned(_)), "{error:?}");
        let error = engine.read(TOPIC, partition, Offset::ZERO, 1 << 20).unwrap_err();
        assert!(matches!(error, ReadError::Poisoned(_)), "{error:?}");
        let error = engine.offset_for_timestamp(TOPIC, partition, 0).unwrap_err();
        assert!(matches!(error, ReadError::Poisoned(_)), "{error:?}");
    }
    let error = engine.create_topic("another", TopicConfig::default()).unwrap_err();
    assert!(matches!(error, TopicError::Poisoned(_)), "{error:?}");
    let error = engine.delete_topic(TOPIC).unwrap_err();
    assert!(matches!(error, TopicError::Poisoned(_)), "{error:?}");
    assert!(matches!(engine.flush(), Err(AppendError::Poisoned(_))));
    assert!(matches!(engine.tick(), Err(AppendError::Poisoned(_))));
}

#[test]
fn a_failed_fdatasync_poisons_the_engine() {
    poisoned_by(|faults| faults.fail_next_syncs(1), Durability::Sync);
}

#[test]
fn a_failed_write_poisons_the_engine() {
    poisoned_by(|faults| faults.fail_next_writes(1), Durability::Sync);
}

#[test]
fn a_failed_write_poisons_the_engine_in_os_mode() {
    poisoned_by(|faults| faults.fail_next_writes(1), Durability::Os);
}

#[test]
fn a_failed_fsync_is_never_retried() {
    // The failure is transient (one fsync only): the engine must still stay poisoned rather
    // than retry and call the data durable.
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    common::append_value(&engine, TOPIC, 0, b"first");
    faults.fail_next_syncs(1);
    let syncs = faults.fdatasyncs();
    assert!(engine.append(TOPIC, 0, &[Record::new(None, b"doomed")]).is_err());
    for _ in 0..3 {
        assert!(engine.append(TOPIC, 0, &[Record::new(None, b"later")]).is_err());
        assert!(engine.flush().is_err());
    }
    assert_eq!(faults.fdatasyncs(), syncs, "no fsync after the failed one");
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(1), "nothing published");
}

#[test]
fn a_failed_fsync_in_a_roll_poisons_the_engine() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Os);
    engine.create_topic(TOPIC, common::small_segments(1)).unwrap();
    let value = vec![b'r'; 1000];
    for i in 0..3 {
        assert_eq!(common::append_value(&engine, TOPIC, 0, &value), i);
    }
    // Os mode fsyncs only when a segment rolls: the fourth record rolls the first segment.
    faults.fail_next_syncs(1);
    let error = engine.append(TOPIC, 0, &[Record::new(None, &value)]).unwrap_err();
    assert!(matches!(error, AppendError::Io(_)), "{error:?}");
    assert!(engine.poisoned().is_some());
    drop(engine);
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.partitions[0].damage.is_empty());
    assert_eq!(common::read_all(&engine, TOPIC, 0, 0, 1 << 20).len(), 3);
    check_no_leftovers(directory.path());
}

#[test]
fn a_failed_topic_creation_poisons_the_engine_and_leaves_nothing() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Sync);
    faults.fail_next_syncs(1);
    let error = engine.create_topic(TOPIC, TopicConfig::default()).unwrap_err();
    assert!(matches!(error, TopicError::Io(_)), "{error:?}");
    assert!(engine.poisoned().is_some());
    drop(engine);
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert_eq!(report.removed_incomplete_topics, [format!(".{TOPIC}.creating")]);
    assert!(engine.list_topics().is_empty());
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
}

fn check_no_leftovers(root: &Path) {
    let files = common::files_under(root);
    assert!(files.iter().all(|f| f.extension().is_none_or(|e| e != "tmp")), "{files:?}");
}
