//! Background work as step functions: interval flushes, retention, compaction, and a
//! read-only engine's refresh.

use super::Engine;
use crate::Offset;
use crate::error::{AppendError, ReadError, TopicError};
use crate::io::Io;
use crate::log::Durability;
use crate::partition::{CompactionFailure, CompactionReport};

impl<I: Io> Engine<I> {
    /// Fsync every partition now.
    pub fn flush(&self) -> Result<(), AppendError> {
        // Fail-stop: a poisoned engine reports no success, even when nothing is left to sync.
        if crate::canary::active(crate::canary::Canary::FlushIgnoresPoison)
            && self.inner.context.poison.check().is_err()
        {
            return Ok(());
        }
        self.inner.context.poison.check()?;
        if self.inner.options.read_only {
            return Ok(());
        }
        // Every partition's flush queued before any is waited for: one turn, every
        // partition's fdatasync in one submission.
        let partitions = self.all_partitions();
        let flushes: Vec<_> = partitions
            .iter()
            .map(|partition| partition.submit(crate::partition::Request::Flush))
            .collect::<Result<_, _>>()?;
        for flush in flushes {
            flush.wait()?;
        }
        Ok(())
    }

    /// One step of all background work: [`Engine::flush_due`], then [`Engine::maintain`].
    /// The simulator calls it between workload steps; the runtime calls the two halves from
    /// threads of their own, so a long compaction pass never delays an interval flush.
    pub fn tick(&self) -> Result<(), AppendError> {
        self.flush_due()?;
        self.maintain()
    }

    /// In `interval` mode, fsync every partition whose last fsync is older than the interval
    /// (a no-op in the other modes and for a read-only engine). Bounded by one fdatasync per
    /// partition. It takes no lock that retention or compaction holds for long (they hold
    /// `maintenance`, which it never takes), so it runs on time beside a pass in progress:
    /// this is what keeps `interval:MS`'s loss window at MS plus one flusher period.
    pub(crate) fn flush_due(&self) -> Result<(), AppendError> {
        self.inner.context.poison.check()?;
        if self.inner.options.read_only {
            return Ok(());
        }
        if let Durability::Interval { .. } = self.inner.options.durability {
            // The partition logs know their deadlines: a turn syncs those that are due.
            for path in &self.inner.context.write_paths {
                path.turn_once();
            }
            self.inner.context.poison.check()?;
        }
        Ok(())
    }

    /// Retention and compaction of every partition: sealed segments older than
    /// `retention_ms` or beyond `retention_bytes` removed, a durable log start first (see
    /// `Partition::apply_retention`); then a compaction pass where one is due. A pass may
    /// take long (it reads and rewrites segments); it never holds a lock that appends,
    /// flushes or reads wait for, except for the moment of a segment swap.
    pub(crate) fn maintain(&self) -> Result<(), AppendError> {
        self.inner.context.poison.check()?;
        if self.inner.options.read_only {
            return Ok(());
        }
        let now = self.inner.context.clock.now_ms();
        for partition in self.all_partitions() {
            partition.apply_retention(now)?;
            // An abandoned pass leaves its log as it was and is kept for `compaction_error`;
            // the other partitions go on. Only a poisoned engine stops the tick.
            if let Err(error) = partition.compact(now, false) {
                self.inner.context.poison.check()?;
                debug_assert!(matches!(error, AppendError::Io(_)), "{error}");
            }
        }
        Ok(())
    }

    /// The last compaction pass of a partition that was abandoned on an I/O error (reading
    /// its segments, writing the cleaned copy, disk full), while no pass has succeeded since.
    /// The group that failed is as it was (groups swapped before it stay swapped), and the
    /// partition is served as usual; the tick tries again after a back-off of 1 s doubling
    /// per failure in a row, up to a minute.
    pub fn compaction_error(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Option<CompactionFailure>, AppendError> {
        Ok(self.partition_for_append(topic, partition)?.compaction_failure())
    }

    /// Delete the records of a partition below `before`, as far as whole segments allow:
    /// every sealed segment all of whose records lie below `before` (and below the high
    /// watermark) is removed, the new log start made durable first. Returns the log start
    /// after the call. The call never moves it past `before` (records of the first kept segment
    /// below `before` stay readable until a later call, once that segment is sealed and wholly
    /// below it) and never back (if retention or an earlier call already moved it past
    /// `before`, that is what comes back). Any cleanup policy; internal topics (`__` names) are
    /// not found. A crash at any moment leaves the log start where it was or where it was
    /// going. Kafka's `DeleteRecords` at segment granularity:
    /// topologies purge their repartition topics with it once the records are committed.
    pub fn delete_records(
        &self,
        topic: &str,
        partition: u32,
        before: Offset,
    ) -> Result<Offset, AppendError> {
        self.inner.context.poison.check()?;
        if self.inner.options.read_only {
            return Err(AppendError::ReadOnly);
        }
        // Internal topics are not the user's: their records (the committed offsets and
        // transaction commit records) are what recovery decides by.
        if crate::groups::is_internal(topic) {
            return Err(AppendError::TopicNotFound { topic: topic.to_owned() });
        }
        self.partition_for_append(topic, partition)?.delete_before(before)
    }

    /// Compact one partition now, as [`Engine::compact_topic`] does each.
    pub fn compact_partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Option<CompactionReport>, AppendError> {
        let partition = self.partition_for_append(topic, partition)?;
        partition.compact(self.inner.context.clock.now_ms(), true)
    }

    /// Compact every partition of a compacted topic now, whatever its dirty ratio (the lag
    /// bounds still hold). Returns one report per partition, `None` where nothing was
    /// cleanable.
    pub fn compact_topic(&self, name: &str) -> Result<Vec<Option<CompactionReport>>, AppendError> {
        let topic = self.existing_topic(name).map_err(|error| match error {
            TopicError::Corruption(damage) => AppendError::Corruption(damage),
            _ => AppendError::TopicNotFound { topic: name.to_owned() },
        })?;
        let now = self.inner.context.clock.now_ms();
        topic.partitions.iter().map(|partition| partition.compact(now, true)).collect()
    }

    /// Read-only engines: pick up what the writing process appended to every partition since
    /// the last look. A no-op for an engine that writes itself.
    pub fn refresh(&self) -> Result<(), ReadError> {
        for partition in self.all_partitions() {
            partition.refresh()?;
        }
        Ok(())
    }
}
