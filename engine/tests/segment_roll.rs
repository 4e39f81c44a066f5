//! Segments roll by size and by age; after a reopen the sealed segments load their index files
//! and reads cross segment boundaries.

mod common;

use chronik_engine::{Durability, Offset, Record, TopicConfig};
use common::ManualClock;

const TOPIC: &str = "events";

fn value(i: u64) -> Vec<u8> {
    format!("record {i:05} {}", "p".repeat((i % 97) as usize)).into_bytes()
}

#[test]
fn segments_roll_by_size_and_survive_a_reopen() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, common::small_segments(1)).unwrap();
    let total = 600u64;
    let mut i = 0;
    while i < total {
        // Batches of one to three records.
        let values: Vec<Vec<u8>> = (i..(i + 1 + i % 3).min(total)).map(value).collect();
        let records: Vec<Record<'_>> = values.iter().map(|v| Record::new(None, v)).collect();
        assert_eq!(engine.append(TOPIC, 0, &records).unwrap().base_offset.get(), i);
        i += values.len() as u64;
    }
    let end = engine.high_watermark(TOPIC, 0).unwrap().get();
    let before = engine.describe_topic(TOPIC).unwrap().partitions[0];
    assert!(before.segment_count > 10, "small segments roll: {before:?}");
    assert_eq!(before.log_end_offset.get(), end);

    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let logs = common::log_files(&partition);
    assert_eq!(logs.len(), before.segment_count);
    for log in &logs {
        let size = std::fs::metadata(log).unwrap().len();
        assert!(size <= 4096, "{} is {size} bytes", log.display());
    }
    // Every sealed segment has its index files; the active one need not.
    for log in &logs[..logs.len() - 1] {
        assert!(log.with_extension("index").exists(), "{}", log.display());
        assert!(log.with_extension("timeindex").exists(), "{}", log.display());
    }
    let expected = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    assert_eq!(expected.len() as u64, end);
    drop(engine);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(report.partitions[0].rebuilt_indexes, 0, "sealed segments load their indexes");
    let after = engine.describe_topic(TOPIC).unwrap().partitions[0];
    assert_eq!(after, before);
    // Reads from every offset, with read sizes that end inside and across segments.
    for from in (0..end).step_by(7) {
        for max_bytes in [0, 1, 1000, 3000, 1 << 20] {
            let read = common::read_all(&engine, TOPIC, 0, from, max_bytes);
            assert_eq!(read, expected[from as usize..], "from {from}, max_bytes {max_bytes}");
        }
    }
    // A read never spans two segments, so a big read stops at a segment boundary.
    let first = engine.read(TOPIC, 0, Offset::ZERO, 1 << 20).unwrap();
    let second_base = common::base_offset_of(&common::log_files(&partition)[1]);
    assert_eq!(first.next_offset().get(), second_base);
    // The sealed segments keep rolling correctly after the reopen.
    for i in end..end + 200 {
        assert_eq!(common::append_value(&engine, TOPIC, 0, &value(i)), i);
    }
    let count = engine.describe_topic(TOPIC).unwrap().partitions[0].segment_count;
    assert!(count > after.segment_count);
    assert_eq!(common::read_all(&engine, TOPIC, 0, 0, 4096).len() as u64, end + 200);
}

#[test]
fn segments_roll_by_age() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    let config = TopicConfig { segment_ms: 60_000, ..TopicConfig::default() };
    engine.create_topic(TOPIC, config).unwrap();
    let segments = || engine.describe_topic(TOPIC).unwrap().partitions[0].segment_count;

    common::append_value(&engine, TOPIC, 0, b"a");
    clock.advance(59_999);
    common::append_value(&engine, TOPIC, 0, b"b");
    assert_eq!(segments(), 1, "younger than segment_ms");
    clock.advance(1);
    common::append_value(&engine, TOPIC, 0, b"c");
    assert_eq!(segments(), 2, "the first record turned segment_ms old");
    clock.advance(30_000);
    common::append_value(&engine, TOPIC, 0, b"d");
    assert_eq!(segments(), 2, "age counts from the new segment's creation on the engine clock");
    clock.advance(30_000);
    common::append_value(&engine, TOPIC, 0, b"e");
    assert_eq!(segments(), 3);
    // Idle time alone does not roll: only an append can.
    clock.advance(10 * 60_000);
    assert_eq!(segments(), 3);
    drop(engine);

    // After a reopen the active segment's age comes from its first record, found by the scan.
    let (engine, report) =
        common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    assert!(report.is_clean());
    common::append_value(&engine, TOPIC, 0, b"f");
    assert_eq!(engine.describe_topic(TOPIC).unwrap().partitions[0].segment_count, 4);
    let values: Vec<Vec<u8>> =
        common::read_all(&engine, TOPIC, 0, 0, 1 << 20).into_iter().map(|r| r.value).collect();
    assert_eq!(values, ["a", "b", "c", "d", "e", "f"].map(|v| v.as_bytes().to_vec()));
}
