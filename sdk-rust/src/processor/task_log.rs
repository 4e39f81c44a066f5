//! What a task needs of the log it runs on ([`TaskLog`]), and the embedded engine's answer.
//! The task code is written once against this trait, so a task on the engine and one on a
//! Kafka-protocol cluster (`kafka::group`) take the same steps and commit the same way.
//! Invariant: `commit` appends its writes and moves the group's positions all or nothing; a
//! log that cannot promise that cannot run exactly once.

use super::api::ProcessorError;
use crate::{Fetch, GroupCommit, Io, Offset, TransactionWrite};
use chronik_engine::metrics::Metrics;
use chronik_engine::{Engine, StateDir};

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
    /// The directory where task snapshots and disk stores are kept, if this log has a local
    /// one (a cluster does not: a partition may move to another machine, so its state always
    /// comes from the changelog).
    fn state_dir(&self) -> Option<StateDir> {
        None
    }
    fn metrics(&self) -> Option<&Metrics> {
        None
    }
    /// Microseconds on a clock that never goes back, for latencies (`None`: none are kept).
    fn monotonic_us(&self) -> Option<u64> {
        None
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

    fn state_dir(&self) -> Option<StateDir> {
        Some(Engine::state_dir(self))
    }

    fn metrics(&self) -> Option<&Metrics> {
        Some(self.metrics_registry())
    }

    fn monotonic_us(&self) -> Option<u64> {
        Some(Engine::monotonic_us(self))
    }
}
