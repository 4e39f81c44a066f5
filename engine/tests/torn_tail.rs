//! A torn tail (bytes after the last synced batch that are not a whole valid batch) is cut at
//! open and reported; everything acknowledged stays; a second open finds a clean log.

mod common;

use chronik_engine::Durability;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

const TOPIC: &str = "torn";

fn append_to_file(path: &Path, bytes: &[u8]) {
    let mut file = OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

/// Write 50 acknowledged records (with one roll along the way), damage the tail with `tail`
/// (given the active segment's bytes), and check recovery.
fn torn_tail_is_cut(tail: impl Fn(&[u8]) -> Vec<u8>, expected_records_cut: u64) {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, common::small_segments(1)).unwrap();
    let big = vec![b'z'; 3000];
    for i in 0..50u64 {
        let value = if i == 10 { big.clone() } else { format!("acknowledged {i}").into_bytes() };
        assert_eq!(common::append_value(&engine, TOPIC, 0, &value), i);
    }
    let expected = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    assert!(engine.describe_topic(TOPIC).unwrap().partitions[0].segment_count >= 2);
    drop(engine);

    let partition = common::partition_directory(directory.path(), TOPIC, 0);
    let active = common::log_files(&partition).pop().unwrap();
    let clean = std::fs::read(&active).unwrap();
    let garbage = tail(&clean);
    append_to_file(&active, &garbage);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    let recovery = &report.partitions[0];
    assert_eq!(recovery.truncated_bytes, garbage.len() as u64, "{:?}", report.lines());
    assert_eq!(recovery.truncated_records, expected_records_cut);
    assert!(recovery.damage.is_empty(), "a torn tail is not corruption: {:?}", recovery.damage);
    assert_eq!(std::fs::read(&active).unwrap(), clean, "exactly the tail is cut");
    assert_eq!(common::read_all(&engine, TOPIC, 0, 0, 1 << 20), expected);
    assert_eq!(common::append_value(&engine, TOPIC, 0, b"after recovery"), 50);
    drop(engine);

    // Recovery is idempotent: the next open finds nothing to do and the same records.
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    let records = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    assert_eq!(records[..50], expected);
    assert_eq!(records[50].value, b"after recovery");
    assert_eq!(records.len(), 51);
}

#[test]
fn garbage_after_the_last_batch_is_cut() {
    // Bytes that start nothing like a batch header.
    torn_tail_is_cut(|_| (0..777u32).map(|i| (i * 31 % 251) as u8).collect(), 0);
}

#[test]
fn zeros_after_the_last_batch_are_cut() {
    // What a file extended but never written looks like after a crash.
    torn_tail_is_cut(|_| vec![0; 4000], 0);
}

#[test]
fn a_short_tail_smaller_than_a_header_is_cut() {
    torn_tail_is_cut(|_| vec![7; 10], 0);
}

#[test]
fn a_partial_copy_of_a_valid_batch_is_cut() {
    // The last batch without its final bytes, as a torn write of the next batch would leave
    // it: a valid header whose body is cut short. Its header counts one record.
    torn_tail_is_cut(
        |active| {
            let (position, _) = *common::batch_positions_of(active).last().unwrap();
            let batch = &active[usize::try_from(position).unwrap()..];
            batch[..batch.len() - 10].to_vec()
        },
        1,
    );
}

#[test]
fn a_whole_batch_with_a_wrong_offset_is_cut() {
    // A complete, checksummed copy of an earlier batch whose offset does not follow on, with no
    // synced evidence after it, is not trusted either.
    torn_tail_is_cut(
        |active| {
            let (position, _) = common::batch_positions_of(active)[0];
            let (next, _) = common::batch_positions_of(active)[1];
            active[usize::try_from(position).unwrap()..usize::try_from(next).unwrap()].to_vec()
        },
        1,
    );
}
