//! The `chronik` binary on damaged data directories: a flipped byte inside a sealed segment is
//! reported with file and position and exit code 3, after the records before it; the directory
//! is left as it was. Garbage appended to the active segment is a torn tail: cut and reported,
//! every acknowledged record kept.

mod common;

use common::chronik;
use std::path::{Path, PathBuf};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn segments(data: &Path) -> Vec<PathBuf> {
    let directory = data.join("topics/t/0");
    let mut logs: Vec<PathBuf> = std::fs::read_dir(directory)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

fn snapshot(data: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![data.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            files.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    files.sort();
    files
}

/// A topic with several segments holding the values 1..=n, one record per line.
fn produce_lines(data: &Path, n: usize) -> String {
    let created = chronik(data, &["topic", "create", "t", "--segment-bytes", "4096"], None);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let lines: String = (1..=n).map(|i| i.to_string() + "\n").collect();
    // One line at a time would be slow; a few batches make several segments.
    for chunk in lines.split_inclusive('\n').collect::<Vec<_>>().chunks(50) {
        let output = chronik(data, &["produce", "t"], Some(&chunk.concat()));
        assert!(output.status.success(), "{}", text(&output.stderr));
    }
    lines
}

#[test]
fn flipped_byte_in_sealed_segment_exits_3_after_the_good_records() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let lines = produce_lines(&data, 2000);
    let logs = segments(&data);
    assert!(logs.len() >= 3, "expected several segments, got {}", logs.len());
    let victim = &logs[1];
    let mut bytes = std::fs::read(victim).unwrap();
    let position = 200;
    bytes[position] ^= 0x40;
    std::fs::write(victim, &bytes).unwrap();
    let before = snapshot(&data);

    let output = chronik(&data, &["consume", "t", "--from", "0"], None);
    assert_eq!(output.status.code(), Some(3), "stderr: {}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(stderr.contains(&victim.display().to_string()), "no file in: {stderr}");
    assert!(stderr.contains("at byte 0"), "no position of the damaged batch in: {stderr}");
    assert!(stderr.contains("checksum mismatch"), "{stderr}");
    let printed = text(&output.stdout);
    assert!(!printed.is_empty());
    assert!(lines.starts_with(&printed), "printed records are not a prefix of the written ones");
    let first_of_victim: usize =
        segments(&data)[1].file_stem().unwrap().to_str().unwrap().parse().unwrap();
    assert_eq!(
        printed.lines().count(),
        first_of_victim,
        "all records before the damage are printed"
    );
    assert_eq!(snapshot(&data), before, "the data directory was changed");
}

#[test]
fn garbage_appended_to_the_active_segment_is_cut_and_reported() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let lines = produce_lines(&data, 500);
    let active = segments(&data).pop().unwrap();
    let length = std::fs::metadata(&active).unwrap().len();
    let mut file = std::fs::OpenOptions::new().append(true).open(&active).unwrap();
    std::io::Write::write_all(&mut file, &[0xAB; 777]).unwrap();
    drop(file);

    let output = chronik(&data, &["consume", "t"], None);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("cut a torn tail of 777 bytes"), "{stderr}");
    assert_eq!(text(&output.stdout), lines, "every acknowledged record is kept");
    assert_eq!(std::fs::metadata(&active).unwrap().len(), length);

    let again = chronik(&data, &["consume", "t"], None);
    assert!(text(&again.stderr).is_empty(), "recovery is not idempotent: {}", text(&again.stderr));
}

#[test]
fn usage_errors_exit_2_and_missing_topics_exit_1() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let bad = chronik(&data, &["produce", "t", "--durability", "sometimes"], None);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    let missing = chronik(&data, &["consume", "nope"], None);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("does not exist"));
    let invalid = chronik(&data, &["topic", "create", "bad/name"], None);
    assert_eq!(invalid.status.code(), Some(1));
}
