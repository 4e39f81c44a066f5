//! `chronik verify` (read-only) and the next writable open (recovery) judge a damaged data
//! directory the same way: verify reports damage exactly when the open does (in its recovery
//! report, by failing, or on a read of what it opened), and a torn unsynced tail as a notice of
//! exactly the bytes and records the open cuts. Each case builds one kind of damage; verify runs
//! on it first and must change nothing, then the engine opens a copy.

mod common;

use chronik_engine::internals::format::{self, BATCH_HEADER_BYTES, RECORD_HEADER_BYTES};
use chronik_engine::verify::{Severity, VerifyReport};
use chronik_engine::{
    Durability, Engine, OpenError, Options, ReadError, Record, RecoveryReport, TopicConfig,
};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const TOPIC: &str = "t";
const SYNC_FILE: &str = "synced.checkpoint";

/// What recovery is meant to find in a case (checks that the case builds what it says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expected {
    Clean,
    Torn,
    Damage,
}

/// What one side decided.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Verdict {
    damage: bool,
    /// Bytes and records of a torn tail cut (recovery) or announced as cut (verify).
    torn_bytes: u64,
    torn_records: u64,
}

type Build = fn(&Path);

#[test]
fn verify_and_recovery_classify_every_damaged_directory_alike() {
    let cases: &[(&str, Build, Expected)] = &[
        ("a clean directory of several segments", clean, Expected::Clean),
        ("garbage after the last batch, no checkpoint", garbage_without_checkpoint, Expected::Torn),
        (
            "garbage after the last batch, past the checkpoint",
            garbage_past_checkpoint,
            Expected::Torn,
        ),
        ("zeros after the last batch (more than a block)", zeros_after_last_batch, Expected::Torn),
        ("a partial copy of the last batch", partial_batch, Expected::Torn),
        ("a whole copy of an earlier batch (wrong offset)", copied_batch, Expected::Torn),
        ("a torn batch carrying a batch in its value", embedded_batch, Expected::Torn),
        ("a flipped byte below the checkpoint", flip_below_checkpoint, Expected::Damage),
        (
            "a flipped byte in the last batch, no checkpoint",
            flip_last_no_checkpoint,
            Expected::Torn,
        ),
        (
            "a flipped byte vouched for by later batches only",
            flip_vouched_by_hints,
            Expected::Damage,
        ),
        (
            "a flipped byte past an older checkpoint, vouched",
            flip_past_old_checkpoint,
            Expected::Damage,
        ),
        (
            "the active segment shorter than the checkpoint",
            shorter_than_checkpoint,
            Expected::Damage,
        ),
        ("direct I/O block padding after the last batch", direct_io_padding, Expected::Clean),
        (
            "a flipped byte in a sealed segment, indexes lost",
            sealed_flip_rescanned,
            Expected::Damage,
        ),
        ("a flipped byte in a sealed segment, indexes kept", sealed_flip_indexed, Expected::Damage),
        ("a sealed segment cut short", sealed_cut_short, Expected::Damage),
        ("a lost middle segment", lost_middle_segment, Expected::Damage),
        ("the checkpoint names a lost last segment", lost_last_segment, Expected::Damage),
        (
            "a flipped byte in the last batch, vouched by the recovery point",
            flip_last_vouched_by_recovery_point,
            Expected::Damage,
        ),
        ("a lost last segment and the one before cut", lost_last_and_cut, Expected::Damage),
    ];
    let mut disagreements = String::new();
    for &(name, build, expected) in cases {
        let directory = tempfile::tempdir().unwrap();
        let root = directory.path().join("data");
        build(&root);
        let before = common::snapshot(&root);
        let io = Arc::new(common::test_io());
        let report = chronik_engine::verify::verify(&io, &root).unwrap();
        assert_eq!(common::snapshot(&root), before, "{name}: verify changed the directory");
        let verified = verify_verdict(&report);

        let copy = directory.path().join("copy");
        copy_tree(&root, &copy);
        let (recovered, lines) = recovery_verdict(&copy);
        let found = match (&recovered, expected) {
            (v, Expected::Clean) => !v.damage && v.torn_bytes == 0,
            (v, Expected::Torn) => !v.damage && v.torn_bytes > 0,
            (v, Expected::Damage) => v.damage && v.torn_bytes == 0,
        };
        assert!(found, "{name}: the case is not {expected:?} to recovery: {recovered:?} {lines:?}");
        if verified != recovered {
            let findings: Vec<String> = report.findings.iter().map(ToString::to_string).collect();
            writeln!(
                disagreements,
                "{name}:\n  verify   {verified:?}\n    {findings:?}\n  recovery {recovered:?}\n    \
                 {lines:?}"
            )
            .unwrap();
        }
    }
    assert!(disagreements.is_empty(), "verify and recovery disagree:\n{disagreements}");
}

fn verify_verdict(report: &VerifyReport) -> Verdict {
    let mut verdict = Verdict { damage: report.has_damage(), torn_bytes: 0, torn_records: 0 };
    for finding in report.findings.iter().filter(|f| f.severity == Severity::Notice) {
        if let Some(bytes) = number_before(&finding.what, " bytes", "unsynced tail of ") {
            verdict.torn_bytes += bytes;
            // An older verify did not count the records; a missing count is a disagreement.
            verdict.torn_records +=
                number_before(&finding.what, " records", "bytes, ").unwrap_or(u64::MAX / 2);
        }
    }
    verdict
}

/// The number between `prefix` and `suffix` in `text`, if there is one.
fn number_before(text: &str, suffix: &str, prefix: &str) -> Option<u64> {
    let start = text.find(prefix)? + prefix.len();
    let rest = &text[start..];
    rest[..rest.find(suffix)?].parse().ok()
}

/// Open `root` writable; damage is in the report, an open that fails on corruption, or a read
/// of the opened log that meets corruption (a sealed segment with intact indexes is not
/// scanned at open, only checked when read).
fn recovery_verdict(root: &Path) -> (Verdict, Vec<String>) {
    let options = Options {
        durability: Durability::Sync,
        direct_io: common::test_direct_io(),
        ..Options::default()
    };
    let clock = common::ManualClock::new(common::EPOCH_MS);
    let (engine, report): (common::Engine, RecoveryReport) =
        match Engine::open(common::test_io(), clock, root, options) {
            Ok(opened) => opened,
            Err(OpenError::Corruption(corruption)) => {
                let verdict = Verdict { damage: true, torn_bytes: 0, torn_records: 0 };
                return (verdict, vec![format!("open failed: {corruption}")]);
            }
            Err(error) => panic!("open failed: {error}"),
        };
    let mut lines = report.lines();
    let mut damage = report.partitions.iter().any(|p| !p.damage.is_empty());
    let mut next = chronik_engine::Offset::ZERO;
    loop {
        match engine.read(TOPIC, 0, next, 1 << 20) {
            Ok(fetch) if fetch.is_empty() => break,
            Ok(fetch) => next = fetch.next_offset(),
            Err(ReadError::Corruption(corruption)) => {
                lines.push(format!("read: {corruption}"));
                damage = true;
                break;
            }
            Err(error) => panic!("read: {error}"),
        }
    }
    let torn_bytes = report.truncated_bytes();
    let torn_records = report.truncated_records();
    (Verdict { damage, torn_bytes, torn_records }, lines)
}

fn copy_tree(from: &Path, to: &Path) {
    for (path, bytes) in common::snapshot(from) {
        let target = to.join(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, bytes).unwrap();
    }
}

/// Sync appends of one record each to a topic of one (large) segment, closed cleanly, then
/// its recovery point and clean-shutdown mark removed (as if the writer had been killed before
/// it made one); returns the active segment's log file.
fn one_segment(root: &Path, count: u64) -> PathBuf {
    let log = one_segment_closed(root, count);
    common::forget_clean_close(root);
    log
}

/// As [`one_segment`], keeping the recovery point and the mark the close left.
fn one_segment_closed(root: &Path, count: u64) -> PathBuf {
    let (engine, _) = common::open(root, Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    for i in 0..count {
        assert_eq!(common::append_value(&engine, TOPIC, 0, format!("value {i}").as_bytes()), i);
    }
    drop(engine);
    active_log(root)
}

fn flip_last_vouched_by_recovery_point(root: &Path) {
    // No checkpoint and no later batch vouches for the last batch, but the recovery point the
    // close left covers it: damage in synced data, to verify as to the reads after an open
    // that does not read it.
    let log = one_segment_closed(root, 12);
    flip_in_batch(&log, 11);
    std::fs::remove_file(checkpoint_of(root)).unwrap();
}

fn active_log(root: &Path) -> PathBuf {
    common::log_files(&common::partition_directory(root, TOPIC, 0)).pop().unwrap()
}

fn checkpoint_of(root: &Path) -> PathBuf {
    common::partition_directory(root, TOPIC, 0).join(SYNC_FILE)
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

fn garbage() -> Vec<u8> {
    (0..777u32).map(|i| (i * 31 % 251) as u8).collect()
}

fn clean(root: &Path) {
    common::filled_small_segments(root, 300);
}

fn garbage_without_checkpoint(root: &Path) {
    let log = one_segment(root, 20);
    append_bytes(&log, &garbage());
    std::fs::remove_file(checkpoint_of(root)).unwrap();
}

fn garbage_past_checkpoint(root: &Path) {
    let log = one_segment(root, 20);
    append_bytes(&log, &garbage());
}

fn zeros_after_last_batch(root: &Path) {
    // Longer than a block, so never taken for the padding of a direct write.
    let log = one_segment(root, 20);
    append_bytes(&log, &[0; 5000]);
}

fn partial_batch(root: &Path) {
    let log = one_segment(root, 20);
    let bytes = std::fs::read(&log).unwrap();
    let (position, _) = *common::batch_positions_of(&bytes).last().unwrap();
    let batch = &bytes[usize::try_from(position).unwrap()..];
    append_bytes(&log, &batch[..batch.len() - 10]);
}

fn copied_batch(root: &Path) {
    let log = one_segment(root, 20);
    let bytes = std::fs::read(&log).unwrap();
    let positions = common::batch_positions_of(&bytes);
    let (start, end) = (positions[0].0, positions[1].0);
    append_bytes(&log, &bytes[usize::try_from(start).unwrap()..usize::try_from(end).unwrap()]);
}

fn embedded_batch(root: &Path) {
    // As in embedded_batch_torn_tail.rs: the carried batch's hint is no evidence of a sync.
    let log = one_segment(root, 5);
    let mut inner = Vec::new();
    let mirrored = [Record::new(None, b"mirrored")];
    let far = chronik_engine::Offset::new(1_000_000);
    format::encode_batch(&mut inner, far, &mirrored, 0, far).unwrap();
    let mut value = inner.clone();
    value.extend_from_slice(&[7; 200]);
    let mut outer = Vec::new();
    let zero = chronik_engine::Offset::ZERO;
    format::encode_batch(&mut outer, zero, &[Record::new(None, &value)], 0, zero).unwrap();
    let five = chronik_engine::Offset::new(5);
    format::set_batch_offsets(&mut outer, five, five);
    append_bytes(&log, &outer[..BATCH_HEADER_BYTES + RECORD_HEADER_BYTES + inner.len() + 20]);
}

/// Flip a byte of the first record's value in batch `index` of `log`.
fn flip_in_batch(log: &Path, index: usize) {
    let (position, _) = common::batch_positions(log)[index];
    common::flip_byte(log, position + 64 + 28 + 2);
}

fn flip_below_checkpoint(root: &Path) {
    let log = one_segment(root, 20);
    flip_in_batch(&log, 19);
}

fn flip_last_no_checkpoint(root: &Path) {
    let log = one_segment(root, 20);
    flip_in_batch(&log, 19);
    std::fs::remove_file(checkpoint_of(root)).unwrap();
}

fn flip_vouched_by_hints(root: &Path) {
    // The checkpoint write was lost, but the batches after the damaged one were written after
    // it had been fsynced, and say so.
    let log = one_segment(root, 20);
    flip_in_batch(&log, 5);
    std::fs::remove_file(checkpoint_of(root)).unwrap();
}

fn flip_past_old_checkpoint(root: &Path) {
    // The newest checkpoint writes were lost: the one on disk covers the first ten batches.
    one_segment(root, 10);
    let old = std::fs::read(checkpoint_of(root)).unwrap();
    let (engine, _) = common::open(root, Durability::Sync);
    for i in 10..20 {
        assert_eq!(common::append_value(&engine, TOPIC, 0, format!("value {i}").as_bytes()), i);
    }
    drop(engine);
    std::fs::write(checkpoint_of(root), old).unwrap();
    flip_in_batch(&active_log(root), 15);
}

fn shorter_than_checkpoint(root: &Path) {
    // A whole synced batch is gone from the end: what is left scans clean.
    let log = one_segment(root, 20);
    let (position, _) = *common::batch_positions(&log).last().unwrap();
    std::fs::OpenOptions::new().write(true).open(&log).unwrap().set_len(position).unwrap();
}

fn direct_io_padding(root: &Path) {
    // A copy taken while a direct-I/O engine is open: the last block of the active segment is
    // padded with zeros, as after a crash.
    let live = tempfile::tempdir().unwrap();
    let options = Options { durability: Durability::Sync, direct_io: true, ..Options::default() };
    let clock = common::ManualClock::new(common::EPOCH_MS);
    let (engine, _) = Engine::open(common::test_io(), clock, live.path(), options).unwrap();
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    for i in 0..7 {
        common::append_value(&engine, TOPIC, 0, format!("direct {i}").as_bytes());
    }
    copy_tree(live.path(), root);
    drop(engine);
    let size = std::fs::metadata(active_log(root)).unwrap().len();
    assert_eq!(size % chronik_engine::io::DIRECT_ALIGNMENT as u64, 0, "padded to a block");
}

/// Several small segments; returns the partition's log files.
fn small_segments(root: &Path) -> Vec<PathBuf> {
    let partition = common::filled_small_segments(root, 300);
    let logs = common::log_files(&partition);
    assert!(logs.len() > 3, "{logs:?}");
    logs
}

fn sealed_flip_indexed(root: &Path) {
    let logs = small_segments(root);
    flip_in_batch(&logs[0], 3);
}

fn sealed_flip_rescanned(root: &Path) {
    let logs = small_segments(root);
    flip_in_batch(&logs[0], 3);
    std::fs::remove_file(logs[0].with_extension("index")).unwrap();
    std::fs::remove_file(logs[0].with_extension("timeindex")).unwrap();
}

fn sealed_cut_short(root: &Path) {
    let logs = small_segments(root);
    let length = std::fs::metadata(&logs[0]).unwrap().len() - 10;
    std::fs::OpenOptions::new().write(true).open(&logs[0]).unwrap().set_len(length).unwrap();
}

fn lost_middle_segment(root: &Path) {
    let logs = small_segments(root);
    std::fs::remove_file(&logs[1]).unwrap();
}

fn lost_last_segment(root: &Path) {
    let logs = small_segments(root);
    std::fs::remove_file(logs.last().unwrap()).unwrap();
}

fn lost_last_and_cut(root: &Path) {
    let logs = small_segments(root);
    std::fs::remove_file(logs.last().unwrap()).unwrap();
    let previous = &logs[logs.len() - 2];
    let length = std::fs::metadata(previous).unwrap().len() - 10;
    std::fs::OpenOptions::new().write(true).open(previous).unwrap().set_len(length).unwrap();
}
