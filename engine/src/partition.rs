//! One partition: what readers see (the segment list, the high watermark), the requests of
//! the write path, and maintenance (retention, compaction).
//!
//! The write path is the second design's: a request (append, flush, a transaction's steps)
//! goes to the engine's [`WritePath`] and is answered when the partition's log
//! (`crate::log`) and the reactor have done it; no lock of the partition is held meanwhile.
//! What the log decides comes back as events through [`PartitionHost`], which keeps the
//! segment list and the watermark that readers use: a batch's index entry when it is placed,
//! the active segment's end when its write completed, the watermark when the mode allows,
//! the next segment when a roll created it.
//!
//! Locks, in the only order they are taken (none while holding one later in the list):
//! `maintenance` (retention and compaction, held for a whole pass), the write path's reactor
//! (held by its driver for a turn; the host callbacks run under it), `state` (the segment list
//! and the partition's flags), then the watermark's. The compaction bookkeeping
//! (`first_dirty`, `compaction_blocked`, `compaction_failure`) is taken with no other lock
//! held but `maintenance`. No thread holds `state` while it waits for the write path.

use crate::canary::{self, Canary};
use crate::checkpoint::CheckpointWriter;
use crate::compaction::{self, CleanError, KEY_MAP_ENTRIES_MAX, Source};
use crate::engine::{Durability, Poison};
use crate::error::{AppendError, Corruption, CorruptionKind, IoError, OpenError, ReadError};
use crate::fetch::Fetch;
use crate::format::{self, DecodeError};
use crate::io::{self, Io, OpenMode};
use crate::limits::BATCH_BYTES_MAX;
use crate::log::{self as write_log, Acked, Batch, Event, Failure, PartitionLog, Refusal};
use crate::log_start;
use crate::metrics::Metrics;
use crate::reactor::{self, Host, PartitionId};
use crate::recovery::{self, PartitionRecovery};
use crate::segment::{self, LOG_SUFFIX, Segment, SegmentFile};
use crate::sync::Mutex;
use crate::topic::TopicConfig;
use crate::watermark::Watermark;
pub(crate) use crate::write_path::Request;
use crate::write_path::WritePath;
use crate::{Clock, Offset, Record};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The offsets a successful append was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: Offset,
    pub last_offset: Offset,
}

#[derive(Debug)]
struct State<I: Io> {
    /// Ordered by base offset; the last one is active. Never empty.
    segments: Vec<Segment<I>>,
    /// Damaged synced data found at open at the end of the log: appends are refused and reads
    /// at or after this offset report it.
    damaged: Option<(Offset, Corruption)>,
    /// The topic was deleted: appends are refused, so none can roll into a removed directory.
    deleted: bool,
    /// The topic's settings; [`Partition::set_config`] changes them.
    config: TopicConfig,
    /// Read-only: the position in the active segment where open stopped at bytes that do not
    /// parse (a torn tail the writer has not cut yet). `refresh` waits there instead of taking
    /// those same bytes for a rewrite.
    unread_tail: Option<u64>,
}

impl<I: Io> State<I> {
    fn active(&self) -> &Segment<I> {
        self.segments.last().expect("a partition always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment<I> {
        self.segments.last_mut().expect("a partition always has an active segment")
    }

    fn next_offset(&self) -> Offset {
        self.active().next_offset
    }
}

/// What one compaction pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    pub segments_in: u64,
    pub segments_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub records_in: u64,
    pub records_kept: u64,
    /// Distinct keys in the pass's key map.
    pub keys: u64,
    /// Writing the new segments' index files or `cleaner.offset` failed (derived data: the
    /// pass stands, and the next open rebuilds the indexes or cleans from further back).
    pub derived_files_failed: bool,
}

/// A partition as [`crate::Engine::describe_topic`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionDescription {
    pub partition: u32,
    pub log_start_offset: Offset,
    pub log_end_offset: Offset,
    /// The end of what readers may see.
    pub high_watermark: Offset,
    pub segment_count: usize,
    pub size_bytes: u64,
    /// Compaction passes that rewrote segments since the partition was opened.
    pub compaction_passes: u64,
    /// Every offset below this was cleaned by compaction (0 for a log never compacted).
    pub cleaned_offset: Offset,
    /// Bytes of the segments holding offsets at or after `cleaned_offset`: the dirty part
    /// (`dirty_bytes / size_bytes` is the dirty ratio).
    pub dirty_bytes: u64,
    /// Compaction met damage in a segment and stopped for this partition until it is
    /// reopened (reads report the damage where they meet it).
    pub compaction_blocked: bool,
    /// Compaction passes abandoned on an I/O error before a group's commit (that group is as
    /// it was; the tick retries after a back-off). See [`Engine::compaction_error`].
    ///
    /// [`Engine::compaction_error`]: crate::Engine::compaction_error
    pub compaction_failures: u64,
}

/// A compaction pass abandoned on an I/O error before it committed anything.
#[derive(Clone, Debug)]
pub struct CompactionFailure {
    /// The error, as its `Display` wrote it (operation, file and cause).
    pub message: String,
    pub kind: std::io::ErrorKind,
    /// Failures in a row, for the back-off.
    pub streak: u32,
    /// Engine clock time before which the tick does not try this partition again.
    pub retry_at_ms: i64,
}

/// First back-off after an abandoned compaction pass; it doubles per failure in a row.
const COMPACTION_BACKOFF_MS: i64 = 1_000;
/// Longest back-off between compaction attempts after failures.
const COMPACTION_BACKOFF_MAX_MS: i64 = 60_000;

/// An append in flight ([`crate::Engine::append_nowait`]): its offsets once the write path
/// has done it, durably in `sync` mode. Wait for it (driving the write path when nobody else
/// does), look whether it is in ([`PendingAppend::try_take`]), or await it as a
/// [`std::future::Future`], which needs the engine's driver thread
/// ([`crate::runtime::Runtime`]) or another caller waiting. Appends to one partition are
/// given offsets in the order they were queued. Dropped unanswered, the append still happens;
/// only its answer is thrown away.
#[derive(Debug)]
pub struct PendingAppend<I: Io> {
    partition: Arc<Partition<I>>,
    pending: crate::write_path::Pending<I>,
    started: u64,
}

impl<I: Io> PendingAppend<I> {
    /// Block until the append is done (or failed).
    pub fn wait(self) -> Result<Appended, AppendError> {
        let result = self.partition.appended(self.pending.wait());
        self.partition.count_append(&result, self.started);
        result
    }

    /// The outcome, if it is in; never blocks and never drives.
    pub fn try_take(&mut self) -> Option<Result<Appended, AppendError>> {
        let answer = self.pending.try_take()?;
        let result = self.partition.appended(answer);
        self.partition.count_append(&result, self.started);
        Some(result)
    }
}

impl<I: Io> std::future::Future for PendingAppend<I> {
    type Output = Result<Appended, AppendError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let answer = std::task::ready!(std::pin::Pin::new(&mut self.pending).poll(cx));
        let result = self.partition.appended(answer);
        self.partition.count_append(&result, self.started);
        std::task::Poll::Ready(result)
    }
}

/// A request of a partition in flight ([`Partition::submit`]).
pub(crate) struct Requested<'a, I: Io> {
    partition: &'a Partition<I>,
    pending: crate::write_path::Pending<I>,
}

impl<I: Io> Requested<'_, I> {
    pub fn wait(self) -> Result<Acked, AppendError> {
        // An answer stands even if the engine was poisoned meanwhile (by another partition's
        // failure in the same turn, say): what the log acknowledged was done, durably in
        // `sync` mode; reporting it failed would invite a duplicate.
        self.pending.wait().map_err(|refusal| self.partition.refused(refusal))
    }
}

/// A writable partition's place in the engine's write path.
#[derive(Debug)]
struct Writer<I: Io> {
    path: Arc<WritePath<I>>,
    id: PartitionId,
}

#[derive(Debug)]
pub(crate) struct Partition<I: Io> {
    topic: String,
    id: u32,
    directory: PathBuf,
    io: Arc<I>,
    clock: Arc<dyn Clock>,
    poison: Arc<Poison>,
    metrics: Arc<Metrics>,
    durability: Durability,
    state: Mutex<State<I>>,
    /// `None` when opened read-only.
    writer: Option<Writer<I>>,
    /// Serialises retention and compaction; taken before any other lock.
    maintenance: Mutex<()>,
    /// Compaction: every offset below this was cleaned by an earlier pass (`cleaner.offset`).
    first_dirty: Mutex<Offset>,
    compaction_passes: AtomicU64,
    /// Damage found by compaction in a source segment: no more passes until reopened.
    compaction_blocked: Mutex<Option<Corruption>>,
    /// The last abandoned pass (an I/O error before its commit) and when to try again.
    compaction_failure: Mutex<Option<CompactionFailure>>,
    compaction_failures: AtomicU64,
    /// What readers may see: the durable end in `sync` and `interval` modes, the written end in
    /// `os` mode (`watermark.rs`: lock-free reads, waiters).
    watermark: Watermark,
}

#[derive(Debug)]
pub(crate) struct PartitionContext<I: Io> {
    pub io: Arc<I>,
    pub clock: Arc<dyn Clock>,
    pub poison: Arc<Poison>,
    pub metrics: Arc<Metrics>,
    pub durability: Durability,
    pub read_only: bool,
    /// Segment files are written with direct I/O ([`crate::Options::direct_io`]).
    pub direct: bool,
    /// The engine's write path; `None` when opened read-only.
    pub write_path: Option<Arc<WritePath<I>>>,
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
            write_path: self.write_path.clone(),
        }
    }
}

/// What the write path tells a partition (see the module documentation). Holds the partition
/// weakly: the reactor must not keep a closed partition alive.
struct PartitionHost<I: Io> {
    partition: Weak<Partition<I>>,
}

impl<I: Io> Host<I> for PartitionHost<I> {
    fn on_event(&self, event: &Event) {
        if let Some(partition) = self.partition.upgrade() {
            partition.on_event(event);
        }
    }

    fn created(&self, file: Arc<SegmentFile<I>>, now_ms: i64) {
        if let Some(partition) = self.partition.upgrade() {
            let mut state = partition.state.lock();
            let base = state.next_offset();
            let interval = state.config.index_interval_bytes;
            state.segments.push(Segment::empty_shared(base, file, interval, now_ms));
        }
    }

    fn index_files(&self, segment: Offset, length: u64, next_offset: Offset) -> (Vec<u8>, Vec<u8>) {
        let partition = self.partition.upgrade().expect("a sealing partition is alive");
        let state = partition.state.lock();
        let sealed = state
            .segments
            .iter()
            .find(|s| s.base_offset == segment)
            .expect("the segment being sealed is in the list");
        assert_eq!((sealed.size, sealed.next_offset), (length, next_offset), "sealed as written");
        sealed.index.encode(length, next_offset)
    }
}

impl<I: Io> Partition<I> {
    /// Create the directory of a new partition with an empty first segment. The caller fsyncs
    /// the parent directory.
    pub fn create_files(io: &I, directory: &Path) -> Result<(), IoError> {
        io.create_directory(directory).map_err(|e| IoError::new("mkdir", directory, e))?;
        let path = directory.join(segment::file_name(Offset::ZERO, LOG_SUFFIX));
        for path in [path, directory.join(crate::checkpoint::CHECKPOINT_FILE)] {
            let file = io
                .open(&path, OpenMode::CreateNew)
                .map_err(|e| IoError::new("create", &path, e))?;
            io.close(file);
        }
        io::sync_directory(io, directory).map_err(|e| IoError::new("fsync", directory, e))
    }

    /// Open and recover the partition stored in `directory`, and (writable) hand its write
    /// path to the engine's reactor.
    pub fn open(
        context: &PartitionContext<I>,
        directory: PathBuf,
        topic: &str,
        id: u32,
        config: TopicConfig,
        transaction_end: Offset,
    ) -> Result<(Arc<Self>, PartitionRecovery), OpenError> {
        let now = context.clock.now_ms();
        let read_only = context.read_only;
        let span = tracing::info_span!("recovery", topic, partition = id, read_only).entered();
        let recovered = recovery::recover_partition(
            context,
            &directory,
            topic,
            id,
            &config,
            now,
            transaction_end,
        )
        .inspect_err(|error| tracing::error!(%error, "recovery failed"))?;
        if recovered.report.is_clean() {
            tracing::debug!(segments = recovered.segments.len(), "clean");
        } else {
            tracing::warn!(report = %recovered.report, "recovered");
        }
        drop(span);
        let active = recovered.segments.last().expect("recovery yields a segment");
        let (base, size, end) = (active.base_offset, active.size, active.next_offset);
        let log_state = write_log::Recovered {
            base_offset: base,
            size,
            next_offset: end,
            created_ms: active.created_ms,
            tail: active.tail.clone(),
        };
        let active_file = Arc::clone(&active.file);
        let checkpoint = if context.write_path.is_some() {
            let mut checkpoint =
                CheckpointWriter::open(&context.io, &directory, recovered.checkpoint)?;
            if recovered.damaged.is_none() {
                // Recovery fsynced what it kept; record it as evidence for the next recovery.
                checkpoint.record(base, size, end)?;
                if recovered.report.rolled_back_records > 0 {
                    // Durably, so no older slot naming the rolled-back bytes outlives a crash.
                    checkpoint.sync()?;
                }
            }
            Some(checkpoint)
        } else {
            None
        };
        let log_config = write_log::Config {
            durability: context.durability,
            segment_bytes: config.segment_bytes,
            segment_ms: config.segment_ms,
            direct: context.direct,
        };
        let state = State {
            config,
            unread_tail: (read_only && recovered.report.truncated_bytes > 0).then_some(size),
            segments: recovered.segments,
            damaged: recovered.damaged,
            deleted: false,
        };
        let cleaned = log_start::read_cleaner_offset(&*context.io, &directory);
        let report = recovered.report;
        let partition = Arc::new_cyclic(|weak: &Weak<Partition<I>>| {
            let writer = context.write_path.as_ref().zip(checkpoint).map(|(path, checkpoint)| {
                let log = PartitionLog::new(log_config, log_state, now);
                let host: Arc<dyn Host<I>> = Arc::new(PartitionHost { partition: weak.clone() });
                let directory = directory.clone();
                let id = path.with_reactor(|reactor| {
                    reactor.add(directory, log, active_file, checkpoint, host)
                });
                Writer { path: Arc::clone(path), id }
            });
            Partition {
                topic: topic.to_owned(),
                id,
                directory,
                io: Arc::clone(&context.io),
                clock: Arc::clone(&context.clock),
                poison: Arc::clone(&context.poison),
                metrics: Arc::clone(&context.metrics),
                durability: context.durability,
                state: Mutex::new(state),
                writer,
                maintenance: Mutex::new(()),
                first_dirty: Mutex::new(cleaned),
                compaction_passes: AtomicU64::new(0),
                compaction_blocked: Mutex::new(None),
                compaction_failure: Mutex::new(None),
                compaction_failures: AtomicU64::new(0),
                watermark: Watermark::new(end),
            }
        });
        Ok((partition, report))
    }

    pub fn high_watermark(&self) -> Offset {
        self.watermark.get()
    }

    fn publish(&self, offset: Offset) {
        self.watermark.publish(offset);
    }

    /// Take in what the log decided (through the reactor's host callback).
    fn on_event(&self, event: &Event) {
        match event {
            Event::Placed { position, info } => {
                let mut state = self.state.lock();
                let active = state.active_mut();
                assert!(info.base_offset >= active.base_offset, "placed in the active segment");
                reactor::on_placed(&mut active.index, *position, info);
            }
            Event::Written { end, position } => {
                let mut state = self.state.lock();
                let active = state.active_mut();
                assert!(*end >= active.next_offset && *position >= active.size, "never back");
                (active.next_offset, active.size) = (*end, *position);
            }
            Event::Published(offset) => {
                // Fail-stop: once the engine is poisoned nothing more is shown as durable.
                if self.durability == Durability::Os || self.poison.check().is_ok() {
                    self.publish(*offset);
                }
            }
            Event::Rolled { segment } => {
                let state = self.state.lock();
                assert_eq!(state.active().base_offset, *segment, "the host made the new segment");
            }
            Event::Poisoned(failure) => {
                self.poison.set(format!("{}/{}: {failure}", self.topic, self.id));
            }
        }
    }

    /// Block until a record at `offset` is visible or `timeout` passes. Returns whether it is.
    pub fn wait_for(&self, offset: Offset, timeout: Duration) -> Result<bool, ReadError> {
        if self.writer.is_none() {
            // Read-only: another process writes, and nothing here is notified. Look, wait,
            // look again.
            self.refresh()?;
            if self.high_watermark() <= offset {
                self.watermark.wait_change(timeout);
                self.refresh()?;
            }
            return Ok(self.high_watermark() > offset);
        }
        // Every publish wakes every waiter, also those waiting for a later offset: it waits
        // again until the offset is visible or the whole timeout has passed.
        Ok(self.watermark.wait_past(offset, timeout))
    }

    pub fn describe(&self) -> PartitionDescription {
        // Read before `state`: one guard at a time (a second lock in the same expression would
        // wait for itself).
        let cleaned = *self.first_dirty.lock();
        let state = self.state.lock();
        PartitionDescription {
            partition: self.id,
            log_start_offset: state.segments[0].base_offset,
            log_end_offset: state.next_offset(),
            high_watermark: self.high_watermark(),
            segment_count: state.segments.len(),
            size_bytes: state.segments.iter().map(|s| s.size).sum(),
            compaction_passes: self.compaction_passes.load(Ordering::Relaxed),
            cleaned_offset: cleaned,
            dirty_bytes: state
                .segments
                .iter()
                .filter(|s| s.next_offset > cleaned)
                .map(|s| s.size)
                .sum(),
            compaction_blocked: self.compaction_blocked.lock().is_some(),
            compaction_failures: self.compaction_failures.load(Ordering::Relaxed),
        }
    }

    /// The last abandoned compaction pass, while no pass has succeeded since.
    pub fn compaction_failure(&self) -> Option<CompactionFailure> {
        self.compaction_failure.lock().clone()
    }

    fn poison_with(&self, error: &IoError) {
        self.poison.set(format!("{}/{}: {error}", self.topic, self.id));
    }

    pub fn append(&self, records: &[Record<'_>]) -> Result<Appended, AppendError> {
        let started = self.clock.monotonic_us();
        let result = self.append_unmeasured(records);
        self.count_append(&result, started);
        result
    }

    fn append_unmeasured(&self, records: &[Record<'_>]) -> Result<Appended, AppendError> {
        self.poison.check()?;
        if canary::active(Canary::AppendPanicsOnEmptyValue) {
            assert!(records.iter().all(|r| !r.value.is_empty()), "canary: an empty value");
        }
        let batch = self.encode(records)?;
        let appended = Self::as_appended(self.submit(Request::Append(batch))?.wait()?);
        if canary::active(Canary::AppendReportsWrongOffset) && appended.base_offset.get() > 0 {
            let base_offset = Offset::new(appended.base_offset.get() - 1);
            let last_offset = Offset::new(appended.last_offset.get() - 1);
            return Ok(Appended { base_offset, last_offset });
        }
        Ok(appended)
    }

    /// Queue an append and return at once; see [`PendingAppend`].
    pub fn append_nowait(
        self: &Arc<Self>,
        records: &[Record<'_>],
    ) -> Result<PendingAppend<I>, AppendError> {
        self.poison.check()?;
        let writer = self.writer.as_ref().ok_or(AppendError::ReadOnly)?;
        self.check_appendable()?;
        let batch = self.encode(records)?;
        let pending = writer.path.submit(writer.id, Request::Append(batch));
        let started = self.clock.monotonic_us();
        Ok(PendingAppend { partition: Arc::clone(self), pending, started })
    }

    /// Count an answered append in the metrics.
    fn count_append(&self, result: &Result<Appended, AppendError>, started: u64) {
        let m = &self.metrics;
        match result {
            Ok(appended) => {
                Metrics::add(&m.appends, 1);
                Metrics::add(
                    &m.records_appended,
                    (appended.last_offset.get() + 1).saturating_sub(appended.base_offset.get()),
                );
                m.append_latency.record(self.clock.monotonic_us().saturating_sub(started));
            }
            Err(_) => Metrics::add(&m.append_errors, 1),
        }
    }

    /// What an append's answer means to its caller.
    fn appended(&self, answer: Result<Acked, Refusal>) -> Result<Appended, AppendError> {
        answer.map(Self::as_appended).map_err(|refusal| self.refused(refusal))
    }

    fn as_appended(acked: Acked) -> Appended {
        match acked {
            Acked::Appended { base_offset, next_offset } => {
                Appended { base_offset, last_offset: Offset::new(next_offset.get() - 1) }
            }
            other => unreachable!("an append is answered as one: {other:?}"),
        }
    }

    /// Encode `records` as one batch at offset zero (the log gives it its offsets), outside
    /// any lock.
    fn encode(&self, records: &[Record<'_>]) -> Result<Batch, AppendError> {
        let now = self.clock.now_ms();
        let mut bytes = Vec::new();
        let info = format::encode_batch(&mut bytes, Offset::ZERO, records, now, Offset::ZERO)?;
        Ok(Batch { bytes, info })
    }

    /// Send `request` down the write path and wait for its answer. Refused at once when the
    /// partition takes no appends.
    fn request(&self, request: Request) -> Result<Acked, AppendError> {
        self.submit(request)?.wait()
    }

    /// Send `request` down the write path without waiting: several partitions' requests sent
    /// before any is waited for share one turn (flushes, a transaction's syncs).
    pub fn submit(&self, request: Request) -> Result<Requested<'_, I>, AppendError> {
        let writer = self.writer.as_ref().ok_or(AppendError::ReadOnly)?;
        self.check_appendable()?;
        Ok(Requested { partition: self, pending: writer.path.submit(writer.id, request) })
    }

    /// What a refusal of the write path means to a caller.
    fn refused(&self, refusal: Refusal) -> AppendError {
        match refusal {
            Refusal::Poisoned(failure) => AppendError::Io(self.io_error(&failure)),
            Refusal::QueueFull => AppendError::Overloaded { queued: write_log::QUEUED_MAX },
            Refusal::Removed => AppendError::TopicNotFound { topic: self.topic.clone() },
        }
    }

    /// The I/O error a log's failure stands for, with the file it happened on.
    fn io_error(&self, failure: &Failure) -> IoError {
        let path = match failure.operation {
            "checkpoint" => self.directory.join(crate::checkpoint::CHECKPOINT_FILE),
            "create" | "seal" => self.directory.clone(),
            _ => self.directory.join(segment::file_name(failure.segment, LOG_SUFFIX)),
        };
        let source = std::io::Error::new(failure.kind, failure.message.clone());
        IoError { operation: failure.operation, path, source }
    }

    fn check_appendable(&self) -> Result<(), AppendError> {
        self.poison.check()?;
        let state = self.state.lock();
        if state.deleted {
            return Err(AppendError::TopicNotFound { topic: self.topic.clone() });
        }
        if let Some((_, corruption)) = &state.damaged {
            return Err(AppendError::Corruption(corruption.clone()));
        }
        Ok(())
    }

    /// Apply changed topic settings (the caller made them durable in `topic.meta`).
    pub fn set_config(&self, config: TopicConfig) {
        let (segment_bytes, segment_ms) = (config.segment_bytes, config.segment_ms);
        self.state.lock().config = config;
        if let Some(writer) = &self.writer {
            writer.path.with_reactor(|reactor| {
                if let Some(log) = reactor.log_mut(writer.id) {
                    log.set_segment_limits(segment_bytes, segment_ms);
                }
            });
        }
    }

    /// Refuse appends from now on and leave the write path; the caller then removes the files.
    pub fn mark_deleted(&self) {
        self.state.lock().deleted = true;
        if let Some(writer) = &self.writer {
            writer.path.remove(writer.id);
        }
    }

    /// A finished compaction pass, in the metrics and the trace.
    fn count_compaction(&self, report: &CompactionReport) {
        let m = &self.metrics;
        Metrics::add(&m.compaction_passes, 1);
        Metrics::add(&m.compaction_bytes_in, report.bytes_in);
        Metrics::add(&m.compaction_bytes_out, report.bytes_out);
        Metrics::add(&m.compaction_records_in, report.records_in);
        Metrics::add(&m.compaction_records_kept, report.records_kept);
        let (records_in, records_kept) = (report.records_in, report.records_kept);
        tracing::info!(records_in, records_kept, bytes_out = report.bytes_out, "compacted");
    }

    /// Retention: remove the oldest sealed segments the topic's settings no longer keep, a
    /// prefix of the log, never the active segment. A sealed segment goes when its newest
    /// record is older than `retention_ms` on the engine clock, or while the partition without
    /// it is still at least `retention_bytes` long. Returns how many segments went.
    ///
    /// Crash-safe in this order: the new log start (the base of the first segment kept) is
    /// made durable in `log.start`; the segments leave the partition's list, so new reads
    /// below the log start are out of range (reads in flight keep their open files); then
    /// their files are removed and the directory fsynced. A crash after the first step is
    /// finished by recovery, which removes whatever files are left below the log start.
    pub fn apply_retention(&self, now: i64) -> Result<usize, AppendError> {
        if self.writer.is_none() {
            return Ok(0);
        }
        let _maintenance = self.maintenance.lock();
        self.poison.check()?;
        let (count, log_start) = {
            let state = self.state.lock();
            let config = state.config;
            if state.deleted || !config.cleanup.deletes() {
                return Ok(0);
            }
            let mut total: u64 = state.segments.iter().map(|s| s.size).sum();
            let sealed = &state.segments[..state.segments.len() - 1];
            let mut count = 0;
            for segment in sealed {
                let newest = segment.index.max_timestamp();
                let too_old = config
                    .retention_ms
                    .is_some_and(|ms| newest != i64::MIN && now.saturating_sub(newest) > ms);
                let too_big =
                    config.retention_bytes.is_some_and(|limit| total - segment.size >= limit);
                if !(too_old || too_big) {
                    break;
                }
                total -= segment.size;
                count += 1;
            }
            if canary::active(Canary::RetentionRemovesOneTooMany)
                && count > 0
                && count < sealed.len()
            {
                count += 1;
            }
            if count == 0 {
                return Ok(0);
            }
            (count, state.segments[count].base_offset)
        };
        let removed = (|| {
            if !canary::active(Canary::RetentionSkipsLogStart) {
                log_start::write(&*self.io, &self.directory, log_start)?;
            }
            let removed: Vec<Segment<I>> = {
                let mut state = self.state.lock();
                // Only retention, serialised by `maintenance`, takes segments from the front.
                assert_eq!(state.segments[count].base_offset, log_start);
                state.segments.drain(..count).collect()
            };
            for segment in &removed {
                recovery::remove_segment_files(&*self.io, &self.directory, segment.base_offset)?;
            }
            io::sync_directory(&*self.io, &self.directory)
                .map_err(|e| IoError::new("fsync", &self.directory, e))?;
            Ok(removed.len())
        })();
        removed.inspect_err(|e: &IoError| self.poison_with(e)).map_err(AppendError::from)
    }

    /// One compaction pass (see [`crate::compaction`]) if the topic is compacted and due: its
    /// dirty ratio reached `min_cleanable_dirty_ratio`, a dirty segment is older than
    /// `max_compaction_lag_ms`, or `force`. Returns what it did, or `None` if nothing was due.
    ///
    /// An I/O error before a group's swap is committed abandons the pass (groups swapped
    /// before it stay swapped; the failing group is left as it was): the error is returned
    /// without poisoning and kept for [`Partition::
    /// compaction_failure`], and passes that are not forced wait for a back-off. An I/O error
    /// at or after a commit poisons the engine; the next open finishes the swap in flight.
    pub fn compact(&self, now: i64, force: bool) -> Result<Option<CompactionReport>, AppendError> {
        if self.writer.is_none() {
            return Ok(None);
        }
        let _maintenance = self.maintenance.lock();
        self.poison.check()?;
        if self.compaction_blocked.lock().is_some() {
            return Ok(None);
        }
        let backing_off =
            self.compaction_failure.lock().as_ref().is_some_and(|f| now < f.retry_at_ms);
        if backing_off && !force {
            return Ok(None);
        }
        let (sources, config) = {
            let state = self.state.lock();
            let config = state.config;
            if state.deleted || !config.cleanup.compacts() {
                return Ok(None);
            }
            // Sealed segments only, and none holding a record younger than the lag: the active
            // segment and what is above the high watermark are never touched.
            let horizon = now.saturating_sub(config.min_compaction_lag_ms);
            let cleanable = if canary::active(Canary::CompactionTouchesActiveSegment) {
                state.segments.len()
            } else {
                state.segments.len() - 1
            };
            let sealed = &state.segments[..cleanable];
            let sources: Vec<Source<I>> = sealed
                .iter()
                .take_while(|s| s.index.max_timestamp() <= horizon)
                .filter(|s| s.next_offset <= self.high_watermark())
                .map(|s| Source {
                    base: s.base_offset,
                    next_offset: s.next_offset,
                    size: s.size,
                    max_timestamp: s.index.max_timestamp(),
                    file: Arc::clone(&s.file),
                })
                .collect();
            (sources, config)
        };
        let first_dirty = *self.first_dirty.lock();
        let total: u64 = sources.iter().map(|s| s.size).sum();
        let dirty: Vec<&Source<I>> =
            sources.iter().filter(|s| s.next_offset > first_dirty).collect();
        // Forced, a pass runs even with nothing dirty: tombstones may have expired since.
        if (dirty.is_empty() && !force) || total == 0 {
            return Ok(None);
        }
        let ratio = dirty.iter().map(|s| s.size).sum::<u64>() as f64 / total as f64;
        let overdue = config
            .max_compaction_lag_ms
            .is_some_and(|lag| dirty.iter().any(|s| now.saturating_sub(s.max_timestamp) > lag));
        if !force && ratio < config.min_cleanable_dirty_ratio && !overdue {
            return Ok(None);
        }
        let (topic, segments) = (self.topic.as_str(), sources.len());
        let _span =
            tracing::info_span!("compaction", topic, partition = self.id, segments).entered();
        match self.clean(&sources, first_dirty, now, &config) {
            Ok(report) => {
                tracing::info!(
                    records_in = report.records_in,
                    records_kept = report.records_kept,
                    bytes_out = report.bytes_out,
                    "compacted"
                );
                *self.compaction_failure.lock() = None;
                self.count_compaction(&report);
                Ok(Some(report))
            }
            Err(CleanError::Aborted(error)) => {
                tracing::warn!(%error, "compaction pass abandoned");
                self.compaction_failures.fetch_add(1, Ordering::Relaxed);
                let mut failure = self.compaction_failure.lock();
                let streak = failure.as_ref().map_or(0, |f| f.streak).saturating_add(1);
                let backoff = COMPACTION_BACKOFF_MS
                    .saturating_mul(1 << streak.min(16).saturating_sub(1))
                    .min(COMPACTION_BACKOFF_MAX_MS);
                let retry_at_ms = now.saturating_add(backoff);
                let (message, kind) = (error.to_string(), error.source.kind());
                *failure = Some(CompactionFailure { message, kind, streak, retry_at_ms });
                Err(error.into())
            }
            Err(CleanError::Io(error)) => {
                self.poison_with(&error);
                Err(error.into())
            }
            Err(CleanError::Damaged(corruption)) => {
                // This partition stays as it is; the others go on being compacted.
                *self.compaction_blocked.lock() = Some(corruption);
                Ok(None)
            }
        }
    }

    fn clean(
        &self,
        sources: &[Source<I>],
        first_dirty: Offset,
        now: i64,
        config: &TopicConfig,
    ) -> Result<CompactionReport, CleanError> {
        let (map, map_end) = compaction::build_key_map(sources, first_dirty, KEY_MAP_ENTRIES_MAX)
            .map_err(CleanError::before_commit)?;
        let cleanable: Vec<&Source<I>> = sources.iter().filter(|s| s.base < map_end).collect();
        let mut report = CompactionReport { keys: map.len() as u64, ..CompactionReport::default() };
        let owned: Vec<Source<I>> =
            cleanable.iter().map(|s| Source { file: Arc::clone(&s.file), ..**s }).collect();
        for range in compaction::groups(&owned, config.segment_bytes) {
            let group = &owned[range];
            let base = group[0].base;
            let bases: Vec<Offset> = group.iter().map(|s| s.base).collect();
            let cleaned = compaction::clean_group(
                &self.io,
                &self.directory,
                group,
                &map,
                map_end,
                now,
                config,
            )
            .map_err(|e| {
                // Best effort: the next pass and the next open remove it too.
                let _ = self.io.remove_file(&compaction::path_with(
                    &self.directory,
                    base,
                    compaction::CLEANED_SUFFIX,
                ));
                e.before_commit()
            })?;
            compaction::commit_swap(&*self.io, &self.directory, base)?;
            compaction::finish_swap(&*self.io, &self.directory, base, &bases)?;
            let mut segment = cleaned.segment;
            let log = self.directory.join(segment::file_name(base, LOG_SUFFIX));
            segment.file = Arc::new(SegmentFile::open(&self.io, log, OpenMode::Read)?);
            // Index files are derived: the swap is complete without them, the in-memory index
            // serves, and the next open rebuilds what is missing or half written. A disk that
            // fills here costs this partition nothing but a rebuild.
            let indexed = segment.write_index_files().and_then(|()| {
                io::sync_directory(&*self.io, &self.directory)
                    .map_err(|e| IoError::new("fsync", &self.directory, e))
            });
            report.derived_files_failed |= indexed.is_err();
            report.segments_in += group.len() as u64;
            report.segments_out += 1;
            report.bytes_in += group.iter().map(|s| s.size).sum::<u64>();
            report.bytes_out += segment.size;
            report.records_in += cleaned.records_in;
            report.records_kept += cleaned.records_kept;
            let mut state = self.state.lock();
            let at = state
                .segments
                .iter()
                .position(|s| s.base_offset == base)
                .expect("only the cleaner removes sealed segments, under `maintenance`");
            let replaced: Vec<Offset> =
                state.segments[at..at + group.len()].iter().map(|s| s.base_offset).collect();
            assert_eq!(replaced, bases, "the segments cleaned are still in place");
            #[cfg(loom)]
            if crate::sync::bugs::active(crate::sync::bugs::Bug::SplitSwap) {
                state.segments.drain(at..at + group.len());
                drop(state);
                self.state.lock().segments.insert(at, segment);
                continue;
            }
            state.segments.splice(at..at + group.len(), [segment]);
        }
        // Advisory too: absent or stale, the next open cleans from an earlier offset again.
        let recorded = log_start::write_cleaner_offset(&*self.io, &self.directory, map_end);
        report.derived_files_failed |= recorded.is_err();
        *self.first_dirty.lock() = map_end;
        self.compaction_passes.fetch_add(1, Ordering::Relaxed);
        Ok(report)
    }

    /// Sync everything written so far.
    pub fn flush(&self) -> Result<(), AppendError> {
        if self.writer.is_none() {
            return Ok(());
        }
        self.request(Request::Flush).map(|_| ())
    }

    /// Start this partition's part of a transaction: write `records` as one transactional
    /// batch, invisible to readers and the checkpoint until its end. The
    /// partition's log holds later appends and transactions behind it (a fence) until its
    /// `EndTransaction`; callers take partitions in one global order, so transactions never
    /// wait in a cycle.
    pub fn begin_transaction(&self, records: &[Record<'_>]) -> Result<Appended, AppendError> {
        self.poison.check()?;
        let batch = self.encode(records)?;
        match self.request(Request::BeginTransaction(batch))? {
            Acked::TransactionWritten { base_offset, next_offset } => {
                Ok(Appended { base_offset, last_offset: Offset::new(next_offset.get() - 1) })
            }
            other => unreachable!("a transaction's batch is answered as one: {other:?}"),
        }
    }

    /// End this partition's part of a transaction without waiting (several partitions' ends
    /// share a turn). `committed`: the transaction's commit record is durable, so its batch
    /// (synced by a `SyncTransaction` request) is shown like any durable append.
    /// Also on a poisoned or deleted partition: the fence must go. A refusal of it means the
    /// log is gone or poisoned, and then nothing waits behind the fence.
    pub fn submit_end_transaction(&self, committed: bool) -> Option<crate::write_path::Pending<I>> {
        let writer = self.writer.as_ref()?;
        Some(writer.path.submit(writer.id, Request::EndTransaction { committed }))
    }

    /// Read whole batches starting at or before `from`, up to about `max_bytes` (at least one
    /// batch), from one segment, never past the high watermark.
    pub fn read(&self, from: Offset, max_bytes: usize) -> Result<Fetch, ReadError> {
        let fetch = self.read_unmeasured(from, max_bytes)?;
        Metrics::add(&self.metrics.fetches, 1);
        Metrics::add(&self.metrics.bytes_read, fetch.len_bytes() as u64);
        Ok(fetch)
    }

    fn read_unmeasured(&self, from: Offset, max_bytes: usize) -> Result<Fetch, ReadError> {
        self.poison.check()?;
        let high_watermark = self.high_watermark();
        let (file, mut position, limit, mut expected) = {
            let state = self.state.lock();
            let start = state.segments[0].base_offset;
            // Checked before the range: offsets past the damage were acknowledged once, and a
            // consumer asking for them must learn of the damage, not of an offset out of range.
            if let Some((_, corruption)) = state.damaged.as_ref().filter(|(at, _)| from >= *at) {
                return Err(ReadError::Corruption(corruption.clone()));
            }
            if from < start || from > high_watermark {
                let (requested, start, end) = (from.get(), start.get(), high_watermark.get());
                return Err(ReadError::OffsetOutOfRange { requested, start, end });
            }
            if from == high_watermark {
                return Ok(Fetch::empty(from));
            }
            // The segment holding `from`. Offsets between two segments belong to a segment that
            // was lost (recovery reported it): reading them is reading damage, never a skip.
            let holding = state.segments.partition_point(|s| s.base_offset <= from) - 1;
            let segment = &state.segments[holding];
            if from >= segment.next_offset {
                let after = state.segments.get(holding + 1).expect("from is below the watermark");
                let kind = CorruptionKind::OffsetMismatch {
                    expected: segment.next_offset.get(),
                    found: after.base_offset.get(),
                };
                let file = after.file.path.clone();
                return Err(ReadError::Corruption(Corruption { file, position: 0, kind }));
            }
            let (expected, position) = segment.index.entry_for_offset(from);
            (Arc::clone(&segment.file), u64::from(position), segment.size, expected)
        };
        let wanted = from..high_watermark;
        let chunk_bytes = max_bytes.clamp(format::BATCH_HEADER_BYTES, BATCH_BYTES_MAX as usize);
        let mut buffer: Vec<u8> = Vec::new();
        // Bytes the next read must cover: a batch larger than a chunk is read whole.
        let mut at_least = 0usize;
        while position < limit {
            let want = (limit - position).min(chunk_bytes.max(at_least) as u64) as usize;
            let chunk = file.read(position, want).map_err(ReadError::Io)?;
            if chunk.is_empty() {
                break;
            }
            let taken = Self::take_batches(
                &file,
                position,
                &chunk,
                wanted.clone(),
                &mut expected,
                &mut buffer,
            )?;
            if taken.bytes == 0 && !taken.stop {
                let needed = taken.needed.expect("no progress means an incomplete batch");
                let available = limit - position;
                // The batch runs past the segment's end, the file is shorter than its recorded
                // size, or a read of the whole batch still did not hold it: serve what came
                // before, else report it.
                if chunk.len() < want || needed as u64 > available || at_least >= needed {
                    if !buffer.is_empty() {
                        break;
                    }
                    return Err(Self::truncated(&file, position, needed, available).into());
                }
                at_least = needed;
                continue;
            }
            at_least = 0;
            position += taken.bytes as u64;
            // Batches below `from` fill nothing: keep going until one batch is taken, even
            // when `max_bytes` is zero.
            if taken.stop || (!buffer.is_empty() && buffer.len() >= max_bytes) {
                break;
            }
        }
        if buffer.is_empty() {
            return Ok(Fetch::empty(from));
        }
        let next_offset = last_batch_next_offset(&buffer);
        Ok(Fetch::new(buffer, from, next_offset))
    }

    fn truncated(
        file: &SegmentFile<I>,
        position: u64,
        needed: usize,
        available: u64,
    ) -> Corruption {
        let needed = needed as u64;
        Corruption {
            file: file.path.clone(),
            position,
            kind: CorruptionKind::Truncated { needed, available },
        }
    }

    /// Move the wanted batches at the start of `chunk` (read at `position`) into `out`.
    /// `wanted` is the range of offsets asked for (from `from` to the high watermark);
    /// `expected` is the base offset the next batch must have: offsets continue batch after
    /// batch, and a checksum-valid batch in the wrong place is damage, not data.
    fn take_batches(
        file: &SegmentFile<I>,
        position: u64,
        chunk: &[u8],
        wanted: std::ops::Range<Offset>,
        expected: &mut Offset,
        out: &mut Vec<u8>,
    ) -> Result<Taken, ReadError> {
        let mut cursor = 0;
        loop {
            match format::parse_batch_unless(Canary::SkipChecksumOnRead, &chunk[cursor..]) {
                Ok(batch) => {
                    if batch.base_offset() >= wanted.end {
                        return Ok(Taken { bytes: cursor, needed: None, stop: true });
                    }
                    if batch.base_offset() != *expected {
                        let kind = CorruptionKind::OffsetMismatch {
                            expected: expected.get(),
                            found: batch.base_offset().get(),
                        };
                        if out.is_empty() {
                            let position = position + cursor as u64;
                            return Err(
                                Corruption { file: file.path.clone(), position, kind }.into()
                            );
                        }
                        return Ok(Taken { bytes: cursor, needed: None, stop: true });
                    }
                    *expected = batch.next_offset();
                    if batch.next_offset() > wanted.start {
                        out.extend_from_slice(batch.as_bytes());
                    }
                    cursor += batch.len();
                }
                Err(DecodeError::Incomplete { needed, .. }) => {
                    let needed = usize::try_from(needed).unwrap_or(usize::MAX);
                    return Ok(Taken { bytes: cursor, needed: Some(needed), stop: false });
                }
                Err(DecodeError::Corrupt(kind)) => {
                    if out.is_empty() {
                        let position = position + cursor as u64;
                        return Err(Corruption { file: file.path.clone(), position, kind }.into());
                    }
                    // Serve what came before the damage; the next read starts at it and fails.
                    return Ok(Taken { bytes: cursor, needed: None, stop: true });
                }
            }
        }
    }

    /// The first offset whose record timestamp is `>= timestamp`, below the high watermark.
    pub fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<Offset>, ReadError> {
        self.poison.check()?;
        let high_watermark = self.high_watermark();
        let (candidates, damaged): (Vec<_>, _) = {
            let state = self.state.lock();
            let candidates = state
                .segments
                .iter()
                .filter(|s| s.index.max_timestamp() >= timestamp || s.size == 0)
                .map(|s| (Arc::clone(&s.file), s.index.position_for_timestamp(timestamp), s.size))
                .collect();
            (candidates, state.damaged.as_ref().map(|(_, corruption)| corruption.clone()))
        };
        for (file, position, size) in candidates {
            let mut found = None;
            let end = segment::scan(&file, u64::from(position), size, |_, batch| {
                if batch.base_offset() >= high_watermark {
                    return false;
                }
                if batch.max_timestamp() >= timestamp {
                    found =
                        batch.records().find(|r| r.timestamp() >= timestamp).map(|r| r.offset());
                    if canary::active(Canary::TimestampLookupTakesBatchStart) {
                        found = Some(batch.base_offset());
                    }
                }
                found.is_none()
            })?;
            if found.is_some() {
                return Ok(found);
            }
            if let Some(error) = end.damage {
                let kind = match error {
                    DecodeError::Corrupt(kind) => kind,
                    DecodeError::Incomplete { needed, available } => {
                        CorruptionKind::Truncated { needed, available }
                    }
                };
                return Err(
                    Corruption { file: file.path.clone(), position: end.position, kind }.into()
                );
            }
        }
        // The answer may lie in the damaged data at the end of the log: report it, not `None`.
        if let Some(corruption) = damaged {
            return Err(corruption.into());
        }
        Ok(None)
    }

    /// Close: sync what was written and make the checkpoint durable, so the next open knows
    /// that all of it was synced; then leave the write path.
    pub fn close(&self) -> Result<(), AppendError> {
        let Some(writer) = &self.writer else {
            return Ok(());
        };
        if self.poison.check().is_err() {
            writer.path.remove(writer.id);
            return Ok(());
        }
        let closed = writer.path.submit(writer.id, Request::Close).wait();
        let Some(checkpoint) = writer.path.remove(writer.id) else {
            return Ok(()); // Closed before (or the topic deleted).
        };
        match closed {
            Ok(_) => {}
            Err(Refusal::Removed) => return Ok(()),
            Err(refusal) => return Err(self.refused(refusal)),
        }
        {
            // A direct file ends in the zeros padding its last block: cut them, so a clean
            // close leaves nothing for the next open to cut.
            let state = self.state.lock();
            let active = state.active();
            if active.file.direct {
                active.sync_for_seal().inspect_err(|e| self.poison_with(e))?;
            }
        }
        checkpoint.sync().inspect_err(|e| self.poison_with(e))?;
        Ok(())
    }

    /// Read-only partitions: pick up what the writing process appended since the last look,
    /// including segments it rolled to. A tail that does not parse yet is a write in progress
    /// and is left for the next call.
    pub fn refresh(&self) -> Result<(), ReadError> {
        if self.writer.is_some() {
            return Ok(());
        }
        let mut state = self.state.lock();
        loop {
            let active = state.segments.last_mut().expect("active segment");
            let file = Arc::clone(&active.file);
            let size = file.size()?;
            let mut contiguous = true;
            let end = segment::scan(&file, active.size, size, |_, batch| {
                contiguous = batch.base_offset() == active.next_offset;
                if contiguous {
                    active.on_batch(batch.info());
                }
                contiguous
            })?;
            // An incomplete batch is a write in progress. Anything else means the writer
            // recovered and rewrote what this reader had already seen.
            // Zeros padding the last block of a direct write are a write in progress too.
            let known_tail = state.unread_tail == Some(end.position)
                || segment::is_block_padding(&file, end.position, size)?;
            let rewritten = matches!(end.damage, Some(DecodeError::Corrupt(_))) && !known_tail;
            let active = state.segments.last().expect("active segment");
            if size < active.size || (!contiguous && !known_tail) || rewritten {
                return Err(ReadError::Changed { path: file.path.clone() });
            }
            // The writer creates the next segment only once this one is complete, named by the
            // offset after its last record: if it exists, everything before it has been read.
            let base = active.next_offset;
            let next_path = self.directory.join(segment::file_name(base, LOG_SUFFIX));
            let next = match SegmentFile::open(&self.io, next_path, OpenMode::Read) {
                Ok(file) => file,
                Err(error) if error.source.kind() == std::io::ErrorKind::NotFound => break,
                Err(error) => return Err(error.into()),
            };
            let now = self.clock.now_ms();
            let interval = state.config.index_interval_bytes;
            state.segments.push(Segment::empty(base, next, interval, now));
            state.unread_tail = None;
        }
        let end = state.next_offset();
        drop(state);
        self.publish(end);
        Ok(())
    }
}

struct Taken {
    bytes: usize,
    needed: Option<usize>,
    stop: bool,
}

/// The offset after the last batch of a buffer of validated batches (headers only).
fn last_batch_next_offset(buffer: &[u8]) -> Offset {
    let mut rest = buffer;
    let mut next = Offset::ZERO;
    while let Some(batch) = format::view_validated_batch(rest) {
        next = batch.next_offset();
        rest = &rest[batch.len()..];
    }
    next
}
