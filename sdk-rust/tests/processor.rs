//! Stateful processors on real files: a counting processor's store and outputs; a second
//! runner restoring the store from its changelog and going on where the first committed; a
//! processor that fails midway leaving nothing of its uncommitted work, so a rerun gives
//! exactly the counts of an uninterrupted run; store writes coalesced per commit; timers.

use chronik::processor::{
    Context, DEAD_LETTER_HEADERS, OnDecodeError, ProcessError, Processor, ProcessorConfig,
    ProcessorError, Punctuation, Runner,
};
use chronik::testing::{CountByKey, CountEncoding};
use chronik::{Chronik, Durability, Offset, Options, Record, RecordView, TopicConfig};
use std::collections::BTreeMap;

/// Counts records per key in store "counts" and emits `key -> count` to "totals".
fn counter() -> CountByKey {
    CountByKey::new("counts").emit("totals", CountEncoding::Decimal)
}

fn open(dir: &std::path::Path) -> Chronik {
    Chronik::open(dir, Options { durability: Durability::Os, ..Options::default() }).unwrap()
}

fn produce(chronik: &Chronik, from: u64, to: u64) {
    for i in from..to {
        let key = format!("user-{}", i % 7);
        let partition = chronik::partition_for_key(key.as_bytes(), 2);
        chronik
            .engine()
            .append("clicks", partition, &[Record::new(Some(key.as_bytes()), b"click")])
            .unwrap();
    }
}

fn expected_counts(to: u64) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for i in 0..to {
        *counts.entry(format!("user-{}", i % 7)).or_default() += 1;
    }
    counts
}

fn counts<P: Processor>(runner: &Runner<chronik::SystemIo, P>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for partition in 0..2 {
        for entry in runner.store(partition, "counts").unwrap() {
            let (key, value) = entry.unwrap();
            let key = String::from_utf8(key.to_vec()).unwrap();
            counts.insert(key, u64::from_le_bytes((*value).try_into().unwrap()));
        }
    }
    counts
}

/// The last `totals` value per key.
fn totals(chronik: &Chronik) -> BTreeMap<String, u64> {
    let mut latest = BTreeMap::new();
    for partition in 0..2 {
        let mut consumer = chronik.consumer("totals", partition);
        for record in consumer.by_ref() {
            let record = record.unwrap();
            let key = String::from_utf8(record.key.unwrap()).unwrap();
            latest.insert(key, String::from_utf8(record.value).unwrap().parse().unwrap());
        }
    }
    latest
}

fn config() -> ProcessorConfig {
    ProcessorConfig::new("counter", "clicks").store("counts").commit_interval_ms(10)
}

fn setup(chronik: &Chronik) {
    chronik.create_topic("clicks", TopicConfig::default().with_partitions(2)).unwrap();
    chronik.create_topic("totals", TopicConfig::default().with_partitions(2)).unwrap();
}

#[test]
fn counts_restore_and_go_on_where_the_last_commit_left() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    setup(&chronik);
    produce(&chronik, 0, 500);
    let mut runner = Runner::new(chronik.engine(), config(), |_| counter()).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    assert_eq!(stats.records, 500);
    assert_eq!(stats.emitted, 500);
    assert_eq!(counts(&runner), expected_counts(500));
    assert_eq!(totals(&chronik), expected_counts(500));
    drop(runner);

    produce(&chronik, 500, 800);
    drop(chronik);
    let chronik = open(dir.path());
    let mut runner = Runner::new(chronik.engine(), config(), |_| counter()).unwrap();
    assert_eq!(counts(&runner), expected_counts(500), "restored from the changelog");
    let stats = runner.run_until_caught_up().unwrap();
    assert_eq!(stats.records, 300, "only the input after the committed position");
    assert_eq!(counts(&runner), expected_counts(800));
    assert_eq!(totals(&chronik), expected_counts(800));
    let positions: u64 = runner.positions().iter().map(|p| p.get()).sum();
    assert_eq!(positions, 800);
}

#[test]
fn a_failed_run_leaves_nothing_uncommitted_and_a_rerun_counts_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    setup(&chronik);
    produce(&chronik, 0, 2000);
    // A long commit interval: the failure comes with work not yet committed.
    let slow = config().commit_interval_ms(3_600_000);
    let mut failing =
        Runner::new(chronik.engine(), slow.clone(), |_| counter().fail_at_offset(600)).unwrap();
    let error = failing.run_until_caught_up().unwrap_err();
    // The failing record is named: the default `process_batch` hands records over singly.
    let ProcessorError::Process { input, partition, offset, .. } = &error else {
        panic!("{error}");
    };
    assert_eq!((input.as_str(), *partition, *offset), ("clicks", 0, Some(600)), "{error}");
    assert!(error.to_string().contains("\"clicks\", partition 0, offset 600"), "{error}");
    assert!(failing.run_until_caught_up().is_err(), "a failed runner refuses to go on");
    drop(failing);
    let outputs_so_far: usize = totals(&chronik).values().map(|&v| v as usize).sum();
    let mut runner = Runner::new(chronik.engine(), slow, |_| counter()).unwrap();
    runner.run_until_caught_up().unwrap();
    assert_eq!(counts(&runner), expected_counts(2000));
    assert_eq!(totals(&chronik), expected_counts(2000));
    // Every output record is one count step: none duplicated, none missing.
    let mut emitted = 0;
    for partition in 0..2 {
        emitted += chronik.high_watermark("totals", partition).unwrap().get();
    }
    assert_eq!(emitted, 2000, "outputs before the failure were {outputs_so_far}");
}

#[test]
fn writes_to_one_key_are_coalesced_in_the_changelog() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    setup(&chronik);
    produce(&chronik, 0, 700);
    let slow = config().commit_interval_ms(3_600_000);
    let mut runner = Runner::new(chronik.engine(), slow, |_| counter()).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    assert_eq!(stats.commits, 2, "one commit per task when caught up");
    let mut changelog = 0;
    for partition in 0..2 {
        changelog += chronik.high_watermark("counter-counts-changelog", partition).unwrap().get();
    }
    assert_eq!(changelog, 7, "one record per key, not one per update");
}

/// Emits, at every 100 ms of stream time, how many records it saw in that window.
#[derive(Default)]
struct Windowed {
    seen: u64,
    fired: Vec<i64>,
}

impl Processor for Windowed {
    fn process(&mut self, _: &RecordView<'_>, _: &mut Context<'_>) -> Result<(), ProcessError> {
        self.seen += 1;
        Ok(())
    }

    fn punctuate(&mut self, time: Punctuation, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Punctuation::StreamTime(at) = time else { return Ok(()) };
        self.fired.push(at);
        ctx.emit("totals", None, format!("{at}:{}", self.seen).as_bytes());
        self.seen = 0;
        Ok(())
    }
}

#[test]
fn stream_time_timers_fire_once_per_window() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    setup(&chronik);
    for i in 0..50_i64 {
        let record = Record::new(None, b"x").with_timestamp(1_000 + i * 10);
        chronik.engine().append("clicks", 0, &[record]).unwrap();
    }
    let mut config = config();
    config.punctuate_stream_ms = Some(100);
    let mut runner = Runner::new(chronik.engine(), config, |_| Windowed::default()).unwrap();
    runner.run_until_caught_up().unwrap();
    let fired = chronik.high_watermark("totals", 0).unwrap();
    // Timestamps 1000..1490: windows end at 1100, 1200, 1300, 1400.
    assert_eq!(fired, Offset::new(4));
    let fetch = chronik.engine().read("totals", 0, Offset::ZERO, 1 << 20).unwrap();
    let values: Vec<String> =
        fetch.records().map(|r| String::from_utf8(r.value().to_vec()).unwrap()).collect();
    assert_eq!(values, ["1100:10", "1200:10", "1300:10", "1400:10"]);
}

#[test]
fn worker_threads_process_every_partition_until_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    setup(&chronik);
    produce(&chronik, 0, 1000);
    let mut runner = Runner::new(chronik.engine(), config().threads(2), |_| counter()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let stats = std::thread::scope(|scope| {
        let worker = scope.spawn(|| runner.run_until(&stop));
        // Records produced while the workers run are processed too.
        produce(&chronik, 1000, 1500);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while totals(&chronik).values().sum::<u64>() < 1500 {
            assert!(std::time::Instant::now() < deadline, "the workers never caught up");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        worker.join().unwrap()
    })
    .unwrap();
    assert_eq!(stats.records, 1500);
    assert_eq!(counts(&runner), expected_counts(1500));
    assert_eq!(totals(&chronik), expected_counts(1500));
}

/// Per-user statistics as a struct, kept and emitted through serde.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct UserStats {
    clicks: u64,
    last_page: String,
}

struct TypedCounter;

impl Processor for TypedCounter {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let user = String::from_utf8_lossy(record.key().unwrap_or_default()).into_owned();
        let mut stats = ctx.typed::<String, UserStats>("stats")?;
        let mut current = stats.get(&user)?.unwrap_or_default();
        current.clicks += 1;
        current.last_page = String::from_utf8_lossy(record.value()).into_owned();
        stats.put(&user, &current)?;
        ctx.emit_json("totals", Some(&user), &current)?;
        Ok(())
    }
}

#[test]
fn typed_stores_and_outputs_round_trip_through_serde_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    setup(&chronik);
    produce(&chronik, 0, 70);
    let config = ProcessorConfig::new("typed", "clicks").store("stats");
    let mut runner = Runner::new(chronik.engine(), config.clone(), |_| TypedCounter).unwrap();
    runner.run_until_caught_up().unwrap();
    drop(runner);
    let runner = Runner::new(chronik.engine(), config, |_| TypedCounter).unwrap();
    let mut all = BTreeMap::new();
    for partition in 0..2 {
        for entry in runner.store(partition, "stats").unwrap() {
            let (user, stats) = entry.unwrap();
            let user: String = chronik::processor::decode(&user).unwrap();
            let stats: UserStats = chronik::processor::decode(&stats).unwrap();
            all.insert(user, stats);
        }
    }
    assert_eq!(all.len(), 7);
    assert!(all.values().all(|s| s.clicks == 10 && s.last_page == "click"), "{all:?}");
    let fetch = chronik.engine().read("totals", 0, Offset::ZERO, 1 << 20).unwrap();
    let first = fetch.records().next().unwrap();
    let decoded: UserStats = chronik::processor::decode(first.value()).unwrap();
    assert_eq!(decoded.clicks, 1);
}

#[test]
fn a_restore_from_a_snapshot_and_one_from_the_changelog_alone_give_the_same_state() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    setup(&chronik);
    produce(&chronik, 0, 3000);
    let restores = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut config = config();
    config.commit_every_records = Some(100);
    config.snapshot_every_commits = Some(4);
    let seen = std::sync::Arc::clone(&restores);
    config.on_restore =
        Some(std::sync::Arc::new(move |p: chronik::processor::RestoreProgress<'_>| {
            if p.done {
                seen.lock().unwrap().push((p.partition, p.from_snapshot, p.restored));
            }
        }));
    let mut runner = Runner::new(chronik.engine(), config.clone(), |_| counter()).unwrap();
    runner.run_until_caught_up().unwrap();
    drop(runner);
    // More input after the last snapshot, counted without snapshots: the restores below
    // read a changelog tail after the snapshot.
    produce(&chronik, 3000, 3500);
    let tail_config = ProcessorConfig { snapshot_every_commits: None, ..config.clone() };
    let mut runner = Runner::new(chronik.engine(), tail_config.clone(), |_| counter()).unwrap();
    runner.run_until_caught_up().unwrap();
    drop(runner);
    restores.lock().unwrap().clear();
    let from_snapshot = Runner::new(chronik.engine(), tail_config.clone(), |_| counter()).unwrap();
    let used: Vec<_> = restores.lock().unwrap().drain(..).collect();
    assert!(
        used.iter().all(|(_, snapshot, restored)| snapshot.is_some() && *restored > 0),
        "{used:?}"
    );
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let from_changelog = Runner::new(chronik.engine(), tail_config, |_| counter()).unwrap();
    let used: Vec<_> = restores.lock().unwrap().drain(..).collect();
    assert!(used.iter().all(|(_, snapshot, _)| snapshot.is_none()), "{used:?}");
    assert_eq!(counts(&from_snapshot), counts(&from_changelog));
    assert_eq!(counts(&from_changelog), expected_counts(3500));
}

/// A decode check refusing values that are not decimal numbers; records 3 and 7 of one
/// partition are "oops": failed with their offset, skipped, or dead-lettered exactly once.
#[test]
fn undecodable_records_fail_skip_or_go_to_the_dead_letter_topic() {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    chronik.create_topic("numbers", TopicConfig::default()).unwrap();
    chronik.create_topic("totals", TopicConfig::default()).unwrap();
    chronik.create_topic("dead", TopicConfig::default()).unwrap();
    let header = [chronik::Header { key: b"trace", value: b"t" }];
    for i in 0..10_u64 {
        let value = if i == 3 || i == 7 { "oops".to_owned() } else { i.to_string() };
        let record = Record::new(Some(b"k"), value.as_bytes()).with_headers(&header);
        chronik.engine().append("numbers", 0, &[record]).unwrap();
    }
    let config = |policy| {
        let mut config = ProcessorConfig::new("sum", "numbers").store("counts");
        config.decode_check = Some(std::sync::Arc::new(|_: &str, record: &RecordView<'_>| {
            let text = std::str::from_utf8(record.value()).map_err(|e| e.to_string())?;
            text.parse::<u64>().map(drop).map_err(|e| format!("not a number: {e}"))
        }));
        config.on_decode_error = policy;
        config.commit_every_records = Some(2);
        config
    };

    let mut failing =
        Runner::new(chronik.engine(), config(OnDecodeError::Fail), |_| counter()).unwrap();
    let error = failing.run_until_caught_up().unwrap_err();
    let ProcessorError::Decode { input, partition, offset, reason } = &error else {
        panic!("{error}");
    };
    assert_eq!((input.as_str(), *partition, *offset), ("numbers", 0, 3));
    assert!(reason.contains("not a number"), "{error}");
    drop(failing);
    assert_eq!(chronik.high_watermark("totals", 0).unwrap().get(), 2, "its batch uncommitted");

    let missing = OnDecodeError::DeadLetter { topic: "no-such".into() };
    let refused = Runner::new(chronik.engine(), config(missing), |_| counter());
    assert!(refused.unwrap_err().to_string().contains("no-such"));

    let dead = OnDecodeError::DeadLetter { topic: "dead".into() };
    let mut runner = Runner::new(chronik.engine(), config(dead), |_| counter()).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    assert_eq!((stats.records, stats.dead_letters, stats.skipped_records), (8, 2, 0));
    assert_eq!(chronik.high_watermark("totals", 0).unwrap().get(), 8, "the good records once");
    let dead: Vec<_> = chronik.consumer("dead", 0).map(Result::unwrap).collect();
    assert_eq!(dead.len(), 2);
    for (record, offset) in dead.iter().zip([3, 7]) {
        assert_eq!(
            (record.key.as_deref(), record.value.as_slice()),
            (Some(&b"k"[..]), &b"oops"[..])
        );
        let mut expected = vec![(b"trace".to_vec(), b"t".to_vec())];
        let [topic, partition, at, error] = DEAD_LETTER_HEADERS.map(|h| h.as_bytes().to_vec());
        expected.push((topic, b"numbers".to_vec()));
        expected.push((partition, b"0".to_vec()));
        expected.push((at, offset.to_string().into_bytes()));
        assert_eq!(record.headers[..4], expected[..]);
        assert_eq!(record.headers[4].0, error);
    }

    chronik
        .engine()
        .append("numbers", 0, &[Record::new(None, b"nope"), Record::new(None, b"10")])
        .unwrap();
    let mut runner =
        Runner::new(chronik.engine(), config(OnDecodeError::Skip), |_| counter()).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    // `records` counts every input taken, those left out too.
    assert_eq!((stats.records, stats.skipped_records, stats.dead_letters), (2, 1, 0));
    assert_eq!(chronik.high_watermark("dead", 0).unwrap().get(), 2, "nothing more dead-lettered");
}
