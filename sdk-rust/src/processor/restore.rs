//! Restores: each store of a task rebuilt from its changelog partition, a memory store from
//! its latest usable snapshot and the changelog after it, a disk store by opening its files
//! and reading the changelog after the offset they reflect. Invariant: a restore never uses
//! local state that covers more of the changelog than its end (a snapshot or disk store
//! ahead of it holds changes that never committed): such state is ignored or rebuilt.

use super::api::{ProcessorError, RunStats};
use super::changelog::decode_change;
use super::config::{ProcessorConfig, RestoreProgress};
use super::snapshot;
use super::task_log::TaskLog;
use crate::store::{DiskOptions, DiskStore, Files, Store, StoreError, StoreKind, StoreMemory};
use crate::{Io, Offset};
use chronik_engine::Engine;
use chronik_engine::canary::{self, Canary};
use chronik_engine::metrics::Metrics;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Bytes of changelog one restore read fetches.
const RESTORE_FETCH_BYTES: usize = 4 << 20;

/// What a task starts from: its stores, and what restoring them took.
pub(super) type Restored = (BTreeMap<String, Store>, RunStats);

/// Restore every partition's stores, on up to [`ProcessorConfig::threads`] threads.
pub(super) fn restore_all<I: Io>(
    engine: &Engine<I>,
    config: &ProcessorConfig,
    partitions: u32,
) -> Result<Vec<Restored>, ProcessorError> {
    let budgets = disk_budgets(config)?;
    let one = |partition: u32| -> Result<Restored, ProcessorError> {
        let mut stats = RunStats::default();
        let mut stores = BTreeMap::new();
        for name in &config.stores {
            let budget = budgets.get(name.as_str()).cloned();
            let store = restore(engine, config, name, partition, budget, &mut stats)?;
            stores.insert(name.clone(), store);
        }
        Ok((stores, stats))
    };
    let threads = config.threads.clamp(1, partitions.max(1) as usize);
    if threads == 1 {
        return (0..partitions).map(one).collect();
    }
    let mut slots: Vec<Option<Result<Restored, ProcessorError>>> =
        (0..partitions).map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|worker| {
                let one = &one;
                scope.spawn(move || {
                    (0..partitions)
                        .filter(|p| *p as usize % threads == worker)
                        .map(|p| (p, one(p)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for worker in workers {
            match worker.join() {
                Ok(done) => done.into_iter().for_each(|(p, r)| slots[p as usize] = Some(r)),
                Err(_) => slots.iter_mut().for_each(|s| *s = Some(Err(ProcessorError::Panicked))),
            }
        }
    });
    slots.into_iter().map(|slot| slot.unwrap_or(Err(ProcessorError::Panicked))).collect()
}

/// Each disk store's memory budget, shared by its partitions (and, unless the store has its
/// own, by the application's other stores); a budget of 0 bytes is refused.
pub(crate) fn disk_budgets(
    config: &ProcessorConfig,
) -> Result<BTreeMap<&str, StoreMemory>, ProcessorError> {
    let empty = config.stores.iter().find(|name| {
        matches!(config.kind_of(name), StoreKind::Disk(DiskOptions { budget_bytes: Some(0) }))
    });
    if let Some(name) = empty {
        return Err(ProcessorError::Config(format!("store {name:?}: a memory budget of 0 bytes")));
    }
    Ok((config.stores.iter())
        .filter(|name| matches!(config.kind_of(name), StoreKind::Disk(_)))
        .map(|name| (name.as_str(), config.memory_of(name)))
        .collect())
}

/// Restore a store: a memory store from its snapshot (if any) and the changelog after it, a
/// disk store by opening it and reading the changelog after the offset it reflects.
fn restore<L: TaskLog + ?Sized>(
    engine: &L,
    config: &ProcessorConfig,
    name: &str,
    partition: u32,
    budget: Option<StoreMemory>,
    stats: &mut RunStats,
) -> Result<Store, ProcessorError> {
    let topic = config.changelog(name);
    let end = engine.high_watermark(&topic, partition)?;
    let _span = tracing::info_span!("restore", store = name, partition, end = end.get()).entered();
    let store = match config.kind_of(name) {
        StoreKind::Memory => restore_memory(engine, config, name, partition, end, stats)?,
        StoreKind::Disk(_) => {
            let budget = budget.expect("restore_all gives every disk store its budget");
            restore_disk(engine, config, name, partition, end, budget, stats)?
        }
    };
    if let Some(metrics) = engine.metrics() {
        Metrics::add(&metrics.restores_done, 1);
    }
    Ok(store)
}

/// Where a restore reads the changelog: which store, up to where, and what it starts from.
struct Tail<'a> {
    config: &'a ProcessorConfig,
    name: &'a str,
    partition: u32,
    end: Offset,
    /// The snapshot's or the disk store's offset the restore starts from, if any.
    from: Option<Offset>,
    rebuilt: Option<&'a str>,
}

impl Tail<'_> {
    fn report(&self, restored: u64, done: bool) {
        if let Some(listener) = &self.config.on_restore {
            listener(RestoreProgress {
                store: self.name,
                partition: self.partition,
                restored,
                end: self.end,
                from_snapshot: self.from,
                rebuilt: self.rebuilt,
                done,
            });
        }
    }

    /// Read the changelog from `next` to the end, handing each change to `apply` (`None`:
    /// deleted) and each fetch's end to `fetched`; returns the records read.
    fn read<L: TaskLog + ?Sized>(
        &self,
        engine: &L,
        mut next: Offset,
        mut apply: impl FnMut(&[u8], Option<&[u8]>),
        mut fetched: impl FnMut(Offset) -> Result<(), ProcessorError>,
    ) -> Result<u64, ProcessorError> {
        let topic = self.config.changelog(self.name);
        let (mut restored, mut counted) = (0, 0);
        while next < self.end {
            let fetch = engine.read(&topic, self.partition, next, RESTORE_FETCH_BYTES)?;
            if fetch.is_empty() {
                break;
            }
            for record in fetch.records().filter(|r| r.offset() >= next && r.offset() < self.end) {
                restored += 1;
                if record.value().is_empty() && canary::active(Canary::RestoreSkipsTombstone) {
                    continue;
                }
                let key = record.key().unwrap_or_default();
                let Ok(value) = decode_change(record.value()) else {
                    return Err(ProcessorError::BadChangelog {
                        store: self.name.to_owned(),
                        partition: self.partition,
                        offset: record.offset().get(),
                    });
                };
                apply(key, value);
            }
            next = fetch.next_offset();
            fetched(next.min(self.end))?;
            // Per fetch, so the metric shows a restore's progress while it runs.
            if let Some(metrics) = engine.metrics() {
                Metrics::add(&metrics.restore_records, restored - counted);
            }
            counted = restored;
            self.report(restored, false);
        }
        self.report(restored, true);
        Ok(restored)
    }
}

fn restore_memory<L: TaskLog + ?Sized>(
    engine: &L,
    config: &ProcessorConfig,
    name: &str,
    partition: u32,
    end: Offset,
    stats: &mut RunStats,
) -> Result<Store, ProcessorError> {
    // A snapshot is used only if it covers no more of the changelog than is committed: one
    // that runs ahead holds state that never committed.
    let snapshot_name = config.snapshot_file(name, partition);
    let snapshot = engine
        .state_dir()
        .and_then(|state| state.read(&snapshot_name).ok().flatten())
        .and_then(|bytes| snapshot::decode(&bytes))
        .filter(|(offset, _)| *offset <= end);
    let from = snapshot.as_ref().map(|(offset, _)| *offset);
    // The log of changes, snapshot first: sorted by key once at the end (stably, so the last
    // change of a key wins), the map is then built in one pass instead of a tree insert per
    // record.
    let mut changes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    let mut next = Offset::ZERO;
    if let Some((offset, data)) = snapshot {
        changes.extend(data.into_iter().map(|(k, v)| (k, Some(v))));
        next = offset;
        stats.snapshots_loaded += 1;
    }
    let tail = Tail { config, name, partition, end, from, rebuilt: None };
    let restored = tail.read(
        engine,
        next,
        |key, value| changes.push((key.to_vec(), value.map(<[u8]>::to_vec))),
        |_| Ok(()),
    )?;
    changes.sort_by(|a, b| a.0.cmp(&b.0));
    let mut latest: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(changes.len());
    let mut changes = changes.into_iter().peekable();
    while let Some((key, change)) = changes.next() {
        if changes.peek().is_some_and(|(next_key, _)| *next_key == key) {
            continue; // A later change of the same key follows.
        }
        if let Some(value) = change {
            latest.push((key, value));
        }
    }
    stats.restored += restored;
    let snapshot_offset = from.map(Offset::get);
    tracing::info!(restored, ?snapshot_offset, entries = latest.len(), "restored");
    Ok(Store::from_map(latest.into_iter().collect()))
}

fn restore_disk<L: TaskLog + ?Sized>(
    engine: &L,
    config: &ProcessorConfig,
    name: &str,
    partition: u32,
    end: Offset,
    budget: StoreMemory,
    stats: &mut RunStats,
) -> Result<Store, ProcessorError> {
    let failed = |source| ProcessorError::Store { store: name.to_owned(), partition, source };
    let state_dir = engine
        .state_dir()
        .ok_or_else(|| failed(StoreError::Unavailable("this log keeps no local files".into())))?;
    state_dir.create().map_err(|error| failed(StoreError::Unavailable(error.to_string())))?;
    let directory = state_dir.path().join(config.store_directory(name, partition));
    let files = Files { io: Arc::clone(state_dir.io()), directory };
    let identity = format!("{} partition {partition}", config.changelog(name));
    let (mut disk, mut rebuilt) = DiskStore::open(files, identity, budget).map_err(failed)?;
    if let Some(metrics) = engine.metrics() {
        Metrics::add(&metrics.store_unnamed_removed, disk.unnamed_removed());
    }
    if rebuilt.is_none() && !disk.manifest_found() && end > Offset::ZERO {
        // Not a first start: the changelog has records but the store has no files (its
        // directory was removed, or it was condemned after damage, or it never flushed).
        rebuilt = Some(format!(
            "missing: no store files, while the changelog holds offsets up to {}",
            end.get()
        ));
    } else if rebuilt.is_none() && disk.offset() > end {
        rebuilt = Some(format!(
            "stale: it reflects changelog offset {} but the changelog ends at {}",
            disk.offset().get(),
            end.get()
        ));
        disk.wipe().map_err(failed)?;
    }
    let from = rebuilt.is_none().then(|| disk.offset()).filter(|o| o.get() > 0);
    match &rebuilt {
        Some(reason) => {
            stats.stores_rebuilt += 1;
            tracing::warn!(
                store = name,
                partition,
                reason = reason.as_str(),
                "disk store rebuilt from the changelog"
            );
        }
        None if from.is_some() => stats.stores_opened += 1,
        None => {}
    }
    let next =
        if canary::active(Canary::StoreOffsetNotRead) { Offset::ZERO } else { disk.offset() };
    let tail = Tail { config, name, partition, end, from, rebuilt: rebuilt.as_deref() };
    let disk = std::cell::RefCell::new(disk);
    let restored = tail.read(
        engine,
        next,
        |key, value| disk.borrow_mut().apply(key, value),
        |position| {
            let mut disk = disk.borrow_mut();
            if disk.must_flush() { disk.flush(position).map_err(failed) } else { Ok(()) }
        },
    )?;
    let mut store = Store::on_disk(disk.into_inner());
    store.check().map_err(failed)?;
    let disk = store.disk_mut().expect("a disk store");
    if disk.must_flush() {
        disk.flush(end).map_err(failed)?;
    }
    stats.restored += restored;
    tracing::info!(
        restored,
        from = disk.offset().get(),
        entries = disk.len_estimate(),
        "disk store opened"
    );
    Ok(store)
}
