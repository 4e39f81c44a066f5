//! How a processor application runs: [`ProcessorConfig`] and its builders, what the runner
//! does with input that does not decode ([`OnDecodeError`]), and how it tells of restores
//! ([`RestoreProgress`]). Plain data: nothing here reads a log or a store. The names derived
//! here (changelog topics, disk store directories, snapshot files) are spelled nowhere else,
//! so a restarted application finds what an earlier run wrote.

use crate::store::{DiskOptions, StoreKind, StoreMemory};
use crate::{Offset, RecordView};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Whether an input record decodes in the processor's formats: `Err(reason)` if not. Given
/// the input topic, so a check may leave some inputs alone (a topology's tables, whose empty
/// values are deletions).
pub type DecodeCheck = Arc<dyn Fn(&str, &RecordView<'_>) -> Result<(), String> + Send + Sync>;

/// What the runner does with an input record that [`ProcessorConfig::decode_check`] refuses
/// (Kafka Streams' deserialization exception handler, and its dead-letter queues).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnDecodeError {
    /// Stop the run with [`ProcessorError::Decode`]; nothing of the record's batch commits.
    ///
    /// [`ProcessorError::Decode`]: super::ProcessorError::Decode
    #[default]
    Fail,
    /// Leave the record out, counted in [`RunStats::skipped_records`], and go on.
    ///
    /// [`RunStats::skipped_records`]: super::RunStats::skipped_records
    Skip,
    /// Emit the record as it is (key, value, timestamp, headers) to `topic`, with the headers
    /// [`DEAD_LETTER_HEADERS`] added, in the task's next commit (exactly once), and go on.
    /// Counted in [`RunStats::dead_letters`]. The topic must exist when the runner is made.
    ///
    /// [`RunStats::dead_letters`]: super::RunStats::dead_letters
    DeadLetter { topic: String },
}

/// The headers a dead-lettered record gets: its input topic, partition and offset (decimal
/// text) and why it did not decode.
pub const DEAD_LETTER_HEADERS: [&str; 4] =
    ["dead_letter.topic", "dead_letter.partition", "dead_letter.offset", "dead_letter.error"];

/// Progress of one store's restore, for [`ProcessorConfig::on_restore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreProgress<'a> {
    pub store: &'a str,
    pub partition: u32,
    /// Changelog records applied so far, and the changelog's end when the restore began.
    pub restored: u64,
    pub end: Offset,
    /// The restore began from a local snapshot, or a disk store, holding the changelog up to
    /// this offset: it reads only the changelog after it.
    pub from_snapshot: Option<Offset>,
    /// Why a disk store's files were not used (missing beside runs, stale, foreign, damaged):
    /// it is rebuilt from the whole changelog.
    pub rebuilt: Option<&'a str>,
    pub done: bool,
}

/// A callback told of restore progress.
pub type RestoreListener = Arc<dyn Fn(RestoreProgress<'_>) + Send + Sync>;

/// How a processor application runs.
#[derive(Clone)]
pub struct ProcessorConfig {
    /// The application's name: its consumer group, and the prefix of its changelog topics.
    pub application: String,
    /// The input topics, co-partitioned (the same partition count); one task per partition,
    /// which reads partition `p` of every input, merged in timestamp order (ties: the input
    /// listed first). The first input is the one [`ProcessorConfig::new`] names.
    pub inputs: Vec<String>,
    /// Store names; each gets a changelog topic `<application>-<store>-changelog`.
    pub stores: Vec<String>,
    /// The kind of each store named here ([`ProcessorConfig::store_with`]); the others are
    /// of `store_kind`.
    pub store_kinds: BTreeMap<String, StoreKind>,
    /// The kind of the stores not in `store_kinds` (default: memory).
    pub store_kind: StoreKind,
    /// The memory budget the application's disk stores share (block cache, memtables, run
    /// indexes and Bloom filters), all partitions and stores together, except those given a
    /// budget of their own ([`DiskOptions::budget_bytes`]). `None` (the default): the
    /// process's, [`StoreMemory::process`], shared with every other application of the
    /// process. A clone of one `StoreMemory` given to several applications shares it.
    pub store_memory: Option<StoreMemory>,
    /// Commit at least this often while there is work (engine clock).
    pub commit_interval_ms: u64,
    /// Also commit after this many records since the last commit.
    pub commit_every_records: Option<u64>,
    /// Write a snapshot of every store after this many commits, and when a run stops cleanly;
    /// restores start from the snapshot and read only the changelog after it. `None`: no
    /// snapshots but at [`Runner::run_until`]'s clean stop; restores read the whole changelog.
    ///
    /// [`Runner::run_until`]: super::Runner::run_until
    pub snapshot_every_commits: Option<u64>,
    /// Worker threads for [`Runner::run_until`], and for restoring the tasks' stores in
    /// [`Runner::new`]; tasks are spread over them.
    ///
    /// [`Runner::run_until`]: super::Runner::run_until
    /// [`Runner::new`]: super::Runner::new
    pub threads: usize,
    pub punctuate_stream_ms: Option<i64>,
    pub punctuate_wall_ms: Option<i64>,
    pub on_restore: Option<RestoreListener>,
    /// Checks each input record before the processor gets it (`None`: no check, the
    /// default); what a refused record does is `on_decode_error`'s.
    pub decode_check: Option<DecodeCheck>,
    pub on_decode_error: OnDecodeError,
}

impl std::fmt::Debug for ProcessorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessorConfig")
            .field("application", &self.application)
            .field("inputs", &self.inputs)
            .field("stores", &self.stores)
            .field("store_kind", &self.store_kind)
            .field("store_kinds", &self.store_kinds)
            .field("store_memory", &self.store_memory)
            .field("commit_interval_ms", &self.commit_interval_ms)
            .field("threads", &self.threads)
            .field("on_decode_error", &self.on_decode_error)
            .finish_non_exhaustive()
    }
}

impl ProcessorConfig {
    pub fn new(application: &str, input: &str) -> ProcessorConfig {
        ProcessorConfig {
            application: application.to_owned(),
            inputs: vec![input.to_owned()],
            stores: Vec::new(),
            store_kinds: BTreeMap::new(),
            store_kind: StoreKind::default(),
            store_memory: None,
            commit_interval_ms: 100,
            commit_every_records: None,
            snapshot_every_commits: None,
            threads: 1,
            punctuate_stream_ms: None,
            punctuate_wall_ms: None,
            on_restore: None,
            decode_check: None,
            on_decode_error: OnDecodeError::Fail,
        }
    }

    /// Another input topic (a table to join, say), co-partitioned with the first.
    #[must_use]
    pub fn input(mut self, topic: &str) -> ProcessorConfig {
        self.inputs.push(topic.to_owned());
        self
    }

    #[must_use]
    pub fn store(mut self, name: &str) -> ProcessorConfig {
        self.stores.push(name.to_owned());
        self
    }

    /// A store of a given kind: `StoreKind::disk()` keeps it on disk, with a bounded cache.
    #[must_use]
    pub fn store_with(mut self, name: &str, kind: StoreKind) -> ProcessorConfig {
        self.stores.push(name.to_owned());
        self.store_kinds.insert(name.to_owned(), kind);
        self
    }

    /// The kind of `store`.
    pub fn kind_of(&self, store: &str) -> StoreKind {
        self.store_kinds.get(store).copied().unwrap_or(self.store_kind)
    }

    /// The memory budget the application's disk stores share (see
    /// [`ProcessorConfig::store_memory`]).
    ///
    /// ```
    /// use chronik::processor::{ProcessorConfig, StoreKind, StoreMemory};
    /// let memory = StoreMemory::new(512 << 20);
    /// let config = ProcessorConfig::new("app", "clicks")
    ///     .store_with("counts", StoreKind::disk())
    ///     .store_memory(memory.clone());
    /// assert_eq!(config.store_memory.map(|m| m.bytes()), Some(512 << 20));
    /// ```
    #[must_use]
    pub fn store_memory(mut self, memory: StoreMemory) -> ProcessorConfig {
        self.store_memory = Some(memory);
        self
    }

    /// The budget `store`'s partitions share in a runner: a new one if its kind gives it
    /// its own (made once per runner), else the application's, else the process's.
    pub(crate) fn memory_of(&self, store: &str) -> StoreMemory {
        match self.kind_of(store) {
            StoreKind::Disk(DiskOptions { budget_bytes: Some(bytes) }) => StoreMemory::new(bytes),
            _ => self.store_memory.clone().unwrap_or_else(StoreMemory::process),
        }
    }

    #[must_use]
    pub fn commit_interval_ms(mut self, ms: u64) -> ProcessorConfig {
        self.commit_interval_ms = ms;
        self
    }

    #[must_use]
    pub fn threads(mut self, threads: usize) -> ProcessorConfig {
        self.threads = threads;
        self
    }

    /// Call `listener` as each store's restore progresses (after each fetch, and once done),
    /// for progress bars and logs; [`RestoreProgress::rebuilt`] says why a disk store was
    /// rebuilt from its changelog.
    ///
    /// ```
    /// let config = chronik::processor::ProcessorConfig::new("app", "clicks")
    ///     .store("counts")
    ///     .on_restore(|p| if p.done { eprintln!("{}: {} restored", p.store, p.restored) });
    /// assert!(config.on_restore.is_some());
    /// ```
    #[must_use]
    pub fn on_restore(
        mut self,
        listener: impl Fn(RestoreProgress<'_>) + Send + Sync + 'static,
    ) -> ProcessorConfig {
        self.on_restore = Some(Arc::new(listener));
        self
    }

    /// The changelog topic of `store`.
    pub fn changelog(&self, store: &str) -> String {
        format!("{}-{store}-changelog", self.application)
    }

    /// The directory (under the engine's `state/`) of `store`'s disk store for `partition`.
    pub fn store_directory(&self, store: &str, partition: u32) -> String {
        format!("{}-{store}-{partition}.store", self.application)
    }

    /// The state file of `store`'s snapshot for `partition`.
    pub fn snapshot_file(&self, store: &str, partition: u32) -> String {
        format!("{}-{store}-{partition}.snapshot", self.application)
    }
}
