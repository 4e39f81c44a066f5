//! A task's key-value stores: in memory ([`StoreKind::Memory`]), or on disk
//! ([`StoreKind::Disk`]: a log-structured merge tree of our own under the engine's
//! `state/` directory, through the engine's I/O, with a bounded cache), both backed by a
//! compacted changelog topic.
//!
//! A disk store records the changelog offset it reflects, atomically with its data; it takes
//! changes only right after their transaction committed, so it never runs ahead of the
//! changelog; at start it reads only the changelog after its offset. A missing, stale,
//! foreign or damaged store is detected and rebuilt from the changelog.

pub(crate) mod disk;
mod files;
mod manifest;
mod memory;
mod merge;
mod policy;
pub(crate) mod run;
mod typed;

use crate::Record;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::{Bound, RangeBounds};

pub(crate) use disk::DiskStore;
pub use disk::{DiskMerges, check_directory};
pub use files::{Damage, DiskOptions, StoreError};
pub(crate) use files::{Files, bounds_ordered, canary_trusts_damage, is_empty_range};
pub use memory::StoreMemory;
pub use typed::Typed;

/// A processor's `store.get(key)?`: the store's failure as the processor's error. (The runner
/// reports the store's own, typed failure, remembered by the store, ahead of it.)
impl From<StoreError> for crate::processor::ProcessError {
    fn from(error: StoreError) -> crate::processor::ProcessError {
        crate::processor::ProcessError::new(error.to_string())
    }
}

/// Bytes a change waiting for the commit costs beyond its key and value: its hash table slot
/// and two heap allocations (measured with heaptrack).
const CHANGE_OVERHEAD: usize = 96;
/// Changes' table capacity a store keeps across commits.
const DIRTY_KEPT: usize = 1024;

/// Hashes the keys of changes waiting for the commit with xxh3 (SipHash took 6% of a disk
/// store's update). Fixed seeds, as `BuildHasherDefault<DefaultHasher>` had.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The first byte of a changelog value that holds a stored value.
pub(crate) const CHANGELOG_PUT: u8 = 1;

/// Where a store keeps its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StoreKind {
    /// A map in memory, restored at every start from a snapshot and the changelog after it:
    /// the fastest, bounded by memory, and a start costs time proportional to the state.
    #[default]
    Memory,
    /// Sorted runs on disk, in a memory budget shared with the application's other disk
    /// stores ([`DiskOptions::budget_bytes`]): bounded memory, and a start reads
    /// only the changelog the store had not yet taken (the tail).
    Disk(DiskOptions),
}

impl StoreKind {
    /// A disk store with the default cache.
    pub fn disk() -> StoreKind {
        StoreKind::Disk(DiskOptions::default())
    }
}

impl std::str::FromStr for StoreKind {
    type Err = String;

    /// `memory`, `disk` (in the application's shared budget), or `disk:<MiB>` (a budget of
    /// its own, shared by its partitions).
    fn from_str(text: &str) -> Result<StoreKind, String> {
        let kind = match text {
            "memory" => Ok(StoreKind::Memory),
            "disk" => Ok(StoreKind::disk()),
            other => other
                .strip_prefix("disk:")
                .and_then(|mib| mib.parse::<usize>().ok())
                .filter(|&mib| mib > 0)
                // Checked: `mib << 20` drops the high bits, so a huge size would become 0.
                .and_then(|mib| mib.checked_mul(1 << 20))
                .map(|bytes| StoreKind::Disk(DiskOptions { budget_bytes: Some(bytes) }))
                .ok_or_else(|| {
                    format!("unknown store kind {other:?}: memory, disk, or disk:<MiB>")
                }),
        };
        // The budget is split in eighths (the memtables' share): a store parsed has at least
        // a MiB, never a memtable of no bytes.
        assert!(
            !matches!(kind, Ok(StoreKind::Disk(DiskOptions { budget_bytes: Some(b) })) if b < 1 << 20),
            "a disk store parsed has a budget of a MiB or more"
        );
        kind
    }
}

impl<'a> IntoIterator for &'a Store {
    type Item = Result<Entry<'a>, StoreError>;
    type IntoIter = Entries<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// A store's entries in key order ([`Store::range`], [`Store::iter`]), each read checked:
/// a disk read that fails is the last item, an `Err`, never a quiet early end.
pub struct Entries<'a> {
    kind: &'static str,
    /// `None` once an error was handed out.
    inner: Option<Box<dyn Iterator<Item = Result<Entry<'a>, StoreError>> + 'a>>,
}

impl std::fmt::Debug for Entries<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entries").field("kind", &self.kind).finish_non_exhaustive()
    }
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<Entry<'a>, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.inner.as_mut()?.next();
        if matches!(item, Some(Err(_))) {
            // A memory store's reads never fail; after a failure nothing more is read.
            assert_eq!(self.kind, "disk", "only a disk store's read fails");
            self.inner = None;
        }
        item
    }
}

/// A key-value store of one task, ordered by key: in memory, or on disk
/// ([`StoreKind`]), restored from its changelog.
#[derive(Debug, Default)]
pub struct Store {
    /// A memory store's entries.
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    /// A disk store (then `data` stays empty).
    disk: Option<Box<DiskStore>>,
    /// A memory store's changes since the last commit, one per key (the last write wins), as
    /// changelog values: [`CHANGELOG_PUT`] then the value, or empty for a delete. A hash map
    /// with a fixed hasher (an update costs one hash, not a tree walk); sorted by key when
    /// committed. (A disk store keeps its own, in key order: [`DiskStore::pending`].)
    dirty: HashMap<Vec<u8>, Vec<u8>, BuildHasherDefault<KeyHasher>>,
    dirty_bytes: usize,
}

/// A store's entries in key order: borrowed from memory, or read from disk.
pub type Entry<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

impl Store {
    /// A disk store.
    pub(crate) fn on_disk(disk: DiskStore) -> Store {
        Store { disk: Some(Box::new(disk)), ..Store::default() }
    }

    pub(crate) fn disk(&self) -> Option<&DiskStore> {
        self.disk.as_deref()
    }

    pub(crate) fn disk_mut(&mut self) -> Option<&mut DiskStore> {
        self.disk.as_deref_mut()
    }

    /// A memory store holding `data`.
    pub(crate) fn from_map(data: BTreeMap<Vec<u8>, Vec<u8>>) -> Store {
        Store { data, ..Store::default() }
    }

    pub(crate) fn memory_data(&self) -> &BTreeMap<Vec<u8>, Vec<u8>> {
        // Only a memory store snapshots its map; a disk store is its own snapshot.
        assert!(self.disk.is_none(), "a disk store has no map to snapshot");
        &self.data
    }

    /// A disk store's run files (`None` for a memory store).
    pub fn disk_runs(&self) -> Option<usize> {
        self.disk.as_ref().map(|d| d.runs())
    }

    /// What a disk store's merges did since it opened (`None` for a memory store).
    pub fn disk_merges(&self) -> Option<DiskMerges> {
        self.disk.as_ref().map(|d| d.merges())
    }

    /// Bytes a disk store holds in memory of its own: changes not yet in a run, run indexes
    /// and Bloom filters, merge buffers (`None` for a memory store). Its cached blocks are
    /// counted in the budget it shares ([`StoreMemory::resident_bytes`]).
    pub fn resident_bytes(&self) -> Option<usize> {
        self.disk.as_ref().map(|d| d.resident_bytes())
    }

    /// Whether every read of this disk store since the last check went well. A read that
    /// fails returns its error (from [`Store::get`], [`Store::contains_key`], or as the last
    /// item of [`Store::range`] and [`Store::iter`]) and is also remembered here, so a caller
    /// that dropped it is still told: inside a task the runner checks after every call and
    /// fails the task, so nothing read wrong is committed. A damaged store is condemned at
    /// once: the next runner rebuilds it from the changelog.
    pub fn check(&self) -> Result<(), StoreError> {
        let Some(disk) = &self.disk else { return Ok(()) };
        assert!(self.data.is_empty(), "a disk store keeps no map");
        disk.take_failure().map_or(Ok(()), Err)
    }

    /// Which kind of store this is.
    pub fn kind(&self) -> &'static str {
        if self.disk.is_some() { "disk" } else { "memory" }
    }

    /// `key`'s value: borrowed from memory, or read from disk. A disk read that fails is
    /// an error, never `None` ([`StoreError::Damaged`] for damage; see [`Store::check`]).
    pub fn get(&self, key: &[u8]) -> Result<Option<Cow<'_, [u8]>>, StoreError> {
        debug_assert!(self.disk.is_none() || self.data.is_empty(), "a disk store keeps no map");
        match &self.disk {
            Some(disk) => disk.get(key),
            None => Ok(self.data.get(key).map(|v| Cow::Borrowed(v.as_slice()))),
        }
    }

    /// This store through serde ([`Typed`]).
    pub fn typed<K, V>(&mut self) -> Typed<'_, K, V> {
        Typed::new(self)
    }

    /// Whether `key` has a value (a disk read that fails is an error, as in [`Store::get`]).
    pub fn contains_key(&self, key: &[u8]) -> Result<bool, StoreError> {
        debug_assert!(self.disk.is_none() || self.data.is_empty(), "a disk store keeps no map");
        match &self.disk {
            Some(disk) => disk.get(key).map(|value| value.is_some()),
            None => Ok(self.data.contains_key(key)),
        }
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        debug_assert!(self.disk.is_none() || self.data.is_empty(), "a disk store keeps no map");
        if let Some(disk) = &mut self.disk {
            // Recorded for the commit by the disk store itself (it reads back from there).
            disk.put(key, value);
            return;
        }
        // An update of a present key reuses its allocations: no new key, no tree insert.
        match self.data.get_mut(key) {
            Some(stored) => {
                stored.clear();
                stored.extend_from_slice(value);
            }
            None => {
                self.data.insert(key.to_vec(), value.to_vec());
            }
        }
        self.mark(key, Some(value));
        // Pair (per record, so debug only): a put reads back at once, and is recorded for the
        // commit.
        debug_assert!(self.get(key).ok().flatten().as_deref() == Some(value), "a put reads back");
        debug_assert!(
            self.dirty.get(key).is_some_and(|v| v.first() == Some(&CHANGELOG_PUT)),
            "a put is recorded as a put"
        );
    }

    /// Remove `key`, whether it was there or not. A blind write: a disk store reads nothing
    /// to delete a key (ask [`Store::contains_key`] first to know).
    pub fn delete(&mut self, key: &[u8]) {
        if let Some(disk) = &mut self.disk {
            disk.delete(key);
            return;
        }
        self.data.remove(key);
        self.mark(key, None);
        // Per record, so debug only.
        debug_assert!(!self.data.contains_key(key), "a deleted key is gone");
        debug_assert!(self.dirty.get(key).is_some_and(Vec::is_empty), "a delete is recorded");
    }

    /// Record the change of `key` for the next commit (the last change of a key wins): a
    /// memory store's.
    fn mark(&mut self, key: &[u8], value: Option<&[u8]>) {
        debug_assert!(self.disk.is_none(), "a disk store records its own changes");
        let size = |tagged: usize| key.len() + tagged + CHANGE_OVERHEAD;
        let tagged = match self.dirty.get_mut(key) {
            Some(tagged) => {
                debug_assert!(self.dirty_bytes >= size(tagged.len()), "dirty bytes count each");
                self.dirty_bytes -= size(tagged.len());
                tagged.clear();
                tagged
            }
            None => self.dirty.entry(key.to_vec()).or_default(),
        };
        if let Some(value) = value {
            tagged.reserve(value.len() + 1);
            tagged.push(CHANGELOG_PUT);
            tagged.extend_from_slice(value);
        }
        // Per record, so debug only: the change is tagged as the changelog will carry it.
        debug_assert_eq!(tagged.len(), value.map_or(0, |v| v.len() + 1), "a change is tagged");
        self.dirty_bytes += size(tagged.len());
        debug_assert!(
            self.dirty_bytes >= self.dirty.len() * CHANGE_OVERHEAD,
            "dirty bytes count each change"
        );
    }

    /// The changes since the last commit as changelog records, in key order.
    pub(crate) fn changes(&self) -> Vec<Record<'_>> {
        let changes: Vec<(&[u8], &[u8])> = if let Some(disk) = &self.disk {
            disk.pending().collect()
        } else {
            let mut changes: Vec<(&[u8], &[u8])> =
                self.dirty.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
            changes.sort_unstable_by(|a, b| a.0.cmp(b.0));
            changes
        };
        // Before the changes are written to the changelog, where a restore reads them back:
        // one record per key, in order, each a tagged put or an empty delete.
        assert!(changes.windows(2).all(|pair| pair[0].0 < pair[1].0), "changes in key order");
        assert!(
            changes.iter().all(|(_, v)| v.is_empty() || v[0] == CHANGELOG_PUT),
            "a change is a tagged put or a delete"
        );
        changes.into_iter().map(|(key, value)| Record::new(Some(key), value)).collect()
    }

    pub(crate) fn has_changes(&self) -> bool {
        assert_eq!(self.dirty.is_empty(), self.dirty_bytes == 0, "dirty bytes iff changes");
        match &self.disk {
            Some(disk) => disk.has_pending(),
            None => !self.dirty.is_empty(),
        }
    }

    pub(crate) fn dirty_bytes(&self) -> usize {
        if let Some(disk) = &self.disk {
            assert!(self.dirty.is_empty(), "a disk store records its own changes");
            return disk.pending_bytes();
        }
        assert!(
            self.dirty_bytes >= self.dirty.len() * CHANGE_OVERHEAD,
            "dirty bytes count each change"
        );
        self.dirty_bytes
    }

    /// The changes are committed: forget them.
    pub(crate) fn committed(&mut self) {
        assert!(self.disk.is_none() || self.data.is_empty(), "a disk store keeps no map");
        assert_eq!(
            self.dirty_bytes,
            self.dirty.iter().map(|(k, v)| k.len() + v.len() + CHANGE_OVERHEAD).sum::<usize>(),
            "dirty bytes are the sum of the changes'"
        );
        if let Some(disk) = &mut self.disk {
            disk.committed();
        }
        self.dirty.clear();
        // A commit after a large batch would leave its table's capacity behind in every
        // store of every task (hundreds of MiB with many partitions): keep a small one.
        self.dirty.shrink_to(DIRTY_KEPT);
        self.dirty_bytes = 0;
    }

    /// Entries with keys in `range`, in key order. A disk read that fails ends the entries
    /// with its error ([`StoreError::Damaged`] for damage, which also condemns the store so
    /// the next runner rebuilds it): never part of the range as if it were all of it.
    pub fn range<'a, R: RangeBounds<[u8]>>(&'a self, range: R) -> Entries<'a> {
        let kind = self.kind();
        if is_empty_range(range.start_bound(), range.end_bound()) {
            // BTreeMap::range panics on a range that ends before it starts.
            return Entries { kind, inner: Some(Box::new(std::iter::empty())) };
        }
        assert!(bounds_ordered(range.start_bound(), range.end_bound()), "range bounds in order");
        let inner: Box<dyn Iterator<Item = Result<Entry<'a>, StoreError>> + 'a> = match &self.disk {
            Some(disk) if cfg!(debug_assertions) => {
                // Pair with the run writer's order check: entries read back come in strictly
                // increasing key order (debug only: it copies every key).
                let mut last: Option<Vec<u8>> = None;
                Box::new(disk.range(range.start_bound(), range.end_bound()).inspect(move |entry| {
                    if let Ok((key, _)) = entry {
                        debug_assert!(
                            last.as_deref().is_none_or(|l| l < &**key) || canary_trusts_damage(),
                            "a range yields keys in strictly increasing order"
                        );
                        last = Some(key.to_vec());
                    }
                }))
            }
            Some(disk) => Box::new(disk.range(range.start_bound(), range.end_bound())),
            None => Box::new(
                self.data
                    .range::<[u8], _>((range.start_bound(), range.end_bound()))
                    .map(|(k, v)| Ok((Cow::Borrowed(k.as_slice()), Cow::Borrowed(v.as_slice())))),
            ),
        };
        Entries { kind, inner: Some(inner) }
    }

    /// Every entry, in key order; see [`Store::range`].
    pub fn iter(&self) -> Entries<'_> {
        self.range::<(Bound<&[u8]>, Bound<&[u8]>)>((Bound::Unbounded, Bound::Unbounded))
    }

    /// The number of keys, in O(1) and without reading: exact for a memory store; for a disk
    /// store an estimate kept at flushes and merges (writes are blind, so no write knows
    /// whether its key was new). It counts a key updated since its runs last merged more
    /// than once, misses about one new key in a hundred (Bloom filter false positives), and
    /// goes under for keys deleted again or written again after a delete, until their runs
    /// merge into the oldest; it is exact once the store's runs have merged into one.
    /// [`Store::count`] is exact.
    pub fn len_estimate(&self) -> u64 {
        assert!(self.disk.is_none() || self.data.is_empty(), "a disk store keeps no map");
        match &self.disk {
            Some(disk) => disk.len_estimate(),
            None => self.data.len() as u64,
        }
    }

    /// The number of keys, exactly: O(1) for a memory store, a scan of every entry for a
    /// disk store (a read that fails is its error, never a smaller count).
    pub fn count(&self) -> Result<u64, StoreError> {
        match &self.disk {
            Some(_) => self.iter().try_fold(0, |count, entry| entry.map(|_| count + 1)),
            None => Ok(self.data.len() as u64),
        }
    }

    /// Whether the store holds no key (a disk store reads up to its first live entry).
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        match self.iter().next() {
            None => Ok(true),
            Some(entry) => entry.map(|_| false),
        }
    }
}

#[cfg(test)]
mod tests;
