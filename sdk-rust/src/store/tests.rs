//! The disk store against a map: random puts and deletes, flushes at random commits (so
//! runs build up and merge), reopens, ranges; and damage found, never believed.

use super::disk::DiskStore;
use super::{Files, StoreError, StoreMemory};
use crate::Offset;
use chronik_engine::io::{Io, Namespace};
use chronik_simdisk::{Rng, SimDisk};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

const DIRECTORY: &str = "/state/app-counts-0.store";

fn disk() -> (SimDisk, Arc<dyn Io>) {
    let disk = SimDisk::new(Rng::new(7));
    disk.create_directory(Path::new("/state")).unwrap();
    chronik_engine::io::sync_directory(&disk, Path::new("/")).unwrap();
    let io: Arc<dyn Io> = Arc::new(disk.clone());
    (disk, io)
}

fn open(io: &Arc<dyn Io>, identity: &str, budget: usize) -> (DiskStore, Option<String>) {
    let files = Files { io: Arc::clone(io), directory: DIRECTORY.into() };
    DiskStore::open(files, identity.to_owned(), StoreMemory::new(budget)).unwrap()
}

/// Commit the store's changes, then flush them as a commit would.
fn commit_flush(store: &mut DiskStore, offset: Offset) -> Result<(), StoreError> {
    store.committed();
    store.flush(offset)
}

fn entries(store: &DiskStore) -> Vec<(Vec<u8>, Vec<u8>)> {
    // Up to a failed read, which the store also remembers (`take_failure`).
    let all = store.range(Bound::Unbounded, Bound::Unbounded);
    all.map_while(Result::ok).map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
}

#[test]
fn a_disk_store_agrees_with_a_map_through_flushes_merges_and_reopens() {
    let (_disk, io) = disk();
    let mut rng = Rng::new(42);
    // A tiny cache: a flush every few hundred bytes, so runs merge again and again.
    let (mut store, rebuilt) = open(&io, "app-counts-changelog partition 0", 4096);
    assert_eq!(rebuilt, None);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut offset = 0;
    let mut most_runs = 0;
    let mut merged = 0;
    for step in 0..20_000_u64 {
        let key = format!("k{:04}", rng.below(600)).into_bytes();
        if rng.chance(200_000) {
            store.delete(&key);
            model.remove(&key);
        } else {
            let length = rng.below(40) as usize;
            let value = rng.bytes(length);
            store.put(&key, &value);
            model.insert(key.clone(), value);
        }
        assert_eq!(store.get(&key).unwrap().map(|v| v.to_vec()), model.get(&key).cloned());
        offset += 1;
        if store.wants_flush() && rng.chance(500_000) {
            commit_flush(&mut store, Offset::new(offset)).unwrap();
            most_runs = most_runs.max(store.runs());
        }
        if rng.chance(2_000) {
            commit_flush(&mut store, Offset::new(offset)).unwrap();
            merged += store.merges().installed;
            drop(store);
            let (reopened, rebuilt) = open(&io, "app-counts-changelog partition 0", 4096);
            assert_eq!(rebuilt, None);
            assert_eq!(reopened.offset(), Offset::new(offset));
            store = reopened;
        }
        if step % 997 == 0 {
            assert_eq!(
                entries(&store),
                model.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>()
            );
            let low = format!("k{:04}", rng.below(600)).into_bytes();
            let high = format!("k{:04}", rng.below(600)).into_bytes();
            let found: Vec<Vec<u8>> = store
                .range(Bound::Included(&low), Bound::Excluded(&high))
                .map(|entry| entry.unwrap().0.to_vec())
                .collect();
            let expected: Vec<Vec<u8>> = if low < high {
                model.range(low..high).map(|(k, _)| k.clone()).collect()
            } else {
                Vec::new()
            };
            assert_eq!(found, expected, "step {step}");
        }
    }
    assert!(store.take_failure().is_none());
    merged += store.merges().installed;
    eprintln!("{merged} merges, most runs {most_runs}");
    assert!(merged > 20, "merges ran: {merged}");
    assert!(most_runs >= 2, "runs never built up: {most_runs}");
    assert!(store.runs() < 3 * super::policy::FANOUT, "merges keep the runs few: {}", store.runs());
}

#[test]
fn another_stores_files_are_foreign_and_wiped() {
    let (_disk, io) = disk();
    let (mut store, _) = open(&io, "a partition 0", 1 << 20);
    store.put(b"k", b"v");
    commit_flush(&mut store, Offset::new(1)).unwrap();
    drop(store);
    let (store, rebuilt) = open(&io, "b partition 0", 1 << 20);
    assert!(rebuilt.unwrap().contains("foreign"));
    assert_eq!((store.len_estimate(), store.offset()), (0, Offset::ZERO));
}

/// A fresh disk holding one flushed store of 400 entries; the run file's path.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

fn one_run() -> (SimDisk, Arc<dyn Io>, std::path::PathBuf, Entries) {
    let (disk, io) = disk();
    let (mut store, _) = open(&io, "app", 1 << 20);
    let mut expected = Vec::new();
    for i in 0..400_u32 {
        let key = format!("key{i:05}").into_bytes();
        store.put(&key, &i.to_le_bytes());
        expected.push((key, i.to_le_bytes().to_vec()));
    }
    commit_flush(&mut store, Offset::new(400)).unwrap();
    drop(store);
    let run = disk.snapshot().into_keys().find(|p| p.extension().is_some_and(|e| e == "run"));
    (disk, io, run.unwrap(), expected)
}

#[test]
fn every_flipped_byte_of_a_run_is_found_or_harmless() {
    let length = one_run().0.snapshot().values().map(Vec::len).max().unwrap();
    let mut found = 0;
    let mut tried = 0;
    for position in (0..length as u64).step_by(5) {
        let (disk, io, run, expected) = one_run();
        let Ok(file) = disk.open(&run, chronik_engine::io::OpenMode::ReadWrite) else { continue };
        let Ok(byte) = chronik_engine::io::read_exact(&disk, file, position, 1) else {
            disk.close(file);
            continue;
        };
        chronik_engine::io::write_all(&disk, file, position, vec![byte[0] ^ 0x10]).unwrap();
        disk.close(file);
        tried += 1;
        let (store, rebuilt) = open(&io, "app", 1 << 20);
        let seen = entries(&store);
        let failure = store.take_failure();
        assert!(matches!(failure, None | Some(StoreError::Damaged(_))), "{failure:?}");
        if rebuilt.is_some() || failure.is_some() {
            found += 1;
        } else {
            assert_eq!(seen, expected, "a flip at {position} was believed");
        }
    }
    // Every byte of a run is covered by a checksum that is read when the store opens or
    // iterates: every flip is found.
    assert_eq!(found, tried, "{found} of {tried} flips found");
}

/// A power cut at any call of a flush (its run, a merge's slice, the manifest, removals):
/// the store reopens at the offset of the last manifest written, with exactly the state of
/// that offset, and no file beside what the manifest names.
#[test]
fn a_power_cut_anywhere_in_flushes_and_merges_reopens_at_a_flushed_state() {
    let mut cuts_during_merges = 0;
    for seed in 0..60 {
        let (disk, io) = disk();
        let mut rng = Rng::new(seed);
        let identity = "app-counts-changelog partition 0";
        let (mut store, _) = open(&io, identity, 2048);
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut flushed: BTreeMap<u64, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
        flushed.insert(0, BTreeMap::new());
        let cut_at = rng.between(200, 3000);
        let mut offset = 0;
        let mut merging_when_cut = false;
        for step in 0.. {
            let key = format!("k{:03}", rng.below(300)).into_bytes();
            if rng.chance(150_000) {
                store.delete(&key);
                model.remove(&key);
            } else {
                let length = rng.below(24) as usize;
                let value = rng.bytes(length);
                store.put(&key, &value);
                model.insert(key, value);
            }
            offset += 1;
            if step == cut_at {
                disk.cut_power_after(rng.below(40));
            }
            if store.wants_flush() {
                flushed.insert(offset, model.clone());
                let under_way = store.merges_under_way() > 0;
                if commit_flush(&mut store, Offset::new(offset)).is_err() {
                    assert!(disk.power_is_cut(), "seed {seed}: only the cut fails a flush");
                    merging_when_cut |= under_way;
                    break;
                }
            }
        }
        drop(store);
        disk.crash(&mut rng);
        let (store, rebuilt) = open(&io, identity, 2048);
        assert_eq!(rebuilt, None, "seed {seed}: a cut never damages the store");
        let at = store.offset().get();
        let expected = flushed.get(&at).unwrap_or_else(|| panic!("seed {seed}: offset {at}"));
        let expected: Entries = expected.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(entries(&store), expected, "seed {seed}: the state of offset {at}");
        assert!(store.take_failure().is_none(), "seed {seed}: every read went well");
        let files = disk.snapshot().into_keys().filter(|p| p.starts_with(DIRECTORY)).count();
        assert_eq!(files, store.runs() + 1, "seed {seed}: only the manifest and its runs");
        cuts_during_merges += u32::from(merging_when_cut);
    }
    // The cut lands in a flush that had merges under way (their slices, or their install).
    eprintln!("{cuts_during_merges} of 60 cuts during merges");
    assert!(cuts_during_merges >= 20, "{cuts_during_merges} of 60 cuts during merges");
}

/// The key estimate, kept without reading at writes: near the distinct keys written, still
/// near after every key is updated, near zero once every key is deleted, and exact (here) once
/// the runs merged into one that dropped deletions.
#[test]
fn the_key_estimate_follows_puts_updates_and_deletes_without_reads() {
    let (_disk, io) = disk();
    let (mut store, _) = open(&io, "app", 16 << 10);
    let keys = 6000_u64;
    let mut offset = 0;
    let mut write = |store: &mut DiskStore, key: u64, value: Option<&[u8]>| {
        let key = format!("key{key:06}").into_bytes();
        match value {
            Some(value) => store.put(&key, value),
            None => store.delete(&key),
        }
        offset += 1;
        if store.wants_flush() {
            commit_flush(store, Offset::new(offset)).unwrap();
        }
    };
    for key in 0..keys {
        write(&mut store, key, Some(b"first"));
    }
    let estimate = store.len_estimate();
    assert!(estimate <= keys && estimate * 100 >= keys * 97, "{estimate} for {keys} keys");
    for key in 0..keys {
        write(&mut store, key, Some(b"second"));
    }
    let estimate = store.len_estimate();
    assert!(estimate * 100 >= keys * 97 && estimate <= 2 * keys, "{estimate} after updates");
    assert_eq!(entries(&store).len() as u64, keys, "every key is there once");
    for key in 0..keys {
        write(&mut store, key, None);
    }
    let estimate = store.len_estimate();
    assert!(estimate * 20 <= keys, "{estimate} after every key was deleted");
    assert!(entries(&store).is_empty());
    assert!(store.take_failure().is_none(), "every read went well");
    assert!(store.merges().installed > 10, "{:?}", store.merges());
    eprintln!("{:?}, {} runs", store.merges(), store.runs());
}

#[test]
fn stores_sharing_one_budget_stay_within_it_and_each_agrees_with_its_map() {
    // 2 stores x 4 partitions on one budget: the memtables together stay within its write
    // share after every flush round, the cache within the rest, each store exact.
    let (_disk, io) = disk();
    let memory = StoreMemory::new(4 << 20);
    let mut rng = Rng::new(9);
    let open_at = |i: usize| {
        let files = Files { io: Arc::clone(&io), directory: format!("/state/s{i}.store").into() };
        let identity = format!("app-s{}-changelog partition {}", i / 4, i % 4);
        let (store, rebuilt) = DiskStore::open(files, identity, memory.clone()).unwrap();
        assert_eq!(rebuilt, None);
        store
    };
    let mut stores: Vec<DiskStore> = (0..8).map(open_at).collect();
    let mut models: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = vec![BTreeMap::new(); 8];
    let (mut flushes, mut most_writes) = (0, 0);
    for round in 1..=6_000_u64 {
        // One commit's worth: a few puts into stores written at different rates.
        for _ in 0..32 {
            let i = (rng.below(8) * rng.below(8) / 7) as usize;
            let key = format!("k{:05}", rng.below(20_000)).into_bytes();
            let length = rng.below(60) as usize;
            let value = rng.bytes(length);
            stores[i].put(&key, &value);
            models[i].insert(key, value);
        }
        for store in &mut stores {
            store.committed();
        }
        for store in stores.iter_mut().filter(|s| s.wants_flush()) {
            store.flush(Offset::new(round)).unwrap();
            flushes += 1;
        }
        most_writes = most_writes.max(memory.write_bytes());
        assert!(memory.write_bytes() < memory.write_budget(), "round {round}: {memory:?}");
        let own: usize = stores.iter().map(DiskStore::resident_bytes).sum();
        assert!(
            own >= memory.pinned_bytes() + memory.write_bytes(),
            "pinned and writes are theirs"
        );
        assert!(memory.resident_bytes() <= memory.bytes(), "round {round}: {memory:?}");
        if round % 1_000 == 0 {
            let (i, key) = (rng.below(8) as usize, format!("k{:05}", rng.below(20_000)));
            let found = stores[i].get(key.as_bytes()).unwrap().map(|v| v.to_vec());
            assert_eq!(found.as_ref(), models[i].get(key.as_bytes()));
            for (store, model) in stores.iter().zip(&models) {
                let expected: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                assert_eq!(entries(store), expected, "round {round}");
            }
        }
    }
    let merges: u64 = stores.iter().map(|s| s.merges().installed).sum();
    eprintln!(
        "{flushes} flushes, {merges} merges, memtables at most {most_writes} of {}: {memory:?}",
        memory.write_budget()
    );
    assert!(flushes > 100 && merges > 10, "flushes and merges ran: {flushes}, {merges}");
    assert!(most_writes > memory.write_budget() / 2, "the write budget was reached");
    assert!(memory.cached_bytes() > 0, "reads went through the shared cache");
    drop(stores);
    assert_eq!((memory.write_bytes(), memory.pinned_bytes()), (0, 0), "closed stores left it");
}
