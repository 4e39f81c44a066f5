//! Disk stores on real files: a restart opens the store and reads only the changelog after its
//! offset; a store that is missing, stale, foreign or damaged is found, reported and rebuilt
//! from the changelog, and the counts come out exact every time.

use chronik::processor::{ProcessorConfig, RestoreProgress, RunStats, Runner};
use chronik::testing::CountByKey;
use chronik::{Chronik, Durability, Options, Record, SystemIo, TopicConfig};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Counts records per key in "counts", 8-byte counts.
fn counter() -> CountByKey {
    CountByKey::new("counts")
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

fn counts(runner: &Runner<SystemIo, CountByKey>) -> BTreeMap<String, u64> {
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
    let mut runner = Runner::new(chronik.engine(), config(reports), |_| counter()).unwrap();
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
        let runner = Runner::new(chronik.engine(), config(&reports), |_| counter()).unwrap();
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

/// A little-endian `u32` or `u64` of `bytes` at `at`.
fn le(bytes: &[u8], at: usize, width: usize) -> u64 {
    let mut field = [0; 8];
    field[..width].copy_from_slice(&bytes[at..at + width]);
    u64::from_le_bytes(field)
}

/// Where `key`'s value lies in the run file `bytes`, read through the run's footer and block
/// index (docs/format.md, "Disk store runs"): the value's position and the number of the block
/// that holds it, or `None` if the run does not hold the key (or holds a deletion).
fn value_in_run(bytes: &[u8], key: &[u8]) -> Option<(usize, usize)> {
    let footer = &bytes[bytes.len() - 64..];
    assert_eq!(&footer[..4], b"CHSR", "a run's footer");
    let index_offset = le(footer, 8, 8) as usize;
    let index_length = le(footer, 16, 8) as usize;
    let index = &bytes[index_offset..index_offset + index_length - 8];
    let (mut at, mut block) = (0, 0);
    while at < index.len() {
        let key_length = le(index, at, 4) as usize;
        let last_key = &index[at + 4..at + 4 + key_length];
        let offset = le(index, at + 4 + key_length, 8) as usize;
        let length = le(index, at + 12 + key_length, 4) as usize;
        at += 16 + key_length;
        if last_key < key {
            block += 1;
            continue;
        }
        // The block that would hold the key: its entries, without the checksum.
        let (mut entry, end) = (offset, offset + length - 8);
        while entry < end {
            let key_length = le(bytes, entry, 4) as usize;
            let value_length = le(bytes, entry + 4, 4);
            let start = entry + 8 + key_length;
            if &bytes[entry + 8..start] == key {
                return (value_length != u64::from(u32::MAX)).then_some((start, block));
            }
            entry =
                start + if value_length == u64::from(u32::MAX) { 0 } else { value_length as usize };
        }
        return None;
    }
    None
}

/// Flip a bit of `key`'s value in every run of `store` that holds it: a data block in the
/// middle of the run whose framing still parses, so only its checksum tells. Returns the
/// numbers of the damaged blocks.
fn damage_value(store: &Path, key: &[u8]) -> Vec<usize> {
    let mut blocks = Vec::new();
    for entry in std::fs::read_dir(store).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "run") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some((at, block)) = value_in_run(&bytes, key) {
            bytes[at] ^= 0x40;
            std::fs::write(&path, bytes).unwrap();
            blocks.push(block);
        }
    }
    assert!(!blocks.is_empty(), "some run holds {key:?}");
    blocks
}

/// Partition 0's keys in order, with their counts after `to` records.
fn partition_zero(to: u64) -> Vec<(String, u64)> {
    expected(to)
        .into_iter()
        .filter(|(key, _)| chronik::partition_for_key(key.as_bytes(), 2) == 0)
        .collect()
}

/// A key of partition 0 from the middle of its keys (not in a run's first block).
fn middle_key() -> String {
    let keys = partition_zero(20_000);
    keys[keys.len() / 2].0.clone()
}

fn is_damaged(result: &Result<(), chronik::processor::StoreError>) -> bool {
    matches!(result, Err(chronik::processor::StoreError::Damaged(_)))
}

/// A data block in the middle of a run damaged under a key: `get` of that key is
/// `Err(Damaged)` (never the damaged value, never "absent"), and the store's check says so too
/// (for a caller that dropped the error); a key in an undamaged block still reads right.
#[test]
fn a_get_from_a_damaged_block_is_damaged_not_absent() {
    let (dir, reports) = setup();
    let (counts, _, _) = run(dir.path(), &reports);
    assert_eq!(counts, expected(20_000));
    let key = middle_key();
    let blocks = damage_value(&store_directory(dir.path(), 0), key.as_bytes());
    assert!(blocks.iter().any(|&b| b > 0), "a block past the first: {blocks:?}");
    let chronik = open(dir.path());
    let runner = Runner::new(chronik.engine(), config(&reports), |_| counter()).unwrap();
    let store = runner.store(0, "counts").unwrap();
    // A key in another block reads right, and nothing failed.
    let (other, count) = partition_zero(20_000)[0].clone();
    let value = store.get(other.as_bytes()).unwrap().expect("an undamaged key");
    assert_eq!(u64::from_le_bytes((*value).try_into().unwrap()), count);
    store.check().unwrap();
    // The damaged key: an error, and the check reports the damage too.
    let value = store.get(key.as_bytes()).map(|v| v.map(|v| v.to_vec()));
    assert!(is_damaged(&value.map(|_| ())), "a failed get is damage, not an absent key");
    assert!(is_damaged(&store.check()), "the failure is remembered for the task");
}

/// The same damage met by a range: it yields the entries before the damaged block, each
/// right, and in order with none left out, then `Err(Damaged)`; the check says `Damaged` too.
/// The whole iteration ends with `Err(Damaged)` the same way.
#[test]
fn a_range_over_a_damaged_block_stops_with_damage_and_drops_nothing_before_it() {
    let (dir, reports) = setup();
    let (counts, _, _) = run(dir.path(), &reports);
    assert_eq!(counts, expected(20_000));
    let key = middle_key();
    damage_value(&store_directory(dir.path(), 0), key.as_bytes());
    let chronik = open(dir.path());
    let runner = Runner::new(chronik.engine(), config(&reports), |_| counter()).unwrap();
    let store = runner.store(0, "counts").unwrap();
    let want = partition_zero(20_000);
    let decode = |(k, v): (std::borrow::Cow<'_, [u8]>, std::borrow::Cow<'_, [u8]>)| {
        (String::from_utf8(k.to_vec()).unwrap(), u64::from_le_bytes((*v).try_into().unwrap()))
    };
    let high = key.clone() + "~";
    let range = (Bound::Unbounded, Bound::Excluded(high.as_bytes()));
    let mut entries = store.range::<(Bound<&[u8]>, _)>(range);
    let got: Vec<(String, u64)> = entries.by_ref().map_while(Result::ok).map(decode).collect();
    assert!(entries.next().is_none(), "nothing after the error");
    assert!(is_damaged(&store.check()), "the range met the damage: {} entries", got.len());
    assert!(got.len() < want.iter().position(|(k, _)| *k == key).unwrap() + 1);
    assert_eq!(got, want[..got.len()], "the entries before the damage, all of them, right");
    store.check().unwrap(); // The failure was handed out once.

    let entries: Vec<_> = store.iter().collect();
    let (last, before) = entries.split_last().expect("an entry or the error");
    assert!(matches!(last, Err(chronik::processor::StoreError::Damaged(_))), "{last:?}");
    let before: Vec<(String, u64)> =
        before.iter().map(|e| decode(e.as_ref().unwrap().clone())).collect();
    assert_eq!(before, want[..before.len()], "the entries before the damage, all of them");
}

/// A restart whose changelog tail updates the damaged key (the store had not taken it): the
/// restore writes the tail blind, reading no run, so it does not meet the damage; the first
/// read of the damaged block does, as an error (never the key taken as absent), and the next
/// start rebuilds the store exactly.
#[test]
fn a_restore_writes_blind_and_the_first_read_of_the_damage_fails_and_rebuilds() {
    let (dir, reports) = setup();
    let (first, _, _) = run(dir.path(), &reports);
    assert_eq!(first, expected(20_000));
    produce(&open(dir.path()), 20_000, 20_000 + KEYS);
    {
        let chronik = open(dir.path());
        // Counts like `counter()`; on partition 0 it fails at the 300th record: with commits
        // every 50 records, a crash with the changelog ahead of the store (nothing flushed).
        let factory = |partition| match partition {
            0 => counter().fail_at_record(300),
            _ => counter(),
        };
        let config = ProcessorConfig { commit_every_records: Some(50), ..config(&reports) };
        let mut runner = Runner::new(chronik.engine(), config, factory).unwrap();
        runner.run_until_caught_up().expect_err("stopped on purpose");
    }
    // The first key partition 0 took in the failed run: in the changelog after the store.
    let key = (20_000..20_000 + KEYS)
        .map(|i| format!("key-{:05}", i % KEYS))
        .find(|key| chronik::partition_for_key(key.as_bytes(), 2) == 0)
        .unwrap();
    damage_value(&store_directory(dir.path(), 0), key.as_bytes());
    reports.lock().unwrap().clear();
    {
        let chronik = open(dir.path());
        // The restore (inside `Runner::new`) reads the changelog's tail, and no run.
        let runner = Runner::new(chronik.engine(), config(&reports), |_| counter()).unwrap();
        let restored = reports.lock().unwrap().iter().find(|r| r.0 == 0).map(|r| r.3);
        assert!(restored.is_some_and(|r| r > 0), "the tail was read: {reports:?}");
        // The tail's update of the key is in memory; reading every entry still reads the
        // damaged block, and says so.
        let store = runner.store(0, "counts").unwrap();
        let entries: Vec<_> = store.iter().collect();
        let last = entries.last().expect("an entry or the error");
        assert!(matches!(last, Err(chronik::processor::StoreError::Damaged(_))), "{last:?}");
    }
    let (rebuilt, stats, _) = run(dir.path(), &reports);
    assert_eq!(rebuilt, expected(20_000 + KEYS), "rebuilt exactly");
    assert_eq!(stats.stores_rebuilt, 1, "{stats:?}");
}

/// A disk store given a budget of no bytes is refused by name when the runner starts, not a
/// panic; a budget shared by the application works like the process's.
#[test]
fn a_budget_of_no_bytes_is_a_config_error_and_a_shared_one_counts_exactly() {
    use chronik::processor::{DiskOptions, ProcessorError, StoreKind, StoreMemory};
    let (dir, _reports) = setup();
    let chronik = open(dir.path());
    let empty = StoreKind::Disk(DiskOptions { budget_bytes: Some(0) });
    let config = ProcessorConfig::new("zero", "clicks").store_with("counts", empty);
    match Runner::new(chronik.engine(), config, |_| counter()) {
        Err(ProcessorError::Config(message)) => {
            assert!(message.contains("\"counts\""), "{message}");
        }
        other => panic!("expected a config error, got {:?}", other.map(|_| ())),
    }
    let memory = StoreMemory::new(1 << 20);
    let config = ProcessorConfig::new("shared", "clicks")
        .store_with("counts", StoreKind::disk())
        .store_memory(memory.clone());
    let mut runner = Runner::new(chronik.engine(), config, |_| counter()).unwrap();
    runner.run_until_caught_up().unwrap();
    assert_eq!(counts(&runner), expected(20_000));
    assert!(memory.resident_bytes() > 0 && memory.resident_bytes() <= memory.bytes(), "{memory:?}");
    drop(runner);
    assert_eq!(memory.resident_bytes(), memory.cached_bytes(), "closed stores left their charges");
}
