//! The disk store: a log-structured merge tree of our own, small and explicit.
//!
//! - **Pending changes**: the changes since the last commit, in key order, each tagged as
//!   the changelog carries it ([`CHANGELOG_PUT`] then the value, or empty for a deletion): the
//!   commit writes them to the changelog as they are, then moves them into the memtable.
//! - **Memtable**: the committed changes since the last flush, in key order, tagged the same
//!   way (a deletion is kept while older runs may hold the key). It is flushed only right
//!   after a commit, so it holds exactly the committed state.
//! - **Runs**: immutable sorted files ([`super::run`]), newest first, each of a level: a flush
//!   writes a level-0 run; [`super::policy`] chooses merges of a level's oldest
//!   [`super::policy::FANOUT`] runs into one of the next level, and [`super::merge`] runs
//!   them in slices of later flushes (a heap merge), so no commit waits for a whole merge
//!   unless a level falls [`super::policy::LEVEL_RUNS_MAX`] runs behind (backpressure). A
//!   merge that includes the oldest run drops deletions.
//! - **Writes are blind**: a put or delete only changes the memtable; the key count is an
//!   estimate kept per run at flushes and merges ([`RunMeta::live`]).
//! - **Manifest**: the runs, the changelog offset they reflect, the key estimate and the
//!   store's identity, checksummed, replaced atomically (temporary file, fdatasync, rename,
//!   directory fsync) after the runs it names are durable. It is the store's commit point.
//!
//! Invariants: the manifest's offset is a changelog end some transaction committed at, and
//! the runs it names hold exactly the store's state at that offset; a run file is durable
//! (data and directory entry) before a manifest names it, and removed only after a durable
//! manifest stopped naming it.

use super::CHANGELOG_PUT;
use super::files::{Damage, Files, StoreError};
use super::manifest::Manifest;
use super::memory::{self, StoreMemory};
use super::merge::{Blocks, MergeJob};
use super::policy;
use super::run::{self, Block, Lookup, Run, RunMeta, RunWriter, key_hash};
use crate::Offset;
use chronik_engine::canary::{self, Canary};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry as Slot;
use std::ops::Bound;
use std::sync::{Arc, Mutex};

mod range;

pub use range::DiskRange;

const MANIFEST: &str = "MANIFEST";
/// Bytes a memtable or pending entry costs beyond its key and tagged value: its share of a
/// tree node and two heap allocations (measured with heaptrack: 64 undercounted a memtable of
/// small entries by half).
const ENTRY_OVERHEAD: usize = 112;

/// A tagged value's value: `None` for a deletion (empty), else what follows the tag.
fn untag(tagged: &[u8]) -> Option<&[u8]> {
    let (&tag, value) = tagged.split_first()?;
    debug_assert_eq!(tag, CHANGELOG_PUT, "a stored change is a tagged put or a deletion");
    Some(value)
}

/// `value` tagged as the changelog carries it (empty for a deletion), in one allocation.
pub(crate) fn tag(value: Option<&[u8]>) -> Vec<u8> {
    let Some(value) = value else { return Vec::new() };
    let mut tagged = Vec::with_capacity(value.len() + 1);
    tagged.push(CHANGELOG_PUT);
    tagged.extend_from_slice(value);
    tagged
}

/// What a memtable entry adds to the key estimate: a value one, a deletion minus one (it
/// shadows a copy in a run), or nothing when there is no run (then it is not kept).
fn live(tagged: &[u8], runs_empty: bool) -> i64 {
    match (tagged.is_empty(), runs_empty) {
        (false, _) => 1,
        (true, true) => 0,
        (true, false) => -1,
    }
}

/// The bytes an entry is charged to the budget.
fn entry_bytes(key: &[u8], tagged: &[u8]) -> usize {
    key.len() + tagged.len() + ENTRY_OVERHEAD
}

/// What a disk store's merges did since it opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskMerges {
    /// Merges finished and named by the manifest in place of their inputs.
    pub installed: u64,
    /// Merges a flush finished before it returned, because their level held
    /// `LEVEL_RUNS_MAX` runs (the merges fell behind the flushes): the commit waited.
    pub stalls: u64,
}

/// A disk store of one task.
pub struct DiskStore {
    files: Arc<Files>,
    identity: String,
    /// Changes since the last commit, tagged; newer than the memtable.
    pending: BTreeMap<Vec<u8>, Vec<u8>>,
    pending_bytes: usize,
    /// Pending entries holding a value (the rest are deletions).
    pending_values: usize,
    /// What the pending changes add to the key estimate over the memtable's entries
    /// ([`live`]), so that a task's own changes count at once.
    pending_live: i64,
    /// Committed changes since the last flush, tagged; newer than every run.
    memtable: BTreeMap<Vec<u8>, Vec<u8>>,
    memtable_bytes: usize,
    /// Newest first; levels never decrease from newest to oldest.
    runs: Vec<Arc<Run>>,
    /// Merges under way, at most one per level ([`policy`]); each takes a slice of every
    /// flush, and is installed (named by the manifest in place of its inputs) at the flush
    /// that finishes it.
    jobs: Vec<MergeJob>,
    /// Bytes of the last level-0 run written (the rate merges must keep up with).
    flushed_bytes: u64,
    /// Merges installed, and flushes that waited for a merge to finish (backpressure).
    merges_installed: u64,
    stalls: u64,
    /// The budget this store shares with others (cache, memtables, pinned bytes), the id
    /// its blocks are cached under (new at open and wipe), and the bytes of run indexes,
    /// filters and merge buffers it charged there.
    memory: StoreMemory,
    store_id: u64,
    pinned_bytes: usize,
    /// The changelog offset the runs reflect (what the manifest says).
    offset: Offset,
    /// Memtable entries holding a value (the rest are deletions).
    memtable_values: usize,
    next_id: u64,
    /// Damage was found: the manifest is gone and no flush may write another.
    condemned: std::sync::atomic::AtomicBool,
    /// Whether the open found a manifest: without one the store starts empty, which is a
    /// first start only if its changelog is empty too.
    manifest_found: bool,
    /// Files the open removed because no manifest named them.
    unnamed_removed: u64,
    /// The first error a read through `&self` met (a damaged block, a failed read): the
    /// task fails before its next commit, so nothing read wrong is ever committed.
    failure: Mutex<Option<StoreError>>,
}

impl std::fmt::Debug for DiskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskStore")
            .field("identity", &self.identity)
            .field("offset", &self.offset)
            .field("len_estimate", &self.len_estimate())
            .field("pending", &self.pending.len())
            .field("memtable", &self.memtable.len())
            .field("runs", &self.runs)
            .field("jobs", &self.jobs)
            .finish_non_exhaustive()
    }
}

/// Where a lookup found a key.
type Found<'a> = Option<Cow<'a, [u8]>>;

impl DiskStore {
    /// Open the store in `files` (its own directory) within the budget `memory`, or start it
    /// empty; the second value says why an existing store was not usable (then it was
    /// wiped: the caller rebuilds it from the changelog).
    pub fn open(
        files: Files,
        identity: String,
        memory: StoreMemory,
    ) -> Result<(DiskStore, Option<String>), StoreError> {
        let files = Arc::new(files);
        files.create_directory()?;
        memory.join();
        let mut store = DiskStore {
            files: Arc::clone(&files),
            identity,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            pending_values: 0,
            pending_live: 0,
            memtable: BTreeMap::new(),
            memtable_bytes: 0,
            runs: Vec::new(),
            jobs: Vec::new(),
            // A flush writes at most a quarter of the write budget (`StoreMemory::flush_due`).
            flushed_bytes: (memory.write_budget() / 4) as u64,
            merges_installed: 0,
            stalls: 0,
            memory,
            store_id: memory::store_id(),
            pinned_bytes: 0,
            offset: Offset::ZERO,
            memtable_values: 0,
            next_id: 0,
            condemned: std::sync::atomic::AtomicBool::new(false),
            manifest_found: false,
            unnamed_removed: 0,
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
        store.unnamed_removed = store.remove_unnamed()?;
        store.repin();
        // Pair with `write_manifest`: what the manifest named holds again once loaded.
        assert!(store.runs.iter().all(|r| r.meta.id < store.next_id), "run ids below next id");
        assert!(store.levels_ordered(), "levels never decrease from newest to oldest");
        Ok((store, reason))
    }

    fn load(&mut self) -> Result<(), StoreError> {
        // No manifest: a new store, one whose first flush a crash cut short, or one condemned
        // after damage (reported then). It starts empty; files left beside it are removed.
        assert!(
            self.runs.is_empty() && self.memtable.is_empty() && self.pending.is_empty(),
            "a store loads once, empty"
        );
        let Some(bytes) = self.files.read_small(MANIFEST)? else { return Ok(()) };
        self.manifest_found = true;
        let manifest = Manifest::decode(&bytes)
            .ok_or_else(|| StoreError::Damaged(Damage::new(MANIFEST, "does not decode")))?;
        if manifest.identity != self.identity {
            return Err(StoreError::Damaged(Damage::new(MANIFEST, "another store's (foreign)")));
        }
        let mut runs = Vec::with_capacity(manifest.runs.len());
        for meta in &manifest.runs {
            runs.push(Arc::new(Run::open(&self.files, *meta)?));
        }
        self.runs = runs;
        assert_eq!(self.runs.len(), manifest.runs.len(), "every run named is open");
        self.offset = Offset::new(manifest.offset);
        self.next_id = manifest.next_id;
        Ok(())
    }

    /// Charge the budget for what the runs and merges now keep in memory.
    fn repin(&mut self) {
        let pinned = self.runs.iter().map(|r| r.resident_bytes()).sum::<usize>()
            + self.jobs.iter().map(MergeJob::resident_bytes).sum::<usize>();
        self.memory.charge_pinned(self.pinned_bytes, pinned);
        self.pinned_bytes = pinned;
    }

    /// Whether the runs' levels never decrease from newest to oldest.
    fn levels_ordered(&self) -> bool {
        self.runs.windows(2).all(|pair| pair[0].meta.level <= pair[1].meta.level)
    }

    /// Whether `memtable_bytes` and `pending_bytes` are the sums of their entries' sizes.
    fn memtable_accounted(&self) -> bool {
        let sum = |map: &BTreeMap<Vec<u8>, Vec<u8>>| -> usize {
            map.iter().map(|(k, v)| entry_bytes(k, v)).sum()
        };
        sum(&self.memtable) == self.memtable_bytes && sum(&self.pending) == self.pending_bytes
    }

    /// Forget everything: the store is empty at offset 0, its directory without files.
    pub fn wipe(&mut self) -> Result<(), StoreError> {
        // Their outputs are unnamed files, removed below.
        self.jobs.clear();
        self.condemned.store(false, std::sync::atomic::Ordering::Relaxed);
        self.runs.clear();
        // The blocks cached under the old id are never asked for again: they age out.
        self.store_id = memory::store_id();
        self.memtable.clear();
        self.pending.clear();
        self.memory.charge_writes(self.memtable_bytes + self.pending_bytes, 0);
        self.memtable_bytes = 0;
        self.pending_bytes = 0;
        self.pending_values = 0;
        self.pending_live = 0;
        self.memtable_values = 0;
        self.offset = Offset::ZERO;
        self.repin();
        // The manifest first: without it, no run file is believed.
        self.files.remove_if_present(&self.files.path(MANIFEST))?;
        self.files.sync()?;
        for name in self.files.list()? {
            self.files.remove_if_present(&self.files.path(&name))?;
        }
        self.files.sync()
    }

    /// Remove the files no manifest names: runs a crash left half built or merged away.
    fn remove_unnamed(&self) -> Result<u64, StoreError> {
        let named: Vec<u64> = self.runs.iter().map(|r| r.meta.id).collect();
        assert!(
            named.iter().enumerate().all(|(i, id)| !named[..i].contains(id)),
            "a run is named once"
        );
        let mut removed = 0;
        for name in self.files.list()? {
            let keep = name == MANIFEST
                || run::parse_run_name(&name).is_some_and(|id| named.contains(&id));
            if !keep {
                assert_ne!(name, MANIFEST, "the manifest is never removed as unnamed");
                self.files.remove_if_present(&self.files.path(&name))?;
                removed += 1;
            }
        }
        if removed > 0 {
            self.files.sync()?;
        }
        Ok(removed)
    }

    /// Files the open removed because no manifest named them (a crash's half-built runs).
    pub fn unnamed_removed(&self) -> u64 {
        self.unnamed_removed
    }

    /// Make the next open rebuild this store (after damage was found): no flush writes a
    /// manifest again, and the manifest is removed. If the removal fails (an I/O error, said
    /// in the log), the next open trusts the store until a read meets the damage again, which
    /// condemns it again: nothing wrong is ever read as right.
    pub fn condemn(&self) {
        if self.condemned.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let removed = self.files.remove_if_present(&self.files.path(MANIFEST));
        if let Err(error) = removed.and_then(|()| self.files.sync()) {
            tracing::warn!(%error, "a damaged disk store's manifest could not be removed");
        }
    }

    pub fn offset(&self) -> Offset {
        self.offset
    }

    /// Whether the open found the store's manifest (else it started empty).
    pub fn manifest_found(&self) -> bool {
        self.manifest_found
    }

    /// The store's keys, estimated without reading: the runs' live-key changes
    /// ([`RunMeta::live`]), the memtable's values less its deletions, and what the pending
    /// changes change over the memtable. Over by keys updated since their runs last merged,
    /// under by Bloom false positives and keys deleted and written again; exact for a store
    /// of one run that merges dropped deletions from, or of no run.
    pub fn len_estimate(&self) -> u64 {
        let runs: i64 = self.runs.iter().map(|r| r.meta.live).sum();
        let deletions = self.memtable.len() - self.memtable_values;
        let values = i64::try_from(self.memtable_values).expect("a memtable's entries fit i64");
        let deletions = i64::try_from(deletions).expect("a memtable's entries fit i64");
        u64::try_from(runs + values - deletions + self.pending_live).unwrap_or(0)
    }

    /// Whether the memtable (with the changes it takes at the commit) is due a flush within
    /// the budget it shares ([`StoreMemory`]'s write budget): flush after the commit.
    pub fn wants_flush(&self) -> bool {
        debug_assert!(!self.memtable.is_empty() || self.memtable_bytes == 0, "empty: no bytes");
        self.memory.flush_due(self.memtable_bytes + self.pending_bytes, 1)
    }

    /// Whether the memtable is twice due: a restore flushes only then (and leaves the flush,
    /// and the merges it may start, to the first commit otherwise).
    pub fn must_flush(&self) -> bool {
        assert!(
            self.memtable_bytes >= self.memtable.len() * ENTRY_OVERHEAD,
            "memtable bytes count each entry's overhead"
        );
        self.memory.flush_due(self.memtable_bytes + self.pending_bytes, 2)
    }

    pub fn runs(&self) -> usize {
        assert!(self.levels_ordered(), "levels never decrease from newest to oldest");
        self.runs.len()
    }

    /// Bytes held in memory of its own: memtable, run indexes and filters, merge buffers
    /// (its cached blocks are the shared budget's).
    pub fn resident_bytes(&self) -> usize {
        assert!(
            self.memtable_bytes >= self.memtable.len() * ENTRY_OVERHEAD,
            "memtable bytes count each entry's overhead"
        );
        self.memtable_bytes
            + self.pending_bytes
            + self.runs.iter().map(|r| r.resident_bytes()).sum::<usize>()
            + self.jobs.iter().map(MergeJob::resident_bytes).sum::<usize>()
    }

    /// Take the first error a read met, if any.
    pub fn take_failure(&self) -> Option<StoreError> {
        self.failure.lock().ok()?.take()
    }

    /// A read met `error`: condemn the store if it is damage, remember the first such error
    /// (so a task fails before its next commit even if the caller dropped it), and hand it
    /// back to the caller.
    fn fail(&self, error: StoreError) -> StoreError {
        // Only an open finds a store unavailable; a read fails with damage or I/O.
        assert!(!matches!(error, StoreError::Unavailable(_)), "a read fails by damage or I/O");
        if matches!(error, StoreError::Damaged(_)) {
            self.condemn();
        }
        if let Ok(mut failure) = self.failure.lock() {
            failure.get_or_insert_with(|| error.copy());
        }
        error
    }

    fn cached_block(&self, run: &Run, i: usize) -> Result<Arc<Block>, StoreError> {
        assert!(i < run.blocks(), "a block read is one of its run's");
        let key = (self.store_id, run.meta.id, u32::try_from(i).expect("a run's blocks fit u32"));
        if let Some(block) = self.memory.get(key) {
            return Ok(block);
        }
        let block = Arc::new(run.read_block(i)?);
        self.memory.insert(key, Arc::clone(&block));
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
            let block = self.cached_block(run, i)?;
            match block.find(key) {
                Lookup::Absent => {}
                Lookup::Deleted => return Ok(None),
                Lookup::Value(value) => return Ok(Some(Cow::Owned(value.to_vec()))),
            }
        }
        Ok(None)
    }

    /// `key`'s value; a read that fails is its error, also remembered
    /// ([`DiskStore::take_failure`]).
    pub fn get(&self, key: &[u8]) -> Result<Found<'_>, StoreError> {
        if let Some(tagged) = self.pending.get(key).or_else(|| self.memtable.get(key)) {
            return Ok(untag(tagged).map(Cow::Borrowed));
        }
        self.lookup_runs(key).map_err(|error| self.fail(error))
    }

    /// Record a change for the next commit: a blind write, which reads no run.
    fn change(&mut self, key: &[u8], value: Option<&[u8]>) {
        let (before, runs_empty) = (self.pending_bytes, self.runs.is_empty());
        let new_live = match value {
            Some(_) => 1,
            None => live(&[], runs_empty),
        };
        // One search (a key changed again before the commit frees the copy made here).
        match self.pending.entry(key.to_vec()) {
            Slot::Occupied(mut slot) => {
                let tagged = slot.get_mut();
                self.pending_live += new_live - live(tagged, runs_empty);
                debug_assert!(before >= entry_bytes(key, tagged), "pending bytes count each");
                self.pending_bytes -= entry_bytes(key, tagged);
                self.pending_values -= usize::from(!tagged.is_empty());
                tagged.clear();
                if let Some(value) = value {
                    tagged.reserve(value.len() + 1);
                    tagged.push(CHANGELOG_PUT);
                    tagged.extend_from_slice(value);
                }
                self.pending_bytes += entry_bytes(key, tagged);
            }
            Slot::Vacant(slot) => {
                // Over the memtable's entry of the key, if any (a lookup in memory).
                let shadowed = self.memtable.get(key).map_or(0, |t| live(t, runs_empty));
                self.pending_live += new_live - shadowed;
                self.pending_bytes += entry_bytes(key, slot.insert(tag(value)));
            }
        }
        self.pending_values += usize::from(value.is_some());
        self.memory.charge_writes(before, self.pending_bytes);
        // Per record: debug only. The change reads back, tagged as the changelog carries it.
        debug_assert_eq!(self.get(key).ok().flatten().as_deref(), value, "a change reads back");
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.change(key, Some(value));
    }

    /// Delete `key`, blind: the deletion is recorded for the changelog, and shadows the
    /// memtable's and runs' copies.
    pub fn delete(&mut self, key: &[u8]) {
        self.change(key, None);
    }

    /// The changes since the last commit, in key order, tagged as the changelog carries them.
    pub fn pending(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.pending.iter().map(|(key, tagged)| (key.as_slice(), tagged.as_slice()))
    }

    pub fn has_pending(&self) -> bool {
        assert_eq!(self.pending.is_empty(), self.pending_bytes == 0, "pending bytes iff changes");
        !self.pending.is_empty()
    }

    /// Bytes the changes since the last commit take.
    pub fn pending_bytes(&self) -> usize {
        assert!(
            self.pending_bytes >= self.pending.len() * ENTRY_OVERHEAD,
            "pending bytes count each entry's overhead"
        );
        self.pending_bytes
    }

    /// The pending changes are committed: they join the memtable, keys and values moved, not
    /// copied; the smaller of the two maps goes into the larger (after a flush the pending
    /// changes simply become the memtable), and of a key both hold the pending change stays.
    pub fn committed(&mut self) {
        let before = self.memtable_bytes + self.pending_bytes;
        let (newer, older) =
            (std::mem::take(&mut self.pending), std::mem::take(&mut self.memtable));
        self.memtable_bytes += std::mem::take(&mut self.pending_bytes);
        self.memtable_values += std::mem::take(&mut self.pending_values);
        self.pending_live = 0;
        let newer_smaller = newer.len() < older.len();
        let (mut into, from) = if newer_smaller { (older, newer) } else { (newer, older) };
        for (key, tagged) in from {
            match into.entry(key) {
                Slot::Vacant(slot) => {
                    slot.insert(tagged);
                }
                Slot::Occupied(mut slot) => {
                    // The older of the two changes of the key leaves.
                    let old = if newer_smaller {
                        std::mem::replace(slot.get_mut(), tagged)
                    } else {
                        tagged
                    };
                    let size = entry_bytes(slot.key(), &old);
                    debug_assert!(self.memtable_bytes >= size, "memtable bytes count each entry");
                    self.memtable_bytes -= size;
                    self.memtable_values -= usize::from(!old.is_empty());
                }
            }
        }
        if self.runs.is_empty() && self.memtable_values < into.len() {
            // No run holds a deleted key: its deletion need not be kept.
            into.retain(|key, tagged| {
                let keep = !tagged.is_empty();
                if !keep {
                    self.memtable_bytes -= entry_bytes(key, tagged);
                }
                keep
            });
        }
        self.memtable = into;
        self.memory.charge_writes(before, self.memtable_bytes);
        assert!(self.pending.is_empty() && self.pending_values == 0, "committed: none pending");
        assert!(self.memtable_values <= self.memtable.len(), "memtable values are entries");
        debug_assert!(self.memtable_accounted(), "memtable bytes are the sum of its entries'");
    }

    /// The pending changes, copied into the memtable while they stay pending: the bug of
    /// [`Canary::StoreAppliedBeforeCommit`], a store taking changes before their commit.
    pub fn canary_take_uncommitted(&mut self) {
        let pending: Vec<(Vec<u8>, Vec<u8>)> =
            self.pending.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (key, tagged) in pending {
            self.commit_change(key, tagged);
        }
    }

    /// Put one committed change into the memtable, charged to the budget.
    fn commit_change(&mut self, key: Vec<u8>, tagged: Vec<u8>) {
        let (before, key_len, is_value) = (self.memtable_bytes, key.len(), !tagged.is_empty());
        let old = if !is_value && self.runs.is_empty() {
            // No run holds the key: its deletion need not be kept.
            self.memtable.remove(&key)
        } else {
            self.memtable_bytes += entry_bytes(&key, &tagged);
            self.memtable_values += usize::from(is_value);
            self.memtable.insert(key, tagged)
        };
        if let Some(old) = old {
            let size = key_len + old.len() + ENTRY_OVERHEAD;
            debug_assert!(self.memtable_bytes >= size, "memtable bytes count each entry");
            self.memtable_bytes -= size;
            self.memtable_values -= usize::from(!old.is_empty());
        }
        self.memory.charge_writes(before, self.memtable_bytes);
        debug_assert!(self.memtable_values <= self.memtable.len(), "values are entries");
    }

    /// Apply one restored changelog change (committed: straight into the memtable).
    pub fn apply(&mut self, key: &[u8], value: Option<&[u8]>) {
        assert!(self.pending.is_empty(), "a restore applies committed changes only");
        self.commit_change(key.to_vec(), tag(value));
    }

    /// Entries with keys within the bounds, in key order.
    pub fn range(&self, low: Bound<&[u8]>, high: Bound<&[u8]>) -> DiskRange<'_> {
        DiskRange::new(self, low, high)
    }

    /// Write the memtable as a run and record `offset`, the changelog end of the commit that
    /// made the memtable's state, in a new manifest; then merge runs as the levels fill.
    /// Called only right after a commit (or a restore), so the memtable holds committed state.
    pub fn flush(&mut self, offset: Offset) -> Result<(), StoreError> {
        assert!(
            self.pending.is_empty() || canary::active(Canary::StoreAppliedBeforeCommit),
            "a flush follows a commit: nothing is pending"
        );
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
        assert!(self.memtable_accounted(), "memtable bytes are the sum of its entries'");
        if self.memtable.is_empty() && offset == self.offset && self.jobs.is_empty() {
            return Ok(());
        }
        let result = self.write_and_merge(offset);
        // Whatever the result: the runs and merges now open are what it holds.
        self.repin();
        result
    }

    fn write_and_merge(&mut self, offset: Offset) -> Result<(), StoreError> {
        let fresh = if self.memtable.is_empty() { None } else { Some(self.write_run()?) };
        if fresh.is_some() && canary::active(Canary::StoreOffsetAheadOfData) {
            // The bug: the new offset is recorded before the run holding its data.
            let named: Vec<RunMeta> = self.runs.iter().map(|r| r.meta).collect();
            self.write_manifest(offset, &named)?;
        }
        // Each merge under way takes a slice of twice the bytes a flush writes: a merge of
        // level k's runs (FANOUT^(k+1) flushes' worth) then ends in half the flushes until
        // the next one of level k is due.
        // The last run's size, or half the one before (a small flush, one forced at a close
        // say, does not starve the merges at once).
        if let Some(run) = &fresh {
            self.flushed_bytes = run.meta.bytes.max(self.flushed_bytes / 2);
        }
        let slice = 2 * self.flushed_bytes.max(run::BLOCK_BYTES as u64);
        let finished = self.step_jobs(slice)?;
        self.publish(offset, fresh, finished)?;
        self.start_jobs()?;
        // Backpressure: a level behind has its merge finished now, and the flush waits.
        while let Some(level) = policy::overfull(&self.levels()) {
            let i = self.jobs.iter().position(|j| j.level() == level);
            let mut job = self.jobs.swap_remove(i.expect("an overfull level is merging"));
            let meta = loop {
                if let Some(meta) = job.step(u64::MAX)? {
                    break meta;
                }
            };
            let output = Arc::new(Run::open(&self.files, meta)?);
            self.stalls += 1;
            self.publish(offset, None, vec![(job, output)])?;
            self.start_jobs()?;
        }
        Ok(())
    }

    /// Write the memtable as a level-0 run (durable data; the directory entry is the
    /// caller's), opened.
    fn write_run(&mut self) -> Result<Arc<Run>, StoreError> {
        let id = self.take_id();
        let mut writer = RunWriter::create(&self.files, id, 0, self.memtable.len() as u64)?;
        let keep_deletions = !self.runs.is_empty();
        let (mut written, mut live) = (0, 0);
        for (key, value) in &self.memtable {
            // Whether an older run may hold the key: Bloom filters only, no block read.
            let hash = key_hash(key);
            let older = self.runs.iter().any(|r| r.may_contain(hash));
            let value = untag(value);
            live += match (value, older) {
                (Some(_), false) => 1,
                (None, true) => -1,
                _ => 0,
            };
            if value.is_some() || keep_deletions {
                writer.add(key, value)?;
                written += 1;
            }
        }
        let mut meta = writer.finish()?;
        meta.live = live;
        assert_eq!((meta.id, meta.level, meta.entries), (id, 0, written), "the run as built");
        Ok(Arc::new(Run::open(&self.files, meta)?))
    }

    fn levels(&self) -> Vec<u8> {
        self.runs.iter().map(|r| r.meta.level).collect()
    }

    /// Give each merge under way a slice of `budget` input bytes; the finished ones, with
    /// their outputs opened. A merge that fails is dropped (its output is an unnamed file).
    fn step_jobs(&mut self, budget: u64) -> Result<Vec<(MergeJob, Arc<Run>)>, StoreError> {
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.jobs.len() {
            match self.jobs[i].step(budget) {
                Ok(None) => i += 1,
                Ok(Some(meta)) => {
                    let job = self.jobs.remove(i);
                    finished.push((job, Arc::new(Run::open(&self.files, meta)?)));
                }
                Err(error) => {
                    self.jobs.remove(i);
                    return Err(error);
                }
            }
        }
        Ok(finished)
    }

    /// Start the merges the policy chooses.
    fn start_jobs(&mut self) -> Result<(), StoreError> {
        loop {
            let busy: Vec<u8> = self.jobs.iter().map(MergeJob::level).collect();
            let Some(choice) = policy::choose(&self.levels(), &busy) else { return Ok(()) };
            let id = self.take_id();
            let inputs = &self.runs[choice.runs];
            let job = MergeJob::start(&self.files, id, inputs, choice.drop_deletions)?;
            self.jobs.push(job);
        }
    }

    /// Name in one new manifest, at `offset`, the runs as they now are: `fresh` (a flushed
    /// memtable) first, each finished merge's output in place of its inputs. Then remove the
    /// inputs. The new runs' data are durable; their directory entries are made so here,
    /// before the manifest names them.
    fn publish(
        &mut self,
        offset: Offset,
        fresh: Option<Arc<Run>>,
        finished: Vec<(MergeJob, Arc<Run>)>,
    ) -> Result<(), StoreError> {
        assert!(fresh.is_some() || self.memtable.is_empty(), "a flushed memtable is a run");
        let named_first = canary::active(Canary::StoreRunNamedBeforeDurable);
        if (fresh.is_some() || !finished.is_empty()) && !named_first {
            self.files.sync()?;
        }
        let mut runs = self.runs.clone();
        runs.splice(0..0, fresh);
        let installed = finished.len() as u64;
        let mut old = Vec::new();
        for (job, output) in finished {
            let inputs = job.inputs();
            let at = runs.iter().position(|r| r.meta.id == inputs[0]);
            let group = at.expect("a merge's inputs are the store's")..;
            let group = group.start..group.start + inputs.len();
            // Pair with `policy::choose`: the inputs are as chosen, still contiguous, and
            // still the oldest runs if the merge dropped deletions.
            assert!(
                runs[group.clone()].iter().map(|r| r.meta.id).eq(inputs.iter().copied()),
                "a merge's inputs stay contiguous"
            );
            assert!(!job.drop_deletions() || group.end == runs.len(), "deletions go at the oldest");
            drop(job);
            old.extend(runs.splice(group, [output]));
        }
        let named: Vec<RunMeta> = runs.iter().map(|r| r.meta).collect();
        assert!(named.windows(2).all(|p| p[0].level <= p[1].level), "levels never decrease");
        self.write_manifest(offset, &named)?;
        // The manifest is the store's commit point: memory follows it at once, whatever the
        // removals below meet.
        self.runs = runs;
        self.offset = offset;
        self.memtable.clear();
        self.memory.charge_writes(self.memtable_bytes, 0);
        self.memtable_bytes = 0;
        self.memtable_values = 0;
        self.merges_installed += installed;
        if old.is_empty() {
            return Ok(());
        }
        for run in old {
            let path = self.files.path(&run::run_name(run.meta.id));
            // No manifest, range or merge holds it now: its file closes here.
            assert_eq!(Arc::strong_count(&run), 1, "a run merged away is held by nothing");
            drop(run);
            self.files.remove_if_present(&path)?;
        }
        self.files.sync()
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
        let live: i64 = runs.iter().map(|r| r.live).sum();
        let manifest = Manifest {
            identity: self.identity.clone(),
            offset: offset.get(),
            len: u64::try_from(live).unwrap_or(0),
            next_id: self.next_id,
            runs: runs.to_vec(),
        };
        self.files.write_durably(MANIFEST, manifest.encode())
    }

    /// Merges under way (each takes a slice of every flush).
    #[cfg(test)]
    pub fn merges_under_way(&self) -> usize {
        self.jobs.len()
    }

    /// Merges installed, and merges a flush finished before going on.
    pub fn merges(&self) -> DiskMerges {
        DiskMerges { installed: self.merges_installed, stalls: self.stalls }
    }
}

impl Drop for DiskStore {
    fn drop(&mut self) {
        // Its memtable, pending and pinned bytes leave the budget it shares, and so does it.
        self.memory.charge_writes(self.memtable_bytes + self.pending_bytes, 0);
        self.memory.charge_pinned(self.pinned_bytes, 0);
        self.memory.leave();
    }
}

impl Blocks for DiskStore {
    fn block(&self, run: &Run, i: usize) -> Result<Arc<Block>, StoreError> {
        self.cached_block(run, i)
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
