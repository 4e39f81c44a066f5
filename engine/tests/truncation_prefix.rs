//! Property: cutting the active segment at any length, as a crash may, and reopening keeps a
//! prefix of what was written: every batch that lies wholly before the cut is there byte for
//! byte, nothing after it is, and appends continue at the next offset. And the counterpart: when
//! the sync checkpoint proves the cut bytes had been fsynced, the cut is reported as damage,
//! never silently accepted.

mod common;

use chronik_engine::runtime::SystemClock;
use chronik_engine::{Durability, Engine, Offset, Options, Record, RecoveryReport, TopicConfig};
use quickcheck::{QuickCheck, TestResult};
use std::sync::Arc;

fn open(path: &std::path::Path) -> (Engine<chronik_engine::io::SystemIo>, RecoveryReport) {
    let options = Options { durability: Durability::Os, ..Options::default() };
    Engine::open(common::test_io(), Arc::new(SystemClock), path, options).unwrap()
}

fn value(batch: usize, record: usize, size: u8) -> Vec<u8> {
    let mut value = format!("{batch}/{record}/").into_bytes();
    value.resize(value.len() + usize::from(size), b'a' + (record % 26) as u8);
    value
}

fn read_all(engine: &Engine<chronik_engine::io::SystemIo>) -> Vec<(u64, Vec<u8>)> {
    let mut records = Vec::new();
    let mut from = Offset::ZERO;
    loop {
        let fetch = engine.read("t", 0, from, 64 * 1024).unwrap();
        if fetch.is_empty() {
            return records;
        }
        records.extend(fetch.records().map(|r| (r.offset().get(), r.value().to_vec())));
        from = fetch.next_offset();
    }
}

#[allow(clippy::needless_pass_by_value)] // quickcheck passes generated values by value
fn property(
    batch_sizes: Vec<u8>,
    value_size: u8,
    cut_per_mille: u16,
    keep_checkpoint: bool,
) -> TestResult {
    if batch_sizes.is_empty() {
        return TestResult::discard();
    }
    let directory = tempfile::tempdir().unwrap();
    let mut written = Vec::new();
    // End position of each batch in the segment file, and its records.
    let mut batch_ends = Vec::new();
    {
        let (engine, _) = open(directory.path());
        engine.create_topic("t", TopicConfig::default()).unwrap();
        for (b, &size) in batch_sizes.iter().enumerate() {
            let values: Vec<Vec<u8>> =
                (0..=usize::from(size % 16)).map(|r| value(b, r, value_size)).collect();
            let records: Vec<Record<'_>> = values.iter().map(|v| Record::new(None, v)).collect();
            engine.append("t", 0, &records).unwrap();
            let size = engine.describe_topic("t").unwrap().partitions[0].size_bytes;
            batch_ends.push((size, values.len()));
            written.extend(values);
        }
    }
    let segment = directory.path().join("topics/t/0/00000000000000000000.log");
    let length = std::fs::metadata(&segment).unwrap().len();
    let cut = length * u64::from(cut_per_mille % 1001) / 1000;
    let file = std::fs::OpenOptions::new().write(true).open(&segment).unwrap();
    file.set_len(cut).unwrap();
    drop(file);
    if !keep_checkpoint {
        // A crash may lose the checkpoint's unsynced writes; without it, nothing says the cut
        // bytes were synced.
        std::fs::remove_file(directory.path().join("topics/t/0/synced.checkpoint")).unwrap();
    }

    let (engine, report) = open(directory.path());
    if keep_checkpoint && cut < length {
        // The clean close fsynced everything and said so: the cut is damage, not a torn tail.
        let damaged = report.partitions[0].damage.len() == 1 && report.truncated_bytes() == 0;
        let refused = engine.append("t", 0, &[Record::new(None, b"after")]).is_err();
        return TestResult::from_bool(damaged && refused);
    }
    let kept_records: usize =
        batch_ends.iter().take_while(|(end, _)| *end <= cut).map(|(_, count)| count).sum();
    let records = read_all(&engine);
    let expected: Vec<(u64, Vec<u8>)> =
        written.iter().take(kept_records).enumerate().map(|(i, v)| (i as u64, v.clone())).collect();
    if records != expected {
        return TestResult::error(format!(
            "cut at {cut} of {length}: kept {} records, expected {kept_records}",
            records.len()
        ));
    }
    let appended = engine.append("t", 0, &[Record::new(None, b"after")]).unwrap();
    TestResult::from_bool(appended.base_offset.get() == kept_records as u64)
}

#[test]
fn any_truncation_of_the_active_segment_keeps_a_prefix() {
    QuickCheck::new().tests(80).quickcheck(property as fn(Vec<u8>, u8, u16, bool) -> TestResult);
}
