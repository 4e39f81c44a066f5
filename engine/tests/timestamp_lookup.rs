//! `offset_for_timestamp` returns the first offset whose timestamp is at or after the one asked
//! for, across segments, agreeing with a brute-force scan of every record.

mod common;

use chronik_engine::{Durability, Offset, Record};

const TOPIC: &str = "times";

/// Append `timestamps` in batches of 1 to 4 records over small segments and check every lookup
/// against a scan of all records, before and after a reopen.
fn lookups_agree_with_a_scan(timestamps: &[i64]) {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, common::small_segments(1)).unwrap();
    let mut next = 0;
    while next < timestamps.len() {
        let count = (1 + next % 4).min(timestamps.len() - next);
        let values: Vec<String> =
            (next..next + count).map(|i| format!("at {i} {}", "t".repeat(i % 50))).collect();
        let records: Vec<Record<'_>> = values
            .iter()
            .zip(&timestamps[next..])
            .map(|(v, &t)| Record::new(None, v.as_bytes()).with_timestamp(t))
            .collect();
        engine.append(TOPIC, 0, &records).unwrap();
        next += count;
    }
    let segments = engine.describe_topic(TOPIC).unwrap().partitions[0].segment_count;
    assert!(segments >= 5, "the lookups cross segments: {segments}");
    check(&engine, timestamps);
    drop(engine);
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean());
    check(&engine, timestamps);
}

fn check(engine: &common::Engine, timestamps: &[i64]) {
    let records = common::read_all(engine, TOPIC, 0, 0, 1 << 20);
    let read: Vec<i64> = records.iter().map(|r| r.timestamp).collect();
    assert_eq!(read, timestamps);
    let (low, high) = (*timestamps.iter().min().unwrap(), *timestamps.iter().max().unwrap());
    let probes = (low - 3..=high + 3).chain([i64::MIN, i64::MAX, 0, -1]);
    for probe in probes {
        let expected = records.iter().find(|r| r.timestamp >= probe).map(|r| r.offset);
        let found = engine.offset_for_timestamp(TOPIC, 0, probe).unwrap().map(Offset::get);
        assert_eq!(found, expected, "timestamp {probe}");
    }
}

#[test]
fn increasing_timestamps() {
    // Strictly increasing with uneven gaps, several records per millisecond apart.
    let timestamps: Vec<i64> = (0..500i64)
        .map(|i| common::EPOCH_MS + i * 3 + (i * i) % 7)
        .scan(i64::MIN, |last, t| {
            *last = t.max(*last + 1);
            Some(*last)
        })
        .collect();
    lookups_agree_with_a_scan(&timestamps);
}

#[test]
fn equal_timestamps_find_the_first_offset() {
    // Runs of equal timestamps: the first offset of a run is the answer.
    let timestamps: Vec<i64> = (0..500i64).map(|i| common::EPOCH_MS + i / 9).collect();
    lookups_agree_with_a_scan(&timestamps);
}

#[test]
fn out_of_order_timestamps() {
    // Producers may set any timestamp; the lookup still returns the first offset at or after.
    let timestamps: Vec<i64> =
        (0..500i64).map(|i| common::EPOCH_MS + (i * 37) % 101 + i / 5).collect();
    lookups_agree_with_a_scan(&timestamps);
}

#[test]
fn empty_partition_has_no_offset_for_any_timestamp() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, common::small_segments(1)).unwrap();
    for probe in [i64::MIN, 0, common::EPOCH_MS, i64::MAX] {
        assert_eq!(engine.offset_for_timestamp(TOPIC, 0, probe).unwrap(), None);
    }
}
