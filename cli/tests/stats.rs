//! `chronik stats`: offsets, sizes and the append rate from the records' timestamps.

mod common;

use common::{chronik, produce_lines, text};

#[test]
fn stats_show_offsets_sizes_and_the_recent_rate() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    produce_lines(&data, 2000);
    let output = chronik(&data, &["stats", "--format", "json"], None);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let row: serde_json::Value = serde_json::from_str(text(&output.stdout).trim()).unwrap();
    assert_eq!(row["topic"], "t");
    assert_eq!(row["records"], 2000);
    assert_eq!(row["high_watermark"], 2000);
    assert!(row["segments"].as_u64().unwrap() >= 3);
    // Every record was appended within the last minute (of the records' own timestamps).
    let per_minute = row["rate_1m"].as_f64().unwrap() * 60.0;
    assert!((per_minute - 2000.0).abs() < 0.5, "{row}");
    let table = chronik(&data, &["stats"], None);
    let table = text(&table.stdout);
    assert!(table.contains("1 topics, 1 partitions"), "{table}");
    let missing = chronik(&data, &["stats", "nope"], None);
    assert_eq!(missing.status.code(), Some(1), "{}", text(&missing.stderr));
}
