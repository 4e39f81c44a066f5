//! A flipped byte inside a sealed segment is corruption of synced data: the open keeps every
//! byte, reads serve the records before the damage, and the read at the damage reports it with
//! its evidence.

mod common;

use chronik_engine::{CorruptionKind, Durability, Offset, ReadError};
use std::path::PathBuf;

const TOPIC: &str = "sealed";

struct Damaged {
    directory: tempfile::TempDir,
    expected: Vec<common::Owned>,
    /// The damaged segment file, the damaged batch's position in it and its base offset.
    file: PathBuf,
    position: u64,
    base_offset: u64,
    /// The first offset after the damaged batch.
    next_offset: u64,
}

/// Roll several segments, then flip a byte in the value of a batch in the middle of the second
/// one (a sealed segment).
fn damage_a_sealed_segment() -> Damaged {
    let directory = tempfile::tempdir().unwrap();
    let clock = common::ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    engine.create_topic(TOPIC, common::small_segments(1)).unwrap();
    for i in 0..300u64 {
        // Record `i` has the timestamp EPOCH_MS + i.
        clock.set(common::EPOCH_MS + i64::try_from(i).unwrap());
        let value = format!("value {i} {}", "q".repeat((i % 40) as usize));
        assert_eq!(common::append_value(&engine, TOPIC, 0, value.as_bytes()), i);
    }
    let expected = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    drop(engine);
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let logs = common::log_files(&partition);
    assert!(logs.len() >= 4, "several segments: {}", logs.len());
    let file = logs[1].clone();
    let batches = common::batch_positions(&file);
    let (position, base_offset) = batches[batches.len() / 2];
    let next_offset = batches[batches.len() / 2 + 1].1;
    // The last byte of the batch is inside its last record's value.
    common::flip_byte(&file, batches[batches.len() / 2 + 1].0 - 1);
    Damaged { directory, expected, file, position, base_offset, next_offset }
}

fn check_reads_stop_at_the_damage(damaged: &Damaged, engine: &common::Engine) {
    // A consumer reading from the start gets every record before the damaged batch...
    let mut next = Offset::ZERO;
    let mut records = Vec::new();
    let error = loop {
        match engine.read(TOPIC, 0, next, 1 << 20) {
            Ok(fetch) => {
                assert!(!fetch.is_empty(), "the damage is before the end");
                records.extend(common::Owned::of_fetch(&fetch));
                next = fetch.next_offset();
            }
            Err(error) => break error,
        }
    };
    assert_eq!(next.get(), damaged.base_offset, "reads stop right before the damaged batch");
    assert_eq!(records, damaged.expected[..damaged.base_offset as usize]);
    // ...and then the evidence.
    let ReadError::Corruption(corruption) = error else { panic!("expected corruption: {error:?}") };
    assert_eq!(corruption.file, damaged.file);
    assert_eq!(corruption.position, damaged.position);
    let CorruptionKind::ChecksumMismatch { expected, actual } = corruption.kind else {
        panic!("expected a checksum mismatch: {corruption}");
    };
    assert_ne!(expected, actual);
    // Every offset inside the damaged batch reports it too; corruption is never served.
    for from in damaged.base_offset..damaged.next_offset {
        let error = engine.read(TOPIC, 0, Offset::new(from), 1 << 20).unwrap_err();
        assert!(matches!(error, ReadError::Corruption(ref c) if c.position == damaged.position));
    }
    // Segments after the damaged one read normally.
    let third_base = common::base_offset_of(&common::log_files(damaged.file.parent().unwrap())[2]);
    let rest = common::read_all(engine, TOPIC, 0, third_base, 1 << 20);
    assert_eq!(rest, damaged.expected[third_base as usize..]);
    // Appends are not affected: the damage is not at the end of the log.
    let end = damaged.expected.len() as u64;
    assert_eq!(common::append_value(engine, TOPIC, 0, b"more"), end);
}

#[test]
fn a_flipped_byte_in_a_sealed_segment_is_reported_not_served_nor_cut() {
    let damaged = damage_a_sealed_segment();
    let mut snapshot = common::snapshot(damaged.directory.path());
    // The open takes the clean-shutdown mark away, and changes nothing else.
    snapshot.retain(|(path, _)| path.as_os_str() != "clean.shutdown");
    let (engine, report) = common::open(damaged.directory.path(), Durability::Sync);
    // The sealed segment loads from its (intact) index files without a scan, so the damage is
    // found by the read, not the open.
    assert_eq!(report.partitions[0].truncated_bytes, 0);
    assert_eq!(common::snapshot(damaged.directory.path()), snapshot, "open changes no file");
    check_reads_stop_at_the_damage(&damaged, &engine);
}

#[test]
fn a_flipped_byte_in_a_sealed_segment_without_index_files_is_reported_at_open() {
    let damaged = damage_a_sealed_segment();
    for suffix in ["index", "timeindex"] {
        std::fs::remove_file(damaged.file.with_extension(suffix)).unwrap();
    }
    let log_bytes = std::fs::read(&damaged.file).unwrap();
    let (engine, report) = common::open(damaged.directory.path(), Durability::Sync);
    let recovery = &report.partitions[0];
    assert_eq!(recovery.truncated_bytes, 0);
    assert_eq!(recovery.damage.len(), 1, "{:?}", report.lines());
    assert_eq!(recovery.damage[0].file, damaged.file);
    assert_eq!(recovery.damage[0].position, damaged.position);
    assert!(matches!(recovery.damage[0].kind, CorruptionKind::ChecksumMismatch { .. }));
    assert_eq!(std::fs::read(&damaged.file).unwrap(), log_bytes, "open changes no byte");
    // Sizes still count the whole damaged segment.
    let size_bytes: u64 = common::log_files(damaged.file.parent().unwrap())
        .iter()
        .map(|log| std::fs::metadata(log).unwrap().len())
        .sum();
    assert_eq!(engine.describe_topic(TOPIC).unwrap().partitions[0].size_bytes, size_bytes);
    check_reads_stop_at_the_damage(&damaged, &engine);
    drop(engine);
    // Reported again at the next open: damage is never silently forgotten.
    let (_engine, report) = common::open(damaged.directory.path(), Durability::Sync);
    assert_eq!(report.partitions[0].damage.len(), 1);
}

#[test]
fn timestamp_lookups_do_not_serve_the_damage() {
    let damaged = damage_a_sealed_segment();
    let (engine, _) = common::open(damaged.directory.path(), Durability::Sync);
    let at = |offset: u64| common::EPOCH_MS + i64::try_from(offset).unwrap();
    let lookup = |timestamp| engine.offset_for_timestamp(TOPIC, 0, timestamp);
    // Before the damage, and after the damaged segment, lookups work.
    assert_eq!(lookup(i64::MIN).unwrap(), Some(Offset::ZERO));
    assert_eq!(lookup(at(3)).unwrap(), Some(Offset::new(3)));
    let end = damaged.expected.len() as u64;
    assert_eq!(lookup(at(end - 1)).unwrap(), Some(Offset::new(end - 1)));
    assert_eq!(lookup(at(end)).unwrap(), None);
    // A lookup whose answer is in the damaged batch reports the damage instead of skipping it.
    let error = lookup(at(damaged.base_offset)).unwrap_err();
    assert!(matches!(error, ReadError::Corruption(ref c) if c.position == damaged.position));
}
