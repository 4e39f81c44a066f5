//! `chronik verify` and `chronik dump` on intact and damaged data directories: each damage
//! to durable data is reported with its file and exit code 3; what the next open repairs by
//! itself (a torn unsynced tail, a missing index) is a notice with exit code 0; neither tool
//! changes a byte of the directory.

mod common;

use common::{chronik, produce_lines, segments, snapshot, text};
use std::path::Path;

fn verify(data: &Path) -> (i32, String) {
    let output = chronik(data, &["verify"], None);
    (output.status.code().unwrap_or(-1), text(&output.stdout) + &text(&output.stderr))
}

/// A fresh directory with topic `t` (several 4 KiB segments), closed cleanly.
fn fixture() -> (tempfile::TempDir, std::path::PathBuf) {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    produce_lines(&data, 2000);
    (directory, data)
}

#[test]
fn an_intact_directory_verifies_clean_and_dumps_every_record() {
    let (_keep, data) = fixture();
    let (code, out) = verify(&data);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verify: ok: 1 partitions, 0 damaged, 0 notices"), "{out}");
    assert!(out.contains("t/0: offsets 0..2000"), "{out}");
    let json = chronik(&data, &["verify", "--format", "json"], None);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["partitions"][0]["records"], 2000);
    let dump = chronik(&data, &["dump", "--topic", "t", "--records", "--format", "json"], None);
    assert!(dump.status.success(), "{}", text(&dump.stderr));
    let mut offsets = Vec::new();
    for line in text(&dump.stdout).lines() {
        let batch: serde_json::Value = serde_json::from_str(line).unwrap();
        for record in batch["records"].as_array().unwrap() {
            let offset = record["offset"].as_u64().unwrap();
            assert_eq!(record["value"], (offset + 1).to_string());
            offsets.push(offset);
        }
    }
    assert_eq!(offsets, (0..2000).collect::<Vec<_>>());
}

#[test]
fn each_damage_to_durable_data_exits_3_and_names_its_file() {
    type Damage = fn(&Path);
    let cases: [(&str, Damage, &str); 6] = [
        (
            "a flipped byte in a sealed segment",
            |data| {
                // The last byte is in the last batch's records, under its checksum, wherever
                // the batches begin: `produce` batches stdin as it comes, so a byte in the
                // middle could land on a batch header (a bad magic, not a checksum mismatch).
                let log = &segments(data)[1];
                let mut bytes = std::fs::read(log).unwrap();
                let last = bytes.len() - 1;
                bytes[last] ^= 0x40;
                std::fs::write(log, bytes).unwrap();
            },
            "checksum mismatch",
        ),
        (
            "a sealed segment cut short",
            |data| {
                let log = &segments(data)[0];
                let bytes = std::fs::read(log).unwrap();
                std::fs::write(log, &bytes[..bytes.len() - 10]).unwrap();
            },
            "truncated",
        ),
        (
            "a middle segment lost",
            |data| {
                std::fs::remove_file(&segments(data)[1]).unwrap();
            },
            "the one before ends at",
        ),
        (
            "garbage topic metadata",
            |data| {
                std::fs::write(data.join("topics/t/topic.meta"), b"not a topic").unwrap();
            },
            "topic.meta",
        ),
        (
            "a newer format version",
            |data| {
                let path = data.join("chronik.meta");
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[12] = bytes[12].wrapping_add(1); // the version field, little endian
                std::fs::write(path, bytes).unwrap();
            },
            "chronik.meta",
        ),
        (
            "a damaged log start",
            |data| {
                std::fs::write(data.join("topics/t/0/log.start"), [7_u8; 16]).unwrap();
            },
            "log.start",
        ),
    ];
    for (name, damage, expected) in cases {
        let (_keep, data) = fixture();
        damage(&data);
        let before = snapshot(&data);
        let (code, out) = verify(&data);
        assert_eq!(code, 3, "{name}: {out}");
        assert!(out.contains("verify: DAMAGED"), "{name}: {out}");
        assert!(out.to_lowercase().contains(expected), "{name}: expected {expected:?} in {out}");
        assert_eq!(snapshot(&data), before, "{name}: verify changed the directory");
    }
}

#[test]
fn what_the_next_open_repairs_is_a_notice_with_exit_0() {
    let (_keep, data) = fixture();
    // A torn tail: bytes after the last batch of the active segment, never synced.
    let logs = segments(&data);
    let active = logs.last().unwrap();
    let mut bytes = std::fs::read(active).unwrap();
    bytes.extend_from_slice(&[0xab; 100]);
    std::fs::write(active, bytes).unwrap();
    // A sealed segment's indexes lost, another's damaged (their checksum catches it).
    std::fs::remove_file(logs[0].with_extension("index")).unwrap();
    let index = logs[1].with_extension("index");
    let mut bytes = std::fs::read(&index).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&index, bytes).unwrap();
    let (code, out) = verify(&data);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("unsynced tail of 100 bytes"), "{out}");
    assert!(out.contains("offset index missing"), "{out}");
    assert!(out.contains("unusable offset index (checksum mismatch"), "{out}");
    assert!(out.contains("0 damaged, 3 notices"), "{out}");
    // The dump of the active segment shows its batches, then where the damage starts.
    let dump = chronik(&data, &["dump", active.to_str().unwrap()], None);
    assert_eq!(dump.status.code(), Some(3));
    assert!(text(&dump.stdout).contains("(100 bytes from here to the end not shown)"));
    // And the open repairs both: verify is clean afterwards.
    let read = chronik(&data, &["consume", "t"], None);
    assert!(read.status.success(), "{}", text(&read.stderr));
    assert_eq!(text(&read.stdout).lines().count(), 2000);
    let (code, out) = verify(&data);
    assert_eq!((code, out.contains("0 damaged, 0 notices")), (0, true), "{out}");
}

/// The findings of `verify` on `data`, one per line (`DAMAGE: ...` or `notice: ...`).
fn findings(data: &Path) -> (i32, Vec<String>, String) {
    let (code, out) = verify(data);
    let lines = out
        .lines()
        .filter(|l| l.starts_with("DAMAGE: ") || l.starts_with("notice: "))
        .map(str::to_owned)
        .collect();
    (code, lines, out)
}

#[test]
fn each_damaged_file_is_one_finding_that_names_it() {
    // A flipped byte in a sealed segment: one finding, on that segment (not a second one on
    // the next segment for the offsets the damage hides).
    let (_keep, data) = fixture();
    let log = &segments(&data)[1];
    let mut bytes = std::fs::read(log).unwrap();
    bytes[100] ^= 0x40;
    std::fs::write(log, bytes).unwrap();
    let (code, lines, out) = findings(&data);
    assert_eq!(code, 3, "{out}");
    assert_eq!(lines.len(), 1, "{out}");
    let named = format!("DAMAGE: {} at byte ", log.display());
    assert!(lines[0].starts_with(&named) && lines[0].contains("checksum mismatch"), "{out}");

    // A sealed segment cut short likewise.
    let (_keep, data) = fixture();
    let log = &segments(&data)[2];
    let bytes = std::fs::read(log).unwrap();
    std::fs::write(log, &bytes[..bytes.len() / 2]).unwrap();
    let (code, lines, out) = findings(&data);
    assert_eq!((code, lines.len()), (3, 1), "{out}");
    assert!(lines[0].starts_with(&format!("DAMAGE: {}", log.display())), "{out}");

    // A damaged time index is named as the time index, the offset index as the offset index.
    let (_keep, data) = fixture();
    let logs = segments(&data);
    let times = logs[1].with_extension("timeindex");
    let mut bytes = std::fs::read(&times).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&times, bytes).unwrap();
    std::fs::write(logs[2].with_extension("index"), b"not an index").unwrap();
    std::fs::remove_file(logs[3].with_extension("timeindex")).unwrap();
    let (code, lines, out) = findings(&data);
    assert_eq!((code, lines.len()), (0, 3), "{out}");
    let expected = [
        format!("notice: {}: unusable time index (checksum mismatch", times.display()),
        format!("notice: {}: unusable offset index", logs[2].with_extension("index").display()),
        format!("notice: {}: time index missing", logs[3].with_extension("timeindex").display()),
    ];
    for (line, expected) in lines.iter().zip(&expected) {
        assert!(line.starts_with(expected), "expected {expected:?}, got {line:?}");
    }
}
