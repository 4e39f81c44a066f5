//! Append batches with keys, headers and timestamps to a three-partition topic, read them back
//! byte for byte from many offsets, check the errors at the edges, then reopen and read again.

mod common;

use chronik_engine::{AppendError, Durability, Header, Offset, ReadError, Record, TopicConfig};
use common::Owned;
use std::collections::BTreeMap;

const TOPIC: &str = "orders";
const PARTITIONS: u32 = 3;

/// The records of batch `batch` of `partition`: 1 to 5 records, some with keys and headers.
fn batch_records(partition: u32, batch: u32) -> Vec<Owned> {
    let count = 1 + (batch + partition) % 5;
    (0..count)
        .map(|i| Owned {
            offset: 0,
            timestamp: common::EPOCH_MS + i64::from(batch * 10 + i),
            key: (i % 2 == 0).then(|| format!("key-{partition}-{batch}-{i}").into_bytes()),
            value: format!(
                "value {partition}/{batch}/{i} {}",
                "x".repeat((batch * 7 % 50) as usize)
            )
            .into_bytes(),
            headers: (0..i % 3)
                .map(|h| (format!("h{h}").into_bytes(), vec![u8::try_from(h).unwrap(); 3]))
                .collect(),
        })
        .collect()
}

fn append_batch(engine: &common::Engine, partition: u32, owned: &mut [Owned]) -> (u64, u64) {
    let headers: Vec<Vec<Header<'_>>> = owned
        .iter()
        .map(|r| r.headers.iter().map(|(k, v)| Header { key: k, value: v }).collect())
        .collect();
    let records: Vec<Record<'_>> = owned
        .iter()
        .zip(&headers)
        .map(|(r, h)| {
            Record::new(r.key.as_deref(), &r.value).with_timestamp(r.timestamp).with_headers(h)
        })
        .collect();
    let appended = engine.append(TOPIC, partition, &records).unwrap();
    let (base, last) = (appended.base_offset.get(), appended.last_offset.get());
    assert_eq!(last - base + 1, owned.len() as u64);
    for (i, record) in owned.iter_mut().enumerate() {
        record.offset = base + i as u64;
    }
    (base, last)
}

fn check_reads(engine: &common::Engine, expected: &BTreeMap<u32, Vec<Owned>>) {
    for (&partition, records) in expected {
        let end = records.len() as u64;
        assert_eq!(engine.high_watermark(TOPIC, partition).unwrap().get(), end);
        // From every offset, including those in the middle of a batch, with several read sizes:
        // the records below `from` are skipped and the rest come back exactly.
        for from in 0..end {
            for max_bytes in [0, 1, 200, 1 << 20] {
                let read = common::read_all(engine, TOPIC, partition, from, max_bytes);
                assert_eq!(read, records[from as usize..], "partition {partition} from {from}");
            }
            let fetch = engine.read(TOPIC, partition, Offset::new(from), 1).unwrap();
            assert_eq!(fetch.from().get(), from);
            assert_eq!(fetch.records().next().unwrap().offset().get(), from);
            assert_eq!(fetch.batches().count(), 1, "a tiny read still returns one whole batch");
        }
        let at_end = engine.read(TOPIC, partition, Offset::new(end), 1 << 20).unwrap();
        assert!(at_end.is_empty());
        assert_eq!(at_end.next_offset().get(), end);
        let beyond = engine.read(TOPIC, partition, Offset::new(end + 1), 1 << 20).unwrap_err();
        match beyond {
            ReadError::OffsetOutOfRange { requested, start, end: reported } => {
                assert_eq!((requested, start, reported), (end + 1, 0, end));
            }
            other => panic!("expected OffsetOutOfRange, got {other:?}"),
        }
    }
}

#[test]
fn append_and_read_back_across_partitions_and_a_reopen() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean());
    let config = TopicConfig::default().with_partitions(PARTITIONS);
    engine.create_topic(TOPIC, config).unwrap();

    let mut expected: BTreeMap<u32, Vec<Owned>> = BTreeMap::new();
    for batch in 0..12 {
        for partition in 0..PARTITIONS {
            if partition == 2 && batch >= 4 {
                continue; // Partitions of different lengths.
            }
            let mut records = batch_records(partition, batch);
            let records_so_far = expected.get(&partition).map_or(0, Vec::len) as u64;
            let (base, _) = append_batch(&engine, partition, &mut records);
            assert_eq!(base, records_so_far, "offsets are dense per partition");
            expected.entry(partition).or_default().extend(records);
        }
    }

    // A record without a key, headers or explicit timestamp takes the engine clock.
    let appended = engine.append(TOPIC, 2, &[Record::new(None, b"")]).unwrap();
    let fetch = engine.read(TOPIC, 2, appended.base_offset, 1 << 20).unwrap();
    let record = fetch.records().next().unwrap();
    assert_eq!(
        (record.key(), record.value(), record.timestamp()),
        (None, &b""[..], common::EPOCH_MS)
    );
    assert_eq!(record.headers().count(), 0);
    expected.get_mut(&2).unwrap().extend(Owned::of_fetch(&fetch));

    check_reads(&engine, &expected);
    check_errors(&engine);

    let description = engine.describe_topic(TOPIC).unwrap();
    for partition in &description.partitions {
        let length = expected[&partition.partition].len() as u64;
        assert_eq!(partition.log_end_offset.get(), length);
        assert_eq!(partition.high_watermark.get(), length);
        assert_eq!(partition.segment_count, 1);
    }
    drop(engine);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(report.partitions.len(), PARTITIONS as usize);
    check_reads(&engine, &expected);
    // Appends continue after the last offset.
    let next = expected[&0].len() as u64;
    assert_eq!(common::append_value(&engine, TOPIC, 0, b"after reopen"), next);
}

fn check_errors(engine: &common::Engine) {
    let record = [Record::new(None, b"v")];
    assert!(matches!(
        engine.append("missing", 0, &record),
        Err(AppendError::TopicNotFound { topic }) if topic == "missing"
    ));
    assert!(matches!(
        engine.append(TOPIC, PARTITIONS, &record),
        Err(AppendError::PartitionNotFound { partition: PARTITIONS, .. })
    ));
    assert!(matches!(engine.append(TOPIC, 0, &[]), Err(AppendError::Empty)));
    assert!(matches!(
        engine.read("missing", 0, Offset::ZERO, 100),
        Err(ReadError::TopicNotFound { .. })
    ));
    assert!(matches!(
        engine.read(TOPIC, PARTITIONS, Offset::ZERO, 100),
        Err(ReadError::PartitionNotFound { partition: PARTITIONS, .. })
    ));
    assert!(matches!(
        engine.offset_for_timestamp(TOPIC, 7, 0),
        Err(ReadError::PartitionNotFound { .. })
    ));
    assert!(matches!(engine.high_watermark("missing", 0), Err(ReadError::TopicNotFound { .. })));
    assert_eq!(engine.partition_count(TOPIC), Some(PARTITIONS));
    assert_eq!(engine.partition_count("missing"), None);
}
