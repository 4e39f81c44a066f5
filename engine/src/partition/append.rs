//! The partition's requests to the write path: appends (waited for or pipelined), flushes,
//! a transaction's steps, close; and how the log's answers and refusals become results.

use super::{Appended, Partition};
use crate::canary::{self, Canary};
use crate::error::{AppendError, IoError};
use crate::format::{self};
use crate::io::Io;
use crate::layout::{self, LOG_SUFFIX};
use crate::log::{self as write_log, Acked, Batch, Failure, Refusal};
use crate::metrics::Metrics;
pub(crate) use crate::write_path::Request;
use crate::{Offset, Record};
use std::sync::Arc;

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

impl<I: Io> Partition<I> {
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
    /// before any is waited for share one turn (flushes, a transaction's syncs). The caller
    /// waits for each ([`Requested::wait`]), so no driver thread is woken for them.
    pub fn submit(&self, request: Request) -> Result<Requested<'_, I>, AppendError> {
        let writer = self.writer.as_ref().ok_or(AppendError::ReadOnly)?;
        self.check_appendable()?;
        let pending = writer.path.submit_then_wait(writer.id, request);
        Ok(Requested { partition: self, pending })
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
            _ => self.directory.join(layout::file_name(failure.segment, LOG_SUFFIX)),
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
        let closed = writer.path.submit_then_wait(writer.id, Request::Close).wait();
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
        // The recovery point's files were renamed into place without a directory fsync (either
        // name tells the truth); the clean-shutdown mark written after this close claims the
        // new ones, so they must be durable first.
        let directory = &self.directory;
        crate::io::sync_directory(&*self.io, directory)
            .map_err(|e| IoError::new("fsync", directory, e))
            .inspect_err(|e| self.poison_with(e))?;
        Ok(())
    }
}
