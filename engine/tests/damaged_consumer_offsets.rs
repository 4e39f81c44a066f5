//! Damage in `__consumer_offsets` (the commit records of consumer groups and transactions)
//! never closes the data directory. What each kind does:
//!
//! - a damaged batch in a sealed segment: the open reads the commit records before it, skips
//!   the rest of that segment and reads on from the next one (commits made after the damage
//!   are still known); the damage is reported (`RecoveryReport::committed_offsets_damage`,
//!   `Engine::committed_offsets_damage`); a commit whose record was in the damaged part is
//!   unknown (the group's older commit shows); no transaction is rolled back; commits and
//!   transactions go on, and the next open knows them;
//! - damage at the end of its log: commits and transactions are refused with the
//!   `Corruption`, a transaction before any of its batches is written;
//! - a damaged `topic.meta`: the topic is kept closed, every commit record is unknown, commits
//!   and transactions are refused, and `alter_topic_config` with the topic's settings mends it.
//!
//! In every case the other topics work and no committed transaction is rolled back.

mod common;

use chronik_engine::internals::EngineInternals;
use chronik_engine::internals::groups::{OFFSETS_TOPIC, offsets_topic_config};
use chronik_engine::{
    CommitError, CorruptionKind, Durability, Engine, Error, GroupCommit, Offset, Options, Record,
    RecoveryReport, TopicError, TransactionWrite,
};
use std::path::{Path, PathBuf};

fn open(root: &Path, read_only: bool) -> (common::Engine, RecoveryReport) {
    let options = Options { durability: Durability::Sync, read_only, ..Options::default() };
    let clock = common::ManualClock::new(common::EPOCH_MS);
    Engine::open(common::test_io(), clock, root, options)
        .expect("damage in the consumer offsets never closes the directory")
}

fn values(engine: &common::Engine, topic: &str) -> Vec<String> {
    let fetch = engine.read(topic, 0, Offset::ZERO, 1 << 20).unwrap();
    fetch.records().map(|r| String::from_utf8(r.value().to_vec()).unwrap()).collect()
}

fn transaction(
    engine: &common::Engine,
    value: &'static str,
    group_offset: u64,
) -> Result<(), CommitError> {
    let records = [Record::new(None, value.as_bytes())];
    let writes = [TransactionWrite { topic: "t", partition: 0, records: &records }];
    let offsets = [("other", 0, Offset::new(group_offset))];
    let group = GroupCommit { group: "g", offsets: &offsets };
    engine.commit_transaction(&writes, Some(group)).map(|_| ())
}

/// A closed directory: topics `t` (a committed transaction `tx-a`, group `g` at 2 on
/// `other`) and `other`; group `h` committed 1 to `commits` on `other`. With `small`, the
/// offsets topic rolls segments of 4 KiB, so the transaction's commit record sits in a sealed
/// one. Returns the offsets partition's directory.
fn populated(root: &Path, small: bool, commits: u64) -> PathBuf {
    let (engine, _) = open(root, false);
    engine.create_topic("t", common::small_segments(1)).unwrap();
    engine.create_topic("other", common::small_segments(1)).unwrap();
    common::append_value(&engine, "other", 0, b"o");
    engine.commit_offsets("g", &[("other", 0, Offset::new(1))]).unwrap();
    if small {
        let config = chronik_engine::TopicConfig {
            segment_bytes: 4096,
            index_interval_bytes: 512,
            ..offsets_topic_config()
        };
        engine.alter_topic_config(OFFSETS_TOPIC, config).unwrap();
    }
    transaction(&engine, "tx-a", 2).unwrap();
    for i in 1..=commits {
        engine.commit_offsets("h", &[("other", 0, Offset::new(i))]).unwrap();
    }
    common::partition_directory(root, OFFSETS_TOPIC, 0)
}

/// The other topic appends and reads.
fn check_other_works(engine: &common::Engine) {
    common::append_value(engine, "other", 0, b"more");
    assert_eq!(values(engine, "other").last().unwrap(), "more");
}

#[test]
fn damage_in_a_sealed_segment_hides_only_its_records_and_commits_go_on() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    let partition = populated(root, true, 150);
    let logs = common::log_files(&partition);
    assert!(logs.len() >= 3, "the offsets topic rolled: {logs:?}");
    // Batch 0: g's first commit; batch 1: the transaction's commit (g at 2, t/0's end).
    let batches = common::batch_positions(&logs[0]);
    let damaged_at = batches[1].0;
    common::flip_byte(&logs[0], damaged_at + 70);

    for read_only in [true, false] {
        let (engine, report) = open(root, read_only);
        let damage = report.committed_offsets_damage.clone().expect("the damage is reported");
        assert_eq!((&damage.file, damage.position), (&logs[0], damaged_at), "{damage}");
        assert!(matches!(damage.kind, CorruptionKind::ChecksumMismatch { .. }), "{damage}");
        assert_eq!(engine.committed_offsets_damage(), Some(damage));
        assert!(report.lines().iter().any(|l| l.starts_with("consumer offsets:")), "{report:?}");
        // The committed transaction whose commit record is unreadable is not rolled back.
        assert_eq!(values(&engine, "t"), ["tx-a"]);
        // Commits after the damage are known; g's commit inside it is not (its older one shows).
        assert_eq!(engine.committed_offset("h", "other", 0), Some(Offset::new(150)));
        assert_eq!(engine.committed_offset("g", "other", 0), Some(Offset::new(1)));
        if !read_only {
            check_other_works(&engine);
            engine.commit_offsets("h", &[("other", 0, Offset::new(500))]).unwrap();
            transaction(&engine, "tx-b", 3).unwrap();
            engine.maintain().unwrap();
            assert!(engine.poisoned().is_none());
        }
    }
    let (engine, report) = open(root, false);
    assert!(report.committed_offsets_damage.is_some());
    assert_eq!(engine.committed_offset("h", "other", 0), Some(Offset::new(500)));
    assert_eq!(engine.committed_offset("g", "other", 0), Some(Offset::new(3)));
    assert_eq!(values(&engine, "t"), ["tx-a", "tx-b"]);
}

#[test]
fn damage_at_the_end_of_its_log_refuses_commits_and_transactions_before_they_write() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    let partition = populated(root, false, 3);
    let log = common::log_files(&partition).pop().unwrap();
    let (last, _) = *common::batch_positions(&log).last().unwrap();
    common::flip_byte(&log, last + 70);
    // As after a crash with no recovery point: the open reads the end of the log and finds it.
    common::forget_clean_close(root);

    let (engine, report) = open(root, false);
    let damage = report.committed_offsets_damage.clone().expect("the damage is reported");
    assert_eq!((&damage.file, damage.position), (&log, last));
    let offsets_recovery = report.partitions.iter().find(|p| p.topic == OFFSETS_TOPIC).unwrap();
    assert_eq!(offsets_recovery.damage, std::slice::from_ref(&damage));
    assert_eq!(values(&engine, "t"), ["tx-a"]);
    assert_eq!(engine.committed_offset("h", "other", 0), Some(Offset::new(2)));
    check_other_works(&engine);
    let error = engine.commit_offsets("h", &[("other", 0, Offset::new(9))]).unwrap_err();
    assert_eq!(Error::from(error).corruption(), Some(&damage));
    let written = engine.high_watermark("t", 0).unwrap();
    let error = transaction(&engine, "tx-refused", 9).unwrap_err();
    assert_eq!(Error::from(error).corruption(), Some(&damage));
    assert_eq!(engine.describe_topic("t").unwrap().partitions[0].log_end_offset, written);
    drop(engine);
    // Nothing of the refused transaction comes back (the next open could not tell it apart
    // from a committed one, with the commit records damaged).
    let (engine, _) = open(root, false);
    assert_eq!(values(&engine, "t"), ["tx-a"]);
}

#[test]
fn a_damaged_offsets_topic_meta_keeps_commits_unknown_until_mended() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    populated(root, false, 3);
    let meta = root.join("topics").join(OFFSETS_TOPIC).join("topic.meta");
    common::flip_byte(&meta, 60);

    let (engine, report) = open(root, false);
    let damage = report.damaged_topics[0].damage.clone();
    assert_eq!((report.damaged_topics[0].name.as_str(), &damage.file), (OFFSETS_TOPIC, &meta));
    assert_eq!(report.committed_offsets_damage, Some(damage.clone()));
    assert_eq!(engine.committed_offsets_damage(), Some(damage.clone()));
    assert!(!engine.list_topics().iter().any(|t| t.starts_with("__")));
    // Which transaction committed is unknown: none is rolled back.
    assert_eq!(values(&engine, "t"), ["tx-a"]);
    assert_eq!(engine.committed_offset("h", "other", 0), None);
    check_other_works(&engine);
    let error = engine.commit_offsets("h", &[("other", 0, Offset::new(9))]).unwrap_err();
    assert!(matches!(error, CommitError::Topic(TopicError::Corruption(_))), "{error:?}");
    assert_eq!(Error::from(error).corruption(), Some(&damage));
    let error = transaction(&engine, "tx-refused", 9).unwrap_err();
    assert_eq!(Error::from(error).corruption(), Some(&damage));
    assert_eq!(values(&engine, "t"), ["tx-a"]);
    let refused = engine.delete_topic(OFFSETS_TOPIC);
    assert!(matches!(refused, Err(TopicError::InvalidName { .. })), "{refused:?}");

    // Mended with the topic's settings: every commit is back, and commits go on.
    engine.alter_topic_config(OFFSETS_TOPIC, offsets_topic_config()).unwrap();
    assert_eq!(engine.committed_offsets_damage(), None);
    assert_eq!(engine.committed_offset("h", "other", 0), Some(Offset::new(3)));
    assert_eq!(engine.committed_offset("g", "other", 0), Some(Offset::new(2)));
    transaction(&engine, "tx-b", 4).unwrap();
    drop(engine);
    let (engine, report) = open(root, false);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(values(&engine, "t"), ["tx-a", "tx-b"]);
    assert_eq!(engine.committed_offset("g", "other", 0), Some(Offset::new(4)));
}
