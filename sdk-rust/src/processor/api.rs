//! The processor's public API: the [`Processor`] trait and the [`Context`] it is called with,
//! what a run promises ([`Guarantee`]) and when it stops ([`Until`]), what it did
//! ([`RunStats`]) and why it stopped ([`ProcessorError`]). Invariant: only a task makes a
//! `Context` (its fields are the task's own stores and pending [`Outputs`], lent for one
//! call), so a processor's store writes and emitted records always land in the task that
//! commits them, and nothing a processor does reaches the log before that commit.

use super::error::{ProcessError, encode};
use crate::store::{Store, StoreError, Typed};
use crate::{CommitError, Offset, ReadError, RecordView, TopicError};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

/// Records one [`Processor::process_batch`] call gets at most. Commits for pending bytes are
/// considered between batches, so this also bounds how far past `PENDING_BYTES_MAX` a
/// commit's batches may grow.
pub const BATCH_RECORDS_MAX: usize = 1024;

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
    ///
    /// [`ProcessorConfig::decode_check`]: super::ProcessorConfig::decode_check
    /// [`OnDecodeError::Fail`]: super::OnDecodeError::Fail
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
    ///
    /// [`ProcessorConfig::punctuate_stream_ms`]: super::ProcessorConfig::punctuate_stream_ms
    /// [`ProcessorConfig::punctuate_wall_ms`]: super::ProcessorConfig::punctuate_wall_ms
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
    pub(super) stores: &'a mut BTreeMap<String, Store>,
    pub(super) outputs: &'a mut Outputs,
    pub(super) partition: u32,
    pub(super) stream_time: i64,
    pub(super) input: &'a str,
    /// The record being processed, where one is known (see [`ProcessorError::Process`]).
    pub(super) offset: Option<Offset>,
}

impl Context<'_> {
    /// The store named `name` (one of [`ProcessorConfig::stores`]).
    ///
    /// [`ProcessorConfig::stores`]: super::ProcessorConfig::stores
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

#[derive(Debug, Default)]
pub(super) struct Outputs {
    pub(super) records: Vec<Output>,
    pub(super) bytes: usize,
}

#[derive(Debug)]
pub(super) struct Output {
    pub(super) topic: String,
    pub(super) key: Option<Vec<u8>>,
    pub(super) value: Vec<u8>,
    pub(super) timestamp: Option<i64>,
    pub(super) headers: Vec<(Vec<u8>, Vec<u8>)>,
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
    ///
    /// [`OnDecodeError::Skip`]: super::OnDecodeError::Skip
    /// [`OnDecodeError::DeadLetter`]: super::OnDecodeError::DeadLetter
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
