//! `chronik compact TOPIC` reports what it did and nothing else: the topic's bytes before and
//! after, and the segments and records its passes cleaned, agree with the files (no pass of
//! the background maintainer runs beside it: its pass at the open used to race the command's,
//! so "before" could be the size after it and the counts leave out its work); when nothing is
//! cleanable it says so.

mod common;

use common::{chronik_bytes, text};
use std::path::Path;
use std::time::Duration;

/// Records younger than this are not compacted: the producers' own background passes leave
/// the log alone, and `compact` finds it all to do once it is older.
const LAG_MS: u64 = 4000;

/// The bytes of the partition's segment files.
fn segment_bytes(data: &Path) -> u64 {
    common::segments_of(data, "c").iter().map(|p| std::fs::metadata(p).unwrap().len()).sum()
}

#[test]
fn compact_reports_the_sizes_and_counts_of_the_files() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let lag = format!("min_compaction_lag_ms={LAG_MS}");
    let args = ["topic", "create", "c", "--segment-bytes", "4096"];
    let created = chronik_bytes(
        &data,
        &[&args[..], &["--config", "cleanup=compact", "--config", &lag]].concat(),
        b"",
    );
    assert!(created.status.success(), "{}", text(&created.stderr));
    // 20 keys written over and over: a batch per produce, each past a segment's size.
    for round in 0..4 {
        let lines: Vec<String> = (0..500).map(|i| format!("k{}=v{round}-{i}", i % 20)).collect();
        let lines = lines.join("\n") + "\n";
        let args = ["produce", "c", "--key-separator", "="];
        let output = chronik_bytes(&data, &args, lines.as_bytes());
        assert!(output.status.success(), "{}", text(&output.stderr));
    }
    // Every record younger than the lag: nothing is cleanable, and the report says so
    // instead of "cleaned 0 segments into 0, kept 0 of 0 records".
    let unchanged = segment_bytes(&data);
    let output = chronik_bytes(&data, &["compact", "c"], b"");
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    let expected = format!(
        "compacted c: {unchanged} bytes -> {unchanged} bytes; nothing was cleanable (no sealed \
         segment, or every record younger than min_compaction_lag_ms"
    );
    assert!(stdout.starts_with(&expected), "expected {expected:?} in {stdout}");
    assert_eq!(segment_bytes(&data), unchanged);

    std::thread::sleep(Duration::from_millis(LAG_MS + 1000));

    let before = segment_bytes(&data);
    // Records of the sealed segments (all but the last, active one): what the passes read.
    let dump = chronik_bytes(&data, &["dump", "--topic", "c", "--format", "json"], b"");
    assert!(dump.status.success(), "{}", text(&dump.stderr));
    let batches: Vec<serde_json::Value> =
        text(&dump.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let active = batches.last().unwrap()["file"].clone();
    let sealed: u64 =
        batches.iter().filter(|b| b["file"] != active).map(|b| b["count"].as_u64().unwrap()).sum();
    assert!(sealed >= 1000, "several sealed segments: {sealed} records");

    let output = chronik_bytes(&data, &["compact", "c"], b"");
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    let after = segment_bytes(&data);
    assert!(after < before, "{before} -> {after}");
    let expected = format!("compacted c: {before} bytes -> {after} bytes; cleaned ");
    assert!(stdout.starts_with(&expected), "expected {expected:?} in {stdout}");
    let kept = format!("of {sealed} records");
    assert!(stdout.contains(&kept), "expected {kept:?} in {stdout}");

    // Again: nothing left to clean but the cleaned segments; the sizes still agree.
    let output = chronik_bytes(&data, &["compact", "c"], b"");
    let stdout = text(&output.stdout);
    let expected = format!("compacted c: {after} bytes -> {} bytes", segment_bytes(&data));
    assert!(stdout.starts_with(&expected), "expected {expected:?} in {stdout}");
}
