//! Index files are derived data: missing, damaged or stale ones are rebuilt at open from the
//! segment, lookups stay correct, and the next open is clean.

mod common;

use chronik_engine::{Durability, Offset, Record};
use std::path::Path;

const TOPIC: &str = "indexed";

/// Write records with timestamps `EPOCH_MS + 10 * offset` over many small segments.
fn fill(root: &Path) -> Vec<common::Owned> {
    let (engine, _) = common::open(root, Durability::Sync);
    engine.create_topic(TOPIC, common::small_segments(1)).unwrap();
    for i in 0..400u64 {
        let value = format!("indexed value {i:04} {}", "i".repeat((i % 30) as usize));
        let timestamp = common::EPOCH_MS + 10 * i64::try_from(i).unwrap();
        let record = Record::new(None, value.as_bytes()).with_timestamp(timestamp);
        assert_eq!(engine.append(TOPIC, 0, &[record]).unwrap().base_offset.get(), i);
    }
    common::read_all(&engine, TOPIC, 0, 0, 1 << 20)
}

fn check_lookups(engine: &common::Engine, expected: &[common::Owned]) {
    for from in (0..expected.len()).step_by(3) {
        let fetch = engine.read(TOPIC, 0, Offset::new(from as u64), 1).unwrap();
        assert_eq!(common::Owned::of_fetch(&fetch)[0], expected[from]);
    }
    for record in expected.iter().step_by(5) {
        for delta in [-5, 0, 1] {
            let found = engine.offset_for_timestamp(TOPIC, 0, record.timestamp + delta).unwrap();
            let want = expected.iter().find(|r| r.timestamp >= record.timestamp + delta);
            assert_eq!(found.map(Offset::get), want.map(|r| r.offset));
        }
    }
    assert_eq!(common::read_all(engine, TOPIC, 0, 0, 1 << 20), expected);
}

/// Damage the index files of the sealed segments with `damage`, reopen, and check they are
/// rebuilt (two files per damaged segment) to the same bytes as before.
fn rebuilt_after(damage: impl Fn(&Path)) {
    let directory = tempfile::tempdir().unwrap();
    let expected = fill(directory.path());
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let logs = common::log_files(&partition);
    let sealed = &logs[..logs.len() - 1];
    assert!(sealed.len() >= 3, "several sealed segments");
    let originals: Vec<(Vec<u8>, Vec<u8>)> = sealed
        .iter()
        .map(|log| {
            let index = std::fs::read(log.with_extension("index")).unwrap();
            (index, std::fs::read(log.with_extension("timeindex")).unwrap())
        })
        .collect();
    let damaged = [0, sealed.len() - 1];
    for &i in &damaged {
        damage(&sealed[i]);
    }

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    let recovery = &report.partitions[0];
    assert_eq!(recovery.rebuilt_indexes, 2 * damaged.len() as u32, "{:?}", report.lines());
    assert!(recovery.damage.is_empty() && recovery.truncated_bytes == 0);
    for (log, (index, time_index)) in sealed.iter().zip(&originals) {
        assert_eq!(&std::fs::read(log.with_extension("index")).unwrap(), index);
        assert_eq!(&std::fs::read(log.with_extension("timeindex")).unwrap(), time_index);
    }
    let leftovers = common::files_under(&partition);
    assert!(leftovers.iter().all(|p| p.extension().unwrap() != "tmp"), "{leftovers:?}");
    check_lookups(&engine, &expected);
    drop(engine);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    check_lookups(&engine, &expected);
}

#[test]
fn missing_index_files_are_rebuilt() {
    rebuilt_after(|log| {
        std::fs::remove_file(log.with_extension("index")).unwrap();
        std::fs::remove_file(log.with_extension("timeindex")).unwrap();
    });
}

#[test]
fn a_missing_time_index_alone_rebuilds_both() {
    rebuilt_after(|log| std::fs::remove_file(log.with_extension("timeindex")).unwrap());
}

#[test]
fn damaged_index_files_are_rebuilt() {
    rebuilt_after(|log| common::flip_byte(&log.with_extension("index"), 40));
}

#[test]
fn truncated_and_empty_index_files_are_rebuilt() {
    rebuilt_after(|log| {
        let index = log.with_extension("index");
        let length = std::fs::metadata(&index).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&index).unwrap().set_len(length - 3).unwrap();
        std::fs::write(log.with_extension("timeindex"), b"").unwrap();
    });
}

#[test]
fn an_index_of_another_segment_is_rebuilt() {
    // Index files that are valid, but describe a different segment (a stale copy).
    rebuilt_after(|log| {
        let other = log.with_file_name("00000000000000000000.index");
        let mine = log.with_extension("index");
        if other == mine {
            let logs = common::log_files(log.parent().unwrap());
            std::fs::copy(logs[1].with_extension("index"), &mine).unwrap();
        } else {
            std::fs::copy(&other, &mine).unwrap();
        }
    });
}

#[test]
fn leftover_temporary_files_are_removed() {
    let directory = tempfile::tempdir().unwrap();
    let expected = fill(directory.path());
    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let logs = common::log_files(&partition);
    // As a crash between writing an index file and renaming it would leave them.
    std::fs::write(logs[0].with_extension("index.tmp"), b"half written").unwrap();
    std::fs::write(logs[1].with_extension("timeindex.tmp"), b"").unwrap();
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert_eq!(report.partitions[0].removed_temporary_files, 2);
    assert!(!logs[0].with_extension("index.tmp").exists());
    assert!(!logs[1].with_extension("timeindex.tmp").exists());
    check_lookups(&engine, &expected);
}
