//! The disk store: a log-structured merge tree of our own, small and explicit.
//!
//! - **Memtable**: the changes since the last flush, in key order (a deletion is kept as
//!   `None` while older runs may hold the key). Holds committed and uncommitted changes alike
//!   while the task works; it is flushed only right after a commit, when it holds exactly the
//!   committed state.
//! - **Runs**: immutable sorted files ([`super::run`]), newest first, each of a level: a flush
//!   writes a level-0 run; [`FANOUT`] runs of one level merge into one of the next level (a
//!   base-`FANOUT` counter, so a key is rewritten about log_FANOUT(runs) times), and a merge
//!   that includes the oldest run drops deletions.
//! - **Manifest**: the runs, the changelog offset they reflect, the entry count and the
//!   store's identity, checksummed, replaced atomically (temporary file, fdatasync, rename,
//!   directory fsync) after the runs it names are durable. It is the store's commit point.
//!
//! Invariants: the manifest's offset is a changelog end some transaction committed at, and
//! the runs it names hold exactly the store's state at that offset; a run file is durable
//! (data and directory entry) before a manifest names it, and removed only after a durable
//! manifest stopped naming it.

use super::files::{
    Damage, DiskOptions, Files, StoreError, bounds_ordered, canary_trusts_damage, is_empty_range,
};
use super::manifest::Manifest;
use super::run::{self, Block, Lookup, Run, RunMeta, RunWriter, key_hash};
use crate::Offset;
use chronik_engine::canary::{self, Canary};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

/// Runs of one level that merge into one of the next.
pub const FANOUT: usize = 4;
const MANIFEST: &str = "MANIFEST";
/// Bytes a memtable entry costs beyond its key and value (tree node share, vectors).
const ENTRY_OVERHEAD: usize = 64;

/// The memtable's share of the cache: an eighth. It bounds the changelog a restart reads
/// after a crash (what the store had not yet taken), so it is kept small; the rest caches
/// blocks.
fn memtable_bytes(options: DiskOptions) -> usize {
    options.cache_bytes / 8
}

fn block_cache_bytes(options: DiskOptions) -> usize {
    options.cache_bytes - memtable_bytes(options)
}

/// Decoded blocks kept in memory, first in, first out, within a byte budget.
#[derive(Debug, Default)]
struct BlockCache {
    blocks: HashMap<(u64, usize), Arc<Block>>,
    order: VecDeque<(u64, usize)>,
    bytes: usize,
    capacity: usize,
}

impl BlockCache {
    fn get(&self, key: (u64, usize)) -> Option<Arc<Block>> {
        debug_assert_eq!(self.blocks.len(), self.order.len(), "each cached block is in the order");
        self.blocks.get(&key).cloned()
    }

    fn insert(&mut self, key: (u64, usize), block: Arc<Block>) {
        assert!(block.bytes() > 0, "a cached block holds bytes");
        self.bytes += block.bytes();
        match self.blocks.insert(key, block) {
            None => self.order.push_back(key),
            // Replaced (two readers of one block): its bytes were counted once already.
            Some(old) => self.bytes -= old.bytes(),
        }
        while self.bytes > self.capacity {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(block) = self.blocks.remove(&old) {
                assert!(self.bytes >= block.bytes(), "the cache counts each block it holds");
                self.bytes -= block.bytes();
            }
        }
        assert_eq!(self.blocks.len(), self.order.len(), "each cached block is in the order");
        debug_assert_eq!(
            self.bytes,
            self.blocks.values().map(|b| b.bytes()).sum::<usize>(),
            "the cache's bytes are the sum of its blocks'"
        );
    }

    fn forget_run(&mut self, id: u64) {
        self.order.retain(|key| key.0 != id);
        let bytes = &mut self.bytes;
        self.blocks.retain(|key, block| {
            let keep = key.0 != id;
            if !keep {
                assert!(*bytes >= block.bytes(), "the cache counts each block it holds");
                *bytes -= block.bytes();
            }
            keep
        });
        assert_eq!(self.blocks.len(), self.order.len(), "each cached block is in the order");
        assert!(self.blocks.keys().all(|key| key.0 != id), "a forgotten run has no block");
    }
}

/// A disk store of one task.
pub struct DiskStore {
    files: Arc<Files>,
    identity: String,
    options: DiskOptions,
    memtable: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    memtable_bytes: usize,
    /// Newest first; levels never decrease from newest to oldest.
    runs: Vec<Run>,
    cache: Mutex<BlockCache>,
    /// The changelog offset the runs reflect (what the manifest says).
    offset: Offset,
    /// Live entries: runs and memtable together.
    len: u64,
    next_id: u64,
    /// The last key [`DiskStore::get`] looked up in the runs and whether it was there: a put
    /// after a get (a count's update) then knows without a second lookup whether the key is
    /// new. Forgotten on every change.
    last_lookup: Mutex<LastLookup>,
    /// Damage was found: the manifest is gone and no flush may write another.
    condemned: std::sync::atomic::AtomicBool,
    /// Whether the open found a manifest: without one the store starts empty, which is a
    /// first start only if its changelog is empty too.
    manifest_found: bool,
    /// The first error a read through `&self` met (a damaged block, a failed read): the
    /// task fails before its next commit, so nothing read wrong is ever committed.
    failure: Mutex<Option<StoreError>>,
}

impl std::fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStore")
            .field("identity", &self.identity)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("memtable", &self.memtable.len())
            .field("runs", &self.runs)
            .finish_non_exhaustive()
    }
}

/// See [`DiskStore::last_lookup`].
#[derive(Debug, Default)]
struct LastLookup {
    key: Vec<u8>,
    exists: bool,
    valid: bool,
}

/// Where a lookup found a key.
type Found<'a> = Option<Cow<'a, [u8]>>;

impl DiskStore {
    /// Open the store in `files` (its own directory), or start it empty; the second value
    /// says why an existing store was not usable (then it was wiped: the caller rebuilds it
    /// from the changelog).
    pub fn open(
        files: Files,
        identity: String,
        options: DiskOptions,
    ) -> Result<(DiskStore, Option<String>), StoreError> {
        let files = Arc::new(files);
        files.create_directory()?;
        let cache = BlockCache { capacity: block_cache_bytes(options), ..BlockCache::default() };
        let mut store = DiskStore {
            files: Arc::clone(&files),
            identity,
            options,
            memtable: BTreeMap::new(),
            memtable_bytes: 0,
            runs: Vec::new(),
            cache: Mutex::new(cache),
            offset: Offset::ZERO,
            len: 0,
            next_id: 0,
            last_lookup: Mutex::new(LastLookup::default()),
            condemned: std::sync::atomic::AtomicBool::new(false),
            manifest_found: false,
            failure: Mutex::new(None),
        };
        let reason = match store.load() {
            Ok(()) => None,
            Err(StoreError::Damaged(damage)) => Some(damage.to_string()),
            Err(error) => return Err(error),
        };
        if reason.is_some() {
            store.wipe()?;
        }
        store.remove_unnamed()?;
        // Pair with `write_manifest`: what the manifest named holds again once loaded.
        assert!(store.runs.iter().all(|r| r.meta.id < store.next_id), "run ids below next id");
        assert!(store.levels_ordered(), "levels never decrease from newest to oldest");
        Ok((store, reason))
    }

    fn load(&mut self) -> Result<(), StoreError> {
        // No manifest: a new store, one whose first flush a crash cut short, or one condemned
        // after damage (reported then). It starts empty; files left beside it are removed.
        assert!(self.runs.is_empty() && self.memtable.is_empty(), "a store loads once, empty");
        let Some(bytes) = self.files.read_small(MANIFEST)? else { return Ok(()) };
        self.manifest_found = true;
        let manifest = Manifest::decode(&bytes)
            .ok_or_else(|| StoreError::Damaged(Damage::new(MANIFEST, "does not decode")))?;
        if manifest.identity != self.identity {
            return Err(StoreError::Damaged(Damage::new(MANIFEST, "another store's (foreign)")));
        }
        let mut runs = Vec::with_capacity(manifest.runs.len());
        for meta in &manifest.runs {
            runs.push(Run::open(&self.files, *meta)?);
        }
        self.runs = runs;
        assert_eq!(self.runs.len(), manifest.runs.len(), "every run named is open");
        self.offset = Offset::new(manifest.offset);
        self.len = manifest.len;
        self.next_id = manifest.next_id;
        Ok(())
    }

    /// Whether the runs' levels never decrease from newest to oldest.
    fn levels_ordered(&self) -> bool {
        self.runs.windows(2).all(|pair| pair[0].meta.level <= pair[1].meta.level)
    }

    /// Whether `memtable_bytes` is the sum of the memtable's entries' sizes.
    fn memtable_accounted(&self) -> bool {
        let sum: usize = self
            .memtable
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD)
            .sum();
        sum == self.memtable_bytes
    }

    /// Forget everything: the store is empty at offset 0, its directory without files.
    pub fn wipe(&mut self) -> Result<(), StoreError> {
        self.forget_lookup();
        self.condemned.store(false, std::sync::atomic::Ordering::Relaxed);
        self.runs.clear();
        *self.cache.lock().expect("cache lock") =
            BlockCache { capacity: block_cache_bytes(self.options), ..BlockCache::default() };
        self.memtable.clear();
        self.memtable_bytes = 0;
        self.offset = Offset::ZERO;
        self.len = 0;
        // The manifest first: without it, no run file is believed.
        self.files.remove_if_present(&self.files.path(MANIFEST))?;
        self.files.sync()?;
        for name in self.files.list()? {
            self.files.remove_if_present(&self.files.path(&name))?;
        }
        self.files.sync()
    }

    /// Remove the files no manifest names: runs a crash left half built or merged away.
    fn remove_unnamed(&self) -> Result<(), StoreError> {
        let named: Vec<u64> = self.runs.iter().map(|r| r.meta.id).collect();
        assert!(
            named.iter().enumerate().all(|(i, id)| !named[..i].contains(id)),
            "a run is named once"
        );
        let mut removed = false;
        for name in self.files.list()? {
            let keep = name == MANIFEST
                || run::parse_run_name(&name).is_some_and(|id| named.contains(&id));
            if !keep {
                assert_ne!(name, MANIFEST, "the manifest is never removed as unnamed");
                self.files.remove_if_present(&self.files.path(&name))?;
                removed = true;
            }
        }
        if removed {
            self.files.sync()?;
        }
        Ok(())
    }

    /// Make the next open rebuild this store (after damage was found).
    pub fn condemn(&self) {
        self.condemned.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.files.remove_if_present(&self.files.path(MANIFEST));
        let _ = self.files.sync();
    }

    pub fn offset(&self) -> Offset {
        self.offset
    }

    /// Whether the open found the store's manifest (else it started empty).
    pub fn manifest_found(&self) -> bool {
        self.manifest_found
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the memtable has grown to its share of the cache: flush after the commit.
    pub fn wants_flush(&self) -> bool {
        debug_assert!(!self.memtable.is_empty() || self.memtable_bytes == 0, "empty: no bytes");
        self.memtable_bytes >= memtable_bytes(self.options)
    }

    /// Whether the memtable has grown to twice its share: a restore flushes only then (and
    /// leaves the flush, and the merges it may start, to the first commit otherwise).
    pub fn must_flush(&self) -> bool {
        assert!(
            self.memtable_bytes >= self.memtable.len() * ENTRY_OVERHEAD,
            "memtable bytes count each entry's overhead"
        );
        self.memtable_bytes >= 2 * memtable_bytes(self.options)
    }

    pub fn runs(&self) -> usize {
        assert!(self.levels_ordered(), "levels never decrease from newest to oldest");
        self.runs.len()
    }

    /// Bytes held in memory: memtable, cached blocks, run indexes and filters.
    pub fn resident_bytes(&self) -> usize {
        assert!(
            self.memtable_bytes >= self.memtable.len() * ENTRY_OVERHEAD,
            "memtable bytes count each entry's overhead"
        );
        self.memtable_bytes
            + self.cache.lock().map_or(0, |c| c.bytes)
            + self.runs.iter().map(Run::resident_bytes).sum::<usize>()
    }

    /// Take the first error a read met, if any.
    pub fn take_failure(&self) -> Option<StoreError> {
        self.failure.lock().ok()?.take()
    }

    fn fail(&self, error: StoreError) {
        // Only an open finds a store unavailable; a read fails with damage or I/O.
        assert!(!matches!(error, StoreError::Unavailable(_)), "a read fails by damage or I/O");
        if let Ok(mut failure) = self.failure.lock() {
            failure.get_or_insert(error);
        }
    }

    fn block(&self, run: &Run, i: usize) -> Result<Arc<Block>, StoreError> {
        assert!(i < run.blocks(), "a block read is one of its run's");
        let key = (run.meta.id, i);
        if let Some(block) = self.cache.lock().expect("cache lock").get(key) {
            return Ok(block);
        }
        let block = Arc::new(run.read_block(i)?);
        self.cache.lock().expect("cache lock").insert(key, Arc::clone(&block));
        Ok(block)
    }

    /// `key`'s value in the runs, newest first.
    fn lookup_runs(&self, key: &[u8]) -> Result<Found<'_>, StoreError> {
        let hash = key_hash(key);
        for run in &self.runs {
            if !run.may_contain(hash) {
                continue;
            }
            let Some(i) = run.block_for(key) else { continue };
            debug_assert!(i < run.blocks(), "the index names one of the run's blocks");
            let block = self.block(run, i)?;
            match block.find(key) {
                Lookup::Absent => {}
                Lookup::Deleted => return Ok(None),
                Lookup::Value(value) => return Ok(Some(Cow::Owned(value.to_vec()))),
            }
        }
        Ok(None)
    }

    /// `key`'s value; a read that fails is remembered ([`DiskStore::take_failure`]) and
    /// answers `None`.
    pub fn get(&self, key: &[u8]) -> Found<'_> {
        if let Some(value) = self.memtable.get(key) {
            return value.as_deref().map(Cow::Borrowed);
        }
        let found = self.lookup_runs(key).unwrap_or_else(|error| {
            self.fail(error);
            None
        });
        if let Ok(mut last) = self.last_lookup.lock() {
            last.key.clear();
            last.key.extend_from_slice(key);
            last.exists = found.is_some();
            last.valid = true;
        }
        found
    }

    fn exists(&self, key: &[u8]) -> bool {
        match self.memtable.get(key) {
            Some(value) => value.is_some(),
            None => self.exists_in_runs(key),
        }
    }

    /// Whether `key`, which the memtable does not hold, is live in the runs: the last
    /// lookup's answer if it was of this key, else a lookup (a read that fails is remembered,
    /// as in [`DiskStore::get`]).
    fn exists_in_runs(&self, key: &[u8]) -> bool {
        if let Ok(last) = self.last_lookup.lock()
            && last.valid
            && last.key == key
        {
            return last.exists;
        }
        self.lookup_runs(key)
            .unwrap_or_else(|error| {
                self.fail(error);
                None
            })
            .is_some()
    }

    fn forget_lookup(&self) {
        if let Ok(mut last) = self.last_lookup.lock() {
            last.valid = false;
        }
    }

    /// Set `key`'s change in the memtable; returns whether the key was there before (in the
    /// memtable, or else in the runs), with one walk of the memtable for a key it holds.
    fn set(&mut self, key: &[u8], value: Option<&[u8]>) -> bool {
        let size =
            |v: &Option<Vec<u8>>| key.len() + v.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD;
        if let Some(slot) = self.memtable.get_mut(key) {
            let existed = slot.is_some();
            debug_assert!(self.memtable_bytes >= size(slot), "memtable bytes count each entry");
            self.memtable_bytes -= size(slot);
            match (slot.as_mut(), value) {
                (Some(stored), Some(value)) => {
                    stored.clear();
                    stored.extend_from_slice(value);
                }
                (_, value) => *slot = value.map(<[u8]>::to_vec),
            }
            self.memtable_bytes += size(slot);
            self.forget_lookup();
            return existed;
        }
        // One walk of the memtable found nothing: ask the runs only.
        let existed = self.exists_in_runs(key);
        self.forget_lookup();
        let slot = value.map(<[u8]>::to_vec);
        self.memtable_bytes += size(&slot);
        let previous = self.memtable.insert(key.to_vec(), slot);
        debug_assert!(previous.is_none(), "a key the memtable lacked is added once");
        existed
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        if !self.set(key, Some(value)) {
            self.len += 1;
        }
        // Per record: debug only. The key is live now, in memory.
        debug_assert!(self.memtable.get(key).is_some_and(Option::is_some), "a put is in memory");
    }

    /// Returns whether the key was there.
    pub fn delete(&mut self, key: &[u8]) -> bool {
        let was = self.exists(key);
        self.forget_lookup();
        if was {
            self.len = self.len.saturating_sub(1);
            if self.runs.is_empty() {
                // No older run holds it: nothing to shadow.
                if let Some(slot) = self.memtable.remove(key) {
                    let size = key.len() + slot.map_or(0, |v| v.len()) + ENTRY_OVERHEAD;
                    debug_assert!(self.memtable_bytes >= size, "memtable bytes count each entry");
                    self.memtable_bytes -= size;
                }
            } else {
                self.set(key, None);
            }
        }
        // Per record: debug only. A deleted key is shadowed or gone from memory.
        debug_assert!(
            self.memtable.get(key).is_none_or(Option::is_none),
            "a deleted key has no value in memory"
        );
        was
    }

    /// Entries with keys within the bounds, in key order.
    pub fn range(&self, low: Bound<&[u8]>, high: Bound<&[u8]>) -> DiskRange<'_> {
        if is_empty_range(low, high) {
            let nothing: MemtableIter<'_> = Box::new(std::iter::empty());
            let high = high.map(<[u8]>::to_vec);
            let memtable = nothing.peekable();
            return DiskRange { store: Some(self), memtable, cursors: Vec::new(), high };
        }
        assert!(bounds_ordered(low, high), "a range's bounds are in order");
        let memtable: MemtableIter<'_> = Box::new(
            self.memtable.range::<[u8], _>((low, high)).map(|(k, v)| (k.as_slice(), v.as_deref())),
        );
        let (low, high) = (low.map(<[u8]>::to_vec), high.map(<[u8]>::to_vec));
        let cursors = self.runs.iter().map(|run| RunCursor::new(run, &low, Some(self))).collect();
        DiskRange { store: Some(self), memtable: memtable.peekable(), cursors, high }
    }

    /// Write the memtable as a run and record `offset`, the changelog end of the commit that
    /// made the memtable's state, in a new manifest; then merge runs as the levels fill.
    /// Called only right after a commit (or a restore), so the memtable holds committed state.
    pub fn flush(&mut self, offset: Offset) -> Result<(), StoreError> {
        if self.condemned.load(std::sync::atomic::Ordering::Relaxed) {
            // A new manifest would name the damaged runs again.
            return Err(StoreError::Damaged(Damage::new(MANIFEST, "condemned after damage")));
        }
        let result = self.write_memtable(offset);
        match &result {
            // A merge read a damaged run: the next open rebuilds the store.
            Err(StoreError::Damaged(_)) => self.condemn(),
            Err(_) => {}
            Ok(()) => {
                assert!(self.memtable.is_empty() && self.memtable_bytes == 0, "flushed: empty");
                assert_eq!(self.offset, offset, "a flush records its offset");
            }
        }
        result
    }

    fn write_memtable(&mut self, offset: Offset) -> Result<(), StoreError> {
        self.forget_lookup();
        assert!(self.memtable_accounted(), "memtable bytes are the sum of its entries'");
        if self.memtable.is_empty() && offset == self.offset {
            return Ok(());
        }
        let mut runs_named: Vec<RunMeta> = self.runs.iter().map(|r| r.meta).collect();
        if self.memtable.is_empty() {
            self.write_manifest(offset, &runs_named)?;
        } else {
            let id = self.take_id();
            let mut writer = RunWriter::create(&self.files, id, 0, self.memtable.len() as u64)?;
            let keep_deletions = !self.runs.is_empty();
            let mut written = 0;
            for (key, value) in &self.memtable {
                if value.is_some() || keep_deletions {
                    writer.add(key, value.as_deref())?;
                    written += 1;
                }
            }
            let meta = writer.finish()?;
            assert_eq!((meta.id, meta.level, meta.entries), (id, 0, written), "the run as built");
            if canary::active(Canary::StoreOffsetAheadOfData) {
                // The bug: the new offset is recorded before the run holding its data.
                self.write_manifest(offset, &runs_named)?;
            }
            self.files.sync()?;
            runs_named.insert(0, meta);
            self.write_manifest(offset, &runs_named)?;
            self.runs.insert(0, Run::open(&self.files, meta)?);
        }
        self.offset = offset;
        self.memtable.clear();
        self.memtable_bytes = 0;
        self.merge_full_levels()
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        assert!(id < u64::MAX, "run ids never wrap");
        assert!(self.runs.iter().all(|r| r.meta.id < id), "a new run's id is unused");
        self.next_id += 1;
        id
    }

    fn write_manifest(&self, offset: Offset, runs: &[RunMeta]) -> Result<(), StoreError> {
        assert!(
            offset >= self.offset || canary::active(Canary::StoreOffsetNotRead),
            "the store's offset never goes back"
        );
        assert!(
            runs.iter().enumerate().all(|(i, r)| runs[..i].iter().all(|o| o.id != r.id)),
            "a manifest names a run once"
        );
        let manifest = Manifest {
            identity: self.identity.clone(),
            offset: offset.get(),
            len: self.len,
            next_id: self.next_id,
            runs: runs.to_vec(),
        };
        self.files.write_durably(MANIFEST, manifest.encode())
    }

    /// Merge every level that holds [`FANOUT`] runs into one run of the next level.
    fn merge_full_levels(&mut self) -> Result<(), StoreError> {
        loop {
            let mut start = 0;
            let group = loop {
                let Some(first) = self.runs.get(start) else { break None };
                let end = start
                    + self.runs[start..]
                        .iter()
                        .take_while(|r| r.meta.level == first.meta.level)
                        .count();
                if end - start >= FANOUT {
                    break Some(start..end);
                }
                start = end;
            };
            let Some(group) = group else { return Ok(()) };
            let before = self.runs.len();
            self.merge(group)?;
            // Progress: a merge replaces FANOUT runs or more by one, so the loop ends.
            assert!(self.runs.len() + FANOUT - 1 <= before, "a merge leaves fewer runs");
        }
    }

    fn merge(&mut self, group: std::ops::Range<usize>) -> Result<(), StoreError> {
        let first = self.runs[group.start].meta.level;
        assert!(group.len() >= FANOUT, "a merge takes a full level");
        assert!(
            self.runs[group.clone()].iter().all(|r| r.meta.level == first),
            "a merge takes runs of one level"
        );
        let level = first.saturating_add(1);
        let expected = self.runs[group.clone()].iter().map(|r| r.meta.entries).sum();
        let keep_deletions = group.end < self.runs.len();
        let id = self.take_id();
        let mut writer = RunWriter::create(&self.files, id, level, expected)?;
        {
            let cursors = self.runs[group.clone()]
                .iter()
                .map(|run| RunCursor::new(run, &Bound::Unbounded, None))
                .collect();
            let mut merged = DiskRange {
                store: None,
                memtable: (Box::new(std::iter::empty()) as MemtableIter<'_>).peekable(),
                cursors,
                high: Bound::Unbounded,
            };
            while let Some(entry) = merged.next_change() {
                let (key, value) = entry?;
                if value.is_some() || keep_deletions {
                    writer.add(&key, value.as_deref())?;
                }
            }
        }
        let meta = writer.finish()?;
        // A merge drops shadowed entries (and deletions, at the oldest) but invents none.
        assert!(
            meta.entries <= expected || canary_trusts_damage(),
            "a merge writes at most the entries it read"
        );
        self.files.sync()?;
        let mut named: Vec<RunMeta> = self.runs.iter().map(|r| r.meta).collect();
        named.splice(group.clone(), [meta]);
        self.write_manifest(self.offset, &named)?;
        let opened = Run::open(&self.files, meta)?;
        let old: Vec<Run> = self.runs.splice(group, [opened]).collect();
        assert!(self.levels_ordered(), "levels never decrease from newest to oldest");
        let mut cache = self.cache.lock().expect("cache lock");
        for run in &old {
            cache.forget_run(run.meta.id);
        }
        drop(cache);
        for run in old {
            let path = self.files.path(&run::run_name(run.meta.id));
            drop(run);
            self.files.remove_if_present(&path)?;
        }
        self.files.sync()
    }

    /// Apply one restored changelog change.
    pub fn apply(&mut self, key: &[u8], value: Option<&[u8]>) {
        match value {
            Some(value) => self.put(key, value),
            None => {
                self.delete(key);
            }
        }
    }
}

/// One run's entries in key order, a block at a time.
struct RunCursor<'a> {
    run: &'a Run,
    next_block: usize,
    block: Vec<OwnedChange>,
    at: usize,
    /// Read through the store's cache (a range), or directly (a merge).
    store: Option<&'a DiskStore>,
    low: Bound<Vec<u8>>,
}

impl<'a> RunCursor<'a> {
    fn new(run: &'a Run, low: &Bound<Vec<u8>>, store: Option<&'a DiskStore>) -> RunCursor<'a> {
        let next_block = match low {
            Bound::Included(key) | Bound::Excluded(key) => {
                run.block_for(key).unwrap_or(run.blocks())
            }
            Bound::Unbounded => 0,
        };
        assert!(next_block <= run.blocks(), "a cursor starts within its run");
        RunCursor { run, next_block, block: Vec::new(), at: 0, store, low: low.clone() }
    }

    /// The entry under the cursor.
    fn peek(&mut self) -> Result<Option<&OwnedChange>, StoreError> {
        while self.at == self.block.len() {
            if self.next_block >= self.run.blocks() {
                return Ok(None);
            }
            let bytes = match self.store {
                Some(store) => store.block(self.run, self.next_block)?,
                None => Arc::new(self.run.read_block(self.next_block)?),
            };
            self.next_block += 1;
            assert!(self.next_block <= self.run.blocks(), "a cursor stays within its run");
            let low = &self.low;
            self.block = bytes
                .iter()
                .filter(|(key, _)| match low {
                    Bound::Included(l) => *key >= l.as_slice(),
                    Bound::Excluded(l) => *key > l.as_slice(),
                    Bound::Unbounded => true,
                })
                .map(|(key, value)| (key.to_vec(), value.map(<[u8]>::to_vec)))
                .collect();
            // Pair with `RunWriter::add`, which refuses keys out of order before a block is
            // written: a block read back (its checksum and order verified) holds them in order.
            debug_assert!(
                self.block.windows(2).all(|pair| pair[0].0 < pair[1].0) || canary_trusts_damage(),
                "a block's keys strictly increase when read back"
            );
            self.at = 0;
        }
        Ok(self.block.get(self.at))
    }
}

/// A key and its change (`None`: deleted), borrowed or owned.
type Change<'a> = (&'a [u8], Option<&'a [u8]>);
type OwnedChange = (Vec<u8>, Option<Vec<u8>>);
type MemtableIter<'a> = Box<dyn Iterator<Item = Change<'a>> + 'a>;
type MemtableEntries<'a> = std::iter::Peekable<MemtableIter<'a>>;
/// A key and its newest change, as a merge yields them.
type Merged<'a> = (Cow<'a, [u8]>, Option<Cow<'a, [u8]>>);

/// A merged range over the memtable and runs; iterating yields live entries.
pub struct DiskRange<'a> {
    store: Option<&'a DiskStore>,
    memtable: MemtableEntries<'a>,
    cursors: Vec<RunCursor<'a>>,
    high: Bound<Vec<u8>>,
}

impl std::fmt::Debug for DiskRange<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskRange").field("runs", &self.cursors.len()).finish_non_exhaustive()
    }
}

impl<'a> DiskRange<'a> {
    /// The next key of the merge, with its newest change (a value, or `None` for deleted).
    fn next_change(&mut self) -> Option<Result<Merged<'a>, StoreError>> {
        let mut smallest: Option<Vec<u8>> = self.memtable.peek().map(|(k, _)| k.to_vec());
        for cursor in &mut self.cursors {
            match cursor.peek() {
                Ok(Some((key, _))) => {
                    if smallest.as_ref().is_none_or(|s| key < s) {
                        smallest = Some(key.clone());
                    }
                }
                Ok(None) => {}
                Err(error) => return Some(Err(error)),
            }
        }
        let key = smallest?;
        let beyond = match &self.high {
            Bound::Included(h) => key > *h,
            Bound::Excluded(h) => key >= *h,
            Bound::Unbounded => false,
        };
        if beyond {
            return None;
        }
        // The newest source with the key wins: the memtable, then the runs in order.
        let mut change: Option<Option<Cow<'a, [u8]>>> = None;
        if self.memtable.peek().is_some_and(|(k, _)| *k == key.as_slice()) {
            let (_, value) = self.memtable.next().expect("peeked");
            change = Some(value.map(Cow::Borrowed));
        }
        for cursor in &mut self.cursors {
            let matches = matches!(cursor.peek(), Ok(Some((k, _))) if *k == key);
            if matches {
                let (_, value) = std::mem::take(&mut cursor.block[cursor.at]);
                cursor.at += 1;
                if change.is_none() {
                    change = Some(value.map(Cow::Owned));
                }
            }
        }
        debug_assert!(
            self.memtable.peek().is_none_or(|(k, _)| *k > key.as_slice()),
            "the memtable moved past the key it gave"
        );
        Some(Ok((Cow::Owned(key), change.expect("the smallest key has a source"))))
    }
}

impl<'a> Iterator for DiskRange<'a> {
    type Item = (Cow<'a, [u8]>, Cow<'a, [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_change()? {
                Ok((key, Some(value))) => return Some((key, value)),
                Ok((_, None)) => {}
                Err(error) => {
                    // Only a merge reads without a store, and it takes changes, never this.
                    assert!(self.store.is_some(), "a merge does not iterate live entries");
                    if let Some(store) = self.store {
                        store.fail(error);
                    }
                    return None;
                }
            }
        }
    }
}

/// Check the disk store in `directory` without changing any file (for `chronik verify`): its
/// manifest decodes, each run it names opens (footer, index and Bloom filter checksums, and
/// their agreement with the manifest), and every block of every run has a valid checksum and
/// parses in key order. The store's identity is not checked (the caller does not know whose
/// it is). Returns the runs checked, `None` when there is no manifest (a new store, or one
/// condemned after damage: either starts empty and is rebuilt from its changelog); the first
/// damage found is `Err(StoreError::Damaged)`, naming the file.
///
/// # Errors
/// [`StoreError::Damaged`] for damage, [`StoreError::Io`] when a file cannot be read.
pub fn check_directory(
    io: Arc<dyn chronik_engine::io::Io>,
    directory: std::path::PathBuf,
) -> Result<Option<usize>, StoreError> {
    let files = Arc::new(Files { io, directory });
    let Some(bytes) = files.read_small(MANIFEST)? else { return Ok(None) };
    let manifest = Manifest::decode(&bytes)
        .ok_or_else(|| StoreError::Damaged(Damage::new(MANIFEST, "does not decode")))?;
    for meta in &manifest.runs {
        let run = Run::open(&files, *meta)?;
        assert_eq!(run.meta, *meta, "a run opens as the manifest names it");
        for block in 0..run.blocks() {
            run.read_block(block)?;
        }
    }
    Ok(Some(manifest.runs.len()))
}
