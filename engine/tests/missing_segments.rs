//! Lost segment files are reported and never paper over acknowledged offsets: appends are
//! refused, so no offset that was once acknowledged is given out again.

mod common;

use chronik_engine::{AppendError, Durability, Record};

#[test]
fn a_partition_whose_segment_files_are_gone_is_reported_and_refuses_appends() {
    let directory = tempfile::tempdir().unwrap();
    {
        let (engine, _) = common::open(directory.path(), Durability::Sync);
        engine.create_topic("t", common::small_segments(1)).unwrap();
        for i in 0..10 {
            common::append_value(&engine, "t", 0, format!("v{i}").as_bytes());
        }
    }
    let partition = common::partition_directory(directory.path(), "t", 0);
    for log in common::log_files(&partition) {
        std::fs::remove_file(log).unwrap();
    }
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(!report.partitions[0].damage.is_empty(), "{report:?}");
    let refused = engine.append("t", 0, &[Record::new(None, b"again")]).unwrap_err();
    assert!(matches!(refused, AppendError::Corruption(_)), "{refused:?}");
}

#[test]
fn a_synced_segment_missing_after_the_last_one_is_reported() {
    let directory = tempfile::tempdir().unwrap();
    let partition = common::filled_small_segments(directory.path(), 300);
    let logs = common::log_files(&partition);
    assert!(logs.len() > 2);
    // The last segment, which the checkpoint names, disappears.
    std::fs::remove_file(logs.last().unwrap()).unwrap();
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    let damage = &report.partitions[0].damage;
    assert!(
        damage.iter().any(|c| c.to_string().contains("a synced segment is missing")),
        "{damage:?}"
    );
    let refused = engine.append("t", 0, &[Record::new(None, b"again")]).unwrap_err();
    assert!(matches!(refused, AppendError::Corruption(_)), "{refused:?}");
}

#[test]
fn when_a_synced_segment_is_missing_nothing_of_the_one_before_is_cut() {
    let directory = tempfile::tempdir().unwrap();
    let partition = common::filled_small_segments(directory.path(), 300);
    let logs = common::log_files(&partition);
    std::fs::remove_file(logs.last().unwrap()).unwrap();
    // The segment before it was sealed, so fully synced: losing its last bytes is damage.
    let previous = &logs[logs.len() - 2];
    let length = std::fs::metadata(previous).unwrap().len() - 10;
    std::fs::OpenOptions::new().write(true).open(previous).unwrap().set_len(length).unwrap();
    let (_engine, report) = common::open(directory.path(), Durability::Sync);
    assert_eq!(report.truncated_bytes(), 0, "{report:?}");
    assert_eq!(std::fs::metadata(previous).unwrap().len(), length, "nothing is cut");
    assert!(report.partitions[0].damage.len() >= 2, "{report:?}");
}

#[test]
fn reading_into_a_lost_middle_segment_reports_it_instead_of_skipping() {
    let directory = tempfile::tempdir().unwrap();
    let partition = common::filled_small_segments(directory.path(), 300);
    let logs = common::log_files(&partition);
    assert!(logs.len() > 3);
    let lost = common::base_offset_of(&logs[1]);
    let after = common::base_offset_of(&logs[2]);
    std::fs::remove_file(&logs[1]).unwrap();
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(!report.partitions[0].damage.is_empty(), "{report:?}");
    // Reading from the start serves the first segment, then stops at the gap.
    let mut from = chronik_engine::Offset::ZERO;
    let error = loop {
        match engine.read("t", 0, from, 1 << 20) {
            Ok(fetch) => {
                assert!(fetch.records().all(|r| r.offset().get() < lost), "read across the gap");
                from = fetch.next_offset();
            }
            Err(error) => break error,
        }
    };
    assert_eq!(from.get(), lost);
    let chronik_engine::ReadError::Corruption(corruption) = error else { panic!("{error:?}") };
    let expected = chronik_engine::CorruptionKind::OffsetMismatch { expected: lost, found: after };
    assert_eq!(corruption.kind, expected);
}
