//! Every read surface of the SDK reads a compacted log back whole: the log's early batches
//! were emptied by compaction, so the first fetches from offset 0 hold no record at all. The
//! bug this guards against: each surface took "a fetch held no record" for "caught up" and
//! returned part of the log (nothing, here) as if it were all of it.
//!
//! The oracle is the engine's own full read (itself model-checked by the simulator), and the
//! latest value of every key, which compaction must keep.

use chronik::Log;
use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig, Runner};
use chronik::{
    Chronik, Cleanup, Durability, Offset, Options, OwnedRecord, Record, RecordView, TopicConfig,
};
use std::collections::BTreeMap;
use std::time::Duration;

const KEYS: u32 = 100;
const ROUNDS: u32 = 6;

fn open(dir: &std::path::Path) -> Chronik {
    Chronik::open(dir, Options { durability: Durability::Os, ..Options::default() }).unwrap()
}

fn compacted_config() -> TopicConfig {
    TopicConfig { segment_bytes: 4096, cleanup: Cleanup::Compact, ..TopicConfig::default() }
}

/// `KEYS` keys written `ROUNDS` times to `topic` (one record per batch, times 1, 2, ...),
/// then compacted: every sealed segment's early batches keep no record.
fn compacted_topic(chronik: &Chronik, topic: &str) {
    chronik.create_topic(topic, compacted_config()).unwrap();
    let mut time = 0;
    for round in 0..ROUNDS {
        for key in 0..KEYS {
            time += 1;
            let (key, value) = (format!("user-{key:03}"), format!("v{round}"));
            let record = Record::new(Some(key.as_bytes()), value.as_bytes()).with_timestamp(time);
            chronik.engine().append(topic, 0, &[record]).unwrap();
        }
    }
    let reports = chronik.compact_topic(topic).unwrap();
    assert!(reports[0].is_some(), "the compaction pass ran");
    let first = chronik.engine().read(topic, 0, Offset::ZERO, 1 << 20).unwrap();
    assert!(!first.is_empty(), "the log has batches");
    assert_eq!(first.records().count(), 0, "the first fetch holds no record (the bug's setup)");
}

/// The engine's full read: every record, in order.
fn engine_records(chronik: &Chronik, topic: &str) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut from = Offset::ZERO;
    loop {
        let fetch = chronik.engine().read(topic, 0, from, 1 << 20).unwrap();
        if fetch.is_empty() {
            return out;
        }
        for record in fetch.records() {
            out.push((
                record.offset().get(),
                record.key().unwrap().to_vec(),
                record.value().to_vec(),
            ));
        }
        from = fetch.next_offset();
    }
}

fn owned(records: Vec<OwnedRecord>) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    records.into_iter().map(|r| (r.offset.get(), r.key.unwrap(), r.value)).collect()
}

/// The engine's read holds the latest value of every key, and is what each surface must give.
fn expected(chronik: &Chronik, topic: &str) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    let records = engine_records(chronik, topic);
    let latest: BTreeMap<&[u8], &[u8]> =
        records.iter().map(|(_, k, v)| (k.as_slice(), v.as_slice())).collect();
    assert_eq!(latest.len(), KEYS as usize);
    let last = format!("v{}", ROUNDS - 1);
    assert!(latest.values().all(|v| *v == last.as_bytes()), "latest values kept");
    assert!(records.len() < (KEYS * ROUNDS) as usize, "compaction removed records");
    records
}

#[test]
fn the_consumer_iterator_reads_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    compacted_topic(&chronik, "profiles");
    let mut consumer = chronik.consumer("profiles", 0);
    let read = consumer.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
    assert_eq!(owned(read), expected(&chronik, "profiles"));
    assert_eq!(consumer.position(), chronik.high_watermark("profiles", 0).unwrap());
    assert!(consumer.caught_up().unwrap());
}

#[test]
fn poll_and_poll_wait_return_records_until_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    compacted_topic(&chronik, "profiles");
    for wait in [false, true] {
        let mut consumer = chronik.consumer("profiles", 0);
        let mut read = Vec::new();
        loop {
            let fetch = if wait {
                consumer.poll_wait(512, Duration::from_millis(10)).unwrap()
            } else {
                consumer.poll(512).unwrap()
            };
            if fetch.is_empty() {
                break;
            }
            assert!(fetch.records().next().is_some(), "a non-empty poll holds a record");
            for r in fetch.records() {
                read.push((r.offset().get(), r.key().unwrap().to_vec(), r.value().to_vec()));
            }
        }
        assert_eq!(read, expected(&chronik, "profiles"), "poll_wait: {wait}");
        assert!(consumer.caught_up().unwrap());
    }
}

#[test]
fn a_group_consumer_goes_on_from_its_commit_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let want = {
        let chronik = open(dir.path());
        compacted_topic(&chronik, "profiles");
        let mut consumer = chronik.group_consumer("g", "profiles", 0);
        let first: Vec<OwnedRecord> = consumer.by_ref().take(10).map(Result::unwrap).collect();
        assert_eq!(first.len(), 10);
        consumer.commit().unwrap();
        expected(&chronik, "profiles")
    };
    let chronik = open(dir.path());
    let mut consumer = chronik.group_consumer("g", "profiles", 0);
    let rest = consumer.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
    assert_eq!(owned(rest), want[10..]);
    assert!(consumer.caught_up().unwrap());
}

#[test]
fn a_connection_reads_every_record() {
    let dir = tempfile::tempdir().unwrap();
    {
        let chronik = open(dir.path());
        compacted_topic(&chronik, "profiles");
    }
    let connection = chronik::connect(dir.path().to_str().unwrap()).unwrap();
    let records = owned(connection.records("profiles", 0).unwrap());
    let consumer = connection.consumer("profiles", 0, None).unwrap();
    let iterated = owned(consumer.collect::<Result<Vec<_>, _>>().unwrap());
    assert_eq!(records, iterated);
    let Connection::Embedded(chronik) = &connection else { panic!("embedded") };
    assert_eq!(records, expected(chronik, "profiles"));
}

use chronik::Connection;

/// Copies every record it is given to "copy".
struct Copy;

impl Processor for Copy {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        ctx.emit("copy", record.key(), record.value());
        Ok(())
    }
}

#[test]
fn a_processor_runs_until_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    compacted_topic(&chronik, "profiles");
    chronik.create_topic("copy", TopicConfig::default()).unwrap();
    let config = ProcessorConfig::new("copier", "profiles");
    let mut runner = Runner::new(chronik.engine(), config, |_| Copy).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    let want = expected(&chronik, "profiles");
    assert_eq!(stats.records, want.len() as u64);
    assert_eq!(runner.positions(), [chronik.high_watermark("profiles", 0).unwrap()]);
    let copied: Vec<_> = chronik
        .consumer("copy", 0)
        .map(|r| r.map(|r| (r.key.unwrap(), r.value)).unwrap())
        .collect();
    let want: Vec<_> = want.into_iter().map(|(_, k, v)| (k, v)).collect();
    assert_eq!(copied, want);
}

#[test]
fn a_topology_joins_a_compacted_table_loaded_whole() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    compacted_topic(&chronik, "profiles");
    for topic in ["clicks", "enriched"] {
        chronik.create_topic(topic, TopicConfig::default()).unwrap();
    }
    // Clicks after every profile update (later times), one per user.
    for key in 0..KEYS {
        let key = format!("user-{key:03}");
        let time = i64::from(KEYS * ROUNDS) + 1;
        let record = Record::new(Some(key.as_bytes()), b"click").with_timestamp(time);
        chronik.engine().append("clicks", 0, &[record]).unwrap();
    }
    let topology = chronik::dsl::Topology::new("enrich");
    let profiles = topology.table("profiles");
    topology
        .stream("clicks")
        .join(&profiles, |click, profile| [profile, b":", &click.value].concat())
        .to("enriched");
    topology.runner(chronik.engine()).unwrap().run_until_caught_up().unwrap();
    let enriched: Vec<String> = chronik
        .consumer("enriched", 0)
        .map(|r| String::from_utf8(r.unwrap().value).unwrap())
        .collect();
    let last = format!("v{}:click", ROUNDS - 1);
    assert_eq!(enriched.len(), KEYS as usize, "every click found its profile");
    assert!(enriched.iter().all(|v| *v == last));
}

/// One step of a random log's history.
#[derive(Clone, Debug)]
enum Step {
    /// A batch of records, each `(key, tombstone)`; key `None` is an unkeyed record.
    Append(Vec<(Option<u8>, bool)>),
    Compact,
    /// `delete_records` below this share (in 1/256) of the high watermark.
    DeleteBelow(u8),
}

use quickcheck::Arbitrary;

impl Arbitrary for Step {
    fn arbitrary(g: &mut quickcheck::Gen) -> Self {
        match u8::arbitrary(g) % 10 {
            0 => Step::Compact,
            1 => Step::DeleteBelow(u8::arbitrary(g)),
            _ => {
                let len = 1 + usize::arbitrary(g) % 6;
                let record = |g: &mut quickcheck::Gen| {
                    // Few unkeyed records and few keys, so whole segments are superseded.
                    let key = (u8::arbitrary(g) % 32 != 0).then(|| u8::arbitrary(g) % 6);
                    (key, u8::arbitrary(g) % 12 == 0)
                };
                Step::Append((0..len).map(|_| record(g)).collect())
            }
        }
    }
}

/// Plays `steps` on topic "log" (4 KiB segments, compacted, tombstones dropped at once), then
/// compacts once more.
fn play(chronik: &Chronik, steps: &[Step]) {
    // Tombstones go at the first pass that sees them: whole segments can empty.
    let config = TopicConfig { segment_bytes: 4096, delete_retention_ms: 0, ..compacted_config() };
    chronik.create_topic("log", config).unwrap();
    let mut time = 0;
    for step in steps {
        match step {
            Step::Append(records) => {
                time += 1;
                let owned: Vec<(Option<Vec<u8>>, Vec<u8>)> = records
                    .iter()
                    .map(|(key, tombstone)| {
                        let value = if *tombstone { Vec::new() } else { vec![b'v'; 200] };
                        (key.map(|k| vec![b'k', k]), value)
                    })
                    .collect();
                let batch: Vec<Record<'_>> = owned
                    .iter()
                    .map(|(k, v)| Record::new(k.as_deref(), v).with_timestamp(time))
                    .collect();
                chronik.engine().append("log", 0, &batch).unwrap();
            }
            Step::Compact => {
                chronik.compact_topic("log").unwrap();
            }
            Step::DeleteBelow(share) => {
                let end = chronik.high_watermark("log", 0).unwrap().get();
                let before = Offset::new(end * u64::from(*share) / 256);
                chronik.delete_records("log", 0, before).unwrap();
            }
        }
    }
    chronik.compact_topic("log").unwrap();
}

type Row = (u64, Option<Vec<u8>>, Vec<u8>);

fn row(record: &RecordView<'_>) -> Row {
    (record.offset().get(), record.key().map(<[u8]>::to_vec), record.value().to_vec())
}

/// The engine's full read of "log", from its log start.
fn read_whole(chronik: &Chronik) -> Vec<Row> {
    let mut out = Vec::new();
    let mut from = Offset::ZERO;
    loop {
        let fetch = match chronik.engine().read("log", 0, from, 1 << 20) {
            Err(chronik::ReadError::OffsetOutOfRange { start, .. }) => {
                from = Offset::new(start);
                continue;
            }
            other => other.unwrap(),
        };
        if fetch.is_empty() {
            return out;
        }
        out.extend(fetch.records().map(|r| row(&r)));
        from = fetch.next_offset();
    }
}

/// Each surface, on a random history of appends, compactions and deletes over small
/// segments: the iterator, poll loops, a group consumer committing partway and reopened, and a
/// processor, each give exactly the engine's full read and end at the high watermark.
#[test]
fn every_surface_reads_a_random_compacted_and_holed_log_whole() {
    #[allow(clippy::needless_pass_by_value)] // quickcheck hands the input over by value.
    fn property(steps: Vec<Step>, commit_after: u8) -> bool {
        let dir = tempfile::tempdir().unwrap();
        let chronik = open(dir.path());
        play(&chronik, &steps);
        let want = read_whole(&chronik);
        let end = chronik.high_watermark("log", 0).unwrap();

        let mut iterator = chronik.consumer("log", 0);
        let iterated: Vec<Row> = iterator
            .by_ref()
            .map(|r| r.unwrap())
            .map(|r| (r.offset.get(), r.key, r.value))
            .collect();
        assert_eq!(iterated, want, "iterator");
        assert_eq!(iterator.position(), end);

        let mut polled = Vec::new();
        let mut consumer = chronik.consumer("log", 0);
        loop {
            let fetch = consumer.poll(64).unwrap();
            if fetch.is_empty() {
                break;
            }
            assert!(fetch.records().next().is_some(), "a poll with batches holds a record");
            polled.extend(fetch.records().map(|r| row(&r)));
        }
        assert_eq!(polled, want, "poll");
        assert_eq!(consumer.position(), end);

        let mut group = chronik.group_consumer("g", "log", 0);
        let first = usize::from(commit_after).min(want.len());
        for _ in 0..first {
            group.next().unwrap().unwrap();
        }
        group.commit().unwrap();

        chronik.create_topic("copy", TopicConfig::default()).unwrap();
        let config = ProcessorConfig::new("copier", "log");
        let mut runner = Runner::new(chronik.engine(), config, |_| Copy).unwrap();
        let stats = runner.run_until_caught_up().unwrap();
        assert_eq!(stats.records, want.len() as u64, "processor");
        assert_eq!(runner.positions(), [end], "processor position");
        // Every clone of the engine goes, so the directory's lock does.
        drop((runner, iterator, consumer, group, chronik));

        let chronik = open(dir.path());
        let group = chronik.group_consumer("g", "log", 0);
        let rest: Vec<u64> = group.map(|r| r.unwrap().offset.get()).collect();
        let want_rest: Vec<u64> = want[first..].iter().map(|(o, _, _)| *o).collect();
        assert_eq!(rest, want_rest, "group consumer after a reopen");
        true
    }
    quickcheck::QuickCheck::new().tests(16).quickcheck(property as fn(Vec<Step>, u8) -> bool);
}

/// A position past the high watermark (a seek past the end, or a group's commit that a crash
/// in `os` mode outlived) is `OffsetOutOfRange` at once, for reads and for `caught_up`: never
/// "caught up", which would skip what is appended below that position.
#[test]
fn a_position_past_the_end_is_out_of_range_not_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    chronik.create_topic("t", TopicConfig::default()).unwrap();
    for i in 0..10u8 {
        chronik.engine().append("t", 0, &[Record::new(None, &[i])]).unwrap();
    }
    let mut consumer = chronik.consumer("t", 0);
    consumer.seek(Offset::new(50));
    let out_of_range = |e: &chronik::ReadError| {
        matches!(e, chronik::ReadError::OffsetOutOfRange { requested: 50, end: 10, .. })
    };
    assert!(consumer.next().unwrap().is_err_and(|e| out_of_range(&e)));
    assert!(consumer.caught_up().is_err_and(|e| out_of_range(&e)));
    consumer.seek(Offset::new(10));
    assert!(consumer.caught_up().unwrap());
}
