//! A read-only engine beside a writing one: it takes no lock, changes no file, refuses writes,
//! and follows the writer's appends across segment rolls with `refresh`.

mod common;

use chronik_engine::{AppendError, Durability, Options, Record, TopicConfig, TopicError};
use std::sync::Arc;

fn open_read_only(root: &std::path::Path) -> (common::Engine, chronik_engine::RecoveryReport) {
    let options = Options { read_only: true, ..Options::default() };
    let clock = common::ManualClock::new(common::EPOCH_MS);
    chronik_engine::Engine::open(common::test_io(), clock as Arc<_>, root, options).unwrap()
}

fn values(records: &[common::Owned]) -> Vec<Vec<u8>> {
    records.iter().map(|r| r.value.clone()).collect()
}

#[test]
fn a_reader_follows_the_writer_across_rolls_without_changing_a_file() {
    let directory = tempfile::tempdir().unwrap();
    let (writer, _) = common::open(directory.path(), Durability::Sync);
    writer.create_topic("t", common::small_segments(1)).unwrap();
    let mut written = Vec::new();
    for i in 0..20 {
        let value = format!("early-{i}").into_bytes();
        common::append_value(&writer, "t", 0, &value);
        written.push(value);
    }
    let (reader, report) = open_read_only(directory.path());
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(values(&common::read_all(&reader, "t", 0, 0, 1 << 20)), written);

    // The writer rolls several segments; the reader sees nothing new until it refreshes.
    for i in 0..400 {
        let value = format!("late-{i}-{}", "x".repeat(i % 50)).into_bytes();
        common::append_value(&writer, "t", 0, &value);
        written.push(value);
    }
    let before = writer.describe_topic("t").unwrap().partitions[0];
    assert!(before.segment_count > 3, "the writer rolled segments");
    assert_eq!(reader.high_watermark("t", 0).unwrap().get(), 20);
    let snapshot = common::snapshot(directory.path());
    reader.refresh().unwrap();
    assert_eq!(reader.high_watermark("t", 0).unwrap(), before.log_end_offset);
    assert_eq!(values(&common::read_all(&reader, "t", 0, 0, 4096)), written);
    assert_eq!(
        reader.describe_topic("t").unwrap().partitions[0].segment_count,
        before.segment_count
    );

    // Writes are refused, and nothing the reader did changed a file.
    let refused = reader.append("t", 0, &[Record::new(None, b"no")]).unwrap_err();
    assert!(matches!(refused, AppendError::ReadOnly), "{refused:?}");
    let refused = reader.create_topic("u", TopicConfig::default()).unwrap_err();
    assert!(matches!(refused, TopicError::ReadOnly), "{refused:?}");
    drop(reader);
    assert_eq!(common::snapshot(directory.path()), snapshot, "the reader changed a file");
}

#[test]
fn a_reader_leaves_a_torn_tail_unread_and_in_place() {
    let directory = tempfile::tempdir().unwrap();
    {
        let (writer, _) = common::open(directory.path(), Durability::Sync);
        writer.create_topic("t", TopicConfig::default()).unwrap();
        for i in 0..5 {
            common::append_value(&writer, "t", 0, format!("v{i}").as_bytes());
        }
    }
    let partition = common::partition_directory(directory.path(), "t", 0);
    let log = common::log_files(&partition).pop().unwrap();
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(&[0x5A; 100]);
    std::fs::write(&log, &bytes).unwrap();

    let (reader, report) = open_read_only(directory.path());
    assert_eq!(report.partitions[0].truncated_bytes, 100);
    assert!(report.lines()[0].contains("left unread"), "{:?}", report.lines());
    assert_eq!(common::read_all(&reader, "t", 0, 0, 1 << 20).len(), 5);
    // The same unread tail on the next look is not a rewrite: the reader waits there.
    reader.refresh().unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), bytes, "a reader never cuts");
    // A writer opens, cuts the tail and appends: the reader follows.
    let (writer, report) = common::open(directory.path(), Durability::Sync);
    assert_eq!(report.partitions[0].truncated_bytes, 100);
    common::append_value(&writer, "t", 0, b"after the cut");
    reader.refresh().unwrap();
    let records = common::read_all(&reader, "t", 0, 0, 1 << 20);
    assert_eq!(records.last().unwrap().value, b"after the cut");
}

#[test]
fn a_reader_needs_an_existing_data_directory() {
    let directory = tempfile::tempdir().unwrap();
    let missing = directory.path().join("nothing-here");
    let options = Options { read_only: true, ..Options::default() };
    let clock = common::ManualClock::new(common::EPOCH_MS);
    let result =
        chronik_engine::Engine::open(common::test_io(), clock as Arc<_>, &missing, options);
    assert!(result.is_err());
    assert!(!missing.exists(), "a reader created the directory");
}

#[test]
fn a_reader_is_told_to_reopen_when_the_writer_recovered_and_rewrote_what_it_saw() {
    let directory = tempfile::tempdir().unwrap();
    let partition = common::partition_directory(directory.path(), "t", 0);
    {
        let (writer, _) = common::open(directory.path(), Durability::Sync);
        writer.create_topic("t", TopicConfig::default()).unwrap();
        for i in 0..10 {
            common::append_value(&writer, "t", 0, format!("seen-{i}").as_bytes());
        }
    }
    let (reader, _) = open_read_only(directory.path());
    assert_eq!(reader.high_watermark("t", 0).unwrap().get(), 10);
    // A crash takes the last three (as if never synced, checkpoint lost too); the writer
    // recovers and writes other records at those offsets.
    let log = common::log_files(&partition).pop().unwrap();
    let (position, _) = common::batch_positions(&log)[7];
    std::fs::OpenOptions::new().write(true).open(&log).unwrap().set_len(position).unwrap();
    std::fs::remove_file(partition.join("synced.checkpoint")).unwrap();
    let (writer, _) = common::open(directory.path(), Durability::Sync);
    for i in 0..20 {
        common::append_value(&writer, "t", 0, format!("rewritten-{i}-padding").as_bytes());
    }
    let error = reader.refresh().unwrap_err();
    assert!(matches!(error, chronik_engine::ReadError::Changed { .. }), "{error:?}");
}
