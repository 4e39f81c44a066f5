//! A checksum-valid batch in the wrong place (a misdirected write put a copy of batch 0 where
//! another batch was) is damage: reads report the offset mismatch instead of serving the copy,
//! skipping offsets, or returning empty fetches below the high watermark forever.

mod common;

use chronik_engine::{CorruptionKind, Durability, Offset, ReadError};

/// A topic with sealed segments of same-sized batches; batch 0 of the first segment is copied
/// over its batch number `target` (or its last batch). Returns the directory and the base
/// offset of the overwritten batch.
fn with_copied_batch(over_last: bool) -> (tempfile::TempDir, u64) {
    let directory = tempfile::tempdir().unwrap();
    let partition = common::filled_small_segments(directory.path(), 300);
    let first = common::log_files(&partition)[0].clone();
    let mut bytes = std::fs::read(&first).unwrap();
    let batches = common::batch_positions_of(&bytes);
    let length = usize::try_from(batches[1].0 - batches[0].0).unwrap();
    let (position, offset) = if over_last { *batches.last().unwrap() } else { batches[2] };
    let copy = bytes[..length].to_vec();
    let position = usize::try_from(position).unwrap();
    bytes[position..position + length].copy_from_slice(&copy);
    std::fs::write(&first, bytes).unwrap();
    (directory, offset)
}

fn assert_mismatch(result: Result<chronik_engine::Fetch, ReadError>, offset: u64) {
    match result {
        Err(ReadError::Corruption(c)) => {
            assert_eq!(c.kind, CorruptionKind::OffsetMismatch { expected: offset, found: 0 });
        }
        other => panic!("expected an offset mismatch, got {other:?}"),
    }
}

#[test]
fn a_copy_in_the_middle_of_a_sealed_segment_is_reported_not_served() {
    let (directory, offset) = with_copied_batch(false);
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    assert_mismatch(engine.read("t", 0, Offset::new(offset), 1), offset);
    // Reading from the start serves what comes before the copy, then reports it.
    let fetch = engine.read("t", 0, Offset::ZERO, 1 << 20).unwrap();
    let offsets: Vec<u64> = fetch.records().map(|r| r.offset().get()).collect();
    assert_eq!(offsets, (0..offset).collect::<Vec<_>>());
    assert_mismatch(engine.read("t", 0, fetch.next_offset(), 1 << 20), offset);
}

#[test]
fn a_copy_at_the_end_of_a_sealed_segment_is_reported_not_an_empty_fetch() {
    let (directory, offset) = with_copied_batch(true);
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    assert!(engine.high_watermark("t", 0).unwrap().get() > offset);
    assert_mismatch(engine.read("t", 0, Offset::new(offset), 1 << 20), offset);
}
