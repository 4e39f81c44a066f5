//! Retention (`cleanup = delete`) and changing a topic's settings: `Engine::tick` removes the
//! oldest sealed segments by age or total size, never the active one; the log start moves
//! forward durably (`log.start`); reads below it are out of range; a crash between recording
//! the log start and removing the files is finished by the next open; a damaged `log.start`
//! keeps its topic closed (reported, every read refused) instead of guessing.

mod common;

use chronik_engine::{Cleanup, Durability, Offset, ReadError, Record, TopicConfig, TopicError};
use common::ManualClock;

const TOPIC: &str = "events";

fn small(retention_ms: Option<i64>, retention_bytes: Option<u64>) -> TopicConfig {
    TopicConfig {
        segment_bytes: 4096,
        index_interval_bytes: 512,
        retention_ms,
        retention_bytes,
        ..TopicConfig::default()
    }
}

fn fill(engine: &common::Engine, count: u64, clock: &ManualClock) {
    for i in 0..count {
        let value = format!("value-{i:05}-{}", "x".repeat(100));
        engine.append(TOPIC, 0, &[Record::new(None, value.as_bytes())]).unwrap();
        clock.advance(10);
    }
}

fn describe(engine: &common::Engine) -> chronik_engine::PartitionDescription {
    engine.describe_topic(TOPIC).unwrap().partitions[0]
}

#[test]
fn retention_by_size_removes_the_oldest_sealed_segments_durably() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    engine.create_topic(TOPIC, small(None, Some(16 * 1024))).unwrap();
    fill(&engine, 600, &clock);
    let before = describe(&engine);
    assert!(before.segment_count > 10, "{before:?}");
    engine.tick().unwrap();
    let after = describe(&engine);
    assert!(after.log_start_offset > Offset::ZERO, "{after:?}");
    assert_eq!(after.log_end_offset, before.log_end_offset, "retention never touches the end");
    assert!(after.size_bytes >= 16 * 1024, "at least retention_bytes is kept: {after:?}");
    let removed_one_more = after.size_bytes - 4096 >= 16 * 1024;
    assert!(!removed_one_more || after.segment_count <= 2, "no more is removed than needed");
    let start = after.log_start_offset;
    match engine.read(TOPIC, 0, Offset::ZERO, 1 << 20) {
        Err(ReadError::OffsetOutOfRange { start: s, .. }) => assert_eq!(s, start.get()),
        other => panic!("a read below the log start: {other:?}"),
    }
    let kept = common::read_all(&engine, TOPIC, 0, start.get(), 1 << 20);
    assert_eq!(kept.len() as u64, after.log_end_offset.get() - start.get());
    assert_eq!(kept[0].offset, start.get());
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    assert_eq!(common::log_files(&partition).len(), after.segment_count);
    assert_eq!(common::base_offset_of(&common::log_files(&partition)[0]), start.get());
    drop(engine);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(describe(&engine).log_start_offset, start);
    assert_eq!(common::read_all(&engine, TOPIC, 0, start.get(), 1 << 20), kept);
    // Appends continue after the end; nothing below the start comes back.
    let next = common::append_value(&engine, TOPIC, 0, b"after");
    assert_eq!(next, after.log_end_offset.get());
}

#[test]
fn retention_by_age_never_removes_the_active_segment() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Os, clock.clone());
    engine.create_topic(TOPIC, small(Some(60_000), None)).unwrap();
    fill(&engine, 300, &clock);
    let before = describe(&engine);
    engine.tick().unwrap();
    assert_eq!(describe(&engine), before, "nothing is a minute old yet");
    clock.advance(10 * 60_000);
    engine.tick().unwrap();
    let after = describe(&engine);
    assert_eq!(after.segment_count, 1, "every sealed segment expired: {after:?}");
    assert_eq!(after.log_end_offset, before.log_end_offset);
    assert_eq!(
        common::read_all(&engine, TOPIC, 0, after.log_start_offset.get(), 1 << 20).len() as u64,
        after.log_end_offset.get() - after.log_start_offset.get(),
        "the active segment's records are all still there"
    );
    engine.tick().unwrap();
    assert_eq!(describe(&engine), after, "the active segment stays however old");
}

#[test]
fn settings_change_durably_and_retention_follows_them() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    engine.create_topic(TOPIC, small(None, None)).unwrap();
    fill(&engine, 300, &clock);
    engine.tick().unwrap();
    assert_eq!(describe(&engine).log_start_offset, Offset::ZERO, "kept forever by default");

    let mut changed = engine.describe_topic(TOPIC).unwrap().config;
    changed.set("retention_bytes", "8192").unwrap();
    engine.alter_topic_config(TOPIC, changed).unwrap();
    assert_eq!(engine.describe_topic(TOPIC).unwrap().config, changed);
    engine.tick().unwrap();
    assert!(describe(&engine).log_start_offset > Offset::ZERO);

    let compacted = TopicConfig { cleanup: Cleanup::Compact, ..changed };
    engine.alter_topic_config(TOPIC, compacted).unwrap();
    let more = TopicConfig { partitions: 3, ..compacted };
    assert!(matches!(
        engine.alter_topic_config(TOPIC, more),
        Err(TopicError::InvalidConfig { .. })
    ));
    assert!(matches!(
        engine.alter_topic_config("missing", compacted),
        Err(TopicError::NotFound { .. })
    ));
    drop(engine);
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    assert_eq!(engine.describe_topic(TOPIC).unwrap().config, compacted, "durable");
}

#[test]
fn a_crash_after_the_log_start_is_recorded_is_finished_at_open() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    engine.create_topic(TOPIC, small(None, None)).unwrap();
    fill(&engine, 300, &clock);
    let all = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    drop(engine);
    // As retention leaves it if the machine stops right after `log.start` is durable.
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let logs = common::log_files(&partition);
    let start = common::base_offset_of(&logs[3]);
    std::fs::write(
        partition.join(chronik_engine::internals::log_start::LOG_START_FILE),
        chronik_engine::internals::log_start::encode(Offset::new(start)),
    )
    .unwrap();

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(report.partitions[0].removed_segments_below_log_start, 3);
    assert_eq!(describe(&engine).log_start_offset.get(), start);
    assert_eq!(common::log_files(&partition), logs[3..]);
    let start_index = usize::try_from(start).unwrap();
    assert_eq!(common::read_all(&engine, TOPIC, 0, start, 1 << 20), all[start_index..]);
    drop(engine);

    // A damaged log start keeps the topic closed: guessing could hide lost or resurrect
    // removed data. Every read reports it.
    let file = partition.join(chronik_engine::internals::log_start::LOG_START_FILE);
    common::flip_byte(&file, 20);
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert_eq!(report.damaged_topics[0].damage.file, file, "{:?}", report.lines());
    let read = engine.read(TOPIC, 0, Offset::new(start), 1 << 20);
    assert!(matches!(read, Err(chronik_engine::ReadError::Corruption(_))), "{read:?}");
}

#[test]
fn a_lost_segment_after_the_log_start_is_reported() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    engine.create_topic(TOPIC, small(None, Some(8192))).unwrap();
    fill(&engine, 300, &clock);
    engine.tick().unwrap();
    let start = describe(&engine).log_start_offset;
    drop(engine);
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let first = common::log_files(&partition)[0].clone();
    assert_eq!(common::base_offset_of(&first), start.get());
    std::fs::remove_file(&first).unwrap();
    let (_, report) = common::open(directory.path(), Durability::Sync);
    assert!(!report.is_clean(), "a segment at the log start is missing");
    let line = &report.lines()[0];
    assert!(line.contains(&format!("where {} was expected", start.get())), "{line}");
}

#[test]
fn delete_records_removes_whole_segments_below_the_offset_on_any_policy() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    // Neither retention nor compaction would remove anything here.
    engine
        .create_topic(TOPIC, TopicConfig { cleanup: Cleanup::Compact, ..small(None, None) })
        .unwrap();
    fill(&engine, 300, &clock);
    let before = describe(&engine);
    assert!(before.segment_count > 5, "{before:?}");
    assert_eq!(engine.delete_records(TOPIC, 0, Offset::ZERO).unwrap(), Offset::ZERO);
    let start = engine.delete_records(TOPIC, 0, Offset::new(100)).unwrap();
    let after = describe(&engine);
    assert_eq!(after.log_start_offset, start);
    assert!(start > Offset::ZERO && start <= Offset::new(100), "{start:?}");
    assert_eq!(after.log_end_offset, before.log_end_offset);
    // The first segment kept holds offset 100 or starts at it: no segment wholly below 100
    // is left, none holding 100 or above went.
    let kept = common::read_all(&engine, TOPIC, 0, start.get(), 1 << 20);
    assert_eq!(kept[0].offset, start.get());
    assert!(kept.iter().any(|r| r.offset == 100));
    match engine.read(TOPIC, 0, Offset::ZERO, 1 << 20) {
        Err(ReadError::OffsetOutOfRange { start: s, .. }) => assert_eq!(s, start.get()),
        other => panic!("a read below the log start: {other:?}"),
    }
    // Never back; never the active segment, whatever is asked.
    assert_eq!(engine.delete_records(TOPIC, 0, Offset::new(10)).unwrap(), start);
    let end = engine.delete_records(TOPIC, 0, Offset::new(u64::MAX)).unwrap();
    let last = describe(&engine);
    assert_eq!((last.log_start_offset, last.segment_count), (end, 1));
    assert!(end < last.log_end_offset);
    drop(engine);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(describe(&engine).log_start_offset, end);
    assert!(matches!(
        engine.delete_records("missing", 0, Offset::ZERO),
        Err(chronik_engine::AppendError::TopicNotFound { .. })
    ));
    assert!(matches!(
        engine.delete_records(TOPIC, 3, Offset::ZERO),
        Err(chronik_engine::AppendError::PartitionNotFound { .. })
    ));
    // The offsets topic is the engine's: its commit records are what recovery decides by.
    engine.commit_offsets("readers", &[(TOPIC, 0, end)]).unwrap();
    assert!(matches!(
        engine.delete_records("__consumer_offsets", 0, Offset::new(u64::MAX)),
        Err(chronik_engine::AppendError::TopicNotFound { .. })
    ));
    drop(engine);
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    assert_eq!(engine.committed_offset("readers", TOPIC, 0), Some(end));
}
