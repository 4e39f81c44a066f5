//! A flipped byte in an early batch of the active segment, followed by batches whose
//! synced-offset hints prove it had been fsynced, is corruption of acknowledged data: recovery
//! keeps every byte and reports it, reads stop before it, and appends are refused.

mod common;

use chronik_engine::{AppendError, CorruptionKind, Durability, Offset, ReadError, Record};

const TOPIC: &str = "active";

#[test]
fn damage_inside_synced_data_of_the_active_segment_is_kept_and_reported() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, chronik_engine::TopicConfig::default()).unwrap();
    // One append at a time: each is fsynced before the next is written, so every later batch
    // carries a synced-offset hint above every earlier offset.
    for i in 0..20u64 {
        let values = [format!("first {i}"), format!("second {i}")];
        let records = values.each_ref().map(|v| Record::new(Some(b"k"), v.as_bytes()));
        assert_eq!(engine.append(TOPIC, 0, &records).unwrap().base_offset.get(), 2 * i);
    }
    let expected = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    drop(engine);
    // As after a crash with no recovery point: the open reads the whole active segment.
    common::forget_clean_close(directory.path());

    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let logs = common::log_files(&partition);
    assert_eq!(logs.len(), 1, "everything is in the active segment");
    let batches = common::batch_positions(&logs[0]);
    let (position, base_offset) = batches[5];
    assert_eq!(base_offset, 10);
    // A byte of the batch's first record's value.
    common::flip_byte(&logs[0], position + 64 + 28 + 2);
    let damaged_bytes = std::fs::read(&logs[0]).unwrap();

    for attempt in 0..2 {
        let (engine, report) = common::open(directory.path(), Durability::Sync);
        assert_eq!(std::fs::read(&logs[0]).unwrap(), damaged_bytes, "nothing is truncated");
        let recovery = &report.partitions[0];
        assert_eq!(recovery.truncated_bytes, 0, "attempt {attempt}");
        assert_eq!(recovery.damage.len(), 1, "attempt {attempt}: {:?}", report.lines());
        let damage = &recovery.damage[0];
        assert_eq!((&damage.file, damage.position), (&logs[0], position));
        assert!(matches!(damage.kind, CorruptionKind::ChecksumMismatch { expected, actual }
            if expected != actual));

        // Every record before the damaged batch reads back.
        let mut records = Vec::new();
        let mut next = Offset::ZERO;
        while next.get() < base_offset {
            let fetch = engine.read(TOPIC, 0, next, 100).unwrap();
            records.extend(common::Owned::of_fetch(&fetch));
            next = fetch.next_offset();
        }
        assert_eq!(records, expected[..10]);
        // The read at the damaged batch reports it, with the evidence, and so does a read of
        // any later offset: those were acknowledged too.
        for from in [10, 11, 12, 39, 40, 1000] {
            let error = engine.read(TOPIC, 0, Offset::new(from), 1 << 20).unwrap_err();
            let ReadError::Corruption(corruption) = error else { panic!("{error:?}") };
            assert_eq!(&corruption, damage);
        }
        // Appending after damaged acknowledged data would hide it: refused.
        let error = engine.append(TOPIC, 0, &[Record::new(None, b"no")]).unwrap_err();
        assert!(matches!(error, AppendError::Corruption(ref c) if c == damage), "{error:?}");
        // Timestamp lookups find what lies before the damage, and report it otherwise.
        let timestamp = expected[3].timestamp;
        assert_eq!(engine.offset_for_timestamp(TOPIC, 0, timestamp).unwrap(), Some(Offset::ZERO));
        let error = engine.offset_for_timestamp(TOPIC, 0, timestamp + 1).unwrap_err();
        assert!(matches!(error, ReadError::Corruption(ref c) if c == damage), "{error:?}");
        // Nothing visible lies past the damage.
        assert_eq!(engine.high_watermark(TOPIC, 0).unwrap().get(), base_offset);
        drop(engine);
        // The close leaves no recovery point over the damage: the next open, clean close or
        // not, reads it again and keeps refusing appends behind it.
    }
    assert_eq!(std::fs::read(&logs[0]).unwrap(), damaged_bytes, "closing changes nothing");
}

#[test]
fn damage_below_the_recovery_point_is_not_read_at_open_but_every_read_reports_it() {
    // After a clean close the recovery point covers the whole segment: the open reads none of
    // it, and the damage is found by the first read that reaches it, never served.
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, chronik_engine::TopicConfig::default()).unwrap();
    for i in 0..20u64 {
        assert_eq!(common::append_value(&engine, TOPIC, 0, format!("value {i}").as_bytes()), i);
    }
    drop(engine);
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let log = common::log_files(&partition).pop().unwrap();
    let (position, base_offset) = common::batch_positions(&log)[5];
    common::flip_byte(&log, position + 64 + 20);
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    let recovery = &report.partitions[0];
    assert!(report.clean_shutdown && recovery.opened_clean, "{report:?}");
    assert_eq!(recovery.scanned_bytes, 0);
    assert!(recovery.damage.is_empty(), "not read at open: {report:?}");
    let mut next = Offset::ZERO;
    while next.get() < base_offset {
        let fetch = engine.read(TOPIC, 0, next, 100).unwrap();
        assert_eq!(fetch.records().next().unwrap().offset(), next, "every record before it");
        next = fetch.next_offset();
    }
    let error = engine.read(TOPIC, 0, Offset::new(base_offset), 1 << 20).unwrap_err();
    let ReadError::Corruption(corruption) = error else { panic!("{error:?}") };
    assert_eq!((corruption.file, corruption.position), (log, position));
}

/// Five synced appends, closed cleanly, then one byte flipped in the last batch. Returns the
/// directory, the log file, the position of the last batch and the file size.
fn flip_in_last_batch() -> (tempfile::TempDir, std::path::PathBuf, u64, u64) {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, chronik_engine::TopicConfig::default()).unwrap();
    for i in 0..5u64 {
        assert_eq!(common::append_value(&engine, TOPIC, 0, format!("v{i}").as_bytes()), i);
    }
    drop(engine);
    common::forget_clean_close(directory.path());
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let log = common::log_files(&partition).pop().unwrap();
    let (position, _) = *common::batch_positions(&log).last().unwrap();
    let size = std::fs::metadata(&log).unwrap().len();
    common::flip_byte(&log, size - 1);
    (directory, log, position, size)
}

#[test]
fn damage_in_the_last_batch_is_kept_when_the_checkpoint_vouches_for_it() {
    // No later batch vouches for the last one, but the sync checkpoint written by the group
    // commit (and fsynced at close) does: the damage is corruption of synced data.
    let (directory, log, position, _) = flip_in_last_batch();
    let damaged_bytes = std::fs::read(&log).unwrap();
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert_eq!(report.partitions[0].truncated_bytes, 0);
    let damage = &report.partitions[0].damage;
    assert_eq!(damage.len(), 1, "{report:?}");
    assert_eq!(damage[0].position, position);
    let fetch = engine.read(TOPIC, 0, Offset::ZERO, 1 << 20).unwrap();
    assert_eq!(fetch.records().count(), 4);
    assert!(matches!(
        engine.read(TOPIC, 0, Offset::new(4), 1 << 20),
        Err(ReadError::Corruption(_))
    ));
    drop(engine);
    assert_eq!(std::fs::read(&log).unwrap(), damaged_bytes, "nothing was cut");
}

#[test]
fn damage_in_the_last_batch_without_any_evidence_is_a_torn_tail() {
    // The counterpart: without the checkpoint (a crash may lose its unsynced write) nothing
    // vouches for the last batch, so recovery cannot tell it from a torn unsynced write, and
    // cuts it.
    let (directory, log, position, size) = flip_in_last_batch();
    let partition = log.parent().unwrap();
    std::fs::remove_file(partition.join("synced.checkpoint")).unwrap();
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert_eq!(report.partitions[0].truncated_bytes, size - position);
    assert!(report.partitions[0].damage.is_empty());
    assert_eq!(common::read_all(&engine, TOPIC, 0, 0, 1 << 20).len(), 4);
    assert_eq!(common::append_value(&engine, TOPIC, 0, b"v4 again"), 4);
}
