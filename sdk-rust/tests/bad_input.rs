//! Hostile use of the Rust SDK: every bad argument is a typed `Err`, never a panic or a hang,
//! and nothing acknowledged before or between the bad calls is lost.

use chronik::{
    AppendError, Chronik, CommitError, Error, Offset, Options, ReadError, Record, TopicConfig,
    TopicError,
};
use std::time::Duration;

/// Whether an append error is the one a case expects.
type Check = fn(&AppendError) -> bool;

fn open() -> (tempfile::TempDir, Chronik) {
    let directory = tempfile::tempdir().expect("tempdir");
    let chronik = Chronik::open(directory.path(), Options::default()).expect("open");
    chronik.create_topic("t", TopicConfig::default().with_partitions(2)).expect("create");
    (directory, chronik)
}

/// Bad topic names and configs are `TopicError::InvalidName` / `InvalidConfig`.
#[test]
fn bad_topic_names_and_configs_are_refused() {
    let (_directory, chronik) = open();
    let long = "x".repeat(chronik::limits::TOPIC_NAME_BYTES_MAX + 1);
    let names = ["", ".", "..", "../escape", "a/b", "/abs", "a\\b", "a\0b", "__internal", &long];
    for name in names {
        let result = chronik.create_topic(name, TopicConfig::default());
        assert!(matches!(result, Err(TopicError::InvalidName { .. })), "name {name:?}: {result:?}");
    }
    let partitions_max = chronik::limits::PARTITIONS_MAX;
    for partitions in [0, partitions_max + 1, u32::MAX] {
        let result = chronik.create_topic("p", TopicConfig::default().with_partitions(partitions));
        assert!(
            matches!(result, Err(TopicError::InvalidConfig { .. })),
            "partitions {partitions}: {result:?}"
        );
    }
    let result = chronik.create_topic("t", TopicConfig::default());
    assert!(matches!(result, Err(TopicError::AlreadyExists { .. })), "{result:?}");
    // Nothing escaped the data directory or was left half-made.
    let topics: Vec<String> = chronik.list_topics().into_iter().collect();
    assert_eq!(topics, ["t"]);
}

/// Appends with a bad topic, partition or batch are `AppendError`s.
#[test]
fn bad_appends_are_refused() {
    let (_directory, chronik) = open();
    let huge = vec![0_u8; 20 << 20];
    let one = [Record::new(None, b"v")];
    let big = [Record::new(None, &huge)];
    let too_many_count = chronik::limits::BATCH_RECORDS_MAX as usize + 1;
    let too_many = vec![Record::new(None, b""); too_many_count];
    let cases: [(&str, u32, &[Record<'_>], Check); 7] = [
        ("missing", 0, &one, |e| matches!(e, AppendError::TopicNotFound { .. })),
        ("../t", 0, &one, |e| matches!(e, AppendError::TopicNotFound { .. })),
        ("t", 2, &one, |e| matches!(e, AppendError::PartitionNotFound { .. })),
        ("t", u32::MAX, &one, |e| matches!(e, AppendError::PartitionNotFound { .. })),
        ("t", 0, &[], |e| matches!(e, AppendError::Empty)),
        ("t", 0, &big, |e| matches!(e, AppendError::BatchTooLarge { .. })),
        ("t", 0, &too_many, |e| {
            matches!(e, AppendError::TooManyRecords { .. } | AppendError::BatchTooLarge { .. })
        }),
    ];
    let mut acknowledged = Vec::new();
    for (index, (topic, partition, records, check)) in cases.iter().enumerate() {
        let mut producer = chronik.producer(topic);
        let error = producer.send_to(*partition, records).expect_err(topic);
        assert!(check(&error), "case {index} ({topic}, {partition}): {error}");
        // A good append after each refusal still works and is kept.
        let value = format!("ok-{index}").into_bytes();
        chronik.producer("t").send_to(0, &[Record::new(None, &value)]).expect("good append");
        acknowledged.push(value);
    }
    let error = chronik.producer("missing").partition_for_key(b"k").expect_err("no topic");
    assert!(matches!(error, AppendError::TopicNotFound { .. }), "{error}");
    let read: Vec<Vec<u8>> = chronik.consumer("t", 0).map(|r| r.expect("read").value).collect();
    assert_eq!(read, acknowledged);
}

/// Reads of a missing topic or partition, or from an offset past the end, are `ReadError`s,
/// and none of them waits.
#[test]
fn bad_reads_are_refused_without_waiting() {
    let (_directory, chronik) = open();
    chronik.producer("t").send_to(0, &[Record::new(None, b"v")]).expect("append");
    let cases: [(&str, u32, u64); 5] =
        [("missing", 0, 0), ("t", 2, 0), ("t", u32::MAX, 0), ("t", 0, 2), ("t", 0, u64::MAX)];
    for (topic, partition, offset) in cases {
        let mut consumer = chronik.consumer(topic, partition);
        consumer.seek(Offset::new(offset));
        let error = consumer.poll(1 << 20).expect_err("poll");
        assert!(
            matches!(
                error,
                ReadError::TopicNotFound { .. }
                    | ReadError::PartitionNotFound { .. }
                    | ReadError::OffsetOutOfRange { .. }
            ),
            "({topic}, {partition}, {offset}): {error}"
        );
        let started = std::time::Instant::now();
        let waited = consumer.poll_wait(1 << 20, Duration::from_secs(3600));
        assert!(waited.is_err(), "({topic}, {partition}, {offset}): {waited:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "poll_wait waited on a bad read");
        let next = consumer.next().expect("an error, not the end");
        assert!(next.is_err(), "({topic}, {partition}, {offset}): {next:?}");
    }
    // A zero byte budget still returns the first batch rather than nothing forever.
    let fetch = chronik.consumer("t", 0).poll(0).expect("poll 0");
    assert_eq!(fetch.records().count(), 1);
}

/// Binary, non-UTF-8 keys, values and headers round-trip byte for byte.
#[test]
fn binary_keys_and_values_round_trip() {
    let (_directory, chronik) = open();
    let key: &[u8] = &[0xff, 0xfe, 0x00, 0x80];
    let value: Vec<u8> = (0..=255).collect();
    let header = [chronik::Header { key: &[0xc3, 0x28], value: &[0x00] }];
    let record = Record::new(Some(key), &value).with_headers(&header);
    let mut producer = chronik.producer("t");
    let partition = producer.partition_for_key(key).expect("partition");
    assert!(partition < 2);
    producer.send_to(partition, &[record]).expect("append");
    let read = chronik.consumer("t", partition).next().expect("one").expect("read");
    assert_eq!(read.key.as_deref(), Some(key));
    assert_eq!(read.value, value);
    assert_eq!(read.headers, [(vec![0xc3, 0x28], vec![0x00])]);
}

/// Group misuse is `CommitError::InvalidGroup`.
#[test]
fn bad_groups_are_refused() {
    let (_directory, chronik) = open();
    let error = chronik.consumer("t", 0).commit().expect_err("no group");
    assert!(matches!(error, CommitError::InvalidGroup { .. }), "{error}");
    for (group, topic, partition) in [("", "t", 0), ("g", "missing", 0), ("g", "t", 9)] {
        let result = chronik.group_consumer(group, topic, partition).commit();
        assert!(result.is_err(), "({group:?}, {topic}, {partition}): {result:?}");
    }
}

/// A data directory path that is a file, or lies under one, is an `Error::Open`.
#[test]
fn data_directory_that_is_a_file_is_refused() {
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("file");
    std::fs::write(&file, b"not a directory").expect("write");
    for path in [file.clone(), file.join("below")] {
        let result = Chronik::open(&path, Options::default());
        assert!(matches!(result, Err(Error::Open(_))), "{}: {result:?}", path.display());
    }
    assert_eq!(std::fs::read(&file).expect("read"), b"not a directory");
}
