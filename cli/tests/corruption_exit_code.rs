//! The `chronik` binary on damaged data directories: a flipped byte inside a sealed segment is
//! reported with file and position and exit code 3, after the records before it; the directory
//! is left as it was. Garbage appended to the active segment is a torn tail: cut and reported,
//! every acknowledged record kept.

mod common;

use common::{chronik, produce_lines, segments, snapshot, text};

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
    // A data directory (a missing one is a usage error too), without the topic.
    let created = chronik(&data, &["topic", "create", "u"], None);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let missing = chronik(&data, &["consume", "nope"], None);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("does not exist"));
    let invalid = chronik(&data, &["topic", "create", "bad/name"], None);
    assert_eq!(invalid.status.code(), Some(2), "an invalid name is a usage error");
}
