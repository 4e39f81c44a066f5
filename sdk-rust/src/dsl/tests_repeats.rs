//! Records written again to a repartition topic, as an upstream stage run at least once on a
//! cluster writes them after a crash: the stage reading them takes each once, by the marks
//! they carry (`chronik.from`), so its state stays exact. Run on the engine, with the
//! deduplication the cluster's runner turns on; without it (the canary) counts go up twice.

use super::TopologyRunner;
use super::builder::Topology;
use super::task::FROM_HEADER;
use crate::processor::ProcessorError;
use crate::{Chronik, Durability, Options, OwnedRecord, Record, TopicConfig};

const REPARTITION: &str = "pages-repartition-0001";

/// A data directory at `dir` with `topics`, each of `partitions` partitions.
fn open(dir: &std::path::Path, topics: &[&str], partitions: u32) -> Chronik {
    let chronik =
        Chronik::open(dir, Options { durability: Durability::Os, ..Options::default() }).unwrap();
    for name in topics {
        let config = TopicConfig { partitions, ..TopicConfig::default() };
        chronik.create_topic(name, config).unwrap();
    }
    chronik
}

fn setup(dir: &std::path::Path) -> (Chronik, Topology) {
    let chronik = open(dir, &["clicks", "per-page"], 2);
    let topology = Topology::new("pages");
    topology
        .stream("clicks")
        .group_by(|click| click.value.clone())
        .named("per-page")
        .count()
        .to("per-page");
    for i in 0..30u32 {
        let user = format!("user-{}", i % 4);
        let partition = crate::partition_for_key(user.as_bytes(), 2);
        let page = format!("/page/{}", i % 3);
        let record = Record::new(Some(user.as_bytes()), page.as_bytes()).with_timestamp(i.into());
        chronik.engine().append("clicks", partition, &[record]).unwrap();
    }
    (chronik, topology)
}

fn all(chronik: &Chronik, topic: &str, partition: u32) -> Vec<OwnedRecord> {
    chronik.consumer(topic, partition).collect::<Result<Vec<_>, _>>().unwrap()
}

/// Store entries: key, value.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Each page's count, from its store.
fn counts(runner: &TopologyRunner<crate::SystemIo>) -> Entries {
    let mut counts = Vec::new();
    for partition in 0..2 {
        let store = runner.store("per-page", partition).unwrap();
        for entry in store {
            let (key, value) = entry.unwrap();
            if key.first() == Some(&b'K') {
                counts.push((key.into_owned(), value.into_owned()));
            }
        }
    }
    counts.sort();
    counts
}

/// Append every record of the repartition topic to it again, headers and all.
fn write_again(chronik: &Chronik) -> u64 {
    let mut again = 0;
    for partition in 0..2 {
        let records = all(chronik, REPARTITION, partition);
        let headers: Vec<Vec<crate::Header<'_>>> =
            records.iter().map(OwnedRecord::header_views).collect();
        let views: Vec<Record<'_>> =
            records.iter().zip(&headers).map(|(r, h)| r.as_record(h)).collect();
        if !views.is_empty() {
            chronik.engine().append(REPARTITION, partition, &views).unwrap();
        }
        again += records.len() as u64;
    }
    again
}

fn run_twice(deduplicate: bool) -> (Entries, Entries, u64) {
    let dir = tempfile::tempdir().unwrap();
    let (chronik, topology) = setup(dir.path());
    let mut runner =
        TopologyRunner::build(chronik.engine(), &topology, |c| c, deduplicate).unwrap();
    runner.run_until_caught_up().unwrap();
    let first = counts(&runner);
    let again = write_again(&chronik);
    let stats = runner.run_until_caught_up().unwrap();
    assert_eq!(stats.records, again, "every record written again is read");
    (first, counts(&runner), stats.emitted)
}

#[test]
fn records_written_again_to_a_repartition_topic_are_taken_once() {
    let (first, second, emitted) = run_twice(true);
    assert_eq!(first.len(), 3, "three pages counted: {first:?}");
    assert_eq!(second, first, "the counts did not move");
    assert_eq!(emitted, 0, "nothing taken, nothing emitted");
}

#[test]
fn without_the_marks_a_record_written_again_is_counted_again() {
    // The canary of the test above: the same run without deduplication changes the counts.
    let (first, second, emitted) = run_twice(false);
    assert_ne!(second, first);
    assert_eq!(emitted, 30, "each record written again counted again");
}

#[test]
fn a_repartitioned_record_with_a_damaged_mark_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (chronik, topology) = setup(dir.path());
    let mut runner = TopologyRunner::build(chronik.engine(), &topology, |c| c, true).unwrap();
    runner.run_until_caught_up().unwrap();
    let header = [crate::Header { key: FROM_HEADER, value: b"short" }];
    let record = Record::new(Some(b"k"), b"/page/0").with_headers(&header);
    chronik.engine().append(REPARTITION, 0, &[record]).unwrap();
    let error = runner.run_until_caught_up().unwrap_err();
    assert!(matches!(error, ProcessorError::Process { .. }), "{error:?}");
    assert!(error.to_string().contains("is not 20 bytes"), "{error}");
}

#[test]
fn a_stage_that_only_passes_records_on_takes_a_record_written_twice_once() {
    // Clicks re-keyed by page, joined with a table (a stage with a table store only), then
    // counted in one group: the middle stage keeps its marks in a store of its own, so a
    // record written twice to its input is passed on once.
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path(), &["clicks", "pages", "totals"], 1);
    let topology = Topology::new("joined");
    let pages = topology.table("pages");
    topology
        .stream("clicks")
        .map(|mut click| {
            click.key = Some(click.value.clone());
            click
        })
        .left_join(&pages, |click, _| click.value.clone())
        .group_by(|_| b"all".to_vec())
        .named("totals")
        .count()
        .to("totals");
    for i in 0..10u8 {
        let page = [b'p', b'0' + i % 3];
        let record = Record::new(Some(b"u"), &page).with_timestamp(i.into());
        chronik.engine().append("clicks", 0, &[record]).unwrap();
    }
    let mut runner = TopologyRunner::build(chronik.engine(), &topology, |c| c, true).unwrap();
    runner.run_until_caught_up().unwrap();
    let mut repartitions: Vec<String> =
        chronik.list_topics().into_iter().filter(|t| t.contains("-repartition-")).collect();
    repartitions.sort();
    let first = &repartitions[0];
    let records = all(&chronik, first, 0);
    let headers: Vec<Vec<crate::Header<'_>>> =
        records.iter().map(OwnedRecord::header_views).collect();
    let again: Vec<Record<'_>> =
        records.iter().zip(&headers).map(|(r, h)| r.as_record(h)).collect();
    chronik.engine().append(first, 0, &again).unwrap();
    runner.run_until_caught_up().unwrap();
    let last = all(&chronik, "totals", 0).pop().expect("a count");
    assert_eq!(last.value, b"10", "each click counted once");
}

#[test]
fn records_a_stage_wrote_from_two_streams_are_written_unmarked_and_each_taken() {
    // A join of two streams pairs records as they arrive, so a replay may pair them
    // otherwise: its writes carry no marks (a mark per writer partition alone would also take
    // view 1's pair at offset 1, then drop click 1's first pair, at offset 1 too).
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path(), &["views", "clicks", "totals"], 1);
    let topology = Topology::new("pairs");
    let views = topology.stream("views");
    let clicks = topology.stream("clicks");
    views
        .join_stream(&clicks, super::JoinWindows::of(100), |view, click| {
            [&view.value[..], b"+", &click.value].concat()
        })
        .group_by(|_| b"all".to_vec())
        .named("totals")
        .count()
        .to("totals");
    for (topic, value, time) in [("views", "v0", 0), ("clicks", "c0", 1), ("views", "v1", 5)] {
        let record = Record::new(Some(b"a"), value.as_bytes()).with_timestamp(time);
        chronik.engine().append(topic, 0, &[record]).unwrap();
    }
    let record = Record::new(Some(b"a"), b"c1").with_timestamp(6);
    chronik.engine().append("clicks", 0, &[record]).unwrap();
    let mut runner = TopologyRunner::build(chronik.engine(), &topology, |c| c, true).unwrap();
    runner.run_until_caught_up().unwrap();
    // v0+c0 (from clicks 0), v1+c0 (views 1), then v0+c1 and v1+c1 (clicks 1).
    let last = all(&chronik, "totals", 0).pop().expect("a count");
    assert_eq!(last.value, b"4");
}
