//! Chronik's storage engine: topics and partitions of append-only segmented logs.
//!
//! The engine is sans-thread and sans-clock: every file operation goes through the [`io::Io`]
//! trait, time comes from an injected [`Clock`], and background work (interval flushes,
//! retention, compaction) is a step function, [`Engine::tick`] (its halves
//! [`Engine::flush_due`] and [`Engine::maintain`]), that the [`runtime`] module drives from two
//! threads in production and the simulator drives deterministically. See `ARCHITECTURE.md`
//! for the code map and `docs/format.md` for the bytes on disk.
//!
//! ```
//! use chronik_engine::{io::PreadIo, runtime::SystemClock, Engine, Options, Record, TopicConfig};
//! use std::sync::Arc;
//!
//! let directory = tempfile::tempdir().unwrap();
//! let (engine, _report) =
//!     Engine::open(PreadIo::new(), Arc::new(SystemClock), directory.path(), Options::default())
//!         .unwrap();
//! engine.create_topic("clicks", TopicConfig::default()).unwrap();
//! let appended = engine.append("clicks", 0, &[Record::new(Some(b"user-1"), b"home")]).unwrap();
//! assert_eq!(appended.base_offset.get(), 0);
//! let fetch = engine.read("clicks", 0, appended.base_offset, 1 << 20).unwrap();
//! let record = fetch.records().next().unwrap();
//! assert_eq!(record.value(), b"home");
//! ```

// Some items are used only through `internals` (the simulator's reactor, tests); dead code is
// checked with the feature on, as every workspace build has it.
#![cfg_attr(not(feature = "internals"), allow(dead_code))]
// Library code never unwraps: a failure is a typed error or a named invariant (`expect`).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

// The public API: the items below, and the modules a user needs by name (an I/O backend,
// the runtime's threads, metrics, offline verification, limits, the test canaries).
// Everything else is private; the CLI, the simulator, benches and the engine's tests reach it
// through `internals`, which exists only with the cargo feature of that name.
pub mod canary;
pub mod io;
pub mod metrics;
pub mod runtime;
pub mod verify;

pub use engine::{Engine, GroupCommit, Options, TopicDescription, TransactionWrite};
pub use error::{
    AppendError, CloseError, CommitError, Corruption, CorruptionKind, Error, IoError, OpenError,
    Poisoned, ReadError, TopicError,
};
pub use fetch::{Fetch, Header, Headers, RecordView};
pub use format::{Record, partition_for_key};
pub use log::Durability;
pub use partition::{
    Appended, CompactionFailure, CompactionReport, PartitionDescription, PendingAppend,
};
pub use recovery::{DamagedTopic, PartitionRecovery, RecoveryReport};
pub use state_dir::StateDir;
pub use topic::{CONFIG_KEYS, Cleanup, TopicConfig};

mod checkpoint;
mod clean_shutdown;
mod compaction;
mod context;
mod engine;
mod error;
mod fetch;
mod format;
mod groups;
mod index;
mod layout;
mod log;
mod log_start;
#[cfg(all(test, loom))]
mod loom_models;
mod parallel;
mod partition;
mod reactor;
mod recovery;
mod segment;
mod state_dir;
mod swap;
mod sync;
mod tail;
mod topic;
mod watermark;
mod write_path;

#[cfg(feature = "internals")]
pub mod internals;

use std::fmt;

/// The position of a record in a partition. Offsets start at zero, strictly increase, and are
/// never reused.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(u64);

impl Offset {
    /// The first offset of every partition.
    pub const ZERO: Offset = Offset(0);

    pub const fn new(value: u64) -> Self {
        Offset(value)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// The offset `count` records after this one.
    #[must_use]
    pub fn plus(self, count: u64) -> Offset {
        Offset(self.0.checked_add(count).expect("offset overflow"))
    }
}

impl fmt::Debug for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Offset({})", self.0)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The source of time for the engine: record timestamps, segment age and interval flushes.
///
/// Production uses [`runtime::SystemClock`]; the simulator passes a simulated clock. The engine
/// core never reads the system clock itself.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;

    /// Microseconds on a clock that never goes back, for latencies ([`metrics`]). By default
    /// derived from [`Clock::now_ms`] (millisecond resolution; the simulator's clocks keep
    /// it); [`runtime::SystemClock`] reads a monotonic clock.
    fn monotonic_us(&self) -> u64 {
        u64::try_from(self.now_ms()).unwrap_or(0).saturating_mul(1000)
    }

    /// Give the processor to other threads for a moment: the write path's group commit does,
    /// before a turn, while writers the last turn answered are on their way back with their
    /// next append. By default nothing (the simulator and tests run without it);
    /// [`runtime::SystemClock`] yields the thread.
    fn yield_now(&self) {}
}

impl fmt::Debug for dyn Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Reading the clock here would make debug output a hidden clock read.
        f.write_str("Clock")
    }
}

/// Upper bounds that keep every buffer and loop in the engine bounded.
pub mod limits {
    /// Largest encoded batch, header included.
    pub const BATCH_BYTES_MAX: u32 = 16 * 1024 * 1024;
    /// Bytes of a batch's header, before its records ([`crate::Record::encoded_bytes`] each).
    pub const BATCH_HEADER_BYTES: usize = 64;
    /// Most records in one batch.
    pub const BATCH_RECORDS_MAX: u32 = 1 << 20;
    /// Largest segment size a topic may configure; positions inside a segment fit in `u32`.
    pub const SEGMENT_BYTES_MAX: u64 = 1 << 30;
    /// Smallest segment size a topic may configure.
    pub const SEGMENT_BYTES_MIN: u64 = 4096;
    /// Most partitions per topic.
    pub const PARTITIONS_MAX: u32 = 4096;
    /// Longest topic name.
    pub const TOPIC_NAME_BYTES_MAX: usize = 200;
    /// Most write shards (`Options::write_shards`) an engine runs.
    pub const WRITE_SHARDS_MAX: usize = 64;
    /// Bytes read from a segment in one read operation while scanning.
    pub const SCAN_CHUNK_BYTES: usize = 4 * 1024 * 1024;
    /// Durable bytes past a partition's recovery point after which the write path makes a new
    /// one, unless `Options::recovery_point_bytes` says otherwise: what an open after a crash
    /// reads of each partition, at most (plus what was written since).
    pub const RECOVERY_POINT_BYTES_DEFAULT: u64 = 32 * 1024 * 1024;
    /// ... or milliseconds since the last one (`Options::recovery_point_ms`).
    pub const RECOVERY_POINT_MS_DEFAULT: u64 = 5_000;

    const _: () = assert!(BATCH_BYTES_MAX as u64 <= SEGMENT_BYTES_MAX);
    const _: () = assert!(SEGMENT_BYTES_MAX + BATCH_BYTES_MAX as u64 <= u32::MAX as u64);
    const _: () = assert!(SEGMENT_BYTES_MIN < SEGMENT_BYTES_MAX);
}
