//! Topic management: create, list, describe, delete; typed errors for bad names and configs;
//! leftovers of an interrupted create or delete are removed at open; a recreated topic starts
//! over at offset zero.

mod common;

use chronik_engine::limits::{PARTITIONS_MAX, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN};
use chronik_engine::{Durability, Offset, ReadError, TopicConfig, TopicError};

#[test]
fn create_list_describe_delete() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    assert!(engine.list_topics().is_empty());
    let config = TopicConfig { segment_ms: 1234, ..TopicConfig::default().with_partitions(4) };
    engine.create_topic("b-topic", config).unwrap();
    engine.create_topic("a.topic_1", TopicConfig::default()).unwrap();
    assert_eq!(engine.list_topics(), ["a.topic_1", "b-topic"]);

    let description = engine.describe_topic("b-topic").unwrap();
    assert_eq!(description.name, "b-topic");
    assert_eq!(description.config, config);
    assert_eq!(description.partitions.len(), 4);
    for (i, partition) in description.partitions.iter().enumerate() {
        assert_eq!(partition.partition, i as u32);
        assert_eq!(partition.log_start_offset, Offset::ZERO);
        assert_eq!(partition.log_end_offset, Offset::ZERO);
        assert_eq!(partition.high_watermark, Offset::ZERO);
        assert_eq!((partition.segment_count, partition.size_bytes), (1, 0));
    }
    common::append_value(&engine, "b-topic", 3, b"x");
    let partition = engine.describe_topic("b-topic").unwrap().partitions[3];
    assert_eq!(partition.log_end_offset, Offset::new(1));
    assert!(partition.size_bytes > 0);

    assert!(matches!(
        engine.create_topic("b-topic", TopicConfig::default()),
        Err(TopicError::AlreadyExists { name }) if name == "b-topic"
    ));
    assert!(matches!(engine.describe_topic("nope"), Err(TopicError::NotFound { .. })));
    assert!(matches!(engine.delete_topic("nope"), Err(TopicError::NotFound { .. })));

    engine.delete_topic("b-topic").unwrap();
    assert_eq!(engine.list_topics(), ["a.topic_1"]);
    assert!(!directory.path().join("topics/b-topic").exists());
    assert!(matches!(
        engine.read("b-topic", 0, Offset::ZERO, 1),
        Err(ReadError::TopicNotFound { .. })
    ));
    drop(engine);

    // The config and the deletion survive a reopen.
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean());
    assert_eq!(engine.list_topics(), ["a.topic_1"]);
    assert_eq!(engine.describe_topic("a.topic_1").unwrap().config, TopicConfig::default());
    let entries: Vec<_> = std::fs::read_dir(directory.path().join("topics"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(entries, ["a.topic_1"], "no leftovers in the topics directory");
}

#[test]
fn invalid_names_and_configs_are_rejected() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    let long = "x".repeat(201);
    for name in ["", ".hidden", "a/b", "..", "sp ace", "tab\t", "é", "a\0b", long.as_str()] {
        let error = engine.create_topic(name, TopicConfig::default()).unwrap_err();
        assert!(matches!(error, TopicError::InvalidName { .. }), "{name:?}: {error:?}");
    }
    engine.create_topic(&"x".repeat(200), TopicConfig::default()).unwrap();

    let default = TopicConfig::default();
    let invalid = [
        default.with_partitions(0),
        default.with_partitions(PARTITIONS_MAX + 1),
        TopicConfig { segment_bytes: SEGMENT_BYTES_MIN - 1, ..default },
        TopicConfig { segment_bytes: SEGMENT_BYTES_MAX + 1, ..default },
        TopicConfig { segment_ms: 0, ..default },
        TopicConfig { segment_ms: -5, ..default },
        TopicConfig { index_interval_bytes: 0, ..default },
    ];
    for config in invalid {
        let error = engine.create_topic("valid-name", config).unwrap_err();
        assert!(matches!(error, TopicError::InvalidConfig { .. }), "{config:?}: {error:?}");
    }
    assert_eq!(engine.list_topics(), ["x".repeat(200)], "nothing was created");
    assert!(engine.poisoned().is_none(), "rejections are not failures");
    let topics = common::files_under(&directory.path().join("topics"));
    assert!(topics.iter().all(|f| f.starts_with("x".repeat(200))), "{topics:?}");
}

#[test]
fn leftovers_of_interrupted_creates_and_deletes_are_removed_at_open() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic("kept", TopicConfig::default()).unwrap();
    common::append_value(&engine, "kept", 0, b"kept");
    drop(engine);

    // As a crash in the middle of create_topic and of delete_topic leaves them.
    let topics = directory.path().join("topics");
    std::fs::create_dir_all(topics.join(".half.creating/0")).unwrap();
    std::fs::write(topics.join(".half.creating/topic.meta"), b"partial").unwrap();
    std::fs::write(topics.join(".half.creating/0/00000000000000000000.log"), b"").unwrap();
    std::fs::create_dir_all(topics.join(".gone.deleting/0")).unwrap();
    std::fs::write(topics.join(".gone.deleting/0/00000000000000000000.log"), b"data").unwrap();

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    let mut removed = report.removed_incomplete_topics.clone();
    removed.sort();
    assert_eq!(removed, [".gone.deleting", ".half.creating"]);
    assert!(!report.is_clean());
    assert_eq!(report.lines().len(), 2, "{:?}", report.lines());
    assert!(!topics.join(".half.creating").exists());
    assert!(!topics.join(".gone.deleting").exists());
    assert_eq!(engine.list_topics(), ["kept"]);
    assert_eq!(common::read_all(&engine, "kept", 0, 0, 1 << 20).len(), 1);
    // The interrupted name is free to use.
    engine.create_topic("half", TopicConfig::default()).unwrap();
    drop(engine);

    let (_engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
}

#[test]
fn a_recreated_topic_starts_at_offset_zero() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic("again", common::small_segments(2)).unwrap();
    for i in 0..100 {
        assert_eq!(common::append_value(&engine, "again", 1, &[b'o'; 200]), i);
    }
    assert!(engine.describe_topic("again").unwrap().partitions[1].segment_count > 1);
    engine.delete_topic("again").unwrap();
    engine.create_topic("again", TopicConfig::default()).unwrap();
    let description = engine.describe_topic("again").unwrap();
    assert_eq!(description.partitions.len(), 1, "the new config applies");
    assert_eq!(description.partitions[0].log_end_offset, Offset::ZERO);
    assert!(engine.read("again", 0, Offset::ZERO, 1 << 20).unwrap().is_empty());
    assert_eq!(common::append_value(&engine, "again", 0, b"fresh"), 0);
    drop(engine);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean());
    let records = common::read_all(&engine, "again", 0, 0, 1 << 20);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value, b"fresh");
    assert_eq!(engine.partition_count("again"), Some(1));
}
