//! Stateful processors on real files: a counting processor's store and outputs; a second
//! runner restoring the store from its changelog and going on where the first committed; a
//! processor that fails midway leaving nothing of its uncommitted work, so a rerun gives
//! exactly the counts of an uninterrupted run; store writes coalesced per commit; timers.

use chronik::processor::{
    Context, ProcessError, Processor, ProcessorConfig, ProcessorError, Punctuation, Runner,
};
use chronik::{Chronik, Durability, Offset, Options, Record, RecordView, TopicConfig};
use std::collections::BTreeMap;

/// Counts records per key in store "counts" and emits `key -> count` to "totals".
#[derive(Default)]
struct Counter {
    /// Fail on the record at this offset (once), to stand for a crash.
    fail_at: Option<u64>,
}

impl Processor for Counter {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        if self.fail_at == Some(record.offset().get()) {
            return Err(ProcessError::new("failing on purpose"));
        }
        let key = record.key().unwrap_or_default();
        let store = ctx.store("counts")?;
        let count = store.get(key).map_or(0, |v| u64::from_le_bytes((*v).try_into().unwrap())) + 1;
        store.put(key, &count.to_le_bytes());
        ctx.emit("totals", Some(key), count.to_string().as_bytes());
        Ok(())
    }
}

fn open(dir: &std::path::Path) -> Chronik {
    Chronik::open(dir, Options { durability: Durability::Os, ..Options::default() }).unwrap()
}

fn produce(chronik: &Chronik, from: u64, to: u64) {
    for i in from..to {
        let key = format!("user-{}", i % 7);
        let partition = chronik::partition_for_key(key.as_bytes(), 2);
        chronik
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
    let mut runner = Runner::new(chronik.engine(), config(), |_| Counter::default()).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    assert_eq!(stats.records, 500);
    assert_eq!(stats.emitted, 500);
    assert_eq!(counts(&runner), expected_counts(500));
    assert_eq!(totals(&chronik), expected_counts(500));
    drop(runner);

    produce(&chronik, 500, 800);
    drop(chronik);
    let chronik = open(dir.path());
    let mut runner = Runner::new(chronik.engine(), config(), |_| Counter::default()).unwrap();
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
        Runner::new(chronik.engine(), slow.clone(), |_| Counter { fail_at: Some(600) }).unwrap();
    let error = failing.run_until_caught_up().unwrap_err();
    assert!(matches!(error, ProcessorError::Process { .. }), "{error}");
    assert!(failing.run_until_caught_up().is_err(), "a failed runner refuses to go on");
    drop(failing);
    let outputs_so_far: usize = totals(&chronik).values().map(|&v| v as usize).sum();
    let mut runner = Runner::new(chronik.engine(), slow, |_| Counter::default()).unwrap();
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
    let mut runner = Runner::new(chronik.engine(), slow, |_| Counter::default()).unwrap();
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
        chronik.append("clicks", 0, &[record]).unwrap();
    }
    let mut config = config();
    config.punctuate_stream_ms = Some(100);
    let mut runner = Runner::new(chronik.engine(), config, |_| Windowed::default()).unwrap();
    runner.run_until_caught_up().unwrap();
    let fired = chronik.high_watermark("totals", 0).unwrap();
    // Timestamps 1000..1490: windows end at 1100, 1200, 1300, 1400.
    assert_eq!(fired, Offset::new(4));
    let fetch = chronik.read("totals", 0, Offset::ZERO, 1 << 20).unwrap();
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
    let mut runner =
        Runner::new(chronik.engine(), config().threads(2), |_| Counter::default()).unwrap();
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
    let fetch = chronik.read("totals", 0, Offset::ZERO, 1 << 20).unwrap();
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
    let mut runner = Runner::new(chronik.engine(), config.clone(), |_| Counter::default()).unwrap();
    runner.run_until_caught_up().unwrap();
    drop(runner);
    // More input after the last snapshot, counted without snapshots: the restores below
    // read a changelog tail after the snapshot.
    produce(&chronik, 3000, 3500);
    let tail_config = ProcessorConfig { snapshot_every_commits: None, ..config.clone() };
    let mut runner =
        Runner::new(chronik.engine(), tail_config.clone(), |_| Counter::default()).unwrap();
    runner.run_until_caught_up().unwrap();
    drop(runner);
    restores.lock().unwrap().clear();
    let from_snapshot =
        Runner::new(chronik.engine(), tail_config.clone(), |_| Counter::default()).unwrap();
    let used: Vec<_> = restores.lock().unwrap().drain(..).collect();
    assert!(
        used.iter().all(|(_, snapshot, restored)| snapshot.is_some() && *restored > 0),
        "{used:?}"
    );
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let from_changelog =
        Runner::new(chronik.engine(), tail_config, |_| Counter::default()).unwrap();
    let used: Vec<_> = restores.lock().unwrap().drain(..).collect();
    assert!(used.iter().all(|(_, snapshot, _)| snapshot.is_none()), "{used:?}");
    assert_eq!(counts(&from_snapshot), counts(&from_changelog));
    assert_eq!(counts(&from_changelog), expected_counts(3500));
}
