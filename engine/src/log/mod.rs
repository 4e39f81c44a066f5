//! A partition's write path as a pure state machine (sans-I/O): the second engine design's core.
//!
//! [`PartitionLog`] owns what the write path decides: the segments' ends, the next offset, the
//! written, synced and published ends, the transaction fence, the batches waiting to be written
//! and the callers waiting for an acknowledgement. It never does I/O, takes no lock and never
//! reads a clock. Callers hand it encoded batches ([`PartitionLog::append`]); it answers with
//! the operations it wants run ([`PartitionLog::poll_ops`]), and takes their outcomes back
//! ([`PartitionLog::complete`]); acknowledgements come out of [`PartitionLog::poll_ack`]. Time
//! is passed in (`now_ms`), as in quinn-proto. An I/O reactor (one thread, one io_uring) runs
//! the operations of many partitions in one submission; the simulator runs them on its disk and
//! completes them in an order its seed chooses. The same code decides in both.
//!
//! # Invariants (asserted here, and checked against a model of the disk by the tests)
//!
//! - Offsets are given in submission order, contiguous, each once.
//! - In `sync` mode an append is acknowledged only after an fdatasync of its segment completed
//!   that was submitted after its write completed, or linked behind it ([`LogOp::link_next`]:
//!   the runner starts the next operation only after this one succeeded, as `IOSQE_IO_LINK`).
//! - The published end (the high watermark) is never ahead of the durable end in `sync` and
//!   `interval` modes, and never ahead of the written end in `os` mode; never past a fence.
//! - At most one fdatasync (or seal) of a file is in flight: Linux reports a write-back error
//!   to only one of two concurrent fsyncs.
//! - Writes in flight overlap only in a chain: a direct write rewrites the partial block
//!   before its batches, so it is linked behind the write that wrote that block when both are
//!   submitted together, and waits for that write's completion otherwise.
//! - A segment is sealed (durable at its exact length, its index files written) only when no
//!   write or fdatasync of it is in flight, and the next segment's file is created only after
//!   that: every segment but the last is fully durable.
//! - After a failed write, fdatasync, seal or create the log is poisoned (fail-stop): nothing
//!   more is acknowledged as written or durable, and every waiter gets the failure.
//!
//! What is deliberately not here yet: reads (readers use the segment list and the high
//! watermark published by the runner), retention and compaction swaps, and recovery (which
//! hands its result to [`PartitionLog::new`]).

#[cfg(test)]
mod tests;

use crate::Offset;
use crate::canary::{self, Canary};
use crate::format::{self, BatchInfo};
use crate::io::DIRECT_ALIGNMENT;
use std::collections::VecDeque;
use std::io;

/// When an append is acknowledged, and what a crash may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Acknowledged after the records and the metadata needed to read them are fsynced.
    /// Concurrent appenders to a partition share fsyncs (group commit). Readers see records
    /// only once they are durable.
    #[default]
    Sync,
    /// Acknowledged when written to the OS; fsynced by [`Engine::tick`](crate::Engine::tick)
    /// at most `ms` later.
    /// A crash loses at most the last `ms` of acknowledged records. Readers see records once
    /// they are durable.
    Interval { ms: u64 },
    /// Acknowledged when written to the OS; fsynced only when a segment rolls and on close.
    /// Readers see records at once.
    Os,
}

/// Most bytes one coalesced write carries (a single larger batch is written alone).
pub const WRITE_BYTES_MAX: usize = 1 << 20;
/// Most writes of one partition in flight at once.
pub const WRITES_IN_FLIGHT_MAX: usize = 16;
/// Most batches and flushes queued in one partition before [`PartitionLog::append`] refuses
/// more ([`Refusal::QueueFull`]): the caller's backpressure.
pub const QUEUED_MAX: usize = 1 << 14;

const _: () = assert!(WRITE_BYTES_MAX.is_multiple_of(DIRECT_ALIGNMENT));
const _: () = assert!(WRITES_IN_FLIGHT_MAX >= 2, "pipelining needs two writes in flight");

/// Names one operation the log asked for, so its outcome finds its way back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(u64);

impl OpId {
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Names a caller waiting for an acknowledgement. Chosen by the caller; the log only hands
/// it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket(pub u64);

/// A partition's settings, as the write path needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub durability: Durability,
    pub segment_bytes: u64,
    pub segment_ms: i64,
    /// Segment files are written with direct I/O: every write covers whole blocks.
    pub direct: bool,
    /// Most bytes one coalesced write carries: [`WRITE_BYTES_MAX`] in the engine; tests make
    /// it small so that one turn holds several writes. At least one block.
    pub write_bytes_max: usize,
    /// A recovery point is made once this many bytes past the last one are durable (in `os`
    /// mode, once this many are written: an fdatasync of its own then makes them durable).
    pub recovery_point_bytes: u64,
    /// ... or once this long passed since the last one and any byte past it is durable
    /// (written, in `os` mode).
    pub recovery_point_ms: i64,
}

/// The active segment as recovery left it: everything in it below `size` is durable.
#[derive(Debug)]
pub struct Recovered {
    pub base_offset: Offset,
    pub size: u64,
    pub next_offset: Offset,
    pub created_ms: i64,
    /// On a direct file, the bytes of its last, partial block (`size % DIRECT_ALIGNMENT`).
    pub tail: Vec<u8>,
    /// The largest record timestamp in the segment below `size` (`i64::MIN` if none).
    pub max_timestamp: i64,
    /// The position of the segment's durable recovery point (its index files cover the
    /// bytes below it); at most `size`.
    pub recovery_point: u64,
}

/// A batch encoded at offset zero by the caller, outside any lock; the log gives it its
/// offsets.
#[derive(Debug)]
pub struct Batch {
    pub bytes: Vec<u8>,
    /// As `format::encode_batch` returned it (relative offsets: `next_offset` is the count).
    pub info: BatchInfo,
}

/// An operation the log wants run.
#[derive(Debug)]
pub struct LogOp {
    pub id: OpId,
    pub kind: OpKind,
    /// The next operation of the same [`PartitionLog::poll_ops`] call may start only after
    /// this one succeeded (io_uring's `IOSQE_IO_LINK`); if this one fails, the next one fails
    /// too (or is cancelled) and its outcome is ignored.
    pub link_next: bool,
}

#[derive(Debug)]
pub enum OpKind {
    /// Write `buffer` at `position` of the segment file based at `segment`. Its batches start
    /// at `batches_position` (later than `position` only on a direct file, where the buffer
    /// begins with the partial block already written and ends with zero padding).
    Write { segment: Offset, position: u64, batches_position: u64, buffer: Vec<u8> },
    /// fdatasync of the segment file.
    Fdatasync { segment: Offset },
    /// Make the segment durable at exactly `length` bytes, which end at offset `next_offset`
    /// (on a direct file: truncate the padding, then fsync; otherwise fdatasync), then write
    /// its index files (temporary files and renames; the directory fsync of the following
    /// [`OpKind::Create`] makes them durable).
    Seal { segment: Offset, length: u64, next_offset: Offset },
    /// Create the file of the next segment and fsync the partition directory.
    Create { segment: Offset },
    /// Record in `synced.checkpoint` (not fsynced) that every byte below `position` of the
    /// segment, and every offset below `offset`, is durable.
    Checkpoint { segment: Offset, position: u64, offset: Offset },
    /// Make a recovery point: write the segment's index files covering its first `position`
    /// bytes (which end at `offset`, and whose largest timestamp is `max_timestamp`), each
    /// through a temporary file, fdatasync and rename. Every byte below `position` is durable
    /// already, so whichever of the old and new files a crash leaves is true.
    RecoveryPoint { segment: Offset, position: u64, offset: Offset, max_timestamp: i64 },
}

/// Why an operation failed, kept for every waiter it fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub operation: &'static str,
    pub segment: Offset,
    pub kind: io::ErrorKind,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of segment {}: {}", self.operation, self.segment, self.message)
    }
}

impl Failure {
    fn from_error(operation: &'static str, segment: Offset, error: &io::Error) -> Self {
        Failure { operation, segment, kind: error.kind(), message: error.to_string() }
    }
}

/// Why the log refused or failed a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// An operation failed earlier: the log takes nothing more until it is reopened.
    Poisoned(Failure),
    /// [`QUEUED_MAX`] requests wait already.
    QueueFull,
    /// The partition is no longer driven (its topic was deleted, or the engine closed it).
    Removed,
}

/// What an acknowledgement acknowledges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acked {
    /// An append, durable as the durability mode promises.
    Appended { base_offset: Offset, next_offset: Offset },
    /// Every request queued before the flush is durable.
    Flushed { end: Offset },
    /// As [`Acked::Flushed`], and the checkpoint that says so is written: nothing is left to
    /// do for the partition.
    Closed { end: Offset },
    /// A transactional batch is written (not durable, not visible); the fence holds the
    /// partition until [`PartitionLog::end_transaction`].
    TransactionWritten { base_offset: Offset, next_offset: Offset },
    /// The transactional batch is durable (still invisible).
    TransactionSynced,
    /// The fence is gone; a committed batch is shown.
    TransactionEnded,
}

#[derive(Debug)]
pub struct Ack {
    pub ticket: Ticket,
    pub result: Result<Acked, Refusal>,
}

/// What changed in the log, for whoever shows it to readers (in order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A batch was given its place in the active segment (its write may not have completed).
    Placed { position: u64, info: BatchInfo },
    /// Every batch below `end` (at byte `position` of the active segment) is written.
    Written { end: Offset, position: u64 },
    /// Readers may see every offset below this (the high watermark moved).
    Published(Offset),
    /// The active segment was sealed and the next one, based at `segment`, is active.
    Rolled { segment: Offset },
    /// The log is poisoned.
    Poisoned(Failure),
}

/// A position in the log: an offset, the byte position of the active segment it maps to,
/// and the largest record timestamp of the segment below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct End {
    offset: Offset,
    position: u64,
    max_timestamp: i64,
}

#[derive(Debug)]
enum Queued {
    Append { ticket: Ticket, batch: Batch, transactional: bool },
    Flush { ticket: Ticket, close: bool },
}

/// A batch given its offsets and place, not yet in a write.
#[derive(Debug)]
struct Placed {
    bytes: Vec<u8>,
    position: u64,
    /// Where the log ends after this batch.
    end: End,
}

/// A caller waiting for the log to pass `end`.
#[derive(Clone, Copy, Debug)]
struct Waiter {
    ticket: Ticket,
    base_offset: Offset,
    end: Offset,
    kind: WaitKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaitKind {
    /// Acknowledged when written (`os`, `interval`) or durable (`sync`).
    Append,
    /// Acknowledged when written, whatever the mode.
    Transaction,
    /// Acknowledged when durable, whatever the mode.
    Flush,
    /// Acknowledged when durable and the checkpoint saying so is written.
    Close,
}

#[derive(Debug)]
struct WriteInFlight {
    id: OpId,
    start: u64,
    end: End,
    done: bool,
}

/// Where a transaction's batch stands in the active segment.
#[derive(Clone, Copy, Debug)]
struct Fence {
    start: End,
    end: End,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Roll {
    /// The next batch does not fit: seal once every write and fdatasync is done.
    Due,
    Sealing(OpId),
    /// Sealed: create the next segment.
    Sealed,
    Creating(OpId, Offset),
}

#[derive(Debug)]
struct Active {
    base_offset: Offset,
    created_ms: i64,
    tail: Vec<u8>,
}

/// The write path of one partition. See the module documentation.
#[derive(Debug)]
pub struct PartitionLog {
    config: Config,
    active: Active,
    /// Where the next batch goes.
    placed: End,
    /// Every write below this end completed.
    written: End,
    /// Every byte below this end of the active segment is durable (fence included).
    durable: End,
    /// What acknowledgements and readers may take as durable: `durable`, but never past a
    /// fence.
    synced: Offset,
    watermark: Offset,
    queue: VecDeque<Queued>,
    unwritten: VecDeque<Placed>,
    writes: VecDeque<WriteInFlight>,
    waiters: VecDeque<Waiter>,
    fence: Option<Fence>,
    transaction_sync: Option<Ticket>,
    sync_in_flight: Option<(OpId, End)>,
    roll: Option<Roll>,
    checkpoint_due: Option<(Offset, u64, Offset)>,
    checkpoint_in_flight: Option<OpId>,
    /// The position of the active segment's newest durable recovery point.
    recovery_point: u64,
    recovery_point_due: Option<End>,
    recovery_point_in_flight: Option<(OpId, End)>,
    last_recovery_point_ms: i64,
    /// When the last fdatasync was submitted (or the last seal ran).
    last_sync_ms: i64,
    acks: VecDeque<Ack>,
    events: VecDeque<Event>,
    poisoned: Option<Failure>,
    next_op: u64,
}

impl PartitionLog {
    /// A log whose active segment recovery left as `recovered`, all of it durable.
    pub fn new(config: Config, recovered: Recovered, now_ms: i64) -> Self {
        assert!(recovered.next_offset >= recovered.base_offset);
        assert_eq!(
            recovered.tail.len() as u64,
            if config.direct { recovered.size % DIRECT_ALIGNMENT as u64 } else { 0 },
            "a direct segment's tail is its partial block"
        );
        assert!(recovered.recovery_point <= recovered.size, "a recovery point inside the segment");
        let end = End {
            offset: recovered.next_offset,
            position: recovered.size,
            max_timestamp: recovered.max_timestamp,
        };
        // Recovery made the whole segment durable; a recovery point at its end saves the next
        // open from reading the bytes past the one it found.
        let recovery_point_due = (recovered.recovery_point < recovered.size).then_some(end);
        PartitionLog {
            config,
            active: Active {
                base_offset: recovered.base_offset,
                created_ms: recovered.created_ms,
                tail: recovered.tail,
            },
            placed: end,
            written: end,
            durable: end,
            synced: end.offset,
            watermark: end.offset,
            queue: VecDeque::new(),
            unwritten: VecDeque::new(),
            writes: VecDeque::new(),
            waiters: VecDeque::new(),
            fence: None,
            transaction_sync: None,
            sync_in_flight: None,
            roll: None,
            checkpoint_due: None,
            checkpoint_in_flight: None,
            recovery_point: recovered.recovery_point,
            recovery_point_due,
            recovery_point_in_flight: None,
            last_recovery_point_ms: now_ms,
            last_sync_ms: now_ms,
            acks: VecDeque::new(),
            events: VecDeque::new(),
            poisoned: None,
            next_op: 0,
        }
    }

    /// The offset the next placed batch gets.
    pub fn next_offset(&self) -> Offset {
        self.placed.offset
    }

    /// Every offset below this is durable and committed.
    pub fn synced(&self) -> Offset {
        self.synced
    }

    /// What readers may see.
    pub fn watermark(&self) -> Offset {
        self.watermark
    }

    /// The base offset of the active segment.
    pub fn active_segment(&self) -> Offset {
        self.active.base_offset
    }

    pub fn poisoned(&self) -> Option<&Failure> {
        self.poisoned.as_ref()
    }

    /// Nothing queued, in flight or waiting.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
            && self.unwritten.is_empty()
            && self.writes.is_empty()
            && self.waiters.is_empty()
            && self.transaction_sync.is_none()
            && self.sync_in_flight.is_none()
            && self.roll.is_none()
            && self.checkpoint_in_flight.is_none()
            && self.checkpoint_due.is_none()
            && self.recovery_point_in_flight.is_none()
            && self.recovery_point_due.is_none()
    }

    /// Queue an append; `ticket` is acknowledged through [`PartitionLog::poll_ack`].
    pub fn append(&mut self, ticket: Ticket, batch: Batch) -> Result<(), Refusal> {
        self.enqueue(Queued::Append { ticket, batch, transactional: false })
    }

    /// Queue a transaction's batch for this partition. Once placed it holds a fence: later
    /// requests wait until [`PartitionLog::end_transaction`], syncs and readers stop before
    /// it. Acknowledged ([`Acked::TransactionWritten`]) once written.
    pub fn begin_transaction(&mut self, ticket: Ticket, batch: Batch) -> Result<(), Refusal> {
        self.enqueue(Queued::Append { ticket, batch, transactional: true })
    }

    /// Make the written transactional batch durable (without showing it); acknowledged with
    /// [`Acked::TransactionSynced`].
    pub fn sync_transaction(&mut self, ticket: Ticket) -> Result<(), Refusal> {
        self.check_poison()?;
        assert!(self.fence.is_some(), "a transaction's batch is written");
        assert!(self.transaction_sync.is_none(), "one transaction sync at a time");
        self.transaction_sync = Some(ticket);
        self.complete_waiters();
        Ok(())
    }

    /// Release the fence. `committed`: the commit record is durable, so the batch (made
    /// durable by [`PartitionLog::sync_transaction`]) is shown like any durable append.
    pub fn end_transaction(&mut self, ticket: Ticket, committed: bool) {
        let fence = self.fence.take().expect("a transaction holds the partition");
        self.acks.push_back(Ack { ticket, result: Ok(Acked::TransactionEnded) });
        assert!(self.transaction_sync.is_none(), "the transaction's sync finished");
        if committed && self.poisoned.is_none() {
            assert!(self.durable.offset >= fence.end.offset, "a committed batch was synced");
            self.mark_synced(self.durable.offset);
            self.checkpoint_due =
                Some((self.active.base_offset, self.durable.position, self.durable.offset));
        }
    }

    /// Queue a flush: acknowledged once everything queued before it is durable.
    pub fn flush(&mut self, ticket: Ticket) -> Result<(), Refusal> {
        self.enqueue(Queued::Flush { ticket, close: false })
    }

    /// Queue a close: a flush that is acknowledged only once the checkpoint recording it is
    /// written too, so the caller may stop driving the log.
    pub fn close(&mut self, ticket: Ticket) -> Result<(), Refusal> {
        self.enqueue(Queued::Flush { ticket, close: true })
    }

    /// New segment limits (a topic's settings changed); the next placement uses them.
    pub fn set_segment_limits(&mut self, segment_bytes: u64, segment_ms: i64) {
        self.config.segment_bytes = segment_bytes;
        self.config.segment_ms = segment_ms;
    }

    /// Stop: every request waiting or queued is answered [`Refusal::Removed`]. Nothing may be
    /// in flight.
    pub fn abandon(&mut self) {
        assert!(self.writes.is_empty() && self.sync_in_flight.is_none(), "nothing in flight");
        for ticket in self.waiting_tickets() {
            self.acks.push_back(Ack { ticket, result: Err(Refusal::Removed) });
        }
        self.unwritten.clear();
    }

    /// Take every waiting and queued request's ticket out.
    fn waiting_tickets(&mut self) -> Vec<Ticket> {
        let mut tickets: Vec<Ticket> = self.waiters.drain(..).map(|w| w.ticket).collect();
        tickets.extend(self.transaction_sync.take());
        tickets.extend(self.queue.drain(..).map(|queued| match queued {
            Queued::Append { ticket, .. } | Queued::Flush { ticket, .. } => ticket,
        }));
        tickets
    }

    fn enqueue(&mut self, queued: Queued) -> Result<(), Refusal> {
        self.check_poison()?;
        if self.queue.len() >= QUEUED_MAX {
            return Err(Refusal::QueueFull);
        }
        self.queue.push_back(queued);
        Ok(())
    }

    fn check_poison(&self) -> Result<(), Refusal> {
        match &self.poisoned {
            Some(failure) => Err(Refusal::Poisoned(failure.clone())),
            None => Ok(()),
        }
    }

    /// The next change to show readers, in order.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next acknowledgement, in the order they were decided.
    pub fn poll_ack(&mut self) -> Option<Ack> {
        self.acks.pop_front()
    }

    /// When [`PartitionLog::poll_ops`] must run next without any new request or completion
    /// (an `interval` flush), on the engine clock.
    pub fn poll_timeout(&self) -> Option<i64> {
        let recovery_point = (self.config.durability == Durability::Os
            && self.written.position > self.recovery_point
            && self.sync_in_flight.is_none())
        .then(|| self.last_recovery_point_ms.saturating_add(self.config.recovery_point_ms));
        let Durability::Interval { ms } = self.config.durability else { return recovery_point };
        let pending = self.written.offset > self.durable.offset || self.placed != self.written;
        pending.then(|| self.last_sync_ms.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)))
    }

    /// Append to `out` the operations to run now, in order; chains of
    /// [`LogOp::link_next`] stay within them.
    pub fn poll_ops(&mut self, now_ms: i64, out: &mut Vec<LogOp>) {
        if self.poisoned.is_some() {
            return;
        }
        self.place(now_ms);
        let first_new = out.len();
        self.emit_writes(out);
        self.emit_sync(now_ms, out, first_new);
        self.emit_roll(out);
        self.emit_checkpoint(out);
        self.emit_recovery_point(out);
    }

    fn op_id(&mut self) -> OpId {
        self.next_op += 1;
        OpId(self.next_op)
    }

    /// Give queued requests their offsets and places, in queue order, until the active
    /// segment is full, a fence holds the partition, or a roll is under way.
    fn place(&mut self, now_ms: i64) {
        while self.roll.is_none() && self.fence.is_none() {
            let Some(front) = self.queue.front() else { break };
            if let Queued::Append { batch, .. } = front
                && self.should_roll(batch.bytes.len() as u64, now_ms)
            {
                self.roll = Some(Roll::Due);
                break;
            }
            match self.queue.pop_front().expect("front exists") {
                Queued::Flush { ticket, close } => {
                    let end = self.placed.offset;
                    let base_offset = end;
                    let kind = if close { WaitKind::Close } else { WaitKind::Flush };
                    self.waiters.push_back(Waiter { ticket, base_offset, end, kind });
                }
                Queued::Append { ticket, batch, transactional } => {
                    self.place_batch(ticket, batch, transactional);
                }
            }
        }
        self.complete_waiters();
    }

    fn should_roll(&self, batch_bytes: u64, now_ms: i64) -> bool {
        if self.placed.position == 0 {
            return false;
        }
        let too_big = self.placed.position + batch_bytes > self.config.segment_bytes;
        let too_old = now_ms.saturating_sub(self.active.created_ms) >= self.config.segment_ms;
        too_big || too_old
    }

    fn place_batch(&mut self, ticket: Ticket, mut batch: Batch, transactional: bool) {
        let length = u32::try_from(batch.bytes.len()).expect("a batch is at most 16 MiB");
        assert_eq!(length, batch.info.length, "the batch is as encoded");
        assert_eq!(batch.info.base_offset, Offset::ZERO, "batches come encoded at offset zero");
        let count = batch.info.next_offset.get();
        assert!(count > 0, "a batch holds at least one record");
        if transactional {
            format::set_transactional(&mut batch.bytes);
        }
        let start = self.placed;
        format::set_batch_offsets(&mut batch.bytes, start.offset, self.synced);
        let next_offset = start.offset.plus(count);
        let info = BatchInfo { base_offset: start.offset, next_offset, ..batch.info };
        self.events.push_back(Event::Placed { position: start.position, info });
        self.placed = End {
            offset: next_offset,
            position: start.position + u64::from(length),
            max_timestamp: start.max_timestamp.max(info.max_timestamp),
        };
        let (bytes, position, end) = (batch.bytes, start.position, self.placed);
        self.unwritten.push_back(Placed { bytes, position, end });
        let kind = if transactional { WaitKind::Transaction } else { WaitKind::Append };
        self.waiters.push_back(Waiter {
            ticket,
            base_offset: start.offset,
            end: self.placed.offset,
            kind,
        });
        if transactional {
            self.fence = Some(Fence { start, end: self.placed });
        }
    }

    /// Coalesce placed batches into writes, as many as may be in flight.
    fn emit_writes(&mut self, out: &mut Vec<LogOp>) {
        while !self.unwritten.is_empty() && self.writes.len() < WRITES_IN_FLIGHT_MAX {
            if self.config.direct
                && let Some(previous) = self.writes.back().filter(|w| !w.done)
                && !previous.end.position.is_multiple_of(DIRECT_ALIGNMENT as u64)
            {
                // The next direct write rewrites the block this one ends in: it may be in
                // flight with it only behind it in one chain, so only if that write goes out
                // in this same submission (the last operation so far); otherwise it waits.
                let id = previous.id;
                match out.last_mut() {
                    Some(op) if op.id == id && !canary::active(Canary::DirectWritesUnlinked) => {
                        op.link_next = true;
                    }
                    Some(op) if op.id == id => {}
                    _ => break,
                }
            }
            let batches_position = self.unwritten[0].position;
            let mut buffer = Vec::new();
            let mut end = batches_position;
            let mut end_of_write = self.unwritten[0].end;
            if self.config.direct {
                if canary::active(Canary::DirectWriteDropsTail) {
                    buffer.resize(self.active.tail.len(), 0);
                } else {
                    buffer.extend_from_slice(&self.active.tail);
                }
            }
            while let Some(next) = self.unwritten.front() {
                let fits = buffer.len() + next.bytes.len() <= self.config.write_bytes_max;
                if !buffer.is_empty() && end > batches_position && !fits {
                    break;
                }
                let next = self.unwritten.pop_front().expect("front exists");
                assert_eq!(next.position, end, "placed batches are contiguous");
                end += next.bytes.len() as u64;
                assert_eq!(next.end.position, end, "a placed batch ends where its bytes do");
                end_of_write = next.end;
                if buffer.is_empty() {
                    buffer = next.bytes;
                } else {
                    buffer.extend_from_slice(&next.bytes);
                }
            }
            let position = batches_position - self.active.tail.len() as u64;
            if self.config.direct {
                self.pad_direct(&mut buffer, position, end);
            }
            let id = self.op_id();
            assert!(self.writes.back().is_none_or(|w| w.end.position == batches_position));
            self.writes.push_back(WriteInFlight {
                id,
                start: position,
                end: end_of_write,
                done: false,
            });
            let segment = self.active.base_offset;
            let kind = OpKind::Write { segment, position, batches_position, buffer };
            out.push(LogOp { id, kind, link_next: false });
        }
    }

    /// Keep the partial last block as the next write's tail and pad the buffer to whole
    /// blocks.
    fn pad_direct(&mut self, buffer: &mut Vec<u8>, position: u64, end: u64) {
        let block = DIRECT_ALIGNMENT as u64;
        assert!(position.is_multiple_of(block), "direct writes start at a block");
        let tail_start = usize::try_from(end - end % block - position).expect("in memory");
        self.active.tail = buffer[tail_start..].to_vec();
        let padded = usize::try_from((end - position).next_multiple_of(block)).expect("in memory");
        buffer.resize(padded, 0);
    }

    /// Start an fdatasync if a waiter needs one and none is in flight. The writes this call
    /// emitted (`out[first_new..]`) are linked before it when no older write is still in
    /// flight, so it covers them in the same submission; otherwise it covers what completed.
    fn emit_sync(&mut self, now_ms: i64, out: &mut Vec<LogOp>, first_new: usize) {
        if self.sync_in_flight.is_some()
            || matches!(self.roll, Some(Roll::Sealing(_) | Roll::Sealed | Roll::Creating(..)))
            || !self.sync_wanted(now_ms)
        {
            return;
        }
        let new_writes = out.len() - first_new;
        let older_in_flight = self.writes.iter().rev().skip(new_writes).any(|write| !write.done);
        let link = new_writes > 0 && !older_in_flight;
        let covers = if link { self.writes.back().expect("new writes").end } else { self.written };
        if covers.position <= self.durable.position {
            return;
        }
        if link {
            for op in &mut out[first_new..] {
                assert!(matches!(op.kind, OpKind::Write { .. }), "only writes precede the sync");
                op.link_next = true;
            }
        }
        let id = self.op_id();
        // The interval counts from the submission: what completes after it waits for the next
        // fdatasync, due one interval later (not one interval after this one completes).
        self.last_sync_ms = now_ms;
        self.sync_in_flight = Some((id, covers));
        let kind = OpKind::Fdatasync { segment: self.active.base_offset };
        out.push(LogOp { id, kind, link_next: false });
    }

    /// Whether anyone waits for an fdatasync of the active segment.
    fn sync_wanted(&self, now_ms: i64) -> bool {
        let bound = self.synced;
        let waits = |kind: WaitKind| self.waiters.iter().any(|w| w.kind == kind && w.end > bound);
        if waits(WaitKind::Flush) || waits(WaitKind::Close) || self.transaction_sync.is_some() {
            return true;
        }
        match self.config.durability {
            Durability::Sync => waits(WaitKind::Append),
            Durability::Interval { ms } => {
                let due = self.last_sync_ms.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX));
                now_ms >= due && self.written.position > self.durable.position
            }
            // The periodic fdatasync a recovery point needs.
            Durability::Os => self.recovery_point_wanted(self.written, now_ms),
        }
    }

    /// Whether a recovery point at `end` is due: enough bytes or time past the last one.
    fn recovery_point_wanted(&self, end: End, now_ms: i64) -> bool {
        if end.position <= self.recovery_point {
            return false;
        }
        let bytes = end.position - self.recovery_point;
        let waited = now_ms.saturating_sub(self.last_recovery_point_ms);
        bytes >= self.config.recovery_point_bytes || waited >= self.config.recovery_point_ms
    }

    /// The durable end a recovery point may cover: never a fenced transaction's batch, whose
    /// commit recovery must still be able to roll back from the end of the log.
    fn recovery_point_end(&self) -> End {
        match self.fence {
            Some(fence) if fence.start.offset < self.durable.offset => fence.start,
            _ => self.durable,
        }
    }

    /// Make a due recovery point, one at a time, never during a roll (a seal writes the same
    /// index files, covering the whole segment).
    fn emit_recovery_point(&mut self, out: &mut Vec<LogOp>) {
        if self.recovery_point_in_flight.is_some() || self.roll.is_some() {
            return;
        }
        let Some(end) = self.recovery_point_due.take() else { return };
        if end.position <= self.recovery_point {
            return;
        }
        let early = canary::active(Canary::RecoveryPointBeforeSync);
        assert!(end.position <= self.durable.position || early, "it covers durable bytes");
        let id = self.op_id();
        let kind = OpKind::RecoveryPoint {
            segment: self.active.base_offset,
            position: end.position,
            offset: end.offset,
            max_timestamp: end.max_timestamp,
        };
        out.push(LogOp { id, kind, link_next: false });
        self.recovery_point_in_flight = Some((id, end));
    }

    /// Move a due roll on: seal the active segment once nothing of it is in flight, then
    /// create the next one.
    fn emit_roll(&mut self, out: &mut Vec<LogOp>) {
        match self.roll {
            Some(Roll::Due)
                if self.unwritten.is_empty()
                    && self.writes.is_empty()
                    && self.sync_in_flight.is_none()
                    && self.recovery_point_in_flight.is_none() =>
            {
                assert!(self.fence.is_none(), "no roll under a fence");
                assert_eq!(self.written, self.placed, "every placed batch is written");
                let id = self.op_id();
                let length = self.placed.position;
                let segment = self.active.base_offset;
                let next_offset = self.placed.offset;
                let kind = OpKind::Seal { segment, length, next_offset };
                out.push(LogOp { id, kind, link_next: false });
                self.roll = Some(Roll::Sealing(id));
            }
            Some(Roll::Sealed) => {
                let id = self.op_id();
                let segment = self.placed.offset;
                out.push(LogOp { id, kind: OpKind::Create { segment }, link_next: false });
                self.roll = Some(Roll::Creating(id, segment));
            }
            _ => {}
        }
    }

    fn emit_checkpoint(&mut self, out: &mut Vec<LogOp>) {
        if self.checkpoint_in_flight.is_some() {
            return;
        }
        if let Some((segment, position, offset)) = self.checkpoint_due.take() {
            let id = self.op_id();
            out.push(LogOp {
                id,
                kind: OpKind::Checkpoint { segment, position, offset },
                link_next: false,
            });
            self.checkpoint_in_flight = Some(id);
        }
    }

    /// Take the outcome of operation `id` back. Every operation [`PartitionLog::poll_ops`]
    /// emitted completes exactly once, also after a failure poisoned the log (a cancelled
    /// link reports an error).
    pub fn complete(&mut self, id: OpId, result: io::Result<()>, now_ms: i64) {
        if let Some(index) = self.writes.iter().position(|w| w.id == id) {
            self.complete_write(index, result, now_ms);
        } else if self.sync_in_flight.is_some_and(|(sync, _)| sync == id) {
            let (_, covers) = self.sync_in_flight.take().expect("checked");
            self.complete_sync(covers, result, now_ms);
        } else if self.roll == Some(Roll::Sealing(id)) {
            self.complete_seal(result, now_ms);
        } else if let Some(Roll::Creating(create, base)) = self.roll
            && create == id
        {
            self.complete_create(base, result, now_ms);
        } else if self.recovery_point_in_flight.is_some_and(|(point, _)| point == id) {
            let (_, end) = self.recovery_point_in_flight.take().expect("checked");
            match result {
                Ok(()) if self.poisoned.is_none() => {
                    assert!(end.position > self.recovery_point, "recovery points only advance");
                    self.recovery_point = end.position;
                    self.last_recovery_point_ms = now_ms;
                }
                Ok(()) => {}
                Err(error) => {
                    let failure =
                        Failure::from_error("recovery point", self.active.base_offset, &error);
                    self.poison(failure);
                }
            }
        } else if self.checkpoint_in_flight == Some(id) {
            self.checkpoint_in_flight = None;
            if let Err(error) = result {
                // The records it names are durable and acknowledged; the failure still stops
                // the log, as every I/O error does.
                self.poison(Failure::from_error("checkpoint", self.active.base_offset, &error));
            }
        } else {
            panic!("completion of an operation not in flight: {id:?}");
        }
        self.complete_waiters();
    }

    fn complete_write(&mut self, index: usize, result: io::Result<()>, now_ms: i64) {
        // The canary takes a failed write for a done one: neither poisoned nor reported.
        let ignored = result.is_err() && canary::active(Canary::WriteErrorNotPoisoned);
        if let (Err(error), false) = (result, ignored) {
            self.writes.remove(index);
            self.poison(Failure::from_error("write", self.active.base_offset, &error));
            return;
        }
        if self.poisoned.is_some() {
            // Nothing is called written any more; the write only leaves the books.
            self.writes.remove(index);
            return;
        }
        assert!(!self.writes[index].done, "a write completes once");
        self.writes[index].done = true;
        let block = DIRECT_ALIGNMENT as u64;
        while self.writes.front().is_some_and(|w| w.done) {
            let write = self.writes.pop_front().expect("front exists");
            let position = self.written.position;
            let expected = if self.config.direct { position - position % block } else { position };
            assert_eq!(write.start, expected, "writes complete the log in order");
            self.written = write.end;
            let (end, position) = (write.end.offset, write.end.position);
            self.events.push_back(Event::Written { end, position });
        }
        if canary::active(Canary::RecoveryPointBeforeSync)
            && self.fence.is_none()
            && self.recovery_point_wanted(self.written, now_ms)
        {
            // The canary takes written bytes for durable ones.
            self.recovery_point_due = Some(self.written);
        }
        if self.poisoned.is_none()
            && self.config.durability == Durability::Os
            && !canary::active(Canary::OsAppendsNotPublished)
        {
            self.publish(self.visible_end(self.written.offset));
        }
        let ack_before_fsync =
            canary::active(Canary::AckBeforeFsync) && self.config.durability == Durability::Sync;
        if self.poisoned.is_none()
            && (canary::active(Canary::LogWatermarkBeforeSync) || ack_before_fsync)
        {
            self.show(self.visible_end(self.written.offset));
        }
    }

    fn complete_sync(&mut self, covers: End, result: io::Result<()>, now_ms: i64) {
        if let Err(error) = result {
            // Never retried: after a failed fdatasync the dirty pages may be gone.
            self.poison(Failure::from_error("fdatasync", self.active.base_offset, &error));
            return;
        }
        if self.poisoned.is_some() {
            return;
        }
        assert!(covers.offset <= self.placed.offset, "a sync covers placed batches");
        let covers = if canary::active(Canary::SyncCoversLaterWrites)
            && self.written.position > covers.position
        {
            self.written
        } else {
            covers
        };
        if covers.position > self.durable.position {
            self.durable = covers;
        }
        let synced = self.visible_end(self.durable.offset);
        self.mark_synced(synced);
        let position = match self.fence {
            Some(fence) if fence.start.offset < self.durable.offset => fence.start.position,
            _ => self.durable.position,
        };
        self.checkpoint_due = Some((self.active.base_offset, position, synced));
        let end = self.recovery_point_end();
        if self.recovery_point_wanted(end, now_ms) {
            self.recovery_point_due = Some(end);
        }
    }

    fn complete_seal(&mut self, result: io::Result<()>, now_ms: i64) {
        if let Err(error) = result {
            self.poison(Failure::from_error("seal", self.active.base_offset, &error));
            return;
        }
        self.last_sync_ms = now_ms;
        self.durable = self.placed;
        self.mark_synced(self.placed.offset);
        self.roll = Some(Roll::Sealed);
        // The seal wrote index files covering the whole segment.
        self.recovery_point_due = None;
    }

    fn complete_create(&mut self, base: Offset, result: io::Result<()>, now_ms: i64) {
        if let Err(error) = result {
            self.poison(Failure::from_error("create", base, &error));
            return;
        }
        assert_eq!(base, self.placed.offset, "the new segment starts where the log ends");
        let end = End { offset: base, position: 0, max_timestamp: i64::MIN };
        self.active = Active { base_offset: base, created_ms: now_ms, tail: Vec::new() };
        (self.placed, self.written, self.durable) = (end, end, end);
        (self.recovery_point, self.last_recovery_point_ms) = (0, now_ms);
        self.roll = None;
        self.events.push_back(Event::Rolled { segment: base });
        self.checkpoint_due = Some((base, 0, base));
    }

    /// `offset`, held back to the start of a fence.
    fn visible_end(&self, offset: Offset) -> Offset {
        match self.fence {
            Some(fence) => offset.min(fence.start.offset),
            None => offset,
        }
    }

    /// Every offset below `offset` is durable and committed: acknowledge and show it.
    fn mark_synced(&mut self, offset: Offset) {
        if self.poisoned.is_some() || offset <= self.synced {
            return;
        }
        assert!(offset <= self.durable.offset, "synced only what an fdatasync covered");
        self.synced = offset;
        self.publish(offset);
    }

    /// Show readers every offset below `offset`.
    fn publish(&mut self, offset: Offset) {
        let limit = match self.config.durability {
            Durability::Os => self.written.offset,
            Durability::Sync | Durability::Interval { .. } => self.synced,
        };
        assert!(offset <= limit, "the watermark never passes what the mode promises");
        assert!(self.fence.is_none_or(|f| offset <= f.start.offset), "nothing past a fence");
        self.show(offset);
    }

    /// Move the watermark (never back) and say so.
    fn show(&mut self, offset: Offset) {
        if offset > self.watermark {
            self.watermark = offset;
            self.events.push_back(Event::Published(offset));
        }
    }

    /// Acknowledge every waiter the log has passed.
    fn complete_waiters(&mut self) {
        if self.poisoned.is_some() {
            return;
        }
        let written = self.written.offset;
        let bound = written.max(self.synced);
        let mut index = 0;
        while index < self.waiters.len() && self.waiters[index].end <= bound {
            let waiter = self.waiters[index];
            let (base_offset, next_offset) = (waiter.base_offset, waiter.end);
            let acked = match waiter.kind {
                WaitKind::Append if self.config.durability == Durability::Sync => {
                    let early = canary::active(Canary::LogAckOnWrite)
                        || canary::active(Canary::AckBeforeFsync);
                    let bound = if early { written } else { self.synced };
                    (waiter.end <= bound).then_some(Acked::Appended { base_offset, next_offset })
                }
                WaitKind::Append => {
                    (waiter.end <= written).then_some(Acked::Appended { base_offset, next_offset })
                }
                WaitKind::Transaction => (waiter.end <= written)
                    .then_some(Acked::TransactionWritten { base_offset, next_offset }),
                WaitKind::Flush => {
                    (waiter.end <= self.synced).then_some(Acked::Flushed { end: waiter.end })
                }
                WaitKind::Close => {
                    let end = self.recovery_point_end();
                    if waiter.end <= self.synced
                        && end.position > self.recovery_point
                        && self.recovery_point_in_flight.is_none()
                    {
                        // A clean close leaves a recovery point at the end: the next open
                        // reads nothing.
                        self.recovery_point_due = Some(end);
                    }
                    let recorded = self.checkpoint_due.is_none()
                        && self.checkpoint_in_flight.is_none()
                        && self.recovery_point_in_flight.is_none()
                        && self.recovery_point >= end.position;
                    (waiter.end <= self.synced && recorded)
                        .then_some(Acked::Closed { end: waiter.end })
                }
            };
            match acked {
                Some(acked) => {
                    self.waiters.remove(index);
                    self.acks.push_back(Ack { ticket: waiter.ticket, result: Ok(acked) });
                }
                None => index += 1,
            }
        }
        if let (Some(ticket), Some(fence)) = (self.transaction_sync, self.fence)
            && self.durable.offset >= fence.end.offset
        {
            self.transaction_sync = None;
            self.acks.push_back(Ack { ticket, result: Ok(Acked::TransactionSynced) });
        }
    }

    /// Fail the log from outside (another log of the engine failed): as after a failed
    /// operation of its own.
    pub fn fail(&mut self, failure: Failure) {
        self.poison(failure);
    }

    /// Fail-stop: fail every waiter and every queued request, and take nothing more.
    fn poison(&mut self, failure: Failure) {
        if self.poisoned.is_some() {
            return;
        }
        let refused = || Err(Refusal::Poisoned(failure.clone()));
        for ticket in self.waiting_tickets() {
            self.acks.push_back(Ack { ticket, result: refused() });
        }
        self.unwritten.clear();
        self.checkpoint_due = None;
        self.recovery_point_due = None;
        self.events.push_back(Event::Poisoned(failure.clone()));
        self.poisoned = Some(failure);
    }
}
