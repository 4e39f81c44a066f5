//! Stateful stream processors: one task per input partition, each with named key-value stores
//! backed by compacted changelog topics, committing its outputs, its store changes and its
//! input position in one transaction ([`chronik_engine::Engine::commit_transaction`]), so that
//! after a crash at any moment the restored state and the outputs are exactly those of a run
//! without the crash.
//!
//! A task's loop: restore each store from its changelog (`<application>-<store>-changelog`,
//! partition = the input partition); start at the position the application's consumer group
//! committed; read a batch of input, call [`Processor::process`] per record; every
//! `commit_interval_ms` (and when caught up, and when the pending bytes grow large) commit.
//! Store writes apply at once (a task reads its own writes) and are coalesced per key until
//! the commit. A failed commit ends the run: the in-memory state is then ahead of what is
//! durable, and only a restart (restore) may continue.
//!
//! Changelog values carry one leading byte, `1`, before the stored value, so that an empty
//! stored value is not taken for a tombstone (an empty changelog value: the key was deleted).

use crate::store::{CHANGELOG_PUT, DiskStore, Files};
pub use crate::store::{DiskOptions, Store, StoreError, StoreKind};
use crate::{CommitError, Fetch, GroupCommit, Header, Io, Offset, ReadError, Record, RecordView};
use crate::{TopicConfig, TopicError, TransactionWrite};
use chronik_engine::Engine;
use chronik_engine::internals::canary::{self, Canary};
use chronik_engine::metrics::Metrics;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Bytes of input one step reads.
const STEP_FETCH_BYTES: usize = 1 << 20;
/// Bytes of changelog one restore read fetches.
const RESTORE_FETCH_BYTES: usize = 4 << 20;
/// Pending changelog and output bytes that force a commit before the interval: well under the
/// engine's batch limit, since one partition's writes of a commit are one batch.
const PENDING_BYTES_MAX: usize = 4 << 20;
/// Records one [`Processor::process_batch`] call gets at most. Commits for pending bytes are
/// considered between batches, so this also bounds how far past `PENDING_BYTES_MAX` a
/// commit's batches may grow.
pub const BATCH_RECORDS_MAX: usize = 1024;
/// How long an idle worker waits for input before looking again (and at the stop flag).
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// What a task needs of the log it runs on: the embedded engine, or (feature `kafka`) a
/// Kafka-protocol cluster. The task code (merge, batches, timers, commits, restores) is the
/// same on both.
pub(crate) trait TaskLog {
    fn now_ms(&self) -> i64;
    fn partition_count(&self, topic: &str) -> Option<u32>;
    /// Records of `topic`/`partition` from `from`, about `max_bytes` of them; from the log
    /// start instead if retention removed `from`.
    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Fetch, ProcessorError>;
    /// Where the partition ends for now: a fetch that reaches it holds all there is, so the
    /// merge of several inputs may decide without waiting for more.
    fn high_watermark(&self, topic: &str, partition: u32) -> Result<Offset, ProcessorError>;
    /// Append `writes` and commit the group's input positions, all or nothing.
    fn commit(
        &self,
        writes: &[TransactionWrite<'_>],
        group: Option<GroupCommit<'_>>,
    ) -> Result<(), ProcessorError>;
    /// A local snapshot of a task's state, if this log keeps them (a cluster does not: a
    /// partition may move to another machine, so its state always comes from the changelog).
    fn read_state_file(&self, _name: &str) -> Option<Vec<u8>> {
        None
    }
    /// Keep a snapshot; false when not kept.
    fn write_state_file(&self, _name: &str, _bytes: Vec<u8>) -> bool {
        false
    }
    fn metrics(&self) -> Option<&Metrics> {
        None
    }
    /// The I/O and directory disk stores keep their files in, if this log has a local one.
    fn state_files(&self) -> Result<(Arc<dyn Io>, PathBuf), StoreError> {
        Err(StoreError::Unavailable("this log keeps no local files".into()))
    }
}

impl<I: Io> TaskLog for Engine<I> {
    fn now_ms(&self) -> i64 {
        Engine::now_ms(self)
    }

    fn partition_count(&self, topic: &str) -> Option<u32> {
        Engine::partition_count(self, topic)
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Fetch, ProcessorError> {
        Ok(crate::cursor::read_in_range(self, topic, partition, from, max_bytes)?)
    }

    fn high_watermark(&self, topic: &str, partition: u32) -> Result<Offset, ProcessorError> {
        Ok(Engine::high_watermark(self, topic, partition)?)
    }

    fn commit(
        &self,
        writes: &[TransactionWrite<'_>],
        group: Option<GroupCommit<'_>>,
    ) -> Result<(), ProcessorError> {
        let appended = self.commit_transaction(writes, group)?;
        debug_assert!(appended.len() <= writes.len());
        Ok(())
    }

    fn read_state_file(&self, name: &str) -> Option<Vec<u8>> {
        Engine::read_state_file(self, name).ok().flatten()
    }

    fn write_state_file(&self, name: &str, bytes: Vec<u8>) -> bool {
        Engine::write_state_file(self, name, bytes).is_ok()
    }

    fn metrics(&self) -> Option<&Metrics> {
        Some(self.metrics_registry())
    }

    fn state_files(&self) -> Result<(Arc<dyn Io>, PathBuf), StoreError> {
        Engine::state_files(self).map_err(|e| StoreError::Unavailable(e.to_string()))
    }
}

#[cfg(feature = "kafka")]
pub(crate) mod kafka;

/// What a run promises about records processed across crashes and rebalances.
///
/// The embedded engine always commits exactly once. On a Kafka-protocol cluster, exactly once
/// needs Kafka transactions: a cluster without them makes an exactly-once run refuse to start
/// ([`ProcessorError::ExactlyOnceUnavailable`]), and at least once must be asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Guarantee {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

/// A guarantee spelled neither `exactly-once` nor `at-least-once`.
#[derive(Debug, thiserror::Error)]
#[error("unknown guarantee {0:?}: exactly-once or at-least-once")]
pub struct UnknownGuarantee(pub String);

impl std::str::FromStr for Guarantee {
    type Err = UnknownGuarantee;

    /// `exactly-once` or `at-least-once`, as the Python SDK and `CHRONIK_GUARANTEE` spell them.
    fn from_str(text: &str) -> Result<Guarantee, UnknownGuarantee> {
        match text {
            "exactly-once" => Ok(Guarantee::ExactlyOnce),
            "at-least-once" => Ok(Guarantee::AtLeastOnce),
            other => Err(UnknownGuarantee(other.to_owned())),
        }
    }
}

impl Guarantee {
    /// The guarantee `CHRONIK_GUARANTEE` names; exactly once when it is not set.
    pub fn from_env() -> Result<Guarantee, UnknownGuarantee> {
        std::env::var("CHRONIK_GUARANTEE").map_or(Ok(Guarantee::ExactlyOnce), |v| v.parse())
    }
}

/// When a run ([`crate::Connection::run`]) stops.
#[derive(Clone, Copy, Debug)]
pub enum Until<'a> {
    /// When the input is processed up to its end (on a cluster: when the group's committed
    /// positions of every input partition, whoever owns it, reach the ends).
    CaughtUp,
    /// When the flag is set (then the processors are closed and commit).
    Stopped(&'a AtomicBool),
}

/// The key and header of a commit marker in a changelog on a Kafka-protocol cluster: every
/// commit of a task ends each of its changelog partitions with one (see `processor::kafka`).
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) const MARKER_KEY: &[u8] = b"chronik.commit";
pub(crate) const MARKER_HEADER: &str = "chronik.commit";
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) const MARKER_MAGIC: &[u8; 4] = b"CHCM";

/// A marker's value: the commit's sequence number and its input positions.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) fn decode_marker(bytes: &[u8]) -> Option<(u64, Vec<Offset>)> {
    let rest = bytes.strip_prefix(MARKER_MAGIC)?;
    let (seq, rest) = rest.split_at_checked(8)?;
    if rest.len() % 8 != 0 {
        return None;
    }
    let seq = u64::from_le_bytes(seq.try_into().ok()?);
    let positions = rest
        .chunks_exact(8)
        .map(|c| Offset::new(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
        .collect();
    Some((seq, positions))
}

/// The committed state a changelog partition holds, key order: what a restore of a finished
/// run makes of it. `records` are the partition's records in offset order. Where commit markers
/// are present (a cluster's changelog), what follows the last one is an unfinished commit and
/// is left out. Records that are not store entries are skipped.
pub fn committed_state(records: &[crate::OwnedRecord]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let is_marker =
        |r: &crate::OwnedRecord| r.headers.iter().any(|(k, _)| k == MARKER_HEADER.as_bytes());
    let end = records.iter().rposition(is_marker).unwrap_or(records.len());
    let mut state = BTreeMap::new();
    for record in records[..end].iter().filter(|r| !is_marker(r)) {
        let key = record.key.clone().unwrap_or_default();
        match record.value.split_first() {
            None => {
                state.remove(&key);
            }
            Some((&CHANGELOG_PUT, stored)) => {
                state.insert(key, stored.to_vec());
            }
            Some(_) => {}
        }
    }
    state.into_iter().collect()
}

/// What a processor returns when it cannot go on; the run stops with it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProcessError(pub String);

impl ProcessError {
    pub fn new(message: impl Into<String>) -> ProcessError {
        ProcessError(message.into())
    }
}

/// Why a processor run stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessorError {
    #[error("invalid processor setup: {0}")]
    Config(String),
    /// The processor failed. `input` is the input topic it was processing (the first input
    /// for `init`, timers and `close`), `offset` the failing record's where the runner knows
    /// it: with the default [`Processor::process_batch`], which hands over one record at a
    /// time.
    #[error("input {input:?}, partition {partition}{}: {source}", at_offset(*.offset))]
    Process { input: String, partition: u32, offset: Option<u64>, source: ProcessError },
    /// An input record that [`ProcessorConfig::decode_check`] refused, under
    /// [`OnDecodeError::Fail`]. Nothing of its batch is committed.
    #[error("input {input:?}, partition {partition}, offset {offset}: cannot decode: {reason}")]
    Decode { input: String, partition: u32, offset: u64, reason: String },
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error(
        "store {store:?}, partition {partition}: the changelog holds a record that is not a store entry at offset {offset}"
    )]
    BadChangelog { store: String, partition: u32, offset: u64 },
    /// A disk store failed: its I/O, or damage found while reading it. A damaged store is
    /// rebuilt from the changelog when the runner is next opened.
    #[error("store {store:?}, partition {partition}: {source}")]
    Store { store: String, partition: u32, source: StoreError },
    #[error("a worker thread panicked")]
    Panicked,
    /// The Kafka-protocol cluster refused or failed (feature `kafka`).
    #[error("{0}")]
    Kafka(String),
    /// Exactly once was asked for on a cluster without Kafka transactions.
    #[error(
        "exactly-once processing refused: {0}. Run with Guarantee::AtLeastOnce to process at \
         least once (after a crash some records are processed twice)"
    )]
    ExactlyOnceUnavailable(String),
}

fn at_offset(offset: Option<u64>) -> String {
    offset.map(|offset| format!(", offset {offset}")).unwrap_or_default()
}

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
    #[default]
    Fail,
    /// Leave the record out, counted in [`RunStats::skipped_records`], and go on.
    Skip,
    /// Emit the record as it is (key, value, timestamp, headers) to `topic`, with the headers
    /// [`DEAD_LETTER_HEADERS`] added, in the task's next commit (exactly once), and go on.
    /// Counted in [`RunStats::dead_letters`]. The topic must exist when the runner is made.
    DeadLetter { topic: String },
}

/// The headers a dead-lettered record gets: its input topic, partition and offset (decimal
/// text) and why it did not decode.
pub const DEAD_LETTER_HEADERS: [&str; 4] =
    ["dead_letter.topic", "dead_letter.partition", "dead_letter.offset", "dead_letter.error"];

/// A stream processor: called for each input record of its partition, in order.
pub trait Processor: Send {
    /// Once, after the task's stores are restored and before any record.
    fn init(&mut self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }

    /// One input record. Read and write stores and emit records through `ctx`.
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError>;

    /// A run of records of one input, in offset order, between which no timer fires and no
    /// commit falls: the runner hands records over through this. The default calls
    /// [`Processor::process`] for each, with `ctx.stream_time()` advanced to each record.
    /// Override it to take something once per batch instead of once per record (the Python
    /// SDK takes the GIL once per batch) or to process records together. When it is called,
    /// `ctx.stream_time()` includes the first record; batches hold at most
    /// [`BATCH_RECORDS_MAX`] records.
    fn process_batch(
        &mut self,
        records: &[RecordView<'_>],
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        for record in records {
            ctx.stream_time = ctx.stream_time.max(record.timestamp());
            // So that a failure names its record.
            ctx.offset = Some(record.offset());
            self.process(record, ctx)?;
        }
        ctx.offset = None;
        Ok(())
    }

    /// A timer fired: stream time (the largest input timestamp seen) reached a multiple of
    /// [`ProcessorConfig::punctuate_stream_ms`] (called before the record that reached it, so
    /// windows are `[start, end)`; once however many multiples it jumped), or the engine
    /// clock one of [`ProcessorConfig::punctuate_wall_ms`]. Called between records.
    fn punctuate(
        &mut self,
        _time: Punctuation,
        _ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        Ok(())
    }

    /// Once, when the run stops cleanly, before the last commit.
    fn close(&mut self, _ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        Ok(())
    }
}

/// Which timer fired, and its time (milliseconds since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Punctuation {
    StreamTime(i64),
    WallClock(i64),
}

/// A processor's view of its task: its stores, where its records go, and time.
#[derive(Debug)]
pub struct Context<'a> {
    stores: &'a mut BTreeMap<String, Store>,
    outputs: &'a mut Outputs,
    partition: u32,
    stream_time: i64,
    input: &'a str,
    /// The record being processed, where one is known (see [`ProcessorError::Process`]).
    offset: Option<Offset>,
}

impl Context<'_> {
    /// The store named `name` (one of [`ProcessorConfig::stores`]).
    pub fn store(&mut self, name: &str) -> Result<&mut Store, ProcessError> {
        self.stores.get_mut(name).ok_or_else(|| ProcessError(format!("no store named {name:?}")))
    }

    /// Emit a record to `topic` (committed with the task's next commit). It goes to the
    /// partition of its key ([`crate::partition_for_key`]), or without a key to this task's
    /// partition number modulo the topic's partition count.
    pub fn emit(&mut self, topic: &str, key: Option<&[u8]>, value: &[u8]) {
        self.emit_owned(topic, key.map(<[u8]>::to_vec), value.to_vec());
    }

    /// [`Context::emit`] with bytes the caller already owns (no copy).
    pub fn emit_owned(&mut self, topic: &str, key: Option<Vec<u8>>, value: Vec<u8>) {
        self.emit_with(topic, key, value, None, Vec::new());
    }

    /// [`Context::emit_owned`] with the record's timestamp (`None`: the engine clock's time
    /// at the commit) and headers.
    pub fn emit_with(
        &mut self,
        topic: &str,
        key: Option<Vec<u8>>,
        value: Vec<u8>,
        timestamp: Option<i64>,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
    ) {
        let header_bytes: usize = headers.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
        self.outputs.bytes += key.as_ref().map_or(0, Vec::len) + value.len() + header_bytes + 32;
        self.outputs.records.push(Output {
            topic: topic.to_owned(),
            key,
            value,
            timestamp,
            headers,
        });
    }

    /// The store named `name`, through serde ([`Typed`]).
    pub fn typed<K, V>(&mut self, name: &str) -> Result<Typed<'_, K, V>, ProcessError> {
        Ok(self.store(name)?.typed())
    }

    /// [`Context::emit`] with a key and value encoded as JSON.
    pub fn emit_json<K: serde::Serialize, V: serde::Serialize>(
        &mut self,
        topic: &str,
        key: Option<&K>,
        value: &V,
    ) -> Result<(), ProcessError> {
        let key = key.map(encode).transpose()?;
        self.emit(topic, key.as_deref(), &encode(value)?);
        Ok(())
    }

    /// The input topic of the record being processed (the first input outside `process`).
    pub fn input(&self) -> &str {
        self.input
    }

    /// The input partition, which is also this task's store partition.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The largest input timestamp seen so far (`i64::MIN` before the first record).
    pub fn stream_time(&self) -> i64 {
        self.stream_time
    }
}

/// A store seen through serde: keys and values of your own types, encoded as JSON. Keys are
/// ordered by their encoding (for strings and non-negative integers of one width, their own
/// order). Get one with [`Context::typed`] or [`Store::typed`].
#[derive(Debug)]
pub struct Typed<'a, K, V> {
    store: &'a mut Store,
    types: std::marker::PhantomData<fn(K, V)>,
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, ProcessError> {
    serde_json::to_vec(value).map_err(|e| ProcessError(format!("cannot encode: {e}")))
}

/// Decode JSON bytes (a record's key or value, say) into `T`.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ProcessError> {
    serde_json::from_slice(bytes).map_err(|e| ProcessError(format!("cannot decode: {e}")))
}

impl<'a, K, V> Typed<'a, K, V> {
    pub(crate) fn new(store: &'a mut Store) -> Typed<'a, K, V> {
        Typed { store, types: std::marker::PhantomData }
    }
}

impl<K, V> Typed<'_, K, V>
where
    K: serde::Serialize + serde::de::DeserializeOwned,
    V: serde::Serialize + serde::de::DeserializeOwned,
{
    pub fn get(&self, key: &K) -> Result<Option<V>, ProcessError> {
        self.store.get(&encode(key)?).map(|v| decode(&v)).transpose()
    }

    pub fn put(&mut self, key: &K, value: &V) -> Result<(), ProcessError> {
        self.store.put(&encode(key)?, &encode(value)?);
        Ok(())
    }

    /// Remove `key`; returns whether it was there.
    pub fn delete(&mut self, key: &K) -> Result<bool, ProcessError> {
        Ok(self.store.delete(&encode(key)?))
    }

    /// Every entry, in the order of the encoded keys.
    pub fn iter(&self) -> impl Iterator<Item = Result<(K, V), ProcessError>> + '_ {
        self.store.iter().map(|entry| {
            let (k, v) = entry.map_err(|e| ProcessError::new(e.to_string()))?;
            Ok((decode(&k)?, decode(&v)?))
        })
    }

    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }
}

#[derive(Debug, Default)]
struct Outputs {
    records: Vec<Output>,
    bytes: usize,
}

#[derive(Debug)]
struct Output {
    topic: String,
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    timestamp: Option<i64>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
}

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
    /// Commit at least this often while there is work (engine clock).
    pub commit_interval_ms: u64,
    /// Also commit after this many records since the last commit.
    pub commit_every_records: Option<u64>,
    /// Write a snapshot of every store after this many commits, and when a run stops cleanly;
    /// restores start from the snapshot and read only the changelog after it. `None`: no
    /// snapshots but at [`Runner::run_until`]'s clean stop; restores read the whole changelog.
    pub snapshot_every_commits: Option<u64>,
    /// Worker threads for [`Runner::run_until`], and for restoring the tasks' stores in
    /// [`Runner::new`]; tasks are spread over them.
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

/// What a run did, summed over its tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Input records taken: handed to the processor, or left out by the decode policy.
    pub records: u64,
    pub commits: u64,
    pub emitted: u64,
    /// Changelog records applied by restores.
    pub restored: u64,
    /// Store snapshots restores started from, and snapshots written.
    pub snapshots_loaded: u64,
    pub snapshots_written: u64,
    /// Disk stores opened with their state (restores read only the changelog after it), and
    /// those found missing, stale, foreign or damaged and rebuilt from the changelog.
    pub stores_opened: u64,
    pub stores_rebuilt: u64,
    /// Events a topology's windowed operators found too late, committed in this run.
    pub late_records: u64,
    /// Input records that did not decode, left out ([`OnDecodeError::Skip`]) or sent to the
    /// dead-letter topic ([`OnDecodeError::DeadLetter`]).
    pub skipped_records: u64,
    pub dead_letters: u64,
}

impl RunStats {
    pub(crate) fn add(&mut self, other: RunStats) {
        self.records += other.records;
        self.commits += other.commits;
        self.emitted += other.emitted;
        self.restored += other.restored;
        self.snapshots_loaded += other.snapshots_loaded;
        self.snapshots_written += other.snapshots_written;
        self.stores_opened += other.stores_opened;
        self.stores_rebuilt += other.stores_rebuilt;
        self.late_records += other.late_records;
        self.skipped_records += other.skipped_records;
        self.dead_letters += other.dead_letters;
    }
}

/// A processor application over an engine: its tasks, restored and ready to run.
pub struct Runner<I: Io, P: Processor> {
    engine: Engine<I>,
    config: ProcessorConfig,
    tasks: Vec<Task<P>>,
    /// A failed commit or processor leaves a task's memory ahead of what is durable.
    failed: bool,
}

impl<I: Io, P: Processor> std::fmt::Debug for Runner<I, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("config", &self.config)
            .field("tasks", &self.tasks.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

struct Task<P> {
    partition: u32,
    processor: P,
    stores: BTreeMap<String, Store>,
    /// Per input, the next offset to process.
    positions: Vec<Offset>,
    /// Per input, the position as of the last commit.
    committed_positions: Vec<Offset>,
    /// The input of the record being processed.
    input: usize,
    outputs: Outputs,
    last_commit_ms: i64,
    /// Records processed since the last commit.
    uncommitted_records: u64,
    commits_since_snapshot: u64,
    stream_time: i64,
    next_stream_punctuation: Option<i64>,
    next_wall_punctuation: Option<i64>,
    stats: RunStats,
}

impl<I: Io, P: Processor> Runner<I, P> {
    /// Create the changelog topics that are missing (compacted, as many partitions as the
    /// input), restore every task's stores, and call each processor's `init`.
    pub fn new(
        engine: &Engine<I>,
        config: ProcessorConfig,
        mut factory: impl FnMut(u32) -> P,
    ) -> Result<Runner<I, P>, ProcessorError> {
        let first =
            config.inputs.first().ok_or_else(|| ProcessorError::Config("no input".into()))?;
        let partitions = engine
            .partition_count(first)
            .ok_or_else(|| TopicError::NotFound { name: first.clone() })?;
        for input in &config.inputs {
            let count = engine
                .partition_count(input)
                .ok_or_else(|| TopicError::NotFound { name: input.clone() })?;
            if count != partitions {
                return Err(ProcessorError::Config(format!(
                    "input {input} has {count} partitions, {first} {partitions}: inputs must be \
                     co-partitioned"
                )));
            }
        }
        if config.commit_interval_ms == 0 || config.threads == 0 {
            return Err(ProcessorError::Config("commit interval and threads must be > 0".into()));
        }
        // Now, not at the first bad record, which may come long after.
        if let OnDecodeError::DeadLetter { topic } = &config.on_decode_error
            && engine.partition_count(topic).is_none()
        {
            return Err(TopicError::NotFound { name: topic.clone() }.into());
        }
        for store in &config.stores {
            let topic = config.changelog(store);
            match engine.partition_count(&topic) {
                Some(count) if count == partitions => {}
                Some(count) => {
                    return Err(ProcessorError::Config(format!(
                        "changelog {topic} has {count} partitions, the input {partitions}"
                    )));
                }
                None => {
                    let changelog = TopicConfig {
                        partitions,
                        cleanup: crate::Cleanup::Compact,
                        ..TopicConfig::default()
                    };
                    match engine.create_topic(&topic, changelog) {
                        Ok(()) | Err(TopicError::AlreadyExists { .. }) => {}
                        Err(error) => return Err(error.into()),
                    }
                }
            }
        }
        let now = engine.now_ms();
        let restored = restore_all(engine, &config, partitions)?;
        let mut tasks = Vec::with_capacity(partitions as usize);
        for (partition, (stores, stats)) in (0..partitions).zip(restored) {
            let positions: Vec<Offset> = config
                .inputs
                .iter()
                .map(|input| {
                    engine
                        .committed_offset(&config.application, input, partition)
                        .unwrap_or(Offset::ZERO)
                })
                .collect();
            let task = Task::start(&config, partition, factory(partition), stores, positions, now);
            tasks.push(task.with_stats(&config, stats)?);
        }
        Ok(Runner { engine: engine.clone(), config, tasks, failed: false })
    }

    /// Run on the calling thread until every task has processed its input up to the high
    /// watermark, then commit. Deterministic: what the simulator and tests use.
    pub fn run_until_caught_up(&mut self) -> Result<RunStats, ProcessorError> {
        self.check_usable()?;
        let result = (|| {
            for task in &mut self.tasks {
                while !task.caught_up(&self.engine, &self.config)? {
                    let before = task.positions.clone();
                    let processed = task.step(&self.engine, &self.config)?;
                    if processed == 0 && canary::active(Canary::ReaderStopsAtEmptyFetch) {
                        break; // The bug: a step without a record taken for "caught up".
                    }
                    assert!(
                        processed > 0 || task.positions != before,
                        "a step below the high watermark processes records or moves on"
                    );
                }
                task.commit(&self.engine, &self.config)?;
                task.flush_stores(&self.engine, &self.config, true)?;
                if self.config.snapshot_every_commits.is_some() {
                    task.snapshot(&self.engine, &self.config);
                }
            }
            Ok(())
        })();
        self.finish(result)
    }

    /// Run the tasks on [`ProcessorConfig::threads`] worker threads until `stop` is set; then
    /// close the processors and commit.
    pub fn run_until(&mut self, stop: &AtomicBool) -> Result<RunStats, ProcessorError> {
        self.check_usable()?;
        let threads = self.config.threads.min(self.tasks.len()).max(1);
        let (engine, config) = (&self.engine, &self.config);
        let mut shares: Vec<Vec<&mut Task<P>>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, task) in self.tasks.iter_mut().enumerate() {
            shares[i % threads].push(task);
        }
        let outcomes: Vec<Result<(), ProcessorError>> = std::thread::scope(|scope| {
            let workers: Vec<_> = shares
                .into_iter()
                .map(|mut share| scope.spawn(move || work(engine, config, &mut share, stop)))
                .collect();
            workers.into_iter().map(|w| w.join().unwrap_or(Err(ProcessorError::Panicked))).collect()
        });
        let result = outcomes.into_iter().collect::<Result<Vec<()>, _>>().map(|_| ());
        let result = result.and_then(|()| {
            for task in &mut self.tasks {
                task.close(&self.engine, &self.config)?;
            }
            Ok(())
        });
        self.finish(result)
    }

    fn check_usable(&self) -> Result<(), ProcessorError> {
        if self.failed {
            return Err(ProcessorError::Config(
                "an earlier run failed: open a new runner to restore the state".into(),
            ));
        }
        Ok(())
    }

    fn finish(&mut self, result: Result<(), ProcessorError>) -> Result<RunStats, ProcessorError> {
        if let Err(error) = result {
            self.failed = true;
            return Err(error);
        }
        let mut stats = RunStats::default();
        for task in &mut self.tasks {
            stats.add(std::mem::take(&mut task.stats));
        }
        Ok(stats)
    }

    /// The application's configuration.
    pub fn config(&self) -> &ProcessorConfig {
        &self.config
    }

    /// A task's store, for inspection (tests, examples).
    pub fn store(&self, partition: u32, name: &str) -> Option<&Store> {
        self.tasks.get(partition as usize)?.stores.get(name)
    }

    /// Every task's stores.
    pub fn stores(&self) -> impl Iterator<Item = &Store> {
        self.tasks.iter().flat_map(|task| task.stores.values())
    }

    /// Every task's position in its first input (the next offset to process).
    pub fn positions(&self) -> Vec<Offset> {
        self.tasks.iter().map(|t| t.positions[0]).collect()
    }
}

fn work<I: Io, P: Processor>(
    engine: &Engine<I>,
    config: &ProcessorConfig,
    tasks: &mut [&mut Task<P>],
    stop: &AtomicBool,
) -> Result<(), ProcessorError> {
    while !stop.load(Ordering::Relaxed) {
        let mut processed = 0;
        for task in tasks.iter_mut() {
            processed += task.step(engine, config)?;
        }
        if processed == 0 {
            for task in tasks.iter_mut() {
                task.commit_if_due(engine, config, true)?;
            }
            if let Some(task) = tasks.first() {
                let (input, position) = (&config.inputs[0], task.positions[0]);
                engine.wait_for(input, task.partition, position, IDLE_WAIT)?;
            }
        }
    }
    Ok(())
}

/// What a task starts from: its stores, and what restoring them took.
type Restored = (BTreeMap<String, Store>, RunStats);

/// Restore every partition's stores, on up to [`ProcessorConfig::threads`] threads.
fn restore_all<I: Io>(
    engine: &Engine<I>,
    config: &ProcessorConfig,
    partitions: u32,
) -> Result<Vec<Restored>, ProcessorError> {
    let one = |partition: u32| -> Result<Restored, ProcessorError> {
        let mut stats = RunStats::default();
        let mut stores = BTreeMap::new();
        for name in &config.stores {
            stores.insert(name.clone(), restore(engine, config, name, partition, &mut stats)?);
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

/// Restore a store: a memory store from its snapshot (if any) and the changelog after it, a
/// disk store by opening it and reading the changelog after the offset it reflects.
pub(crate) fn restore<L: TaskLog + ?Sized>(
    engine: &L,
    config: &ProcessorConfig,
    name: &str,
    partition: u32,
    stats: &mut RunStats,
) -> Result<Store, ProcessorError> {
    let topic = config.changelog(name);
    let end = engine.high_watermark(&topic, partition)?;
    let _span = tracing::info_span!("restore", store = name, partition, end = end.get()).entered();
    let store = match config.kind_of(name) {
        StoreKind::Memory => restore_memory(engine, config, name, partition, end, stats)?,
        StoreKind::Disk(options) => {
            restore_disk(engine, config, name, partition, end, options, stats)?
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
                match record.value().split_first() {
                    None => apply(key, None),
                    Some((&CHANGELOG_PUT, stored)) => apply(key, Some(stored)),
                    Some(_) => {
                        return Err(ProcessorError::BadChangelog {
                            store: self.name.to_owned(),
                            partition: self.partition,
                            offset: record.offset().get(),
                        });
                    }
                }
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
        .read_state_file(&snapshot_name)
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
    options: crate::store::DiskOptions,
    stats: &mut RunStats,
) -> Result<Store, ProcessorError> {
    let failed = |source| ProcessorError::Store { store: name.to_owned(), partition, source };
    let (io, state_directory) = engine.state_files().map_err(failed)?;
    let directory = state_directory.join(config.store_directory(name, partition));
    let files = Files { io, directory };
    let identity = format!("{} partition {partition}", config.changelog(name));
    let (mut disk, mut rebuilt) = DiskStore::open(files, identity, options).map_err(failed)?;
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
    tracing::info!(restored, from = disk.offset().get(), entries = disk.len(), "disk store opened");
    Ok(store)
}

/// Store snapshots: every entry of a store and the changelog offset they cover, checksummed.
///
/// Layout, little endian: magic `CHSS` (4), version 1 (`u16`), changelog offset (`u64`),
/// entry count (`u64`), then per entry key length (`u32`), key, value length (`u32`), value;
/// then the xxh3-64 of everything before it (`u64`). Anything that does not decode is ignored
/// (the restore reads the whole changelog instead).
mod snapshot {
    use crate::Offset;
    use std::collections::BTreeMap;

    const MAGIC: &[u8; 4] = b"CHSS";
    const VERSION: u16 = 1;

    /// A store's entries.
    pub type Data = BTreeMap<Vec<u8>, Vec<u8>>;
    /// A store's entries in key order.
    pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

    pub fn encode(offset: Offset, data: &Data) -> Vec<u8> {
        let size: usize = data.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
        let mut bytes = Vec::with_capacity(30 + size);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&offset.get().to_le_bytes());
        bytes.extend_from_slice(&(data.len() as u64).to_le_bytes());
        for (key, value) in data {
            for part in [key, value] {
                let length = u32::try_from(part.len()).expect("store entries are under 4 GiB");
                bytes.extend_from_slice(&length.to_le_bytes());
                bytes.extend_from_slice(part);
            }
        }
        let checksum = chronik_engine::internals::format::key_hash(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// The offset and the entries, in key order.
    pub fn decode(bytes: &[u8]) -> Option<(Offset, Entries)> {
        let (body, checksum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
        if chronik_engine::internals::format::key_hash(body)
            != u64::from_le_bytes(checksum.try_into().ok()?)
        {
            return None;
        }
        let mut rest = body;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = rest.split_at_checked(n)?;
            rest = tail;
            Some(head)
        };
        if take(4)? != MAGIC || u16::from_le_bytes(take(2)?.try_into().ok()?) != VERSION {
            return None;
        }
        let offset = Offset::new(u64::from_le_bytes(take(8)?.try_into().ok()?));
        let count = u64::from_le_bytes(take(8)?.try_into().ok()?);
        // Entries come in key order: collected into a vector, the map is built in one pass.
        let mut entries = Vec::with_capacity(usize::try_from(count).ok()?.min(body.len() / 8));
        for _ in 0..count {
            let mut part = || -> Option<Vec<u8>> {
                let length = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
                Some(take(length)?.to_vec())
            };
            let key = part()?;
            let value = part()?;
            entries.push((key, value));
        }
        let sorted = entries.windows(2).all(|pair| pair[0].0 < pair[1].0);
        (rest.is_empty() && sorted).then_some((offset, entries))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn snapshots_round_trip_and_any_damage_is_refused() {
            let mut data = BTreeMap::new();
            data.insert(b"a".to_vec(), b"1".to_vec());
            data.insert(b"bb".to_vec(), Vec::new());
            let bytes = encode(Offset::new(42), &data);
            assert_eq!(decode(&bytes), Some((Offset::new(42), data.into_iter().collect())));
            for i in 0..bytes.len() {
                let mut damaged = bytes.clone();
                damaged[i] ^= 0x40;
                assert_eq!(decode(&damaged), None, "byte {i}");
            }
            assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
            assert_eq!(decode(&[]), None);
        }
    }
}

impl<P: Processor> Task<P> {
    /// A task of `partition` with restored `stores`, starting from `positions` (one per
    /// input); [`Task::with_stats`] then calls the processor's `init`.
    pub(crate) fn start(
        config: &ProcessorConfig,
        partition: u32,
        processor: P,
        stores: BTreeMap<String, Store>,
        positions: Vec<Offset>,
        now: i64,
    ) -> Task<P> {
        assert_eq!(positions.len(), config.inputs.len(), "a position per input");
        Task {
            partition,
            processor,
            stores,
            committed_positions: positions.clone(),
            positions,
            input: 0,
            outputs: Outputs::default(),
            last_commit_ms: now,
            uncommitted_records: 0,
            commits_since_snapshot: 0,
            stream_time: i64::MIN,
            next_stream_punctuation: None,
            next_wall_punctuation: config.punctuate_wall_ms.map(|ms| now + ms),
            stats: RunStats::default(),
        }
    }

    /// This task with what restoring it took counted, after the processor's `init`.
    pub(crate) fn with_stats(
        mut self,
        config: &ProcessorConfig,
        stats: RunStats,
    ) -> Result<Task<P>, ProcessorError> {
        self.stats = stats;
        self.call(&config.inputs[0], Processor::init)?;
        Ok(self)
    }

    /// Call the processor with a context over this task.
    fn call(
        &mut self,
        input: &str,
        f: impl FnOnce(&mut P, &mut Context<'_>) -> Result<(), ProcessError>,
    ) -> Result<(), ProcessorError> {
        let mut ctx = Context {
            stores: &mut self.stores,
            outputs: &mut self.outputs,
            partition: self.partition,
            stream_time: self.stream_time,
            input,
            offset: None,
        };
        let result = f(&mut self.processor, &mut ctx).map_err(|source| ProcessorError::Process {
            input: input.to_owned(),
            partition: self.partition,
            offset: ctx.offset.map(Offset::get),
            source,
        });
        self.check_stores()?;
        result
    }

    /// Fail if a disk store's read failed during the call: what the processor did after it
    /// may rest on a wrong answer, so nothing of it may be committed. A damaged store is
    /// condemned, so the next start rebuilds it from the changelog.
    fn check_stores(&self) -> Result<(), ProcessorError> {
        for (name, store) in &self.stores {
            store.check().map_err(|source| ProcessorError::Store {
                store: name.clone(),
                partition: self.partition,
                source,
            })?;
        }
        Ok(())
    }

    /// Flush the disk stores that want it (all with `every`), each at its changelog's end:
    /// right after a commit, so the state they take is exactly the committed state.
    fn flush_stores<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
        every: bool,
    ) -> Result<(), ProcessorError> {
        for (name, store) in &mut self.stores {
            let Some(disk) = store.disk_mut() else { continue };
            if !(every || disk.wants_flush()) {
                continue;
            }
            let end = engine.high_watermark(&config.changelog(name), self.partition)?;
            disk.flush(end).map_err(|source| ProcessorError::Store {
                store: name.clone(),
                partition: self.partition,
                source,
            })?;
        }
        Ok(())
    }

    /// Whether every input's position has reached its high watermark: the one meaning of
    /// "caught up" (a step that processed nothing may only have read past batches that
    /// compaction emptied).
    pub(crate) fn caught_up<L: TaskLog + ?Sized>(
        &self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<bool, ProcessorError> {
        debug_assert_eq!(self.positions.len(), config.inputs.len());
        for (input, &position) in config.inputs.iter().zip(&self.positions) {
            if position < engine.high_watermark(input, self.partition)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Process one fetch of every input, merged by timestamp; returns how many records it
    /// processed. The merge stops where an input's fetch runs out while that input has more
    /// (the next step fetches it), so the order never depends on fetch sizes.
    pub(crate) fn step<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<usize, ProcessorError> {
        let mut fetches = Vec::with_capacity(config.inputs.len());
        for (i, input) in config.inputs.iter().enumerate() {
            let fetch = engine.read(input, self.partition, self.positions[i], STEP_FETCH_BYTES)?;
            let complete = fetch.next_offset() >= engine.high_watermark(input, self.partition)?;
            fetches.push((fetch, complete));
        }
        let mut heads: Vec<_> = fetches
            .iter()
            .zip(self.positions.clone())
            .map(|((fetch, _), from)| {
                fetch.records().filter(move |r| r.offset() >= from).peekable()
            })
            .collect();
        // The merged order first, then batches of it.
        let mut order: Vec<(usize, RecordView<'_>)> = Vec::new();
        loop {
            let mut next: Option<(i64, usize)> = None;
            let mut undecided = false;
            for (i, head) in heads.iter_mut().enumerate() {
                // The bug: later inputs (tables) drained first, whatever their time.
                let ahead = i > 0 && canary::active(Canary::JoinTableAheadOfStream);
                match head.peek() {
                    Some(record) if ahead || next.is_none_or(|(t, _)| record.timestamp() < t) => {
                        next = Some((record.timestamp(), i));
                    }
                    Some(_) => {}
                    None => undecided |= !fetches[i].1,
                }
            }
            let Some((_, i)) = next.filter(|_| !undecided) else { break };
            order.push((i, heads[i].next().expect("peeked")));
        }
        let mut processed = 0;
        let mut start = 0;
        while start < order.len() {
            let input = order[start].0;
            // Timers first: a record at or past a window's end belongs to the next window.
            self.stream_time = self.stream_time.max(order[start].1.timestamp());
            self.punctuate_stream(config)?;
            let until_commit = config
                .commit_every_records
                .map_or(u64::MAX, |n| n.saturating_sub(self.uncommitted_records).max(1));
            let mut end = start + 1;
            let mut time = self.stream_time;
            while end < order.len()
                && order[end].0 == input
                && end - start < BATCH_RECORDS_MAX
                && ((end - start) as u64) < until_commit
            {
                time = time.max(order[end].1.timestamp());
                if self.next_stream_punctuation.is_some_and(|due| time >= due) {
                    break; // That record fires a timer first.
                }
                end += 1;
            }
            let batch = self.screen(config, input, &order[start..end])?;
            self.input = input;
            if !batch.is_empty() {
                self.call(&config.inputs[input], |processor, ctx| {
                    processor.process_batch(&batch, ctx)
                })?;
            }
            let last = &order[end - 1].1;
            self.stream_time = self.stream_time.max(time);
            self.positions[input] = last.offset().plus(1);
            // Records left out count too: they move the position, and so call for a commit.
            processed += end - start;
            self.uncommitted_records += (end - start) as u64;
            if config.commit_every_records.is_some_and(|n| self.uncommitted_records >= n)
                || self.pending_bytes() > PENDING_BYTES_MAX
            {
                self.commit(engine, config)?;
            }
            start = end;
        }
        for (i, head) in heads.iter_mut().enumerate() {
            if head.peek().is_none() {
                // Past offsets compaction removed at the end of the fetch (or at the log start,
                // when retention removed the position).
                self.positions[i] = fetches[i].0.next_offset();
            }
        }
        self.stats.records += processed as u64;
        self.commit_if_due(engine, config, false)?;
        Ok(processed)
    }

    /// The records of `run` (all of input `input`) that pass the decode check, the others
    /// failed, skipped or dead-lettered as `config.on_decode_error` says.
    fn screen<'r>(
        &mut self,
        config: &ProcessorConfig,
        input: usize,
        run: &[(usize, RecordView<'r>)],
    ) -> Result<Vec<RecordView<'r>>, ProcessorError> {
        let records = run.iter().map(|(_, record)| record.clone());
        let Some(check) = &config.decode_check else { return Ok(records.collect()) };
        let topic = &config.inputs[input];
        debug_assert!(run.iter().all(|(i, _)| *i == input), "a run is of one input");
        let mut passed = Vec::with_capacity(run.len());
        for record in records {
            let Err(reason) = check(topic, &record) else {
                passed.push(record);
                continue;
            };
            match &config.on_decode_error {
                OnDecodeError::Fail => {
                    return Err(ProcessorError::Decode {
                        input: topic.clone(),
                        partition: self.partition,
                        offset: record.offset().get(),
                        reason,
                    });
                }
                OnDecodeError::Skip => self.stats.skipped_records += 1,
                OnDecodeError::DeadLetter { topic: dead } => {
                    self.dead_letter(dead, topic, &record, &reason);
                    self.stats.dead_letters += 1;
                }
            }
        }
        Ok(passed)
    }

    /// Emit `record` unchanged to the dead-letter topic `dead`, with where it came from and
    /// why in [`DEAD_LETTER_HEADERS`]: committed with the task's outputs, so exactly once.
    fn dead_letter(&mut self, dead: &str, input: &str, record: &RecordView<'_>, reason: &str) {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> =
            record.headers().map(|h| (h.key.to_vec(), h.value.to_vec())).collect();
        let [topic, partition, offset, error] = DEAD_LETTER_HEADERS;
        headers.push((topic.into(), input.into()));
        headers.push((partition.into(), self.partition.to_string().into_bytes()));
        headers.push((offset.into(), record.offset().get().to_string().into_bytes()));
        headers.push((error.into(), reason.into()));
        let mut ctx = Context {
            stores: &mut self.stores,
            outputs: &mut self.outputs,
            partition: self.partition,
            stream_time: self.stream_time,
            input,
            offset: Some(record.offset()),
        };
        let key = record.key().map(<[u8]>::to_vec);
        ctx.emit_with(dead, key, record.value().to_vec(), Some(record.timestamp()), headers);
    }

    fn punctuate_stream(&mut self, config: &ProcessorConfig) -> Result<(), ProcessorError> {
        let Some(every) = config.punctuate_stream_ms.filter(|&ms| ms > 0) else { return Ok(()) };
        // The first window ends at the first multiple of `every` after the first record.
        let next = *self
            .next_stream_punctuation
            .get_or_insert_with(|| self.stream_time - self.stream_time.rem_euclid(every) + every);
        if self.stream_time >= next {
            let time = self.stream_time - self.stream_time.rem_euclid(every);
            self.next_stream_punctuation = Some(time + every);
            let input = &config.inputs[self.input];
            self.call(input, |processor, ctx| {
                processor.punctuate(Punctuation::StreamTime(time), ctx)
            })?;
        }
        Ok(())
    }

    fn pending_bytes(&self) -> usize {
        self.outputs.bytes + self.stores.values().map(Store::dirty_bytes).sum::<usize>()
    }

    pub(crate) fn commit_if_due<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
        idle: bool,
    ) -> Result<(), ProcessorError> {
        let now = engine.now_ms();
        if let Some(due) = self.next_wall_punctuation.filter(|&due| now >= due) {
            let every = config.punctuate_wall_ms.unwrap_or(1).max(1);
            self.next_wall_punctuation = Some(due + every * ((now - due) / every + 1));
            self.call(&config.inputs[0], |processor, ctx| {
                processor.punctuate(Punctuation::WallClock(now), ctx)
            })?;
        }
        let interval = i64::try_from(config.commit_interval_ms).unwrap_or(i64::MAX);
        let pending = self.pending_bytes() > 0 || self.positions != self.committed_positions;
        if pending && (idle || now.saturating_sub(self.last_commit_ms) >= interval) {
            self.commit(engine, config)?;
        }
        Ok(())
    }

    /// One transaction: every store's changes to its changelog partition, the outputs, and
    /// the input position.
    pub(crate) fn commit<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<(), ProcessorError> {
        if self.pending_bytes() == 0 && self.positions == self.committed_positions {
            return Ok(());
        }
        if canary::active(Canary::SnapshotAheadOfChangelog) {
            self.snapshot(engine, config);
        }
        if canary::active(Canary::StoreAppliedBeforeCommit) {
            // The bug: disk stores take the changes before their transaction commits.
            self.flush_stores(engine, config, true)?;
        }
        let changelogs: Vec<(String, Vec<Record<'_>>)> = self
            .stores
            .iter()
            .filter(|(_, store)| store.has_changes())
            .map(|(name, store)| (config.changelog(name), store.changes()))
            .collect();
        let mut outputs: BTreeMap<(String, u32), Vec<usize>> = BTreeMap::new();
        for (i, output) in self.outputs.records.iter().enumerate() {
            let count = engine
                .partition_count(&output.topic)
                .ok_or_else(|| TopicError::NotFound { name: output.topic.clone() })?;
            let partition = match &output.key {
                Some(key) => crate::partition_for_key(key, count),
                None => self.partition % count,
            };
            outputs.entry((output.topic.clone(), partition)).or_default().push(i);
        }
        let headers: Vec<Vec<Header<'_>>> = self
            .outputs
            .records
            .iter()
            .map(|output| output.headers.iter().map(|(key, value)| Header { key, value }).collect())
            .collect();
        let output_records: Vec<Vec<Record<'_>>> = outputs
            .values()
            .map(|indexes| {
                indexes
                    .iter()
                    .map(|&i| {
                        let output = &self.outputs.records[i];
                        let record = Record::new(output.key.as_deref(), &output.value)
                            .with_headers(&headers[i]);
                        match output.timestamp {
                            Some(timestamp) => record.with_timestamp(timestamp),
                            None => record,
                        }
                    })
                    .collect()
            })
            .collect();
        let mut writes: Vec<TransactionWrite<'_>> = Vec::new();
        for (topic, records) in &changelogs {
            writes.push(TransactionWrite { topic, partition: self.partition, records });
        }
        for ((topic, partition), records) in outputs.keys().zip(&output_records) {
            writes.push(TransactionWrite { topic, partition: *partition, records });
        }
        let offsets: Vec<(&str, u32, Offset)> = config
            .inputs
            .iter()
            .zip(&self.positions)
            .map(|(input, &position)| (input.as_str(), self.partition, position))
            .collect();
        let group = GroupCommit { group: &config.application, offsets: &offsets };
        let early = changelogs.len();
        if canary::active(Canary::InputCommittedBeforeOutputs) {
            engine.commit(&[], Some(group))?;
            engine.commit(&writes, None)?;
        } else if canary::active(Canary::StateAppliedBeforeCommit) {
            engine.commit(&writes[..early], None)?;
            engine.commit(&writes[early..], Some(group))?;
        } else {
            engine.commit(&writes, Some(group))?;
        }
        self.stats.commits += 1;
        self.stats.emitted += self.outputs.records.len() as u64;
        drop(writes);
        drop(output_records);
        drop(headers);
        drop(changelogs);
        for store in self.stores.values_mut() {
            store.committed();
        }
        self.outputs = Outputs::default();
        self.committed_positions.clone_from(&self.positions);
        self.uncommitted_records = 0;
        self.last_commit_ms = engine.now_ms();
        self.flush_stores(engine, config, false)?;
        self.commits_since_snapshot += 1;
        if config.snapshot_every_commits.is_some_and(|n| self.commits_since_snapshot >= n) {
            self.snapshot(engine, config);
        }
        Ok(())
    }

    /// Write every store's snapshot, each with the changelog end it covers: right after a
    /// commit, so exactly the committed state. A snapshot that fails to write is skipped (the
    /// restore reads more of the changelog, that is all).
    fn snapshot<L: TaskLog + ?Sized>(&mut self, engine: &L, config: &ProcessorConfig) {
        for (name, store) in &self.stores {
            if store.disk().is_some() {
                continue; // A disk store is its own snapshot.
            }
            let Ok(end) = engine.high_watermark(&config.changelog(name), self.partition) else {
                continue;
            };
            let bytes = snapshot::encode(end, store.memory_data());
            if engine.write_state_file(&config.snapshot_file(name, self.partition), bytes) {
                self.stats.snapshots_written += 1;
            }
        }
        self.commits_since_snapshot = 0;
    }

    pub(crate) fn close<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<(), ProcessorError> {
        self.call(&config.inputs[0], Processor::close)?;
        self.commit(engine, config)?;
        self.flush_stores(engine, config, true)?;
        self.snapshot(engine, config);
        Ok(())
    }
}
