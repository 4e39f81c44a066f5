//! A task's state on a cluster, restored from its changelog partitions: memory stores from
//! the whole changelog, disk stores (kept under the connection's `state.dir`) from the files
//! of an earlier run on this machine and the changelog after the commit marker they were
//! flushed at. Every commit of a task ends each of its changelogs with a marker; the state
//! restored is that of the last commit whose marker reached every changelog, and what came
//! after it (an unfinished commit) is written back by the next commit (the repairs).
//!
//! A disk store's files are used only when all of these hold, else it is rebuilt from the
//! changelog with a report line: they are this cluster's, of this changelog partition (the
//! identity in the manifest); their offset is within the changelog; the record before that
//! offset is still there and is a marker (a changelog compacted or deleted past it may have
//! lost tombstones the files never saw); and that commit is not ahead of the other stores'.
//! Reading goes through [`Changelogs`], so that the decisions are tested on a fake changelog
//! (compaction, deleted records) that a test broker cannot produce.

use super::{KafkaClient, REQUEST_TIMEOUT, cluster};
use crate::processor::{
    MARKER_HEADER, ProcessorConfig, ProcessorError, RestoreProgress, RunStats, Store,
    decode_change, decode_marker,
};
use crate::store::disk::tag;
use crate::store::{DiskStore, Files, StoreError, StoreKind};
use crate::{Io, Offset, OwnedRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a restore reads changelog partitions: the cluster, or a fake in tests.
pub(super) trait Changelogs {
    /// Where the partition ends: the offset its next record will get.
    fn end(&self, topic: &str, partition: u32) -> Result<Offset, ProcessorError>;
    /// Hand the committed records from `from` on (the first may come later: compacted or
    /// deleted) to `each`, in offset order, until the end or until `each` says stop.
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: Offset,
        each: &mut dyn FnMut(OwnedRecord) -> Result<bool, ProcessorError>,
    ) -> Result<(), ProcessorError>;
}

impl Changelogs for KafkaClient {
    fn end(&self, topic: &str, partition: u32) -> Result<Offset, ProcessorError> {
        self.end_offset(topic, partition).map_err(cluster)
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: Offset,
        each: &mut dyn FnMut(OwnedRecord) -> Result<bool, ProcessorError>,
    ) -> Result<(), ProcessorError> {
        let mut reader = self.reader(topic, partition, from.get()).map_err(cluster)?;
        loop {
            let batch = reader.next_batch(50_000).map_err(cluster)?;
            if batch.is_empty() && reader.at_end() {
                return Ok(());
            }
            for record in batch {
                if !each(record)? {
                    return Ok(());
                }
            }
        }
    }
}

/// Where this machine keeps disk stores, and the cluster they are of.
pub(super) struct LocalState {
    pub directory: PathBuf,
    pub io: Arc<dyn Io>,
    /// The cluster's id (or, if it gives none, its address): part of every store's identity.
    pub cluster: String,
    /// Each disk store's memory budget, shared by its partitions ([`disk_budgets`], made once
    /// per run).
    pub budgets: BTreeMap<String, crate::store::StoreMemory>,
}

impl LocalState {
    /// Take the lock of the store directory `store` (one store of one partition): one task
    /// at a time works in it (a process that lost the partition may not have noticed yet).
    /// The lock is the file's: it goes with the process, however it ends.
    pub(super) fn lock(&self, store: &str) -> Result<std::fs::File, ProcessorError> {
        let path = self.directory.join(format!("{store}.lock"));
        let failed = |error: std::io::Error| {
            ProcessorError::Config(format!("state.dir: {}: {error}", path.display()))
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(failed)?;
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < REQUEST_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(failed(std::io::Error::other(
                        "held by another process of this machine (one state.dir per process)",
                    )));
                }
                Err(std::fs::TryLockError::Error(error)) => return Err(failed(error)),
            }
        }
    }
}

/// The deliberate bugs of this module's tests (their canaries): none outside tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(super) enum Canary {
    /// A disk store's files are used without the marker before their offset.
    TrustFiles,
    /// The last commit of a changelog is applied even where another changelog lacks it.
    ApplyHeld,
    /// The commit restored is the lowest of the changelogs' last (numbers may repeat).
    LowestLast,
}

#[cfg(test)]
thread_local! {
    pub(super) static CANARY: std::cell::Cell<Option<Canary>> = const { std::cell::Cell::new(None) };
    /// [`RESTORE_BUFFER_BYTES`], smaller in a test that reads a changelog as compacted.
    pub(super) static BUFFER_BYTES: std::cell::Cell<usize> =
        const { std::cell::Cell::new(RESTORE_BUFFER_BYTES) };
}

fn buffer_bytes() -> usize {
    #[cfg(test)]
    return BUFFER_BYTES.with(std::cell::Cell::get);
    #[cfg(not(test))]
    RESTORE_BUFFER_BYTES
}

fn canary(which: Canary) -> bool {
    #[cfg(test)]
    return CANARY.with(|active| active.get() == Some(which));
    #[cfg(not(test))]
    {
        let _ = which;
        false
    }
}

/// A commit marker as read: the commit's sequence number, its input positions, its offset.
#[derive(Clone, Debug)]
struct Marker {
    seq: u64,
    positions: Vec<Offset>,
    offset: Offset,
}

/// A change read and not yet applied: its offset, key and value (`None`: deleted).
type Change = (Offset, Vec<u8>, Option<Vec<u8>>);

/// The bytes a change keeps unapplied (counted against [`RESTORE_BUFFER_BYTES`]).
fn change_bytes((_, key, value): &Change) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len)
}

/// Bytes of changes one store's restore keeps unapplied before it applies them anyway. Only a
/// changelog compacted down to few markers holds more between two of them; if what was
/// applied that way proves not committed, the store is read again from the start.
const RESTORE_BUFFER_BYTES: usize = 64 << 20;

enum State {
    Memory(BTreeMap<Vec<u8>, Vec<u8>>),
    Disk(Box<DiskStore>),
}

impl State {
    fn apply(&mut self, key: &[u8], value: Option<&[u8]>) {
        match (self, value) {
            (State::Memory(map), Some(value)) => drop(map.insert(key.to_vec(), value.to_vec())),
            (State::Memory(map), None) => drop(map.remove(key)),
            (State::Disk(disk), value) => disk.apply(key, value),
        }
    }

    fn value(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            State::Memory(map) => Ok(map.get(key).cloned()),
            State::Disk(disk) => Ok(disk.get(key)?.map(std::borrow::Cow::into_owned)),
        }
    }

    fn wipe(&mut self) -> Result<(), StoreError> {
        match self {
            State::Memory(map) => map.clear(),
            State::Disk(disk) => disk.wipe()?,
        }
        Ok(())
    }

    /// Flush a disk store that must, its state being exactly the commit of `marker`.
    fn flush_if_due(&mut self, marker: Offset) -> Result<(), StoreError> {
        match self {
            State::Disk(disk) if disk.must_flush() => disk.flush(marker.plus(1)),
            _ => Ok(()),
        }
    }
}

/// One store's changelog partition as read so far.
struct StoreRead {
    name: String,
    topic: String,
    state: State,
    /// Every marker read (the disk store's base first), in offset order.
    markers: Vec<Marker>,
    /// `state` holds every change read below this offset and none above.
    applied_to: Offset,
    /// The changes read from `applied_to` on, in offset order, and their bytes.
    unapplied: std::collections::VecDeque<Change>,
    unapplied_bytes: usize,
    /// Change records read (again from zero if the store is read again).
    restored: u64,
    end: Offset,
    /// The disk store's offset the read began from, if its files were used.
    from: Option<Offset>,
    rebuilt: Option<String>,
}

impl StoreRead {
    fn new(name: &str, topic: String, state: State, end: Offset) -> StoreRead {
        StoreRead {
            name: name.to_owned(),
            topic,
            state,
            markers: Vec::new(),
            applied_to: Offset::ZERO,
            unapplied: std::collections::VecDeque::new(),
            unapplied_bytes: 0,
            restored: 0,
            end,
            from: None,
            rebuilt: None,
        }
    }

    /// The highest commit number this changelog holds (0: none).
    fn last_seq(&self) -> u64 {
        self.markers.iter().map(|m| m.seq).max().unwrap_or(0)
    }

    /// Whether the changelog holds anything: a store new to the application holds nothing.
    fn holds_anything(&self) -> bool {
        !self.markers.is_empty() || self.restored > 0
    }

    fn failed(&self, partition: u32) -> impl Fn(StoreError) -> ProcessorError + '_ {
        move |source| ProcessorError::Store { store: self.name.clone(), partition, source }
    }

    /// Apply the unapplied changes below `to`.
    fn apply_below(&mut self, to: Offset) {
        while let Some(change) = self.unapplied.pop_front() {
            if change.0 >= to {
                self.unapplied.push_front(change);
                break;
            }
            self.unapplied_bytes -= change_bytes(&change);
            let (offset, key, value) = change;
            self.state.apply(&key, value.as_deref());
            self.applied_to = offset.plus(1);
        }
        self.applied_to = self.applied_to.max(to);
        debug_assert!(self.unapplied.front().is_none_or(|c| c.0 >= self.applied_to));
    }

    /// Read the changelog from `from` to its end. A commit is applied once the next marker is
    /// read (until then another changelog may lack it), or when the unapplied changes pass
    /// [`RESTORE_BUFFER_BYTES`].
    fn read(
        &mut self,
        source: &dyn Changelogs,
        partition: u32,
        from: Offset,
    ) -> Result<(), ProcessorError> {
        let topic = self.topic.clone();
        source.read(&topic, partition, from, &mut |record| {
            if record.offset < from {
                return Ok(true);
            }
            let bad = || ProcessorError::BadChangelog {
                store: self.name.clone(),
                partition,
                offset: record.offset.get(),
            };
            if is_marker(&record) {
                let (seq, positions) = decode_marker(&record.value).ok_or_else(bad)?;
                if let Some(before) = self.markers.last().map(|m| m.offset)
                    && self.applied_to <= before
                {
                    self.apply_below(before);
                    self.state.flush_if_due(before).map_err(self.failed(partition))?;
                }
                self.markers.push(Marker { seq, positions, offset: record.offset });
                return Ok(true);
            }
            let value = decode_change(&record.value).map_err(|()| bad())?.map(<[u8]>::to_vec);
            self.restored += 1;
            let change = (record.offset, record.key.unwrap_or_default(), value);
            self.unapplied_bytes += change_bytes(&change);
            self.unapplied.push_back(change);
            if self.unapplied_bytes > buffer_bytes() {
                self.apply_below(record.offset.plus(1));
            }
            Ok(true)
        })
    }

    /// The marker of commit `target` here, else of the last commit before it.
    fn cut(&self, target: u64) -> Option<&Marker> {
        let exact = self.markers.iter().rev().find(|m| m.seq == target);
        exact.or_else(|| self.markers.iter().rev().find(|m| m.seq < target))
    }

    /// Make `state` the commit `target` (read again from the start if it holds changes past
    /// it), and return the keys changed after it.
    fn settle(
        &mut self,
        source: &dyn Changelogs,
        partition: u32,
        target: u64,
    ) -> Result<BTreeSet<Vec<u8>>, ProcessorError> {
        // The state can be that commit if it holds nothing past the commit's marker.
        let cut = self.cut(target).map(|m| m.offset);
        let committed_to = cut.unwrap_or(Offset::ZERO);
        let exact = match cut {
            Some(cut) => self.applied_to <= cut.plus(1),
            None => self.applied_to == Offset::ZERO,
        };
        if !exact && !canary(Canary::ApplyHeld) {
            self.rebuilt = Some(format!(
                "ahead: it holds changes past commit {target}, the last every changelog holds"
            ));
            self.state.wipe().map_err(self.failed(partition))?;
            self.unapplied.clear();
            (self.unapplied_bytes, self.applied_to, self.restored, self.from) =
                (0, Offset::ZERO, 0, None);
            self.read_to(source, partition, committed_to)?;
        }
        let to = if canary(Canary::ApplyHeld) { Offset::new(u64::MAX) } else { committed_to };
        self.apply_below(to);
        Ok(self.unapplied.drain(..).map(|(_, key, _)| key).collect())
    }

    /// Read the changelog from the start, applying the changes below `to` as they come and
    /// keeping the others unapplied.
    fn read_to(
        &mut self,
        source: &dyn Changelogs,
        partition: u32,
        to: Offset,
    ) -> Result<(), ProcessorError> {
        let topic = self.topic.clone();
        source.read(&topic, partition, Offset::ZERO, &mut |record| {
            if is_marker(&record) {
                // Every change below it is applied, and none past it.
                if record.offset < to {
                    self.state.flush_if_due(record.offset).map_err(self.failed(partition))?;
                }
                return Ok(true);
            }
            self.restored += 1;
            let Ok(value) = decode_change(&record.value) else {
                let (store, offset) = (self.name.clone(), record.offset.get());
                return Err(ProcessorError::BadChangelog { store, partition, offset });
            };
            let key = record.key.unwrap_or_default();
            if record.offset < to {
                self.state.apply(&key, value);
                self.applied_to = record.offset.plus(1);
            } else {
                self.unapplied.push_back((record.offset, key, value.map(<[u8]>::to_vec)));
            }
            Ok(true)
        })
    }
}

fn is_marker(record: &OwnedRecord) -> bool {
    record.headers.iter().any(|(key, _)| key == MARKER_HEADER.as_bytes())
}

/// A partition's state as committed: the stores at the last commit every changelog marked,
/// the input positions that commit recorded, and what its next commit writes first.
pub(super) struct Restored {
    pub stores: BTreeMap<String, Store>,
    pub positions: Option<Vec<Offset>>,
    /// The commit restored: the last one every changelog holds.
    pub commit: u64,
    /// The highest commit number any changelog holds: the next commit takes the one after,
    /// so that no number names two commits (one undone, one not).
    pub seq: u64,
    /// (changelog, key, changelog value): the committed value, written again, of every key
    /// an unfinished commit changed.
    pub repairs: Vec<(String, Vec<u8>, Vec<u8>)>,
    /// Per changelog, the offset after the marker of the commit restored.
    pub ends: Vec<(String, Offset)>,
    pub stats: RunStats,
    /// The locks of the partition's disk stores, held while the task lives.
    pub locks: Vec<std::fs::File>,
}

/// Restore `partition`'s stores of `config`; disk stores under `local`.
pub(super) fn restore_partition(
    source: &dyn Changelogs,
    config: &ProcessorConfig,
    partition: u32,
    local: Option<&LocalState>,
) -> Result<Restored, ProcessorError> {
    let mut locks = Vec::new();
    let mut reads = Vec::with_capacity(config.stores.len());
    let mut stats = RunStats::default();
    for name in &config.stores {
        let read = match (config.kind_of(name), local) {
            (StoreKind::Memory, _) => {
                let topic = config.changelog(name);
                let end = source.end(&topic, partition)?;
                let mut read = StoreRead::new(name, topic, State::Memory(BTreeMap::new()), end);
                read.read(source, partition, Offset::ZERO)?;
                read
            }
            (StoreKind::Disk(_), Some(local)) => {
                let budget = local.budgets.get(name).cloned().ok_or_else(|| {
                    ProcessorError::Config(format!("store {name:?}: no memory budget"))
                })?;
                locks.push(local.lock(&config.store_directory(name, partition))?);
                let read = open_disk(source, config, name, partition, local, budget)?;
                if read.from.is_some() {
                    stats.stores_opened += 1;
                }
                read
            }
            (StoreKind::Disk(_), None) => {
                return Err(ProcessorError::Config(format!("store {name:?}: no state.dir")));
            }
        };
        reads.push(read);
    }
    let target = target(&reads);
    let mut restored = Restored {
        stores: BTreeMap::new(),
        positions: None,
        commit: target,
        seq: reads.iter().map(StoreRead::last_seq).max().unwrap_or(0),
        repairs: Vec::new(),
        ends: Vec::new(),
        stats,
        locks,
    };
    for mut read in reads {
        let changed = read.settle(source, partition, target)?;
        for key in changed {
            let value = read.state.value(&key).map_err(read.failed(partition))?;
            restored.repairs.push((read.topic.clone(), key, tag(value.as_deref())));
        }
        let cut = read.cut(target);
        if let Some(marker) = cut.filter(|m| m.seq == target) {
            restored.positions.get_or_insert_with(|| marker.positions.clone());
        }
        let at = cut.map_or(Offset::ZERO, |m| m.offset.plus(1));
        restored.ends.push((read.topic.clone(), at));
        restored.stats.restored += read.restored;
        if let Some(reason) = &read.rebuilt {
            restored.stats.stores_rebuilt += 1;
            let store = read.name.as_str();
            tracing::warn!(store, partition, reason = reason.as_str(), "disk store rebuilt");
        }
        if let Some(listener) = &config.on_restore {
            listener(RestoreProgress {
                store: &read.name,
                partition,
                restored: read.restored,
                end: read.end,
                from_snapshot: read.from,
                rebuilt: read.rebuilt.as_deref(),
                done: true,
            });
        }
        let store = match read.state {
            State::Memory(map) => Store::from_map(map),
            State::Disk(mut disk) => {
                if disk.must_flush() {
                    disk.flush(at).map_err(|source| ProcessorError::Store {
                        store: read.name.clone(),
                        partition,
                        source,
                    })?;
                }
                Store::on_disk(*disk)
            }
        };
        restored.stores.insert(read.name, store);
    }
    Ok(restored)
}

/// The commit to restore: the last one every changelog holds (of those holding anything: a
/// store new to the application holds none and keeps no other from theirs). Where
/// compaction left no common one, the lowest of the changelogs' last.
fn target(reads: &[StoreRead]) -> u64 {
    let holding: Vec<&StoreRead> = reads.iter().filter(|r| r.holds_anything()).collect();
    let lowest_last = holding.iter().map(|r| r.last_seq()).min().unwrap_or(0);
    if canary(Canary::LowestLast) {
        return lowest_last;
    }
    let mut common: Option<BTreeSet<u64>> = None;
    for read in &holding {
        let seqs: BTreeSet<u64> = read.markers.iter().map(|m| m.seq).collect();
        common = Some(match common {
            None => seqs,
            Some(common) => common.intersection(&seqs).copied().collect(),
        });
    }
    common.and_then(|c| c.last().copied()).unwrap_or(lowest_last)
}

/// Open a disk store's files and read its changelog after them, or rebuild it (the module's
/// doc says when).
fn open_disk(
    source: &dyn Changelogs,
    config: &ProcessorConfig,
    name: &str,
    partition: u32,
    local: &LocalState,
    budget: crate::store::StoreMemory,
) -> Result<StoreRead, ProcessorError> {
    let failed = |source| ProcessorError::Store { store: name.to_owned(), partition, source };
    let topic = config.changelog(name);
    let directory = local.directory.join(config.store_directory(name, partition));
    let files = Files { io: Arc::clone(&local.io), directory };
    let identity = format!("cluster {}: {topic} partition {partition}", local.cluster);
    let (mut disk, mut rebuilt) = DiskStore::open(files, identity, budget).map_err(failed)?;
    // Where the changelog ends, for the report (some brokers answer less than the end: the
    // decisions below rest on the records read, not on it).
    let end = source.end(&topic, partition)?;
    if rebuilt.is_none() && !disk.manifest_found() && end > Offset::ZERO {
        rebuilt = Some(format!(
            "missing: no store files, while the changelog holds offsets up to {}",
            end.get()
        ));
    }
    let mut base = None;
    if rebuilt.is_none() && disk.offset() > Offset::ZERO {
        // The files hold the commit whose marker is the record before their offset.
        let at = Offset::new(disk.offset().get() - 1);
        let mut first = None;
        source.read(&topic, partition, at, &mut |record| {
            first = Some(record);
            Ok(false)
        })?;
        match first {
            None => {
                rebuilt = Some(format!(
                    "stale: the store holds changelog offsets up to {}, past the changelog's end",
                    at.get()
                ));
            }
            Some(record) if record.offset == at && is_marker(&record) => {
                let bad = || ProcessorError::BadChangelog {
                    store: name.to_owned(),
                    partition,
                    offset: at.get(),
                };
                let (seq, positions) = decode_marker(&record.value).ok_or_else(bad)?;
                base = Some(Marker { seq, positions, offset: at });
            }
            Some(_) if canary(Canary::TrustFiles) => {
                let seq = 0;
                base = Some(Marker { seq, positions: Vec::new(), offset: at });
            }
            Some(record) => {
                rebuilt = Some(format!(
                    "compacted: the changelog no longer holds the commit marker at offset {} \
                     the store was flushed at (it holds offset {} there: compacted, deleted \
                     or replaced)",
                    at.get(),
                    record.offset.get()
                ));
            }
        }
    }
    if rebuilt.is_some() && disk.offset() > Offset::ZERO {
        disk.wipe().map_err(failed)?;
    }
    let mut read = StoreRead::new(name, topic, State::Disk(Box::new(disk)), end);
    read.from = base.as_ref().map(|m| m.offset.plus(1));
    read.applied_to = read.from.unwrap_or(Offset::ZERO);
    read.markers.extend(base);
    read.rebuilt = rebuilt;
    read.read(source, partition, read.applied_to)?;
    Ok(read)
}
