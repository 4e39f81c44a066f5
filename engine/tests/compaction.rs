//! Key-based compaction (`cleanup = compact`): after a pass, the latest record of every key is
//! there, offsets and order of the survivors are unchanged, the log end is unchanged, a read
//! from a removed offset returns the next record after it, the active segment is untouched,
//! tombstones stay for `delete_retention_ms`, records younger than `min_compaction_lag_ms` stay,
//! and a swap interrupted by a crash is finished (or a half-written output removed) at open.

mod common;

use chronik_engine::{Cleanup, Durability, Offset, Record, TopicConfig};
use common::{ManualClock, Owned};
use std::collections::BTreeMap;

const TOPIC: &str = "table";

fn config() -> TopicConfig {
    TopicConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        cleanup: Cleanup::Compact,
        min_cleanable_dirty_ratio: 0.0,
        delete_retention_ms: 60_000,
        ..TopicConfig::default()
    }
}

/// Ten keys updated in turn, one record per append; every seventh record has no key, and key
/// `k3` is deleted (a tombstone) half way. Returns what was written, by offset.
fn fill(engine: &common::Engine, clock: &ManualClock, rounds: u64) -> BTreeMap<u64, Owned> {
    let mut written = BTreeMap::new();
    for i in 0..rounds * 10 {
        let key = format!("k{}", i % 10);
        let value = format!("{key}-v{i:05}-{}", "x".repeat(60));
        let tombstone = i == rounds * 5 + 3;
        // After its tombstone, `k3` is never written again.
        let keyless = i % 7 == 6 || (i % 10 == 3 && i > rounds * 5 + 3);
        let value = if tombstone { String::new() } else { value };
        let record = if keyless {
            Record::new(None, value.as_bytes())
        } else {
            Record::new(Some(key.as_bytes()), value.as_bytes())
        };
        let offset = engine.append(TOPIC, 0, &[record]).unwrap().base_offset.get();
        written.insert(
            offset,
            Owned {
                offset,
                timestamp: chronik_engine::Clock::now_ms(clock),
                key: (!keyless).then(|| key.into_bytes()),
                value: value.into_bytes(),
                headers: Vec::new(),
            },
        );
        clock.advance(1);
    }
    written
}

/// The latest record of every key (tombstones included), and every keyless record.
fn latest(written: &BTreeMap<u64, Owned>) -> BTreeMap<Option<Vec<u8>>, u64> {
    let mut latest = BTreeMap::new();
    for (offset, record) in written {
        if record.key.is_some() {
            latest.insert(record.key.clone(), *offset);
        }
    }
    latest
}

#[test]
fn compaction_keeps_the_latest_of_every_key_and_every_offset_in_place() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    engine.create_topic(TOPIC, config()).unwrap();
    let written = fill(&engine, &clock, 60);
    let before = engine.describe_topic(TOPIC).unwrap().partitions[0];
    assert!(before.segment_count > 5);
    let active_base = {
        let partition = common::partition_directory(directory.path(), TOPIC, 0);
        common::base_offset_of(common::log_files(&partition).last().unwrap())
    };

    let report = engine.compact_topic(TOPIC).unwrap()[0].expect("a pass ran");
    assert!(report.records_kept < report.records_in, "{report:?}");
    assert!(report.bytes_out < report.bytes_in, "{report:?}");
    let after = engine.describe_topic(TOPIC).unwrap().partitions[0];
    assert_eq!(after.log_end_offset, before.log_end_offset, "the end never moves");
    assert_eq!(after.log_start_offset, Offset::ZERO);
    assert!(after.size_bytes < before.size_bytes);

    let read = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    // Survivors are exactly what was written at their offsets, in order.
    for record in &read {
        assert_eq!(&written[&record.offset], record, "offset {}", record.offset);
    }
    assert!(read.windows(2).all(|w| w[0].offset < w[1].offset));
    let offsets: Vec<u64> = read.iter().map(|r| r.offset).collect();
    // The latest record of every key, tombstone included, is there; every keyless one too;
    // nothing in the active segment went.
    for offset in latest(&written).values() {
        assert!(offsets.contains(offset), "latest record at {offset} kept");
    }
    for (offset, record) in &written {
        if record.key.is_none() || *offset >= active_base {
            assert!(offsets.contains(offset), "record at {offset} kept");
        }
    }
    // Reading from a removed offset returns the next record after it.
    let removed = (0..before.log_end_offset.get()).find(|o| !offsets.contains(o)).unwrap();
    let next = offsets.iter().copied().find(|&o| o > removed).unwrap();
    assert_eq!(common::read_all(&engine, TOPIC, 0, removed, 300)[0].offset, next);
    // A consumer reading from the start rebuilds the latest value of every key.
    let mut table = BTreeMap::new();
    for record in &read {
        if let Some(key) = &record.key {
            table.insert(key.clone(), record.value.clone());
        }
    }
    for (key, offset) in latest(&written) {
        assert_eq!(table[&key.unwrap()], written[&offset].value);
    }
    // Appends go on after the end; a second pass with nothing dirty does nothing.
    assert_eq!(common::append_value(&engine, TOPIC, 0, b"after"), before.log_end_offset.get());
    drop(engine);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    let reopened = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    assert_eq!(reopened[..read.len()], read[..]);
    // Where the pass ended survives the restart (`cleaner.offset`): only what came after is
    // dirty.
    let described = engine.describe_topic(TOPIC).unwrap().partitions[0];
    assert!(described.cleaned_offset > Offset::ZERO, "{described:?}");
    assert!(described.dirty_bytes < described.size_bytes, "{described:?}");
}

#[test]
fn tombstones_stay_for_delete_retention_and_young_records_stay() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    let config =
        TopicConfig { min_compaction_lag_ms: 100_000, delete_retention_ms: 1_000_000, ..config() };
    engine.create_topic(TOPIC, config).unwrap();
    let written = fill(&engine, &clock, 40);
    // Everything is younger than the lag: nothing is cleanable.
    assert_eq!(engine.compact_topic(TOPIC).unwrap()[0], None);
    clock.advance(200_000);
    let tombstone =
        written.values().find(|r| r.key.is_some() && r.value.is_empty()).unwrap().offset;
    engine.compact_topic(TOPIC).unwrap()[0].expect("a pass ran");
    let offsets: Vec<u64> =
        common::read_all(&engine, TOPIC, 0, 0, 1 << 20).iter().map(|r| r.offset).collect();
    assert!(offsets.contains(&tombstone), "a tombstone stays for delete_retention_ms");
    let mut changed = engine.describe_topic(TOPIC).unwrap().config;
    changed.delete_retention_ms = 0;
    engine.alter_topic_config(TOPIC, changed).unwrap();
    clock.advance(1);
    engine.compact_topic(TOPIC).unwrap();
    let offsets: Vec<u64> =
        common::read_all(&engine, TOPIC, 0, 0, 1 << 20).iter().map(|r| r.offset).collect();
    assert!(!offsets.contains(&tombstone), "then it goes");
    // No earlier value of the deleted key survives it.
    let key = written[&tombstone].key.clone();
    assert!(
        written
            .values()
            .filter(|r| r.key == key && r.offset < tombstone)
            .all(|r| !offsets.contains(&r.offset)),
        "values before the tombstone are gone"
    );
}

#[test]
fn an_interrupted_swap_is_finished_or_undone_at_open() {
    // Two copies of the same log: one compacted, one as before.
    let compacted = tempfile::tempdir().unwrap();
    let original = tempfile::tempdir().unwrap();
    for directory in [&compacted, &original] {
        let clock = ManualClock::new(common::EPOCH_MS);
        let (engine, _) =
            common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
        engine.create_topic(TOPIC, TopicConfig { segment_bytes: 1 << 20, ..config() }).unwrap();
        fill(&engine, &clock, 60);
        // Roll, so what was written is sealed and cleanable.
        let mut rolled = engine.describe_topic(TOPIC).unwrap().config;
        rolled.segment_bytes = 4096;
        engine.alter_topic_config(TOPIC, rolled).unwrap();
        common::append_value(&engine, TOPIC, 0, &[b'z'; 5000]);
        common::append_value(&engine, TOPIC, 0, b"active");
    }
    let clock = ManualClock::new(common::EPOCH_MS + 60_000);
    let (engine, _) = common::open_with_clock(compacted.path(), Durability::Sync, clock);
    let report = engine.compact_topic(TOPIC).unwrap()[0].expect("a pass ran");
    assert!(report.segments_out >= 1);
    let expected = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    drop(engine);
    let cleaned_log = compacted.path().join("topics/table/0/00000000000000000000.log");
    let partition = original.path().join("topics/table/0");

    // A half-written output (never committed) is removed; the log is as before.
    let before = common::snapshot(original.path());
    std::fs::write(partition.join("00000000000000000000.log.cleaned"), b"half").unwrap();
    let (engine, report) = common::open(original.path(), Durability::Sync);
    assert_eq!(report.partitions[0].removed_temporary_files, 1);
    let untouched = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    assert_eq!(untouched.len() as u64, engine.high_watermark(TOPIC, 0).unwrap().get());
    drop(engine);
    assert_eq!(common::snapshot(original.path()), before);

    // A committed swap (the output renamed to `.swap`, the sources still there) is finished.
    std::fs::copy(&cleaned_log, partition.join("00000000000000000000.log.swap")).unwrap();
    let (engine, report) = common::open(original.path(), Durability::Sync);
    assert_eq!(report.partitions[0].finished_compaction_swaps, 1);
    // Its index files are written after the swap: here they are rebuilt. Nothing is lost.
    assert!(report.partitions[0].damage.is_empty(), "{:?}", report.lines());
    assert_eq!(report.truncated_bytes(), 0);
    assert_eq!(common::read_all(&engine, TOPIC, 0, 0, 1 << 20), expected);
    assert!(!partition.join("00000000000000000000.log.swap").exists());
}

/// Damage in a sealed segment stops compaction of that partition, without poisoning the
/// engine or touching its files, and the other topics are still compacted.
#[test]
fn damage_stops_compaction_of_one_log_only() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock.clone());
    engine.create_topic(TOPIC, config()).unwrap();
    fill(&engine, &clock, 40);
    engine.create_topic("other", config()).unwrap();
    for i in 0..400 {
        let key = format!("k{}", i % 10);
        engine.append("other", 0, &[Record::new(Some(key.as_bytes()), &[b'o'; 80])]).unwrap();
    }
    drop(engine);
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let logs = common::log_files(&partition);
    common::flip_byte(&logs[1], 100);
    let before = common::snapshot(&partition);

    let clock = ManualClock::new(common::EPOCH_MS + 60_000);
    let (engine, _) = common::open_with_clock(directory.path(), Durability::Sync, clock);
    assert_eq!(engine.compact_topic(TOPIC).unwrap()[0], None);
    assert!(engine.poisoned().is_none(), "damage is not an I/O failure");
    assert!(engine.describe_topic(TOPIC).unwrap().partitions[0].compaction_blocked);
    assert!(engine.compact_topic("other").unwrap()[0].is_some(), "the other log is compacted");
    engine.tick().unwrap();
    drop(engine);
    assert_eq!(common::snapshot(&partition), before, "the damaged log is left as it was");
}
