//! Consumer groups: a group consumer resumes from its group's last commit after a restart,
//! commits are durable in every durability mode, iteration counts only what it handed out,
//! groups are independent, and a position retention removed moves to the log start.

use chronik::{Chronik, CommitError, Durability, Offset, Options, Record, TopicConfig};

fn open(path: &std::path::Path, durability: Durability) -> Chronik {
    Chronik::open(path, Options { durability, ..Options::default() }).unwrap()
}

fn fill(chronik: &Chronik, count: u32) {
    let mut producer = chronik.producer("events");
    for i in 0..count {
        let value = format!("event-{i:04}");
        producer.send_to(0, &[Record::new(None, value.as_bytes())]).unwrap();
    }
}

#[test]
fn a_group_resumes_where_it_committed_after_a_restart() {
    for durability in [Durability::Sync, Durability::Os, Durability::Interval { ms: 60_000 }] {
        let directory = tempfile::tempdir().unwrap();
        let chronik = open(directory.path(), durability);
        chronik.create_topic("events", TopicConfig::default()).unwrap();
        fill(&chronik, 100);
        // In `interval` mode records are visible once durable.
        chronik.flush().unwrap();
        fill(&chronik, 1);
        let mut consumer = chronik.group_consumer("billing", "events", 0);
        assert_eq!(consumer.committed(), None);
        let first: Vec<_> = consumer.by_ref().take(30).map(Result::unwrap).collect();
        assert_eq!(first.len(), 30, "{durability:?}");
        assert_eq!(first[29].value, b"event-0029");
        assert_eq!(consumer.position(), Offset::new(30), "only what was handed out counts");
        consumer.commit().unwrap();
        // Another group is independent, and a plain consumer cannot commit.
        let other = chronik.group_consumer("audit", "events", 0);
        assert_eq!(other.position(), Offset::ZERO);
        assert!(matches!(
            chronik.consumer("events", 0).commit(),
            Err(CommitError::InvalidGroup { .. })
        ));
        assert!(
            chronik.list_topics().iter().all(|t| !t.starts_with("__")),
            "internal topics hidden"
        );
        // The process ends without a close or flush: the commit is in the offsets topic.
        std::mem::forget(chronik);

        let directory_path = directory.path().to_path_buf();
        // A lock held by the forgotten engine belongs to this process: reopen read-only to
        // read what a restart finds, then check the committed offset survived.
        let reader =
            Chronik::open(&directory_path, Options { read_only: true, ..Options::default() })
                .unwrap();
        let mut resumed = reader.group_consumer("billing", "events", 0);
        assert_eq!(resumed.position(), Offset::new(30), "{durability:?}");
        let next = resumed.next().unwrap().unwrap();
        assert_eq!(
            (next.offset, next.value.as_slice()),
            (Offset::new(30), b"event-0030".as_slice())
        );
        assert_eq!(
            reader.engine().committed_offsets("billing"),
            vec![("events".to_owned(), 0, Offset::new(30))]
        );
    }
}

#[test]
fn commits_are_checked_and_internal_topics_are_reserved() {
    let directory = tempfile::tempdir().unwrap();
    let chronik = open(directory.path(), Durability::Sync);
    chronik.create_topic("events", TopicConfig::default()).unwrap();
    assert!(matches!(
        chronik.engine().commit_offsets("g", &[("missing", 0, Offset::ZERO)]),
        Err(CommitError::PartitionNotFound { .. })
    ));
    assert!(matches!(
        chronik.engine().commit_offsets("g", &[("events", 3, Offset::ZERO)]),
        Err(CommitError::PartitionNotFound { .. })
    ));
    assert!(matches!(
        chronik.engine().commit_offsets("bad group", &[("events", 0, Offset::ZERO)]),
        Err(CommitError::InvalidGroup { .. })
    ));
    assert!(chronik.create_topic("__mine", TopicConfig::default()).is_err());
    chronik.engine().commit_offsets("g", &[("events", 0, Offset::new(5))]).unwrap();
    chronik.engine().commit_offsets("g", &[("events", 0, Offset::new(7))]).unwrap();
    assert_eq!(chronik.committed_offset("g", "events", 0), Some(Offset::new(7)));
    assert!(chronik.delete_topic("__consumer_offsets").is_err());
    drop(chronik);
    let chronik = open(directory.path(), Durability::Sync);
    assert_eq!(chronik.committed_offset("g", "events", 0), Some(Offset::new(7)), "the latest wins");
}

#[test]
fn a_position_below_the_log_start_moves_to_it() {
    let directory = tempfile::tempdir().unwrap();
    let chronik = open(directory.path(), Durability::Os);
    let config =
        TopicConfig { segment_bytes: 4096, retention_bytes: Some(4096), ..TopicConfig::default() };
    chronik.create_topic("events", config).unwrap();
    fill(&chronik, 2000);
    chronik.engine().tick().unwrap();
    let start = chronik.describe_topic("events").unwrap().partitions[0].log_start_offset;
    assert!(start > Offset::ZERO);
    let mut consumer = chronik.consumer("events", 0);
    let first = consumer.next().unwrap().unwrap();
    assert_eq!(first.offset, start);
    let fetch = chronik.consumer("events", 0).poll(1 << 16).unwrap();
    assert_eq!(fetch.records().next().unwrap().offset(), start);
}
