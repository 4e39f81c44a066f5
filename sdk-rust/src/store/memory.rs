//! Memory that disk stores share ([`StoreMemory`]): one block cache and one budget for
//! memtables, over every store and partition that uses it, so memory is bounded by one
//! setting whatever the number of partitions and stores.
//!
//! - **Cache**: 16 shards, each a map from (store, run, block) to a decoded block and a ring
//!   for CLOCK eviction: a block enters unreferenced, a hit marks it, and eviction passes over
//!   marked blocks once (clearing the mark) before it takes them. A scan's blocks, read once,
//!   so go first. Store ids are new at every open and wipe and run ids are never reused, so
//!   the blocks of runs merged away are never hit again and age out: nothing is forgotten
//!   by hand.
//! - **Writes**: the memtables' bytes, charged as they change; an eighth of the budget. A
//!   memtable is flushed (after its task's next commit) at a quarter of that, or when the
//!   memtables together hold all of it and it is one of the larger ones (at least their
//!   average): however many stores share the budget, the largest always flushes first.
//! - **Pinned**: open runs' indexes and Bloom filters and merges' buffers, which stay in
//!   memory; they lower the cache's share, so the budget covers them.
//!
//! Invariant: each shard's bytes are the sum of its blocks', and its ring holds each of its
//! keys once.

use super::run::Block;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const SHARDS: usize = 16;

/// A cached block: the store's id ([`store_id`]), the run's id, the block's index.
pub(crate) type BlockKey = (u64, u64, u32);

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(0);

/// A new id for a store's blocks in the cache (at every open and wipe).
pub(crate) fn store_id() -> u64 {
    NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed)
}

/// Memory disk stores share: a block cache and a budget for memtables (an eighth), within
/// `bytes` together with the open runs' indexes and Bloom filters. Cloning shares it.
#[derive(Clone)]
pub struct StoreMemory {
    shared: Arc<Shared>,
}

struct Shared {
    bytes: usize,
    shards: Vec<Mutex<Shard>>,
    writes: AtomicUsize,
    pinned: AtomicUsize,
    /// Disk stores open on this budget.
    stores: AtomicUsize,
}

#[derive(Default)]
struct Shard {
    slots: HashMap<BlockKey, Slot, BuildHasherDefault<BlockHasher>>,
    ring: VecDeque<BlockKey>,
    bytes: usize,
}

struct Slot {
    block: Arc<Block>,
    referenced: bool,
}

impl std::fmt::Debug for StoreMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreMemory")
            .field("bytes", &self.shared.bytes)
            .field("cached", &self.cached_bytes())
            .field("writes", &self.write_bytes())
            .field("pinned", &self.pinned_bytes())
            .field("stores", &self.shared.stores.load(Ordering::Relaxed))
            .finish()
    }
}

impl StoreMemory {
    /// The process's budget unless told otherwise: 256 MiB.
    pub const DEFAULT_BYTES: usize = 256 << 20;

    /// A budget of `bytes` (more than 0).
    pub fn new(bytes: usize) -> StoreMemory {
        assert!(bytes > 0, "a store memory budget has bytes");
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        let shared = Shared {
            bytes,
            shards,
            writes: AtomicUsize::new(0),
            pinned: AtomicUsize::new(0),
            stores: AtomicUsize::new(0),
        };
        StoreMemory { shared: Arc::new(shared) }
    }

    /// The one budget of the process that disk stores use when given none:
    /// [`StoreMemory::DEFAULT_BYTES`].
    pub fn process() -> StoreMemory {
        static PROCESS: OnceLock<StoreMemory> = OnceLock::new();
        PROCESS.get_or_init(|| StoreMemory::new(StoreMemory::DEFAULT_BYTES)).clone()
    }

    pub fn bytes(&self) -> usize {
        self.shared.bytes
    }

    /// Bytes held now: cached blocks, memtables and pinned run metadata.
    pub fn resident_bytes(&self) -> usize {
        self.cached_bytes() + self.write_bytes() + self.pinned_bytes()
    }

    /// Bytes of open runs' indexes and Bloom filters and of merges' buffers.
    pub fn pinned_bytes(&self) -> usize {
        self.shared.pinned.load(Ordering::Relaxed)
    }

    /// A disk store opened on this budget (its memtable counts toward the average).
    pub(crate) fn join(&self) {
        self.shared.stores.fetch_add(1, Ordering::Relaxed);
    }

    /// A disk store closed; it released its charges first.
    pub(crate) fn leave(&self) {
        let previous = self.shared.stores.fetch_sub(1, Ordering::Relaxed);
        assert!(previous > 0, "a store leaves a budget it joined");
    }

    /// Whether a memtable of `bytes` is due a flush: at a quarter of the write budget, or
    /// when the memtables hold it all and this one is at least their average. `factor` 2
    /// doubles both (a restore flushes only then).
    pub(crate) fn flush_due(&self, bytes: usize, factor: usize) -> bool {
        let budget = factor * self.write_budget();
        let (writes, stores) = (self.write_bytes(), self.shared.stores.load(Ordering::Relaxed));
        assert!(stores > 0 || writes == 0, "memtables belong to stores that joined");
        bytes > 0 && (bytes >= budget / 4 || (writes >= budget && bytes * stores >= writes))
    }

    /// The memtables' budget: an eighth (it also bounds the changelog a restart reads).
    pub(crate) fn write_budget(&self) -> usize {
        self.shared.bytes / 8
    }

    pub(crate) fn write_bytes(&self) -> usize {
        self.shared.writes.load(Ordering::Relaxed)
    }

    /// A memtable grew (or shrank) from `before` to `after` bytes.
    pub(crate) fn charge_writes(&self, before: usize, after: usize) {
        charge(&self.shared.writes, before, after);
    }

    /// A store's pinned bytes (run indexes, filters, merge buffers) went from `before` to
    /// `after`.
    pub(crate) fn charge_pinned(&self, before: usize, after: usize) {
        charge(&self.shared.pinned, before, after);
        if after > before {
            self.trim();
        }
    }

    fn cache_capacity(&self) -> usize {
        let budget = self.shared.bytes - self.write_budget();
        budget.saturating_sub(self.pinned_bytes())
    }

    pub fn cached_bytes(&self) -> usize {
        self.shared.shards.iter().map(|s| s.lock().map_or(0, |s| s.bytes)).sum()
    }

    fn shard(&self, key: BlockKey) -> &Mutex<Shard> {
        // The block index spreads one run's blocks over the shards.
        let mixed = key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ key.1.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
            ^ u64::from(key.2);
        &self.shared.shards[(mixed % SHARDS as u64) as usize]
    }

    /// The cached block `key`, marked as used.
    pub(crate) fn get(&self, key: BlockKey) -> Option<Arc<Block>> {
        let mut shard = self.shard(key).lock().expect("cache shard lock");
        let slot = shard.slots.get_mut(&key)?;
        slot.referenced = true;
        Some(Arc::clone(&slot.block))
    }

    /// Cache `block` as `key` (unmarked), evicting within the shard's share of the capacity.
    pub(crate) fn insert(&self, key: BlockKey, block: Arc<Block>) {
        let capacity = self.cache_capacity() / SHARDS;
        let mut shard = self.shard(key).lock().expect("cache shard lock");
        if shard.slots.contains_key(&key) {
            return; // Two readers of one block: the first one's is kept.
        }
        assert!(block.bytes() > 0, "a cached block holds bytes");
        shard.bytes += block.bytes();
        shard.slots.insert(key, Slot { block, referenced: false });
        shard.ring.push_back(key);
        shard.evict_to(capacity);
    }

    /// Evict until every shard is within its share of the capacity (pinned bytes grew).
    fn trim(&self) {
        let capacity = self.cache_capacity() / SHARDS;
        for shard in &self.shared.shards {
            shard.lock().expect("cache shard lock").evict_to(capacity);
        }
    }
}

impl Shard {
    /// Evict blocks, unmarked first, until the shard holds at most `capacity` bytes.
    fn evict_to(&mut self, capacity: usize) {
        // Each pass clears a mark or evicts, and a cleared block is evicted when next met:
        // within twice the ring's length the shard is back within its share.
        let mut passes = 2 * self.ring.len();
        while self.bytes > capacity && passes > 0 {
            passes -= 1;
            let Some(next) = self.ring.pop_front() else { break };
            let slot = self.slots.get_mut(&next).expect("the ring names cached blocks");
            if slot.referenced {
                slot.referenced = false;
                self.ring.push_back(next);
            } else {
                let slot = self.slots.remove(&next).expect("the ring names cached blocks");
                assert!(self.bytes >= slot.block.bytes(), "a shard counts each block it holds");
                self.bytes -= slot.block.bytes();
            }
        }
        assert!(self.bytes <= capacity, "a shard is within its share after eviction");
        assert_eq!(self.slots.len(), self.ring.len(), "the ring holds each cached key once");
        debug_assert_eq!(
            self.bytes,
            self.slots.values().map(|s| s.block.bytes()).sum::<usize>(),
            "a shard's bytes are the sum of its blocks'"
        );
    }
}

/// Hashes a [`BlockKey`]'s three integers by multiplying and rotating (SipHash was a tenth
/// of a cached read). The keys are ours, not a user's: nothing to defend against.
#[derive(Default)]
struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        // The high bits are the best mixed; hashbrown takes its control bits from the top.
        self.0 ^ (self.0 >> 29)
    }
}

/// Move `counter` by a charge's change from `before` to `after`.
fn charge(counter: &AtomicUsize, before: usize, after: usize) {
    if after >= before {
        counter.fetch_add(after - before, Ordering::Relaxed);
    } else {
        let previous = counter.fetch_sub(before - after, Ordering::Relaxed);
        assert!(previous >= before - after, "a charge is released once, by its holder");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(bytes: usize) -> Arc<Block> {
        Arc::new(Block::for_test(bytes))
    }

    #[test]
    fn a_shard_stays_within_its_share_and_evicts_unused_blocks_before_used_ones() {
        // 16 shards of 8 KiB each: a shard holds two 4 KiB blocks.
        let memory = StoreMemory::new(16 * 8192 * 8 / 7 + 8);
        let store = store_id();
        // Keys of one shard: find them by trying.
        let same: Vec<BlockKey> = (0..10_000_u32)
            .map(|i| (store, 1, i))
            .filter(|k| std::ptr::eq(memory.shard(*k), memory.shard((store, 1, 0))))
            .take(3)
            .collect();
        memory.insert(same[0], block(3900));
        memory.insert(same[1], block(3900));
        assert!(memory.get(same[0]).is_some(), "both fit");
        // A third: the one not used since it came goes, the used one stays.
        memory.insert(same[2], block(3900));
        assert!(memory.get(same[1]).is_none(), "the unused block was evicted");
        assert!(memory.get(same[0]).is_some() && memory.get(same[2]).is_some());
        assert!(memory.cached_bytes() <= memory.cache_capacity());
    }

    #[test]
    fn memtables_are_charged_and_released() {
        let memory = StoreMemory::new(1 << 20);
        memory.charge_writes(0, 500);
        memory.charge_writes(500, 200);
        assert_eq!(memory.write_bytes(), 200);
        memory.charge_writes(200, 0);
        assert_eq!((memory.write_bytes(), memory.resident_bytes()), (0, 0));
        assert_eq!(memory.write_budget(), (1 << 20) / 8);
    }
}
