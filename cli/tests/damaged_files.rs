//! Damage to each kind of file of a data directory, seen through the `chronik` binary: a sealed
//! segment's `.index` and `.timeindex` (garbage, another segment's, a huge sparse file),
//! `topic.meta`, `synced.checkpoint`, the `__consumer_offsets` segment, a zero-length and a
//! missing middle segment, `chronik.meta`. For each: what `verify` says (exit 3 for damage,
//! 0 with a notice for what the next open repairs), what reading and producing do (exit 3 with
//! the file named, or a repair reported on standard error), no panic, and no acknowledged
//! record lost. (A flipped byte in a sealed segment and a torn tail: corruption_exit_code.rs.)

mod common;

use common::{acknowledgements, assert_fails, assert_no_panic, chronik_bytes, snapshot, text};
use std::path::{Path, PathBuf};
use std::process::Output;

/// The records written: 1..=1000, one per line.
const RECORDS: usize = 1000;

/// A data directory with topic `t` in several segments (1..=1000) and group `g` committed at 5.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    common::produce_lines(&data, RECORDS);
    let grouped = chronik_bytes(&data, &["consume", "t", "--group", "g", "--max", "5"], b"");
    assert_eq!(text(&grouped.stdout), "1\n2\n3\n4\n5\n", "{}", text(&grouped.stderr));
    assert!(common::segments(&data).len() >= 8);
    (directory, data)
}

fn partition(data: &Path) -> PathBuf {
    data.join("topics/t/0")
}

/// The `n`-th segment's file with `suffix` (`log`, `index`, `timeindex`).
fn segment_file(data: &Path, n: usize, suffix: &str) -> PathBuf {
    common::segments(data)[n].with_extension(suffix)
}

fn lines(from: usize, to: usize) -> String {
    (from..=to).map(|i| i.to_string() + "\n").collect()
}

fn run(data: &Path, args: &[&str]) -> Output {
    let output = chronik_bytes(data, args, b"");
    assert_no_panic(&output, &args.join(" "));
    output
}

/// `verify` succeeds with exactly one notice holding `needle`.
fn verify_notice(data: &Path, needle: &str) {
    let output = run(data, &["verify"]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    assert!(stdout.contains("notice: ") && stdout.contains(needle), "{stdout}");
    assert!(stdout.contains("0 damaged, 1 notices"), "{stdout}");
}

/// `verify` exits 3 reporting damage of `file` holding `needle`.
fn verify_damage(data: &Path, file: &Path, needle: &str) {
    let output = run(data, &["verify"]);
    let stdout = text(&output.stdout);
    assert_fails(&output, 3, "damaged structures found", "verify");
    let finding = format!("DAMAGE: {}", file.display());
    let line = stdout.lines().find(|l| l.starts_with(&finding)).unwrap_or_else(|| {
        panic!("no {finding} in: {stdout}");
    });
    assert!(line.contains(needle), "{needle:?} not in: {line}");
}

/// Every record is read, exit 0, with `recovery` on standard error (empty: nothing said).
fn consume_everything(data: &Path, recovery: &str) {
    let output = run(data, &["consume", "t"]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains(recovery), "{recovery:?} not in: {stderr}");
    assert!(text(&output.stdout) == lines(1, RECORDS), "records differ");
}

#[test]
fn damaged_index_files_are_rebuilt_and_every_record_reads() {
    type Damage = fn(&Path, &Path);
    let cases: [(&str, &str, Damage); 5] = [
        ("garbage index", "unusable offset index (bad magic or kind", |_, index| {
            std::fs::write(index, b"garbage, not an index at all, but long enough for a header")
                .unwrap();
        }),
        ("empty time index", "unusable time index (file too short", |_, index| {
            std::fs::write(index.with_extension("timeindex"), b"").unwrap();
        }),
        ("another segment's indexes", "base offset differs from the segment's", |data, index| {
            for suffix in ["index", "timeindex"] {
                let other = segment_file(data, 4, suffix);
                std::fs::copy(other, index.with_extension(suffix)).unwrap();
            }
        }),
        ("index cut short", "unusable offset index", |_, index| {
            let length = std::fs::metadata(index).unwrap().len();
            std::fs::File::options().write(true).open(index).unwrap().set_len(length - 3).unwrap();
        }),
        ("index missing", "offset index missing", |_, index| std::fs::remove_file(index).unwrap()),
    ];
    let (_directory, data) = fixture();
    let pristine = snapshot(&data);
    for (case, notice, damage) in cases {
        let index = segment_file(&data, 1, "index");
        damage(&data, &index);
        verify_notice(&data, notice);
        consume_everything(&data, "rebuilt");
        // Lookups by offset go through the rebuilt index.
        let output = run(&data, &["consume", "t", "--from", "150", "--max", "2"]);
        assert_eq!(text(&output.stdout), "151\n152\n", "{case}: {}", text(&output.stderr));
        let output = run(&data, &["verify"]);
        assert!(text(&output.stdout).contains("0 damaged, 0 notices"), "{case}: not rebuilt");
        // Back to the fixture for the next case.
        for (path, bytes) in &pristine {
            std::fs::write(path, bytes).unwrap();
        }
    }
}

/// The largest resident set of any child this process waited for, in bytes.
fn children_rss_max() -> u64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut usage), 0);
        usage
    };
    u64::try_from(usage.ru_maxrss).unwrap() * 1024
}

#[test]
fn a_huge_sparse_index_is_not_read_whole() {
    // A sparse index of 2 GiB (a size a broken file system might set): verify and the open
    // used to read all of it into memory (20 GiB took 23 GB and minutes); now each reads at
    // most SMALL_FILE_BYTES_MAX of it, finds it unusable, and the open rebuilds it.
    let (_directory, data) = fixture();
    for suffix in ["index", "timeindex"] {
        let file =
            std::fs::File::options().write(true).open(segment_file(&data, 1, suffix)).unwrap();
        file.set_len(2 << 30).unwrap();
    }
    let started = std::time::Instant::now();
    verify_notice(&data, "unusable offset and time indexes");
    consume_everything(&data, "rebuilt");
    let rss = children_rss_max();
    println!("huge sparse index: {:?}, children's peak RSS {} MiB", started.elapsed(), rss >> 20);
    assert!(rss < 1 << 30, "a child used {} MiB", rss >> 20);
    assert!(std::fs::metadata(segment_file(&data, 1, "index")).unwrap().len() < 4096);
}

#[test]
fn damaged_topic_metadata_exits_3_and_changes_nothing() {
    let (_directory, data) = fixture();
    let meta = data.join("topics/t/topic.meta");
    let original = std::fs::read(&meta).unwrap();
    for (case, bytes) in [("garbage", b"garbage\n".to_vec()), ("huge", vec![0; 1 << 20])] {
        std::fs::write(&meta, &bytes).unwrap();
        verify_damage(&data, &meta, "");
        // The damaged topic is kept closed and its files untouched; the directory opens.
        let before = snapshot(&data.join("topics/t"));
        for args in [&["consume", "t"][..], &["produce", "t"]] {
            let output = run(&data, args);
            assert_fails(&output, 3, "topic.meta", &format!("{case}: {}", args.join(" ")));
            assert!(output.stdout.is_empty());
        }
        let output = run(&data, &["topic", "list"]);
        assert!(output.status.success(), "{case}: topic list: {}", text(&output.stderr));
        assert_eq!(snapshot(&data.join("topics/t")), before, "{case}: the damaged topic changed");
    }
    std::fs::remove_file(&meta).unwrap();
    verify_damage(&data, &meta, "missing");
    let output = run(&data, &["consume", "t"]);
    assert_fails(&output, 3, "topic.meta", "topic.meta missing");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("missing"), "the error says the file is missing: {stderr}");
    std::fs::write(&meta, &original).unwrap();
    consume_everything(&data, "");
}

#[test]
fn a_damaged_sync_checkpoint_is_a_hint_and_loses_nothing() {
    let (_directory, data) = fixture();
    let checkpoint = partition(&data).join("synced.checkpoint");
    let original = std::fs::read(&checkpoint).unwrap();
    let garbage: Vec<u8> = (0..original.len()).map(|i| (i * 131 % 251) as u8).collect();
    let cases = [("garbage", Some(garbage)), ("empty", Some(Vec::new())), ("missing", None)];
    for (next, (case, bytes)) in (RECORDS as u64..).zip(cases) {
        match bytes {
            Some(bytes) => std::fs::write(&checkpoint, bytes).unwrap(),
            None => std::fs::remove_file(&checkpoint).unwrap(),
        }
        let output = run(&data, &["verify"]);
        assert!(output.status.success(), "{case}: {}", text(&output.stdout));
        if case == "garbage" {
            assert!(text(&output.stdout).contains("synced.checkpoint at byte 0: no valid slot"));
        }
        // Every record reads, and an append goes after them: no offset given out twice.
        let output = chronik_bytes(&data, &["produce", "t"], format!("x{next}\n").as_bytes());
        assert_eq!(acknowledgements(&output), [(0, next)], "{case}: {}", text(&output.stderr));
    }
    let output = run(&data, &["consume", "t", "--from", "998"]);
    assert_eq!(text(&output.stdout), "999\n1000\nx1000\nx1001\nx1002\n");
}

#[test]
fn damaged_consumer_offsets_refuse_a_group_read_before_printing() {
    let (_directory, data) = fixture();
    let offsets = data.join("topics/__consumer_offsets/0/00000000000000000000.log");
    let mut bytes = std::fs::read(&offsets).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x20;
    std::fs::write(&offsets, &bytes).unwrap();
    verify_damage(&data, &offsets, "checksum mismatch");
    // The group's position is unknown: nothing printed (it would start again at 0, then fail
    // to commit), exit 3 naming the file.
    let output = run(&data, &["consume", "t", "--group", "g"]);
    let stderr = assert_fails(&output, 3, "checksum mismatch", "consume --group");
    assert!(stderr.contains("committed offsets are damaged"), "{stderr}");
    assert!(stderr.contains("__consumer_offsets/0/00000000000000000000.log"), "{stderr}");
    assert!(output.stdout.is_empty(), "printed: {}", text(&output.stdout));
    // Without a group, and producing, the topic works as before.
    // The close left a recovery point over the damaged batch, so the open does not read it;
    // loading the committed offsets does, and says so.
    consume_everything(&data, "consumer offsets: commit records after corruption");
    let output = chronik_bytes(&data, &["produce", "t"], b"more\n");
    assert_eq!(acknowledgements(&output), [(0, RECORDS as u64)], "{}", text(&output.stderr));
}

#[test]
fn an_empty_or_missing_middle_segment_is_damage_and_the_rest_is_kept() {
    for case in ["zero-length", "missing"] {
        let (_directory, data) = fixture();
        let logs = common::segments(&data);
        let victim = &logs[4];
        let base: usize = victim.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        let after = &logs[5];
        if case == "missing" {
            std::fs::remove_file(victim).unwrap();
        } else {
            std::fs::write(victim, b"").unwrap();
        }
        if case == "missing" {
            verify_damage(&data, after, &format!("the one before ends at {base}"));
        } else {
            // Its index files, intact, say how long it was: the emptied segment is named.
            verify_damage(&data, victim, "truncated: 0 bytes");
        }
        // The records before the hole are printed, then exit 3 naming where it is.
        let output = run(&data, &["consume", "t"]);
        assert_fails(&output, 3, &after.display().to_string(), case);
        assert!(text(&output.stdout) == lines(1, base), "{case}: records before the hole");
        // Appends go after the end: no offset given out twice, the hole stays reported.
        let output = chronik_bytes(&data, &["produce", "t"], b"more\n");
        assert_eq!(acknowledgements(&output), [(0, RECORDS as u64)], "{}", text(&output.stderr));
        verify_damage(&data, after, "");
        let output = run(&data, &["consume", "t", "--from", &base.to_string()]);
        assert_fails(&output, 3, "corruption", case);
    }
}

#[test]
fn damaged_data_directory_metadata_exits_3() {
    let (_directory, data) = fixture();
    let meta = data.join("chronik.meta");
    let original = std::fs::read(&meta).unwrap();
    for (case, bytes) in [("garbage", b"garbagegarbage!!".to_vec()), ("empty", Vec::new())] {
        std::fs::write(&meta, &bytes).unwrap();
        verify_damage(&data, &meta, "");
        let before = snapshot(&data);
        for args in [&["consume", "t"][..], &["produce", "t"], &["topic", "create", "u"]] {
            let output = run(&data, args);
            assert_fails(&output, 3, "chronik.meta", &format!("{case}: {}", args.join(" ")));
        }
        assert_eq!(snapshot(&data), before, "{case}: a refused open changed files");
    }
    // Missing beside topics: verify reports it, and a writer refuses to open instead of
    // writing a fresh file over a directory whose metadata was lost.
    std::fs::remove_file(&meta).unwrap();
    verify_damage(&data, &meta, "missing");
    let before = snapshot(&data);
    for args in [&["produce", "t"][..], &["topic", "create", "u"]] {
        let output = run(&data, args);
        assert_fails(&output, 3, "chronik.meta", &format!("missing: {}", args.join(" ")));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("missing"), "missing: {}: {stderr}", args.join(" "));
    }
    assert_eq!(snapshot(&data), before, "missing: a refused open changed files");
    std::fs::write(&meta, &original).unwrap();
    consume_everything(&data, "");
}

#[test]
fn an_emptied_active_segment_is_damage_to_verify_too() {
    let (_directory, data) = fixture();
    let active = common::segments(&data).pop().unwrap();
    std::fs::write(&active, b"").unwrap();
    // The open reports it and refuses appends (exit 3); verify should say DAMAGE as well.
    let output = chronik_bytes(&data, &["produce", "t"], b"more\n");
    assert_fails(&output, 3, "appends refused", "produce");
    verify_damage(&data, &active, "truncated");
}
