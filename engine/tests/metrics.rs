//! The engine's metrics count what it did: appends, records and bytes written, fdatasyncs
//! (one per `sync` append here), reads and bytes read, rolls, compaction passes, failures;
//! the Prometheus text carries the same numbers.

mod common;

use chronik_engine::{Cleanup, Durability, Offset, Record, TopicConfig};

#[test]
fn counters_and_histograms_follow_the_work_done() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    let config = TopicConfig { cleanup: Cleanup::Compact, ..common::small_segments(1) };
    engine.create_topic("t", config).unwrap();
    assert_eq!(engine.metrics().appends, 0);
    let before = engine.metrics();
    let value = [7_u8; 300];
    for i in 0..40_u32 {
        let key = format!("k{}", i % 4);
        engine.append("t", 0, &[Record::new(Some(key.as_bytes()), &value); 3]).unwrap();
    }
    let after = engine.metrics();
    assert_eq!(after.appends - before.appends, 40);
    assert_eq!(after.records_appended - before.records_appended, 120);
    assert!(after.bytes_written - before.bytes_written > 120 * 300);
    // `sync`: each append waits for an fdatasync of its own (nothing runs beside it).
    assert!(after.fsyncs - before.fsyncs >= 40, "{after:?}");
    assert_eq!(after.append_latency.count - before.append_latency.count, 40);
    assert_eq!(after.fsync_latency.count, after.fsyncs);
    assert!(after.segments_rolled > 0);
    assert_eq!((after.append_errors, after.fsync_errors), (0, 0));

    let records = common::read_all(&engine, "t", 0, 0, 4096);
    assert_eq!(records.len(), 120);
    let read = engine.metrics();
    assert!(read.fetches > 0);
    let visible = engine.read("t", 0, Offset::ZERO, 1 << 20).unwrap().len_bytes() as u64;
    assert!(engine.metrics().bytes_read - read.bytes_read == visible && visible > 0);

    let report = engine.compact_partition("t", 0).unwrap().expect("a pass ran");
    let compacted = engine.metrics();
    assert_eq!(compacted.compaction_passes, 1);
    assert_eq!(compacted.compaction_records_in, report.records_in);
    assert_eq!(compacted.compaction_records_kept, report.records_kept);
    assert_eq!(compacted.compaction_bytes_in, report.bytes_in);

    let text = compacted.prometheus();
    assert!(text.contains(&format!("chronik_appends_total {}\n", compacted.appends)));
    assert!(text.contains(&format!("chronik_fsyncs_total {}\n", compacted.fsyncs)));
    let inf = format!("chronik_append_latency_seconds_bucket{{le=\"+Inf\"}} {}\n", 40);
    assert!(text.contains(&inf), "{text}");
}

#[test]
fn a_failed_fdatasync_counts_as_an_fsync_error_and_a_failed_append() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Sync);
    engine.create_topic("t", TopicConfig::default()).unwrap();
    engine.append("t", 0, &[Record::new(None, b"ok")]).unwrap();
    faults.fail_next_syncs(1);
    assert!(engine.append("t", 0, &[Record::new(None, b"lost")]).is_err());
    let metrics = engine.metrics();
    assert_eq!((metrics.appends, metrics.append_errors, metrics.fsync_errors), (1, 1, 1));
}
