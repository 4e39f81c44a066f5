//! Disk stores on real files: a restart opens the store and reads only the changelog after its
//! offset; a store that is missing, stale, foreign or damaged is found, reported and rebuilt
//! from the changelog, and the counts come out exact every time.

use chronik::processor::{
    Context, ProcessError, Processor, ProcessorConfig, RestoreProgress, RunStats, Runner,
};
use chronik::{Chronik, Durability, Options, Record, RecordView, SystemIo, TopicConfig};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Counts records per key, 8-byte counts.
struct Counter;

impl Processor for Counter {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let key = record.key().unwrap_or_default();
        let store = ctx.store("counts")?;
        let count = store.get(key).map_or(0, |v| u64::from_le_bytes((*v).try_into().unwrap())) + 1;
        store.put(key, &count.to_le_bytes());
        Ok(())
    }
}

const KEYS: u64 = 3_000;

fn open(dir: &Path) -> Chronik {
    Chronik::open(dir, Options { durability: Durability::Os, ..Options::default() }).unwrap()
}

fn produce(chronik: &Chronik, from: u64, to: u64) {
    for i in from..to {
        let key = format!("key-{:05}", i % KEYS);
        let partition = chronik::partition_for_key(key.as_bytes(), 2);
        chronik
            .engine()
            .append("clicks", partition, &[Record::new(Some(key.as_bytes()), b"x")])
            .unwrap();
    }
}

fn expected(to: u64) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for i in 0..to {
        *counts.entry(format!("key-{:05}", i % KEYS)).or_default() += 1;
    }
    counts
}

/// What the restores reported: per partition, the offset they started from and why a store
/// was rebuilt.
type Reports = Arc<Mutex<Vec<(u32, Option<u64>, Option<String>, u64)>>>;

fn config(reports: &Reports) -> ProcessorConfig {
    let reports = Arc::clone(reports);
    ProcessorConfig {
        on_restore: Some(Arc::new(move |p: RestoreProgress<'_>| {
            if p.done {
                let rebuilt = p.rebuilt.map(str::to_owned);
                let from = p.from_snapshot.map(chronik::Offset::get);
                reports.lock().unwrap().push((p.partition, from, rebuilt, p.restored));
            }
        })),
        // A small cache: the store writes runs and merges them within the test.
        ..ProcessorConfig::new("counter", "clicks")
            .store_with("counts", "disk:1".parse().unwrap())
            .commit_interval_ms(5)
    }
}

fn counts(runner: &Runner<SystemIo, Counter>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for partition in 0..2 {
        let store = runner.store(partition, "counts").unwrap();
        assert_eq!(store.kind(), "disk");
        for entry in store {
            let (key, value) = entry.unwrap();
            let key = String::from_utf8(key.to_vec()).unwrap();
            counts.insert(key, u64::from_le_bytes((*value).try_into().unwrap()));
        }
        store.check().unwrap();
    }
    counts
}

/// Run to the end of the input; the counts and the run's stats.
fn run(dir: &Path, reports: &Reports) -> (BTreeMap<String, u64>, RunStats, usize) {
    let chronik = open(dir);
    let mut runner = Runner::new(chronik.engine(), config(reports), |_| Counter).unwrap();
    let stats = runner.run_until_caught_up().unwrap();
    let runs: usize = (0..2).map(|p| runner.store(p, "counts").unwrap().disk_runs().unwrap()).sum();
    (counts(&runner), stats, runs)
}

fn store_directory(dir: &Path, partition: u32) -> PathBuf {
    let config = ProcessorConfig::new("counter", "clicks");
    dir.join("state").join(config.store_directory("counts", partition))
}

fn setup() -> (tempfile::TempDir, Reports) {
    let dir = tempfile::tempdir().unwrap();
    let chronik = open(dir.path());
    chronik.create_topic("clicks", TopicConfig::default().with_partitions(2)).unwrap();
    produce(&chronik, 0, 20_000);
    (dir, Reports::default())
}

#[test]
fn a_restart_opens_the_store_and_reads_only_the_changelog_after_it() {
    let (dir, reports) = setup();
    let (counts, stats, runs) = run(dir.path(), &reports);
    assert_eq!(counts, expected(20_000));
    assert_eq!(stats.records, 20_000);
    assert!(runs >= 2, "the store wrote runs: {runs}");
    reports.lock().unwrap().clear();

    produce(&open(dir.path()), 20_000, 23_000);
    let (counts, stats, _) = run(dir.path(), &reports);
    assert_eq!(counts, expected(23_000));
    assert_eq!(stats.records, 3_000);
    assert_eq!(stats.stores_opened, 2);
    assert_eq!(stats.stores_rebuilt, 0);
    for (partition, from, rebuilt, restored) in reports.lock().unwrap().iter() {
        assert_eq!(*rebuilt, None);
        // A clean stop flushed the store: nothing after its offset to read.
        assert!(from.is_some(), "partition {partition} started from its store");
        assert_eq!(*restored, 0, "partition {partition} read the changelog again");
    }
}

/// Run once, spoil the stores with `spoil`, run again: the stores are rebuilt, with `reason`
/// in the report, and the counts are exact.
fn rebuilt_after(spoil: impl FnOnce(&Path), reason: &str) {
    let (dir, reports) = setup();
    let (counts, _, _) = run(dir.path(), &reports);
    assert_eq!(counts, expected(20_000));
    reports.lock().unwrap().clear();
    spoil(dir.path());
    let (counts, stats, _) = run(dir.path(), &reports);
    assert_eq!(counts, expected(20_000), "rebuilt exactly");
    assert!(stats.stores_rebuilt >= 1, "{stats:?}");
    let reports = reports.lock().unwrap();
    let (_, from, why, restored) =
        reports.iter().find(|r| r.2.is_some()).expect("a store reported rebuilt");
    assert!(why.as_deref().unwrap().contains(reason), "{why:?} does not say {reason:?}");
    assert_eq!(*from, None);
    assert!(*restored > 0, "a rebuild reads the whole changelog");
}

#[test]
fn a_damaged_run_is_found_and_the_store_rebuilt() {
    rebuilt_after(
        |dir| {
            let store = store_directory(dir, 0);
            let run = std::fs::read_dir(&store)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.extension().is_some_and(|e| e == "run"))
                .unwrap();
            let mut bytes = std::fs::read(&run).unwrap();
            // The footer's last byte: part of its checksum.
            *bytes.last_mut().unwrap() ^= 1;
            std::fs::write(&run, bytes).unwrap();
        },
        "checksum",
    );
}

#[test]
fn a_missing_run_is_found_and_the_store_rebuilt() {
    rebuilt_after(
        |dir| {
            let store = store_directory(dir, 1);
            for entry in std::fs::read_dir(&store).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "run") {
                    std::fs::remove_file(path).unwrap();
                }
            }
        },
        "missing",
    );
}

#[test]
fn another_partitions_store_is_foreign_and_rebuilt() {
    rebuilt_after(
        |dir| {
            let (zero, one) = (store_directory(dir, 0), store_directory(dir, 1));
            std::fs::remove_dir_all(&one).unwrap();
            std::fs::create_dir(&one).unwrap();
            for entry in std::fs::read_dir(&zero).unwrap() {
                let path = entry.unwrap().path();
                std::fs::copy(&path, one.join(path.file_name().unwrap())).unwrap();
            }
        },
        "foreign",
    );
}

#[test]
fn a_store_ahead_of_its_changelog_is_stale_and_rebuilt() {
    let (dir, reports) = setup();
    // A copy of the data directory now, before the store takes more.
    let backup = tempfile::tempdir().unwrap();
    let (counts, _, _) = run(dir.path(), &reports);
    assert_eq!(counts, expected(20_000));
    copy_tree(dir.path(), backup.path());
    // The live directory goes on; its store's offset passes the backup's changelog end.
    produce(&open(dir.path()), 20_000, 25_000);
    run(dir.path(), &reports);
    // The live store put into the backup (a restore from two different backups, say).
    for partition in 0..2 {
        let from = store_directory(dir.path(), partition);
        let to = store_directory(backup.path(), partition);
        std::fs::remove_dir_all(&to).unwrap();
        copy_tree(&from, &to);
    }
    reports.lock().unwrap().clear();
    let (counts, stats, _) = run(backup.path(), &reports);
    assert_eq!(counts, expected(20_000), "the backup's own state, rebuilt");
    assert_eq!(stats.stores_rebuilt, 2);
    let reports = reports.lock().unwrap();
    assert!(reports.iter().all(|r| r.2.as_deref().is_some_and(|w| w.contains("stale"))));
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A byte of a run's first data block flipped: the store opens (blocks are checked when first
/// read), and iterating it outside a task ends with `Damaged` instead of returning the entries
/// before the damage as if they were all of them. The next runner rebuilds it exactly.
#[test]
fn a_damaged_block_read_outside_a_task_is_an_error_not_part_of_the_store() {
    let (dir, reports) = setup();
    let (counts, _, _) = run(dir.path(), &reports);
    assert_eq!(counts, expected(20_000));
    for entry in std::fs::read_dir(store_directory(dir.path(), 0)).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "run") {
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[10] ^= 0x40; // Inside the first block, before any footer or index.
            std::fs::write(&path, bytes).unwrap();
        }
    }
    {
        let chronik = open(dir.path());
        let runner = Runner::new(chronik.engine(), config(&reports), |_| Counter).unwrap();
        let store = runner.store(0, "counts").unwrap();
        let entries: Vec<_> = store.iter().collect();
        let last = entries.last().expect("an entry or the error");
        assert!(
            matches!(last, Err(chronik::processor::StoreError::Damaged(_))),
            "the iteration ends with the damage, after {} entries",
            entries.len() - 1
        );
        assert!(entries[..entries.len() - 1].iter().all(Result::is_ok));
    }
    // The damage the iteration found condemned the store: the next runner rebuilds it.
    let (counts, stats, _) = run(dir.path(), &reports);
    assert_eq!(counts, expected(20_000), "rebuilt exactly");
    assert_eq!(stats.stores_rebuilt, 1, "{stats:?}");
}

/// A store whose whole directory is gone while its changelog has records is a rebuild
/// ("missing"), not a first start.
#[test]
fn a_missing_store_directory_is_reported_rebuilt() {
    rebuilt_after(|dir| std::fs::remove_dir_all(store_directory(dir, 1)).unwrap(), "missing");
}
