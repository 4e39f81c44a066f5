//! The clean-shutdown mark and recovery points, end to end on real files: a complete close
//! leaves the mark, the next open trusts it where the files agree (reading and fsyncing no
//! partition) and removes it before writing; a close that fails leaves none; a damaged mark, or
//! files that disagree with it, are recovered as after a crash, with a report line.

mod common;

use chronik_engine::{CloseError, Durability, Offset, TopicConfig};
use std::io::Write as _;

const TOPIC: &str = "marked";

fn filled(root: &std::path::Path) {
    let (engine, _) = common::open(root, Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default().with_partitions(3)).unwrap();
    for i in 0..30u64 {
        common::append_value(&engine, TOPIC, (i % 3) as u32, format!("value {i}").as_bytes());
    }
    engine.close().unwrap();
}

#[test]
fn a_complete_close_leaves_the_mark_and_the_next_open_reads_and_fsyncs_no_partition() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    filled(root);
    assert!(root.join("clean.shutdown").is_file(), "the close left its mark");
    let (engine, report, faults) = common::open_faulty(root, Durability::Sync);
    assert!(!root.join("clean.shutdown").exists(), "the open took the mark away first");
    assert!(report.clean_shutdown && report.is_clean(), "{:?}", report.lines());
    assert_eq!(report.scanned_bytes(), 0);
    let topic: Vec<_> = report.partitions.iter().filter(|p| p.topic == TOPIC).collect();
    assert_eq!(topic.len(), 3);
    assert!(topic.iter().all(|p| p.opened_clean && p.recovery_point.is_some()), "{topic:?}");
    // Only the directories above the partitions are fsynced (and the data directory once more,
    // for the mark's removal); no segment, no partition directory.
    let synced = faults.synced_directories();
    assert_eq!(faults.fsyncs(), synced.len() as u64 + 1, "{synced:?}");
    assert_eq!(faults.fdatasyncs(), 0);
    for partition in 0..3 {
        let directory = common::partition_directory(root, TOPIC, partition);
        assert!(!synced.contains(&directory), "{synced:?}");
    }
    for partition in 0..3 {
        assert_eq!(common::read_all(&engine, TOPIC, partition, 0, 1 << 20).len(), 10);
    }
    // Appends go on where the recovery point ended.
    assert_eq!(common::append_value(&engine, TOPIC, 0, b"more"), 10);
    drop(engine);
    // A writer killed now would leave no mark: the open that took it is the one writing.
    let (_engine, report) = common::open(root, Durability::Sync);
    assert!(report.clean_shutdown, "the drop of the last clone closed completely too");
}

#[test]
fn a_poisoned_engine_closes_with_an_error_and_leaves_no_mark() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    filled(root);
    let (engine, _, faults) = common::open_faulty(root, Durability::Sync);
    faults.fail_next_syncs(1);
    assert!(engine.append(TOPIC, 0, &[chronik_engine::Record::new(None, b"x")]).is_err());
    let error = engine.close().unwrap_err();
    assert!(matches!(error, CloseError::Poisoned(_)), "{error}");
    assert!(!root.join("clean.shutdown").exists(), "no mark after a failed close");
    let (_engine, report) = common::open(root, Durability::Sync);
    assert!(!report.clean_shutdown);
}

#[test]
fn a_damaged_mark_or_files_that_disagree_with_it_are_recovered_as_after_a_crash() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    filled(root);
    std::fs::write(root.join("clean.shutdown"), b"not a mark at all").unwrap();
    let (engine, report) = common::open(root, Durability::Sync);
    assert!(report.clean_shutdown_unreadable && !report.clean_shutdown);
    assert!(report.lines().iter().any(|l| l.contains("clean-shutdown mark is unreadable")));
    drop(engine);

    // Bytes past the recovery point although the mark says there are none: a torn write of a
    // writer that crashed beside a stale mark. Recovered (and cut) as after a crash.
    let log = common::log_files(&common::partition_directory(root, TOPIC, 1)).pop().unwrap();
    std::fs::OpenOptions::new().append(true).open(&log).unwrap().write_all(&[7; 100]).unwrap();
    let (engine, report) = common::open(root, Durability::Sync);
    assert!(report.clean_shutdown);
    let partition = report.partitions.iter().find(|p| p.topic == TOPIC && p.partition == 1);
    let partition = partition.unwrap();
    assert!(partition.mark_contradicted && !partition.opened_clean, "{partition:?}");
    assert_eq!((partition.truncated_bytes, partition.scanned_bytes), (100, 100));
    assert!(report.lines().iter().any(|l| l.contains("disagrees with the files")));
    assert_eq!(engine.high_watermark(TOPIC, 1).unwrap(), Offset::new(10));
}
