//! The disk store's k-way merge, and the merge jobs built on it.
//!
//! - [`MergeHeap`]: runs' entries in key order, one per key, the newest run's entry winning.
//!   A binary heap of run indexes ordered by (the cursor's key, the index), index 0 the
//!   newest run, so on equal keys the newest pops first and the older copies are skipped.
//!   Cursors hold an `Arc` of their block and the heap compares keys borrowed from it: no
//!   key is copied per step.
//! - [`MergeJob`]: merging a group of runs into one run file, in slices of a bounded number
//!   of input bytes (a flush gives each job a slice: a commit never waits for a whole merge).
//!   Its output is named by no manifest until the store installs it.

use super::files::{Files, StoreError, canary_trusts_damage};
use super::run::{Block, Run, RunMeta, RunWriter};
use chronik_engine::canary::{self, Canary};
use std::ops::Bound;
use std::sync::Arc;

/// A key and its newest change (`None`: deleted), borrowed from a block.
pub(super) type Change<'a> = (&'a [u8], Option<&'a [u8]>);

/// How a merge reads a run's block: through the store's cache (a range), or straight from
/// the file (a job, which would only push useful blocks out of the cache).
pub(super) trait Blocks {
    fn block(&self, run: &Run, i: usize) -> Result<Arc<Block>, StoreError>;
}

/// Blocks read from the file, bypassing any cache.
pub(super) struct Direct;

impl Blocks for Direct {
    fn block(&self, run: &Run, i: usize) -> Result<Arc<Block>, StoreError> {
        Ok(Arc::new(run.read_block(i)?))
    }
}

/// One run's entries from a position on, a block at a time.
struct Cursor {
    run: Arc<Run>,
    next_block: usize,
    /// The block under the cursor (`None` before the first read and past the end).
    block: Option<Arc<Block>>,
    at: usize,
    /// The bound the first block read is sought to (a range's low bound).
    low: Bound<Vec<u8>>,
}

impl Cursor {
    fn new(run: Arc<Run>, low: Bound<&[u8]>) -> Cursor {
        let next_block = match low {
            Bound::Included(key) | Bound::Excluded(key) => {
                run.block_for(key).unwrap_or(run.blocks())
            }
            Bound::Unbounded => 0,
        };
        assert!(next_block <= run.blocks(), "a cursor starts within its run");
        Cursor { run, next_block, block: None, at: 0, low: low.map(<[u8]>::to_vec) }
    }

    /// The entry under the cursor.
    fn entry(&self) -> Option<Change<'_>> {
        let block = self.block.as_ref()?;
        (self.at < block.len()).then(|| block.entry_at(self.at))
    }

    /// Read blocks until one has an entry at or past the cursor; `false` at the run's end.
    fn fill(&mut self, blocks: &dyn Blocks) -> Result<bool, StoreError> {
        while self.block.as_ref().is_none_or(|b| self.at >= b.len()) {
            if self.next_block >= self.run.blocks() {
                self.block = None;
                return Ok(false);
            }
            let block = blocks.block(&self.run, self.next_block)?;
            self.next_block += 1;
            self.at = match std::mem::replace(&mut self.low, Bound::Unbounded) {
                Bound::Included(low) => block.seek(&low, false),
                Bound::Excluded(low) => block.seek(&low, true),
                Bound::Unbounded => 0,
            };
            self.block = Some(block);
        }
        assert!(self.entry().is_some(), "a filled cursor is at an entry");
        Ok(true)
    }
}

/// Runs' entries merged in key order; see the module's doc.
pub(super) struct MergeHeap {
    /// One per run, newest first.
    cursors: Vec<Cursor>,
    /// Indexes of the cursors at an entry, a binary min-heap by (key, index).
    heap: Vec<usize>,
    started: bool,
    /// A read failed: the merge is abandoned, never continued with a source missing.
    failed: bool,
}

impl MergeHeap {
    /// A merge of `runs` (newest first) from `low` on.
    pub fn new(runs: impl IntoIterator<Item = Arc<Run>>, low: Bound<&[u8]>) -> MergeHeap {
        let cursors: Vec<Cursor> = runs.into_iter().map(|run| Cursor::new(run, low)).collect();
        let heap = Vec::with_capacity(cursors.len());
        MergeHeap { cursors, heap, started: false, failed: false }
    }

    /// Whether cursor `a` pops before cursor `b`: a smaller key, or the same key in a newer run.
    fn before(&self, a: usize, b: usize) -> bool {
        let key = |i: usize| self.cursors[i].entry().expect("a cursor in the heap has an entry").0;
        match key(a).cmp(key(b)) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Greater => false,
            // The bug: the oldest run's entry wins a key.
            std::cmp::Ordering::Equal if canary::active(Canary::StoreMergeKeepsOlder) => a > b,
            std::cmp::Ordering::Equal => a < b,
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (left, right) = (2 * i + 1, 2 * i + 2);
            let mut first = i;
            if left < self.heap.len() && self.before(self.heap[left], self.heap[first]) {
                first = left;
            }
            if right < self.heap.len() && self.before(self.heap[right], self.heap[first]) {
                first = right;
            }
            if first == i {
                return;
            }
            self.heap.swap(i, first);
            i = first;
        }
    }

    fn start(&mut self, blocks: &dyn Blocks) -> Result<(), StoreError> {
        assert!(self.heap.is_empty(), "a merge starts once");
        for i in 0..self.cursors.len() {
            if self.cursors[i].fill(blocks)? {
                self.heap.push(i);
            }
        }
        for i in (0..self.heap.len() / 2).rev() {
            self.sift_down(i);
        }
        self.started = true;
        Ok(())
    }

    /// The smallest key and its newest entry (`None`: deleted), without moving past it.
    pub fn peek(&mut self, blocks: &dyn Blocks) -> Result<Option<Change<'_>>, StoreError> {
        assert!(!self.failed, "a merge is not continued after a failed read");
        if !self.started {
            self.start(blocks).inspect_err(|_| self.failed = true)?;
        }
        Ok(self.heap.first().map(|&top| self.cursors[top].entry().expect("a heap entry")))
    }

    /// Move past the smallest key: its newest entry and every older one. Returns the bytes
    /// of the entries passed (keys, values and their length fields).
    pub fn advance(&mut self, blocks: &dyn Blocks) -> Result<u64, StoreError> {
        assert!(self.started && !self.failed, "a merge advances once started, never after failing");
        let Some(&top) = self.heap.first() else { return Ok(0) };
        // The key stays readable through this handle while its cursor moves on.
        let block = Arc::clone(self.cursors[top].block.as_ref().expect("a heap entry's block"));
        let key = block.entry_at(self.cursors[top].at).0;
        let mut passed = 0;
        while let Some(&first) = self.heap.first() {
            let Some((next, value)) = self.cursors[first].entry() else { unreachable!() };
            if next != key {
                // Pair with `before`: the heap gave the smallest key first, every copy of it.
                assert!(next > key || canary_trusts_damage(), "a merge yields keys in order");
                break;
            }
            passed += 8 + next.len() as u64 + value.map_or(0, |v| v.len() as u64);
            self.cursors[first].at += 1;
            match self.cursors[first].fill(blocks) {
                Ok(true) => {}
                Ok(false) => {
                    self.heap.swap_remove(0);
                }
                Err(error) => {
                    self.failed = true;
                    return Err(error);
                }
            }
            self.sift_down(0);
        }
        Ok(passed)
    }
}

/// A merge of a contiguous group of one level's runs into one run of the next level, done
/// in slices.
pub(super) struct MergeJob {
    /// The runs merged (ids, newest first).
    inputs: Vec<u64>,
    /// The level of the runs merged.
    level: u8,
    heap: MergeHeap,
    /// `None` once the output is finished.
    writer: Option<RunWriter>,
    drop_deletions: bool,
    /// Entries in the inputs, deletions included: the output holds at most these.
    entries_in: u64,
    /// The inputs' live-key changes, summed: the output's, unless it drops deletions.
    live_in: i64,
    /// Values written (the output's exact live keys when it drops deletions).
    values: i64,
}

impl std::fmt::Debug for MergeJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MergeJob")
            .field("inputs", &self.inputs)
            .field("drop_deletions", &self.drop_deletions)
            .finish_non_exhaustive()
    }
}

impl MergeJob {
    /// Start merging `inputs` (contiguous runs of one level, newest first) into run `id`, one
    /// level up; `drop_deletions` when no run older than the inputs exists.
    pub fn start(
        files: &Arc<Files>,
        id: u64,
        inputs: &[Arc<Run>],
        drop_deletions: bool,
    ) -> Result<MergeJob, StoreError> {
        let level = inputs.first().expect("a merge has inputs").meta.level;
        assert!(inputs.iter().all(|r| r.meta.level == level), "a merge takes runs of one level");
        assert!(inputs.iter().all(|r| r.meta.id < id), "a merge's output is newer than its inputs");
        let entries_in = inputs.iter().map(|r| r.meta.entries).sum();
        let live_in = inputs.iter().map(|r| r.meta.live).sum();
        let writer = RunWriter::create(files, id, level.saturating_add(1), entries_in)?;
        Ok(MergeJob {
            inputs: inputs.iter().map(|r| r.meta.id).collect(),
            level,
            heap: MergeHeap::new(inputs.iter().cloned(), Bound::Unbounded),
            writer: Some(writer),
            drop_deletions,
            entries_in,
            live_in,
            values: 0,
        })
    }

    pub fn inputs(&self) -> &[u64] {
        &self.inputs
    }

    /// The level of the runs merged.
    pub fn level(&self) -> u8 {
        self.level
    }

    pub fn drop_deletions(&self) -> bool {
        self.drop_deletions
    }

    /// Bytes the job keeps in memory: its output's buffers and filter, a block per input.
    pub fn resident_bytes(&self) -> usize {
        self.writer.as_ref().map_or(0, RunWriter::resident_bytes)
            + self.inputs.len() * 2 * super::run::BLOCK_BYTES
    }

    /// Merge until `budget` bytes of input entries were passed or the inputs end. At their
    /// end the output is finished and its data durable (the directory entry is the caller's):
    /// its record is returned, and the job is done.
    pub fn step(&mut self, budget: u64) -> Result<Option<RunMeta>, StoreError> {
        assert!(self.writer.is_some(), "a finished job takes no more steps");
        let mut passed = 0;
        while passed < budget {
            let Some((key, value)) = self.heap.peek(&Direct)? else {
                return self.finish().map(Some);
            };
            if value.is_some() || !self.drop_deletions {
                self.writer.as_mut().expect("a job under way").add(key, value)?;
            }
            self.values += i64::from(value.is_some());
            let step = self.heap.advance(&Direct)?;
            // Progress: every step passes one entry at least, so a slice ends.
            assert!(step > 0, "a merge step passes an entry");
            passed += step;
        }
        Ok(None)
    }

    fn finish(&mut self) -> Result<RunMeta, StoreError> {
        let mut meta = self.writer.take().expect("a job finishes once").finish()?;
        meta.live = if self.drop_deletions { self.values } else { self.live_in };
        assert_eq!(meta.level, self.level.saturating_add(1), "a merge's output is one level up");
        // A merge drops shadowed entries (and deletions, at the oldest) but invents none.
        assert!(
            meta.entries <= self.entries_in || canary_trusts_damage(),
            "a merge writes at most the entries it read"
        );
        Ok(meta)
    }
}
