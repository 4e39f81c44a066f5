//! What the engine hands to each partition: the shared context and the fail-stop flag. It
//! depends on nothing above the write path, so that the engine, its partitions and recovery
//! can all name it without depending on each other (`engine/tests/tidy.rs` checks that the
//! engine's modules import one another without a cycle).

use crate::Clock;
use crate::error::Poisoned;
use crate::io::Io;
use crate::log::Durability;
use crate::metrics::Metrics;
use crate::sync::Mutex;
use crate::write_path::WritePath;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The fail-stop flag: set by the first failed write or fsync, checked by every operation.
#[derive(Debug, Default)]
pub struct Poison {
    poisoned: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Poison {
    pub fn set(&self, reason: String) {
        let mut slot = self.reason.lock();
        if slot.is_none() {
            *slot = Some(reason);
        }
        self.poisoned.store(true, Ordering::Release);
    }

    pub fn check(&self) -> Result<(), Poisoned> {
        if !self.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        let reason = self.reason.lock().clone().unwrap_or_default();
        Err(Poisoned { reason })
    }
}

#[derive(Debug)]
/// What every partition of an engine shares.
pub(crate) struct PartitionContext<I: Io> {
    pub io: Arc<I>,
    pub clock: Arc<dyn Clock>,
    pub poison: Arc<Poison>,
    pub metrics: Arc<Metrics>,
    pub durability: Durability,
    pub read_only: bool,
    /// Segment files are written with direct I/O ([`crate::Options::direct_io`]).
    pub direct: bool,
    /// The open found the clean-shutdown mark of the last close (see `recovery.rs`).
    pub clean_shutdown: bool,
    /// Threads that recover a topic's partitions at open (at least one).
    pub open_threads: usize,
    /// When the write path makes recovery points: bytes and milliseconds since the last one.
    pub recovery_point_bytes: u64,
    pub recovery_point_ms: i64,
    /// The engine's write paths, one per shard of partitions (each with its own reactor and,
    /// on io_uring, its own rings); empty when opened read-only.
    pub write_paths: Vec<Arc<WritePath<I>>>,
}

impl<I: Io> PartitionContext<I> {
    /// The write path of a partition's shard: partitions spread over the shards by topic and
    /// index, so a topic's partitions land on different shards. `None` when read-only.
    pub fn write_path_of(&self, topic: &str, partition: u32) -> Option<&Arc<WritePath<I>>> {
        let shards = self.write_paths.len() as u64;
        if shards == 0 {
            return None;
        }
        let spread = crate::format::key_hash(topic.as_bytes()).wrapping_add(u64::from(partition));
        let shard = usize::try_from(spread % shards).expect("fewer shards than usize");
        self.write_paths.get(shard)
    }
}

impl<I: Io> Clone for PartitionContext<I> {
    fn clone(&self) -> Self {
        PartitionContext {
            io: Arc::clone(&self.io),
            clock: Arc::clone(&self.clock),
            poison: Arc::clone(&self.poison),
            metrics: Arc::clone(&self.metrics),
            durability: self.durability,
            read_only: self.read_only,
            direct: self.direct,
            clean_shutdown: self.clean_shutdown,
            open_threads: self.open_threads,
            recovery_point_bytes: self.recovery_point_bytes,
            recovery_point_ms: self.recovery_point_ms,
            write_paths: self.write_paths.clone(),
        }
    }
}
