//! One partition: what readers see (the segment list, the high watermark), the requests of
//! the write path, and maintenance (retention, compaction). This file holds the partition's
//! state, open, and the write path's events; `append.rs` its requests, `read.rs` its reads,
//! `maintenance.rs` retention and compaction.
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

mod append;
mod maintenance;
mod read;

pub use append::PendingAppend;
pub use maintenance::{CompactionFailure, CompactionReport};

use crate::checkpoint::CheckpointWriter;
use crate::context::{PartitionContext, Poison};
use crate::error::{Corruption, IoError, OpenError};
use crate::io::{self, Io, OpenMode};
use crate::layout::{self, LOG_SUFFIX};
use crate::log::Durability;
use crate::log::{self as write_log, Event, PartitionLog};
use crate::log_start;
use crate::metrics::Metrics;
use crate::reactor::{self, Host, PartitionId};
use crate::recovery::{self, PartitionRecovery};
use crate::segment::{Segment, SegmentFile};
use crate::sync::Mutex;
use crate::topic::TopicConfig;
use crate::watermark::Watermark;
pub(crate) use crate::write_path::Request;
use crate::write_path::WritePath;
use crate::{Clock, Offset};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

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
    /// Serialises retention, deletes, compaction and a topic's delete; taken before any other
    /// lock.
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

    fn recovery_point_files(
        &self,
        segment: Offset,
        length: u64,
        next_offset: Offset,
        max_timestamp: i64,
    ) -> (Vec<u8>, Vec<u8>) {
        let partition = self.partition.upgrade().expect("a driven partition is alive");
        let state = partition.state.lock();
        let active = state.active();
        assert_eq!(active.base_offset, segment, "a recovery point of the active segment");
        assert!(length <= active.size, "a recovery point covers written bytes");
        active.index.encode_prefix(length, next_offset, max_timestamp)
    }
}

impl<I: Io> Partition<I> {
    /// Create the directory of a new partition with an empty first segment. The caller fsyncs
    /// the parent directory.
    pub fn create_files(io: &I, directory: &Path) -> Result<(), IoError> {
        io.create_directory(directory).map_err(|e| IoError::new("mkdir", directory, e))?;
        let path = directory.join(layout::file_name(Offset::ZERO, LOG_SUFFIX));
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
            max_timestamp: active.index.max_timestamp(),
            // Never a recovery point over damage recovery kept: the next open must read it
            // again, and keep refusing appends behind it.
            recovery_point: if recovered.damaged.is_some() {
                size
            } else {
                recovered.recovery_point
            },
        };
        let active_file = Arc::clone(&active.file);
        let write_path = context.write_path_of(topic, id);
        let checkpoint = if write_path.is_some() {
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
            write_bytes_max: write_log::WRITE_BYTES_MAX,
            recovery_point_bytes: context.recovery_point_bytes,
            recovery_point_ms: context.recovery_point_ms,
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
            let writer = write_path.zip(checkpoint).map(|(path, checkpoint)| {
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

    fn poison_with(&self, error: &IoError) {
        self.poison.set(format!("{}/{}: {error}", self.topic, self.id));
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
        // After any retention, compaction or delete in progress, which would otherwise meet
        // the directory renamed away under it and poison the engine; later ones see `deleted`.
        let _maintenance = self.maintenance.lock();
        self.state.lock().deleted = true;
        if let Some(writer) = &self.writer {
            writer.path.remove(writer.id);
        }
    }
}
