//! Appends and reads: the engine's data path, which finds the partition and hands the
//! request to it.

use super::{Engine, Missing};
use crate::error::{AppendError, ReadError};
use crate::fetch::Fetch;
use crate::io::Io;
use crate::partition::{Appended, Partition, PendingAppend};
use crate::{Offset, Record};
use std::sync::Arc;
use std::time::Duration;

impl<I: Io> Engine<I> {
    pub(super) fn partition_for_append(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Arc<Partition<I>>, AppendError> {
        self.partition(topic, partition).map_err(|missing| {
            let topic = topic.to_owned();
            match missing {
                Missing::Topic => AppendError::TopicNotFound { topic },
                Missing::Partition => AppendError::PartitionNotFound { topic, partition },
                Missing::Damaged(damage) => AppendError::Corruption(damage),
            }
        })
    }

    fn partition_for_read(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Arc<Partition<I>>, ReadError> {
        self.partition(topic, partition).map_err(|missing| {
            let topic = topic.to_owned();
            match missing {
                Missing::Topic => ReadError::TopicNotFound { topic },
                Missing::Partition => ReadError::PartitionNotFound { topic, partition },
                Missing::Damaged(damage) => ReadError::Corruption(damage),
            }
        })
    }

    /// Append `records` as one batch to a partition and return their offsets. Returns once the
    /// records are acknowledged under the engine's [`Durability`](crate::Durability).
    pub fn append(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record<'_>],
    ) -> Result<Appended, AppendError> {
        self.partition_for_append(topic, partition)?.append(records)
    }

    /// Queue an append and return at once, without waiting for it: many appends in flight
    /// from one caller share the write path's turns (and, in `sync` mode, their fdatasyncs).
    /// The records are encoded (and checked) here; the [`PendingAppend`] gives the offsets,
    /// assigned in the order appends to the partition were queued, once the append is done
    /// as the durability mode promises. Refused at once for what `append` refuses at once.
    ///
    /// ```
    /// use chronik_engine::{io::PreadIo, runtime::SystemClock, Engine, Options, Record};
    /// # let directory = tempfile::tempdir().unwrap();
    /// let (engine, _) = Engine::open(
    ///     PreadIo::new(), std::sync::Arc::new(SystemClock), directory.path(), Options::default(),
    /// ).unwrap();
    /// engine.create_topic("t", Default::default()).unwrap();
    /// let pending: Vec<_> = (0..100u32)
    ///     .map(|i| engine.append_nowait("t", 0, &[Record::new(None, &i.to_le_bytes())]).unwrap())
    ///     .collect();
    /// for (i, pending) in pending.into_iter().enumerate() {
    ///     assert_eq!(pending.wait().unwrap().base_offset.get(), i as u64);
    /// }
    /// ```
    pub fn append_nowait(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record<'_>],
    ) -> Result<PendingAppend<I>, AppendError> {
        self.partition_for_append(topic, partition)?.append_nowait(records)
    }

    /// The engine's write shards (none when read-only): the runtime runs a driver thread
    /// for each.
    pub(crate) fn write_shards(&self) -> usize {
        self.inner.context.write_paths.len()
    }

    /// For the runtime's driver thread of `shard`: turn its write path whenever requests are
    /// queued, until `stop()` holds (then [`Engine::wake_write_path`]).
    pub(crate) fn drive_write_path(&self, shard: usize, stop: &dyn Fn() -> bool) {
        if let Some(path) = self.inner.context.write_paths.get(shard) {
            path.drive_until_idle(stop);
        }
    }

    /// Wake the driver threads (to see their stop flag).
    pub(crate) fn wake_write_path(&self) {
        for path in &self.inner.context.write_paths {
            path.notify();
        }
    }

    /// Read whole batches from `from` on, about `max_bytes` of them (at least one batch).
    /// Empty when `from` is the high watermark.
    pub fn read(
        &self,
        topic: &str,
        partition: u32,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Fetch, ReadError> {
        self.partition_for_read(topic, partition)?.read(from, max_bytes)
    }

    /// The first offset whose timestamp is at or after `timestamp`, if any is visible.
    pub fn offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        timestamp: i64,
    ) -> Result<Option<Offset>, ReadError> {
        self.partition_for_read(topic, partition)?.offset_for_timestamp(timestamp)
    }

    /// The end of what readers may see in a partition.
    pub fn high_watermark(&self, topic: &str, partition: u32) -> Result<Offset, ReadError> {
        Ok(self.partition_for_read(topic, partition)?.high_watermark())
    }

    /// Block until `offset` is visible in a partition or `timeout` passes; returns whether it
    /// is. Lets consumers tail a partition without polling.
    pub fn wait_for(
        &self,
        topic: &str,
        partition: u32,
        offset: Offset,
        timeout: Duration,
    ) -> Result<bool, ReadError> {
        self.partition_for_read(topic, partition)?.wait_for(offset, timeout)
    }

    /// The count of requests handed to the write path so far (zero forever when read-only),
    /// for tests that line appenders up behind a turn.
    pub(crate) fn write_requests_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.inner.context.write_paths.first().map_or_else(Arc::default, |path| path.submitted())
    }
}
