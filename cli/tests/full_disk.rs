//! `chronik produce` into a full file system: a 2 MiB tmpfs filled until a write fails with
//! ENOSPC. The producer stops with one clear error (exit 1), and every record it acknowledged
//! is there, byte for byte, when the directory is reopened (with the disk still full, and
//! after space is freed). Needs root and mount(8); elsewhere the test prints why and passes.

mod common;

use common::{acknowledgements, assert_fails, chronik_bytes, text};
use std::process::Command;

/// Unmounts the tmpfs when the test ends, whatever happens.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_fails_cleanly_and_keeps_every_acknowledged_record() {
    let directory = tempfile::tempdir().unwrap();
    let point = directory.path().join("full");
    std::fs::create_dir(&point).unwrap();
    let mounted =
        Command::new("mount").args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"]).arg(&point).output();
    let Ok(mounted) = mounted
        .map_err(|e| e.to_string())
        .and_then(|o| if o.status.success() { Ok(o) } else { Err(text(&o.stderr)) })
    else {
        println!("full_disk: skipped: cannot mount a tmpfs here (needs root and mount)");
        return;
    };
    drop(mounted);
    let _unmount = Mount(point.clone());
    let data = point.join("data");
    let values: Vec<String> = (0..40_000).map(|i| format!("{i}-{}", "x".repeat(100))).collect();
    let input: String = values.iter().map(|v| v.clone() + "\n").collect();
    let output = chronik_bytes(&data, &["produce", "t"], input.as_bytes());
    let stderr = assert_fails(&output, 1, "No space left on device", "produce into a full disk");
    assert_eq!(stderr.matches("No space left on device").count(), 1, "{stderr}");
    let acknowledged = acknowledgements(&output);
    println!("full_disk: {} records acknowledged before the disk filled", acknowledged.len());
    assert!(!acknowledged.is_empty() && acknowledged.len() < values.len());
    assert!(acknowledged.iter().enumerate().all(|(i, &(p, o))| p == 0 && o == i as u64));

    // Reopened on the still full disk, then after space is freed: every acknowledged record.
    let check = |when: &str| {
        let read = chronik_bytes(&data, &["consume", "t"], b"");
        assert!(read.status.success(), "{when}: {}", text(&read.stderr));
        let printed = text(&read.stdout);
        let printed: Vec<&str> = printed.lines().collect();
        assert!(printed.len() >= acknowledged.len(), "{when}: acknowledged records lost");
        assert_eq!(printed[..acknowledged.len()], values[..acknowledged.len()], "{when}");
        let verified = chronik_bytes(&data, &["verify"], b"");
        assert!(verified.status.success(), "{when}: {}", text(&verified.stdout));
    };
    let filler = point.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 4 << 20]);
    check("disk full");
    // Recovery cut the torn tail the failed write left, which freed space: fill it again. The
    // next open would free the page of the clean-shutdown mark the last close left (it takes
    // the mark away first): gone now, so the create meets a disk that is full.
    let _ = std::fs::remove_file(data.join("clean.shutdown"));
    let _ = std::fs::write(point.join("filler2"), vec![0u8; 4 << 20]);
    let more = chronik_bytes(&data, &["topic", "create", "u", "--partitions", "4"], b"");
    assert_fails(&more, 1, "No space left on device", "topic create on a full disk");
    std::fs::remove_file(&filler).unwrap();
    std::fs::remove_file(point.join("filler2")).unwrap();
    check("space freed");
    let listed = chronik_bytes(&data, &["topic", "list"], b"");
    assert_eq!(text(&listed.stdout), "t\n", "the failed create left a topic behind");
    let output = chronik_bytes(&data, &["produce", "t"], b"after\n");
    assert!(output.status.success(), "{}", text(&output.stderr));
}
