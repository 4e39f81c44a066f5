//! One topic's damaged `topic.meta` keeps that topic closed, never the data directory: the
//! open succeeds (writable and read-only), the other topics append, read, compact and retain
//! as before, the damage is in the `RecoveryReport` (file and evidence), and every operation on
//! the damaged topic fails with that `Corruption`, never "not found"; a create of the name is
//! refused. The topic's files are left as they were. The remedies: put the file back and
//! reopen; `alter_topic_config` writes it anew (the partition count must match the directories)
//! and opens the topic; `delete_topic` discards it. Damage to a partition's `log.start` closes
//! its topic the same way, and settings cannot mend it.

mod common;

use chronik_engine::internals::EngineInternals;
use chronik_engine::{
    AppendError, CommitError, CorruptionKind, DamagedTopic, Durability, Engine, Error, GroupCommit,
    Offset, Options, ReadError, Record, TopicConfig, TopicError, TransactionWrite,
};
use std::path::{Path, PathBuf};

const BAD: &str = "bad";

fn bad_config() -> TopicConfig {
    TopicConfig { partitions: 2, ..common::small_segments(2) }
}

/// A closed directory with topics `bad` (2 partitions: `b0-*` records on 0, a committed
/// transaction `tx-*` on 1, group `g` committed at 3 on 0), `good` (deleted by size) and
/// `keyed` (compacted).
fn populated(root: &Path) {
    let (engine, _) = common::open(root, Durability::Sync);
    engine.create_topic(BAD, bad_config()).unwrap();
    let good = TopicConfig { retention_bytes: Some(8192), ..common::small_segments(1) };
    engine.create_topic("good", good).unwrap();
    let keyed = common::small_segments(1).with_cleanup(chronik_engine::Cleanup::Compact);
    engine.create_topic("keyed", keyed).unwrap();
    for i in 0..5 {
        common::append_value(&engine, BAD, 0, format!("b0-{i}").as_bytes());
    }
    let records = [Record::new(None, b"tx-1"), Record::new(None, b"tx-2")];
    let writes = [TransactionWrite { topic: BAD, partition: 1, records: &records }];
    let offsets = [(BAD, 0, Offset::new(3))];
    engine
        .commit_transaction(&writes, Some(GroupCommit { group: "g", offsets: &offsets }))
        .unwrap();
}

fn values(
    engine: &Engine<impl chronik_engine::io::Io>,
    topic: &str,
    partition: u32,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut next =
        engine.describe_topic(topic).unwrap().partitions[partition as usize].log_start_offset;
    loop {
        let fetch = engine.read(topic, partition, next, 1 << 20).unwrap();
        if fetch.is_empty() {
            return out;
        }
        out.extend(fetch.records().map(|r| String::from_utf8(r.value().to_vec()).unwrap()));
        next = fetch.next_offset();
    }
}

fn try_open(root: &Path, read_only: bool) -> (common::Engine, chronik_engine::RecoveryReport) {
    let options = Options { durability: Durability::Sync, read_only, ..Options::default() };
    let clock = common::ManualClock::new(common::EPOCH_MS);
    Engine::open(common::test_io(), clock, root, options)
        .expect("one damaged topic never closes the directory")
}

fn meta_path(root: &Path) -> PathBuf {
    root.join("topics").join(BAD).join("topic.meta")
}

/// The files of topic `bad`, by path.
fn bad_files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    common::snapshot(root).into_iter().filter(|(p, _)| p.starts_with("topics/bad")).collect()
}

/// Every operation on the damaged topic reports `damage`; none finds it missing.
fn check_refused(engine: &common::Engine, damage: &chronik_engine::Corruption, writable: bool) {
    let is_damage = |error: Error| {
        assert_eq!(error.corruption(), Some(damage), "{error}");
    };
    for partition in 0..2 {
        match engine.read(BAD, partition, Offset::ZERO, 1 << 20) {
            Err(ReadError::Corruption(c)) => assert_eq!(&c, damage),
            other => panic!("read: {other:?}"),
        }
        is_damage(engine.high_watermark(BAD, partition).unwrap_err().into());
        is_damage(engine.offset_for_timestamp(BAD, partition, 0).unwrap_err().into());
        match engine.append(BAD, partition, &[Record::new(None, b"x")]) {
            Err(AppendError::Corruption(c)) => assert_eq!(&c, damage),
            other => panic!("append: {other:?}"),
        }
    }
    // Partition 7 of a topic whose settings are unknown: the damage too, not "no partition".
    is_damage(engine.read(BAD, 7, Offset::ZERO, 1).unwrap_err().into());
    match engine.describe_topic(BAD) {
        Err(TopicError::Corruption(c)) => assert_eq!(&c, damage),
        other => panic!("describe: {other:?}"),
    }
    assert_eq!(engine.partition_count(BAD), None);
    match engine.topic_partitions(BAD) {
        Err(TopicError::Corruption(c)) => assert_eq!(&c, damage),
        other => panic!("topic_partitions: {other:?}"),
    }
    assert!(matches!(engine.topic_partitions("nope"), Err(TopicError::NotFound { .. })));
    assert!(engine.list_topics().contains(&BAD.to_owned()), "{:?}", engine.list_topics());
    let expected = vec![DamagedTopic { name: BAD.to_owned(), damage: damage.clone() }];
    assert_eq!(engine.damaged_topics(), expected);
    if !writable {
        return;
    }
    match engine.create_topic(BAD, bad_config()) {
        Err(TopicError::Corruption(c)) => assert_eq!(&c, damage),
        other => panic!("create over a damaged topic: {other:?}"),
    }
    is_damage(engine.compact_topic(BAD).unwrap_err().into());
    is_damage(engine.delete_records(BAD, 0, Offset::new(1)).unwrap_err().into());
    is_damage(engine.compaction_error(BAD, 0).unwrap_err().into());
    let error = engine.commit_offsets("g", &[(BAD, 0, Offset::new(4))]).unwrap_err();
    assert!(matches!(error, CommitError::Topic(TopicError::Corruption(_))), "{error:?}");
    is_damage(error.into());
    let records = [Record::new(None, b"x")];
    let writes = [TransactionWrite { topic: BAD, partition: 0, records: &records }];
    is_damage(engine.commit_transaction(&writes, None).unwrap_err().into());
    assert_eq!(engine.committed_offset("g", BAD, 0), Some(Offset::new(3)), "commits are kept");
}

/// The other topics append, read, retain and compact.
fn check_others_work(engine: &common::Engine) {
    for i in 0..200 {
        common::append_value(engine, "good", 0, format!("good-{i:03}").repeat(8).as_bytes());
        let key = format!("k{}", i % 5);
        engine.append("keyed", 0, &[Record::new(Some(key.as_bytes()), b"v")]).unwrap();
    }
    engine.maintain().unwrap();
    let good = engine.describe_topic("good").unwrap();
    assert!(good.partitions[0].log_start_offset > Offset::ZERO, "retention ran: {good:?}");
    let last = values(engine, "good", 0).pop().unwrap();
    assert_eq!(last, "good-199".repeat(8));
    let compacted = engine.compact_topic("keyed").unwrap();
    assert!(compacted[0].is_some(), "compaction ran");
    assert!(values(engine, "keyed", 0).len() < 200);
    assert!(engine.poisoned().is_none());
}

#[test]
fn a_damaged_topic_meta_closes_only_its_topic_until_the_file_is_put_back() {
    type Damage = fn(&[u8]) -> Option<Vec<u8>>;
    let cases: [(&str, Damage); 5] = [
        ("flipped byte", |b| {
            let mut b = b.to_vec();
            b[40] ^= 0x10;
            Some(b)
        }),
        ("cut short", |b| Some(b[..20].to_vec())),
        ("empty", |_| Some(Vec::new())),
        ("garbage", |_| Some(vec![0x5a; 96])),
        ("missing", |_| None),
    ];
    for (how, damage) in cases {
        let directory = tempfile::tempdir().unwrap();
        let root = directory.path();
        populated(root);
        let path = meta_path(root);
        let original = std::fs::read(&path).unwrap();
        match damage(&original) {
            Some(bytes) => std::fs::write(&path, bytes).unwrap(),
            None => std::fs::remove_file(&path).unwrap(),
        }
        let before = bad_files(root);
        for read_only in [false, true] {
            let (engine, report) = try_open(root, read_only);
            assert_eq!(report.damaged_topics.len(), 1, "{how}: {report:?}");
            let found = &report.damaged_topics[0];
            assert_eq!((found.name.as_str(), &found.damage.file), (BAD, &path), "{how}");
            let evidence_fits = match (how, &found.damage.kind) {
                ("flipped byte", CorruptionKind::ChecksumMismatch { expected, actual }) => {
                    expected != actual
                }
                ("cut short" | "empty", CorruptionKind::Truncated { needed: 96, available }) => {
                    *available < 96
                }
                ("garbage", CorruptionKind::BadMagic { found }) => *found == 0x5a5a_5a5a,
                ("missing", CorruptionKind::Malformed { .. }) => true,
                _ => false,
            };
            assert!(evidence_fits, "{how}: {:?}", found.damage);
            assert!(!report.is_clean());
            assert!(report.lines().iter().any(|l| l.contains("topic bad is damaged")), "{how}");
            check_refused(&engine, &found.damage.clone(), !read_only);
            if read_only {
                assert!(matches!(engine.delete_topic(BAD), Err(TopicError::ReadOnly)));
                let alter = engine.alter_topic_config(BAD, bad_config());
                assert!(matches!(alter, Err(TopicError::ReadOnly)), "{alter:?}");
                assert_eq!(values(&engine, "good", 0).pop().unwrap(), "good-199".repeat(8));
            } else {
                check_others_work(&engine);
            }
            drop(engine);
            assert_eq!(bad_files(root), before, "{how}: the damaged topic's files changed");
        }
        // Put back, the topic is whole: its records, its transaction, its group's commit.
        std::fs::write(&path, &original).unwrap();
        let (engine, report) = try_open(root, false);
        assert!(report.damaged_topics.is_empty(), "{how}: {report:?}");
        assert_eq!(values(&engine, BAD, 0), (0..5).map(|i| format!("b0-{i}")).collect::<Vec<_>>());
        assert_eq!(values(&engine, BAD, 1), ["tx-1", "tx-2"]);
        assert_eq!(engine.committed_offset("g", BAD, 0), Some(Offset::new(3)));
        common::append_value(&engine, BAD, 0, b"after");
    }
}

#[test]
fn alter_topic_config_rewrites_a_damaged_topic_meta_and_opens_the_topic() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    populated(root);
    common::flip_byte(&meta_path(root), 30);
    let (engine, report) = try_open(root, false);
    let damage = report.damaged_topics[0].damage.clone();
    // The partition count must be the one on disk; nothing is written otherwise.
    let wrong = TopicConfig { partitions: 3, ..bad_config() };
    let error = engine.alter_topic_config(BAD, wrong).unwrap_err();
    assert!(matches!(error, TopicError::InvalidConfig { .. }), "{error:?}");
    check_refused(&engine, &damage, true);
    let repaired = TopicConfig { retention_ms: Some(86_400_000), ..bad_config() };
    engine.alter_topic_config(BAD, repaired).unwrap();
    assert!(engine.damaged_topics().is_empty());
    assert_eq!(engine.describe_topic(BAD).unwrap().config, repaired);
    assert_eq!(values(&engine, BAD, 0).len(), 5);
    assert_eq!(values(&engine, BAD, 1), ["tx-1", "tx-2"], "the committed transaction stays");
    common::append_value(&engine, BAD, 1, b"after");
    engine.commit_offsets("g", &[(BAD, 0, Offset::new(5))]).unwrap();
    drop(engine);
    let (engine, report) = try_open(root, false);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(engine.describe_topic(BAD).unwrap().config, repaired);
    assert_eq!(values(&engine, BAD, 1), ["tx-1", "tx-2", "after"]);
    assert_eq!(engine.committed_offset("g", BAD, 0), Some(Offset::new(5)));
}

#[test]
fn delete_topic_discards_a_damaged_topic_and_frees_its_name() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    populated(root);
    common::flip_byte(&meta_path(root), 50);
    let (engine, _) = try_open(root, false);
    engine.delete_topic(BAD).unwrap();
    assert!(!root.join("topics").join(BAD).exists());
    assert!(engine.damaged_topics().is_empty());
    assert!(!engine.list_topics().contains(&BAD.to_owned()));
    assert!(matches!(engine.describe_topic(BAD), Err(TopicError::NotFound { .. })));
    assert!(matches!(engine.delete_topic(BAD), Err(TopicError::NotFound { .. })));
    // The old topic's commits went with it: a new topic of the name starts clean.
    assert_eq!(engine.committed_offset("g", BAD, 0), None);
    engine.create_topic(BAD, bad_config()).unwrap();
    assert!(values(&engine, BAD, 1).is_empty());
    common::append_value(&engine, BAD, 1, b"new");
    drop(engine);
    let (engine, report) = try_open(root, false);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(values(&engine, BAD, 1), ["new"]);
}

#[test]
fn a_damaged_log_start_closes_its_topic_and_settings_cannot_mend_it() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    populated(root);
    let partition = common::partition_directory(root, BAD, 1);
    chronik_engine::internals::log_start::write(&common::test_io(), &partition, Offset::ZERO)
        .unwrap();
    let path = partition.join("log.start");
    let original = std::fs::read(&path).unwrap();
    common::flip_byte(&path, 20);
    let (engine, report) = try_open(root, false);
    let damage = report.damaged_topics[0].damage.clone();
    assert_eq!(damage.file, path);
    check_refused(&engine, &damage, true);
    check_others_work(&engine);
    match engine.alter_topic_config(BAD, bad_config()) {
        Err(TopicError::Corruption(c)) => assert_eq!(c, damage),
        other => panic!("{other:?}"),
    }
    drop(engine);
    std::fs::write(&path, original).unwrap();
    let (engine, report) = try_open(root, false);
    assert!(report.damaged_topics.is_empty());
    assert_eq!(values(&engine, BAD, 1), ["tx-1", "tx-2"]);
}
