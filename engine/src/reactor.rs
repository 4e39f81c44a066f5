//! The I/O reactor of the second engine design: it runs the operations of many partition
//! logs ([`crate::log::PartitionLog`]) through one [`Io`], every turn in one submission.
//!
//! A turn asks every partition's log for the operations it wants now, turns them into
//! [`Operation`]s on the partition's files (segment writes and fdatasyncs, checkpoint writes),
//! submits all of them with [`Io::start_linked`] (on io_uring: one system call per round, a
//! partition's writes linked before its fdatasync), and hands every completion back to its log
//! as it comes: in the same turn on the system backends, which complete a batch before they
//! return, or in a later one (the simulated disk may defer completions, as a ring can).
//! Sealing a segment and creating the next one are rare and involve namespace calls (index
//! files through renames, the new file, the directory fsync): the reactor runs them inline,
//! at once, and completes them before it asks that log again. What changed in a log (batches
//! placed and written, the watermark, a roll, a poison) goes to the partition's [`Host`], which
//! shows it to readers.
//!
//! The reactor holds no lock and reads no clock: `now_ms` is passed in, and a caller (the
//! write path's driver, or the simulator) decides when to turn it.
//!
//! *Invariants:* every operation a log emitted is completed exactly once, in the turn that
//! submitted it or a later one; a partition is removed with none of its operations in flight; a
//! log's linked chain is submitted whole and in order; a buffer stays owned by
//! its operation until the completion hands it back; a host hears a log's events in the order
//! the log decided them, and hears of a new segment's file before any event about it.

use crate::canary::{self, Canary};
use crate::checkpoint::{Checkpoint, CheckpointWriter};
use crate::error::IoError;
use crate::format::BatchInfo;
use crate::index::SegmentIndex;
use crate::io::{self, InFlight, Io, Linked, OpenMode, Operation};
use crate::layout::{self, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::log::{Ack, Event, Failure, LogOp, OpId, OpKind, PartitionLog};
use crate::metrics::Metrics;
use crate::segment::{SegmentFile, write_file_durably};
use crate::{Clock, Offset};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Most partitions one reactor drives at once.
pub const PARTITIONS_MAX: usize = 1 << 20;

/// Names a partition of one reactor. A slot freed by [`Reactor::remove`] is used again with a
/// new generation, so a name kept past its partition's removal never reaches another one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionId {
    slot: u32,
    generation: u32,
}

/// Whoever shows a partition to readers: it hears what changed in the log, in order.
pub trait Host<I: Io>: Send + Sync {
    /// A change decided by the log (see [`Event`]).
    fn on_event(&self, event: &Event);
    /// The file of the segment the log rolls to, created and its directory fsynced; the
    /// [`Event::Rolled`] naming it follows.
    fn created(&self, file: Arc<SegmentFile<I>>, now_ms: i64);
    /// The encoded offset and time index files of segment `segment`, sealed at `length`
    /// bytes ending before offset `next_offset`.
    fn index_files(&self, segment: Offset, length: u64, next_offset: Offset) -> (Vec<u8>, Vec<u8>);
    /// The encoded index files of the first `length` bytes of the active segment `segment`,
    /// ending before offset `next_offset`, largest timestamp `max_timestamp`: a recovery point.
    fn recovery_point_files(
        &self,
        segment: Offset,
        length: u64,
        next_offset: Offset,
        max_timestamp: i64,
    ) -> (Vec<u8>, Vec<u8>);
}

/// A [`Host`] that keeps only the segments' indexes, for a reactor run without an engine
/// around it (the simulator's workload, the benchmark, tests).
#[derive(Debug)]
pub struct IndexHost {
    interval_bytes: u32,
    indexes: crate::sync::Mutex<BTreeMap<Offset, SegmentIndex>>,
}

impl IndexHost {
    /// For a log whose active segment starts at `base` and is empty.
    pub fn new(base: Offset, interval_bytes: u32) -> Arc<IndexHost> {
        let indexes = BTreeMap::from([(base, SegmentIndex::new(base, interval_bytes))]);
        Arc::new(IndexHost { interval_bytes, indexes: crate::sync::Mutex::new(indexes) })
    }
}

impl<I: Io> Host<I> for IndexHost {
    fn on_event(&self, event: &Event) {
        let mut indexes = self.indexes.lock();
        match event {
            Event::Placed { position, info } => {
                let (_, index) = indexes.iter_mut().next_back().expect("an active index");
                on_placed(index, *position, info);
            }
            Event::Rolled { segment } => {
                let last = indexes.keys().next_back().copied();
                assert!(last.is_none_or(|last| last < *segment), "segments roll forward");
                let index = SegmentIndex::new(*segment, self.interval_bytes);
                let previous = indexes.insert(*segment, index);
                assert!(previous.is_none(), "a segment is rolled to once");
            }
            Event::Written { .. } | Event::Published(_) | Event::Poisoned(_) => {}
        }
    }

    fn created(&self, _file: Arc<SegmentFile<I>>, _now_ms: i64) {}

    fn index_files(&self, segment: Offset, length: u64, next_offset: Offset) -> (Vec<u8>, Vec<u8>) {
        assert!(next_offset >= segment, "a sealed segment ends at or after its base");
        let indexes = self.indexes.lock();
        let index = indexes.get(&segment).expect("a sealed segment was rolled to or started");
        index.encode(length, next_offset)
    }

    fn recovery_point_files(
        &self,
        segment: Offset,
        length: u64,
        next_offset: Offset,
        max_timestamp: i64,
    ) -> (Vec<u8>, Vec<u8>) {
        let indexes = self.indexes.lock();
        let index = indexes.get(&segment).expect("the active segment was rolled to or started");
        index.encode_prefix(length, next_offset, max_timestamp)
    }
}

/// Account for a placed batch in its segment's index.
pub fn on_placed(index: &mut SegmentIndex, position: u64, info: &BatchInfo) {
    let position = u32::try_from(position).expect("segment positions fit in u32");
    assert!(info.length > 0, "a placed batch has bytes");
    assert!(info.next_offset > info.base_offset, "a placed batch holds an offset");
    index.on_batch(position, info.base_offset, info.max_timestamp, info.length);
}

/// One partition as the reactor drives it.
struct Driven<I: Io> {
    log: PartitionLog,
    directory: PathBuf,
    direct: bool,
    /// Every segment file the log may name, by base offset.
    files: BTreeMap<Offset, Arc<SegmentFile<I>>>,
    checkpoint: CheckpointWriter<I>,
    host: Arc<dyn Host<I>>,
}

struct Slot<I: Io> {
    generation: u32,
    driven: Option<Driven<I>>,
}

/// What a submitted operation belongs to.
#[derive(Debug)]
struct Owner {
    slot: usize,
    /// The slot's generation when the operation was gathered: it completes to that partition.
    generation: u32,
    id: OpId,
    /// A checkpoint write: recorded in the writer once it succeeded.
    checkpoint: Option<Checkpoint>,
    /// An fdatasync, of this file (for the retry canary).
    fdatasync: Option<io::FileHandle>,
    /// Bytes of a write, for the metrics.
    bytes: usize,
}

/// A batch one turn submitted, with what each of its operations belongs to (`None` once
/// reaped).
struct Flight {
    batch: Box<dyn InFlight>,
    owners: Vec<Option<Owner>>,
    /// When it was submitted, if it holds an fdatasync and the reactor counts metrics.
    started_us: Option<u64>,
}

/// Drives partition logs through one [`Io`]. See the module documentation.
pub struct Reactor<I: Io> {
    io: Arc<I>,
    slots: Vec<Slot<I>>,
    free: Vec<usize>,
    /// Scratch space for one log's operations, kept between turns.
    ops: Vec<LogOp>,
    metrics: Option<(Arc<Metrics>, Arc<dyn Clock>)>,
    /// An operation failed this turn (a completion, or a seal or create run inline).
    failed: bool,
    /// Batches submitted whose operations did not all complete yet, oldest first.
    flights: Vec<Flight>,
}

impl<I: Io> std::fmt::Debug for Reactor<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = self.slots.iter().filter(|s| s.driven.is_some()).count();
        f.debug_struct("Reactor").field("partitions", &count).finish_non_exhaustive()
    }
}

impl<I: Io> Reactor<I> {
    pub fn new(io: Arc<I>) -> Self {
        Reactor {
            io,
            slots: Vec::new(),
            free: Vec::new(),
            ops: Vec::new(),
            metrics: None,
            failed: false,
            flights: Vec::new(),
        }
    }

    /// Count writes, fdatasyncs and rolls in `metrics`, timing fdatasyncs on `clock`.
    pub fn set_metrics(&mut self, metrics: Arc<Metrics>, clock: Arc<dyn Clock>) {
        self.metrics = Some((metrics, clock));
    }

    /// Drive `log`, whose active segment is `active`, in the partition `directory`.
    pub fn add(
        &mut self,
        directory: PathBuf,
        log: PartitionLog,
        active: Arc<SegmentFile<I>>,
        checkpoint: CheckpointWriter<I>,
        host: Arc<dyn Host<I>>,
    ) -> PartitionId {
        assert_eq!(
            active.path.file_name().and_then(|n| n.to_str()).and_then(layout::parse_log_file_name),
            Some(log.active_segment()),
            "the active file is the log's active segment"
        );
        let direct = active.direct;
        let files = BTreeMap::from([(log.active_segment(), active)]);
        let driven = Driven { log, directory, direct, files, checkpoint, host };
        let slot = self.free.pop().unwrap_or_else(|| {
            assert!(self.slots.len() < PARTITIONS_MAX, "a reactor drives a bounded set");
            self.slots.push(Slot { generation: 0, driven: None });
            self.slots.len() - 1
        });
        let entry = &mut self.slots[slot];
        assert!(entry.driven.is_none(), "a free slot is empty");
        entry.generation = entry.generation.wrapping_add(1);
        entry.driven = Some(driven);
        let id = PartitionId {
            slot: u32::try_from(slot).expect("bounded"),
            generation: entry.generation,
        };
        // Pair with `slot_of`: the name handed out finds the partition just registered.
        assert_eq!(self.slot_of(id), Some(slot), "a new partition is registered under its id");
        id
    }

    /// Stop driving `partition`; its checkpoint writer is handed back (for a last sync).
    /// Nothing of it may be in flight: the caller removes it between turns, with nothing
    /// queued that it waits for.
    pub fn remove(&mut self, partition: PartitionId) -> Option<CheckpointWriter<I>> {
        let slot = self.slot_of(partition)?;
        assert!(
            self.flights.iter().flat_map(|f| f.owners.iter().flatten()).all(|o| o.slot != slot),
            "a partition is removed with none of its operations in flight"
        );
        let driven = self.slots[slot].driven.take().expect("slot_of found it");
        assert!(!self.free.contains(&slot), "a slot is freed once");
        self.free.push(slot);
        assert!(self.free.len() <= self.slots.len(), "free slots are slots");
        assert!(self.slot_of(partition).is_none(), "a removed partition's id finds nothing");
        Some(driven.checkpoint)
    }

    fn slot_of(&self, partition: PartitionId) -> Option<usize> {
        let slot = partition.slot as usize;
        assert!(self.slots.len() <= PARTITIONS_MAX, "a reactor drives a bounded set");
        let entry = self.slots.get(slot)?;
        (entry.generation == partition.generation && entry.driven.is_some()).then_some(slot)
    }

    /// The partition's log, if the reactor still drives it.
    pub fn log(&self, partition: PartitionId) -> Option<&PartitionLog> {
        let slot = self.slot_of(partition)?;
        self.slots[slot].driven.as_ref().map(|d| &d.log)
    }

    /// The log, to queue appends, flushes and transactions on.
    pub fn log_mut(&mut self, partition: PartitionId) -> Option<&mut PartitionLog> {
        let slot = self.slot_of(partition)?;
        self.slots[slot].driven.as_mut().map(|d| &mut d.log)
    }

    /// Fail every log not failed yet (fail-stop across the engine): what waits is answered
    /// with the failure, and nothing more is done.
    pub fn fail_all(&mut self, reason: &str) {
        let failure = Failure {
            operation: "poisoned",
            segment: Offset::ZERO,
            kind: std::io::ErrorKind::Other,
            message: reason.to_owned(),
        };
        self.fail_all_with(&failure);
    }

    fn fail_all_with(&mut self, failure: &Failure) {
        for driven in self.slots.iter_mut().filter_map(|slot| slot.driven.as_mut()) {
            if driven.log.poisoned().is_none() {
                driven.log.fail(failure.clone());
            }
            assert!(driven.log.poisoned().is_some(), "fail-stop: every log is failed");
        }
    }

    /// One turn: every partition's ready operations in one submission, the completions ready
    /// (of this turn's batch or of earlier ones) handed back, events passed to the hosts, and
    /// the acknowledgements decided appended to `acks`. A turn that submits nothing while
    /// operations are in flight waits for at least one completion. Returns how many
    /// operations went to the [`Io`] or came back from it (zero: nothing to do until a new
    /// request or a deadline, and nothing is in flight).
    pub fn turn(&mut self, now_ms: i64, acks: &mut Vec<(PartitionId, Ack)>) -> usize {
        let mut batch: Vec<Linked> = Vec::new();
        let mut owners: Vec<Owner> = Vec::new();
        for slot in 0..self.slots.len() {
            if self.slots[slot].driven.is_some() {
                self.gather(slot, now_ms, &mut batch, &mut owners);
            }
        }
        let submitted = batch.len();
        assert_eq!(owners.len(), submitted, "every operation submitted has one owner");
        assert!(
            owners.windows(2).all(|pair| pair[0].slot <= pair[1].slot),
            "a turn gathers the partitions in slot order, each one's chain whole"
        );
        if submitted > 0 {
            let syncs = owners.iter().any(|owner| owner.fdatasync.is_some());
            let started_us = self.metrics.as_ref().filter(|_| syncs).map(|(_, c)| c.monotonic_us());
            let batch = self.io.start_linked(batch);
            assert_eq!(batch.pending(), owners.len(), "the batch holds every operation");
            let owners = owners.into_iter().map(Some).collect();
            self.flights.push(Flight { batch, owners, started_us });
        }
        let completed = self.reap(now_ms, submitted == 0);
        self.hand_out(acks);
        submitted + completed
    }

    /// After completions were handed to the logs: an operation failed, so that log is
    /// poisoned, the engine stops, and so does every other log, before any answer is handed
    /// out; then every log's events go to its host and its acknowledgements to `acks`.
    fn hand_out(&mut self, acks: &mut Vec<(PartitionId, Ack)>) {
        if std::mem::take(&mut self.failed) {
            let failed = self
                .slots
                .iter()
                .filter_map(|slot| slot.driven.as_ref())
                .find_map(|d| d.log.poisoned().cloned());
            if let Some(failure) = failed {
                self.fail_all_with(&failure);
            }
        }
        for (slot, entry) in self.slots.iter_mut().enumerate() {
            let Some(driven) = entry.driven.as_mut() else { continue };
            pass_events(driven);
            let id = PartitionId {
                slot: u32::try_from(slot).expect("bounded"),
                generation: entry.generation,
            };
            while let Some(ack) = driven.log.poll_ack() {
                acks.push((id, ack));
            }
        }
        assert!(!self.failed, "a failure was acted on");
    }

    /// Wait until none of `partition`'s operations is in flight, handing back the
    /// completions that come, of any partition, as a turn does (a failure stops every log;
    /// events go to the hosts, acknowledgements to `acks`). Submits nothing. For a removal.
    pub fn settle(
        &mut self,
        partition: PartitionId,
        now_ms: i64,
        acks: &mut Vec<(PartitionId, Ack)>,
    ) {
        let Some(slot) = self.slot_of(partition) else { return };
        let ours = |flights: &[Flight]| {
            flights.iter().flat_map(|f| f.owners.iter().flatten()).any(|o| o.slot == slot)
        };
        while ours(&self.flights) {
            let before = self.in_flight();
            self.reap(now_ms, true);
            assert!(self.in_flight() < before, "each wait brings a completion");
        }
        self.hand_out(acks);
    }

    /// Operations submitted and not completed yet.
    pub fn in_flight(&self) -> usize {
        self.flights.iter().map(|flight| flight.batch.pending()).sum()
    }

    /// Hand the completions ready back to their logs, oldest batch first; with `wait`, wait
    /// for one if none is ready and any is in flight. Returns how many came back.
    fn reap(&mut self, now_ms: i64, wait: bool) -> usize {
        let mut completed = 0;
        let mut flights = std::mem::take(&mut self.flights);
        for flight in &mut flights {
            completed += self.complete(flight, false, now_ms);
        }
        if wait && completed == 0 && !flights.is_empty() {
            completed += self.complete(&mut flights[0], true, now_ms);
            assert!(completed > 0, "a wait for a batch in flight brings a completion");
        }
        flights.retain(|flight| flight.batch.pending() > 0);
        assert!(self.flights.is_empty(), "no batch is submitted while completions are handled");
        self.flights = flights;
        completed
    }

    /// Hand `flight`'s ready completions back to their logs; how many came back.
    fn complete(&mut self, flight: &mut Flight, wait: bool, now_ms: i64) -> usize {
        let pending = flight.batch.pending();
        let completions = flight.batch.reap(wait);
        assert_eq!(flight.batch.pending() + completions.len(), pending, "each reaped once");
        let count = completions.len();
        for (index, completion) in completions {
            assert!(index < flight.owners.len(), "a completion of an operation of the batch");
            let owner = flight.owners[index].take().expect("an operation completes once");
            // The partition an operation was gathered from is still registered when it
            // completes: a partition is removed only with nothing in flight.
            let entry = &self.slots[owner.slot];
            assert_eq!(entry.generation, owner.generation, "a completion routes to its partition");
            let mut result = completion.result.map(|_| ());
            if let Some(file) = owner.fdatasync {
                if result.is_err() && canary::active(Canary::RetryFsyncAfterFailure) {
                    result = io::run_plain(&*self.io, Operation::Fdatasync { file });
                }
                self.count_fdatasync(flight.started_us, result.is_ok());
            }
            if owner.bytes > 0 && result.is_ok() {
                self.count(|m| &m.bytes_written, owner.bytes as u64);
            }
            self.failed |= result.is_err();
            let driven = self.slots[owner.slot].driven.as_mut().expect("driven while in flight");
            if let (Some(checkpoint), Ok(())) = (owner.checkpoint, &result) {
                driven.checkpoint.written(checkpoint);
            }
            driven.log.complete(owner.id, result, now_ms);
        }
        count
    }

    fn count(&self, counter: impl Fn(&Metrics) -> &std::sync::atomic::AtomicU64, value: u64) {
        if let Some((metrics, _)) = &self.metrics {
            Metrics::add(counter(metrics), value);
        }
    }

    fn count_fdatasync(&self, started: Option<u64>, succeeded: bool) {
        let Some((metrics, clock)) = &self.metrics else { return };
        assert!(started.is_some(), "a turn with an fdatasync timed its submission");
        Metrics::add(&metrics.fsyncs, 1);
        if !succeeded {
            Metrics::add(&metrics.fsync_errors, 1);
        }
        if let Some(started) = started {
            // From the batch's submission to this completion (the same turn on the system
            // backends; turns later on a disk that defers completions).
            metrics.fsync_latency.record(clock.monotonic_us().saturating_sub(started));
        }
    }

    /// Take slot `slot`'s operations into the batch, running seals and creates inline (and
    /// asking the log again after them).
    fn gather(
        &mut self,
        slot: usize,
        now_ms: i64,
        batch: &mut Vec<Linked>,
        owners: &mut Vec<Owner>,
    ) {
        let unlinked = canary::active(Canary::ReactorUnlinkedSync);
        assert_eq!(batch.len(), owners.len(), "every gathered operation has one owner");
        let gathered_before = batch.len();
        let generation = self.slots[slot].generation;
        loop {
            let mut ops = std::mem::take(&mut self.ops);
            assert!(ops.is_empty(), "the scratch operations were drained");
            let driven = self.slots[slot].driven.as_mut().expect("gathered slots are driven");
            driven.log.poll_ops(now_ms, &mut ops);
            if ops.is_empty() {
                self.ops = ops;
                assert!(
                    batch[gathered_before..].last().is_none_or(|op| !op.link_next),
                    "a partition's chain never links into the next partition's operations"
                );
                return;
            }
            // A chain stays within one poll, and only operations submitted to the I/O are
            // linked: a seal or create runs inline, so a link into it would be broken.
            assert!(!ops.last().is_some_and(|op| op.link_next), "a chain ends within its poll");
            assert!(
                ops.windows(2).all(|pair| !pair[0].link_next
                    || matches!(pair[1].kind, OpKind::Write { .. } | OpKind::Fdatasync { .. })),
                "only writes and fdatasyncs are linked behind an operation"
            );
            let mut ran_inline = false;
            // The canary drops only the links that put an fdatasync behind writes.
            let before_sync: Vec<bool> = if unlinked {
                let is_sync = |op: &LogOp| matches!(op.kind, OpKind::Fdatasync { .. });
                (0..ops.len()).map(|i| ops.get(i + 1).is_some_and(is_sync)).collect()
            } else {
                Vec::new()
            };
            for (index, op) in ops.drain(..).enumerate() {
                let unlink = unlinked && before_sync[index];
                let (id, link_next) = (op.id, op.link_next && !unlink);
                let mut owner =
                    Owner { slot, generation, id, checkpoint: None, fdatasync: None, bytes: 0 };
                let operation = match op.kind {
                    OpKind::Write { segment, position, buffer, .. } => {
                        owner.bytes = buffer.len();
                        let file = driven.files[&segment].handle;
                        Operation::Write { file, position, buffer }
                    }
                    OpKind::Fdatasync { segment } => {
                        let file = driven.files[&segment].handle;
                        owner.fdatasync = Some(file);
                        Operation::Fdatasync { file }
                    }
                    OpKind::Checkpoint { segment, position, offset } => {
                        match driven.checkpoint.plan(segment, position, offset) {
                            Some((write, checkpoint)) => {
                                owner.checkpoint = Some(checkpoint);
                                batch.push(Linked { operation: write, link_next: false });
                                owners.push(owner);
                            }
                            None => driven.log.complete(id, Ok(()), now_ms),
                        }
                        continue;
                    }
                    OpKind::RecoveryPoint { segment, position, offset, max_timestamp } => {
                        pass_events(driven);
                        let result =
                            recovery_point(driven, segment, position, offset, max_timestamp);
                        self.failed |= result.is_err();
                        driven.log.complete(id, result.map_err(|e| into_io(&e)), now_ms);
                        ran_inline = true;
                        continue;
                    }
                    OpKind::Seal { segment, length, next_offset } => {
                        pass_events(driven);
                        let result = seal(driven, segment, length, next_offset);
                        self.failed |= result.is_err();
                        driven.log.complete(id, result.map_err(|e| into_io(&e)), now_ms);
                        ran_inline = true;
                        continue;
                    }
                    OpKind::Create { segment } => {
                        let result = create(&self.io, driven, segment, now_ms);
                        self.failed |= result.is_err();
                        if let (Ok(()), Some((metrics, _))) = (&result, &self.metrics) {
                            Metrics::add(&metrics.segments_rolled, 1);
                        }
                        driven.log.complete(id, result.map_err(|e| into_io(&e)), now_ms);
                        ran_inline = true;
                        continue;
                    }
                };
                batch.push(Linked { operation, link_next });
                owners.push(owner);
            }
            self.ops = ops;
            assert_eq!(batch.len(), owners.len(), "every gathered operation has one owner");
            if !ran_inline {
                assert!(
                    batch[gathered_before..].last().is_none_or(|op| !op.link_next),
                    "a partition's chain never links into the next partition's operations"
                );
                return;
            }
        }
    }
}

/// Hand the log's events to its host, in order.
fn pass_events<I: Io>(driven: &mut Driven<I>) {
    while let Some(event) = driven.log.poll_event() {
        if let Event::Rolled { segment } = &event {
            // The host hears of a new segment's file before any event about it.
            assert!(driven.files.contains_key(segment), "a segment is created before its roll");
        }
        driven.host.on_event(&event);
    }
}

/// Make a segment durable at exactly `length` bytes and write its index files. The directory
/// fsync of the next segment's create makes the index renames durable.
fn seal<I: Io>(
    driven: &Driven<I>,
    segment: Offset,
    length: u64,
    next_offset: Offset,
) -> Result<(), IoError> {
    assert!(next_offset >= segment, "a sealed segment ends at or after its base");
    let file = driven.files.get(&segment).expect("the sealed segment is the active file");
    assert_eq!(driven.files.len(), 1, "the reactor keeps only the active segment's file");
    let handle = file.handle;
    if !canary::active(Canary::IndexBeforeData) {
        if driven.direct && !canary::active(Canary::SealKeepsDirectPadding) {
            // The padding of the last block goes: every sealed segment ends at its last batch.
            file.run(Operation::Truncate { file: handle, length })?;
            file.run(Operation::Fsync { file: handle })?;
        } else {
            file.run(Operation::Fdatasync { file: handle })?;
        }
    }
    let (offset_index, time_index) = driven.host.index_files(segment, length, next_offset);
    for (suffix, bytes) in [(INDEX_SUFFIX, offset_index), (TIME_INDEX_SUFFIX, time_index)] {
        let path = driven.directory.join(layout::file_name(segment, suffix));
        write_file_durably(file.io(), &path, bytes)?;
    }
    Ok(())
}

/// Write the active segment's index files for its first `length` bytes (all durable), each
/// through a temporary file, fdatasync and rename. No directory fsync: a crash leaves the old
/// files or the new ones, and both tell the truth (a missing pair only costs the next open a
/// longer scan).
fn recovery_point<I: Io>(
    driven: &Driven<I>,
    segment: Offset,
    length: u64,
    next_offset: Offset,
    max_timestamp: i64,
) -> Result<(), IoError> {
    let file = driven.files.get(&segment).expect("a recovery point of the active file");
    assert!(next_offset >= segment, "a recovery point ends at or after its base");
    let (offset_index, time_index) =
        driven.host.recovery_point_files(segment, length, next_offset, max_timestamp);
    for (suffix, bytes) in [(INDEX_SUFFIX, offset_index), (TIME_INDEX_SUFFIX, time_index)] {
        let path = driven.directory.join(layout::file_name(segment, suffix));
        write_file_durably(file.io(), &path, bytes)?;
    }
    Ok(())
}

/// Create the file of the segment based at `segment`, fsync the partition directory, and
/// tell the host.
fn create<I: Io>(
    io: &Arc<I>,
    driven: &mut Driven<I>,
    segment: Offset,
    now_ms: i64,
) -> Result<(), IoError> {
    let path = driven.directory.join(layout::file_name(segment, LOG_SUFFIX));
    let file = SegmentFile::open(io, path, OpenMode::CreateNew.with_direct(driven.direct))?;
    if !canary::active(Canary::SkipDirectoryFsyncOnRoll) {
        let directory = &driven.directory;
        io::sync_directory(&**io, directory).map_err(|e| IoError::new("fsync", directory, e))?;
    }
    let file = Arc::new(file);
    let previous = driven.files.insert(segment, Arc::clone(&file));
    assert!(previous.is_none(), "a segment's file is created once");
    assert!(
        driven.files.keys().all(|&base| base <= segment),
        "the log rolls to a segment after every one it had"
    );
    // Sealed files stay open for readers through the host; the reactor needs only the active.
    driven.files.retain(|&base, _| base == segment);
    driven.host.created(file, now_ms);
    Ok(())
}

fn into_io(error: &IoError) -> std::io::Error {
    std::io::Error::new(error.source.kind(), error.to_string())
}
