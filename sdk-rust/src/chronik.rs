//! `Chronik`: an open data directory with its background runtime, and its admin. Appends go
//! through a [`Producer`], reads through a [`Consumer`]; `Chronik` itself neither appends nor
//! reads records.

use crate::{
    AppendError, Appended, CommitError, CompactionReport, Consumer, DamagedTopic, DefaultEngine,
    Error, GroupCommit, MetricsSnapshot, Offset, OpenError, Options, Producer, ReadError,
    RecoveryReport, SystemClock, SystemIo, TopicConfig, TopicDescription, TopicError,
    TransactionWrite,
};
use chronik_engine::runtime::Runtime;
use std::path::Path;
use std::sync::Arc;

/// An open data directory with its background runtime.
#[derive(Debug)]
pub struct Chronik {
    engine: DefaultEngine,
    recovery: RecoveryReport,
    /// The I/O backend in use: `io_uring` or `pread`.
    backend: &'static str,
    /// Holds its own engine clone; stopped and joined when this is dropped.
    _runtime: Runtime,
}

impl Chronik {
    /// Open (creating if needed) a data directory, recovering it after a crash.
    ///
    /// The I/O backend is `options.io_backend`: by default io_uring where the kernel allows it;
    /// where it does not, pread/pwrite, with one line on standard error saying why.
    /// `options.write_shards` and `options.open_threads` of 0 mean one per core.
    pub fn open(path: impl AsRef<Path>, mut options: Options) -> Result<Chronik, Error> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        if options.write_shards == 0 {
            options.write_shards = cores;
        }
        if options.open_threads == 0 {
            options.open_threads = cores;
        }
        let io = SystemIo::new(options.io_backend).map_err(|source| {
            let path = path.as_ref().to_path_buf();
            OpenError::Io(chronik_engine::io::IoError {
                operation: "set up io_uring",
                path,
                source,
            })
        })?;
        if let Some(reason) = io.fallback() {
            eprintln!("chronik: {reason}");
        }
        let backend = io.name();
        let (engine, recovery) =
            chronik_engine::Engine::open(io, Arc::new(SystemClock), path.as_ref(), options)?;
        let runtime = Runtime::start(&engine).map_err(|error| {
            let path = path.as_ref().to_path_buf();
            OpenError::Io(chronik_engine::io::IoError {
                operation: "spawn runtime",
                path,
                source: error,
            })
        })?;
        Ok(Chronik { engine, recovery, backend, _runtime: runtime })
    }

    /// The I/O backend in use: `io_uring` or `pread`.
    pub fn io_backend(&self) -> &'static str {
        self.backend
    }

    /// What recovery did when this directory was opened.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The engine underneath, for processors' runners and tools; applications append through
    /// a [`Producer`] and read through a [`Consumer`].
    pub fn engine(&self) -> &DefaultEngine {
        &self.engine
    }

    pub fn create_topic(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        self.engine.create_topic(name, config)
    }

    /// Change a topic's settings; the partition count may only grow.
    pub fn alter_topic_config(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        self.engine.alter_topic_config(name, config)
    }

    pub fn delete_topic(&self, name: &str) -> Result<(), TopicError> {
        self.engine.delete_topic(name)
    }

    pub fn list_topics(&self) -> Vec<String> {
        self.engine.list_topics()
    }

    pub fn describe_topic(&self, name: &str) -> Result<TopicDescription, TopicError> {
        self.engine.describe_topic(name)
    }

    /// The topic's partition count, if it exists.
    pub fn partition_count(&self, topic: &str) -> Option<u32> {
        self.engine.partition_count(topic)
    }

    /// The offset the next record of the partition will get: everything below it is readable.
    pub fn high_watermark(&self, topic: &str, partition: u32) -> Result<Offset, ReadError> {
        self.engine.high_watermark(topic, partition)
    }

    /// The first offset whose timestamp is at or after `timestamp_ms`, if any.
    pub fn offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        timestamp_ms: i64,
    ) -> Result<Option<Offset>, ReadError> {
        self.engine.offset_for_timestamp(topic, partition, timestamp_ms)
    }

    /// What consumer group `group` committed last for the partition.
    pub fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Option<Offset> {
        self.engine.committed_offset(group, topic, partition)
    }

    /// Append to several partitions and commit a group's positions, all or nothing.
    pub fn commit_transaction(
        &self,
        writes: &[TransactionWrite<'_>],
        group: Option<GroupCommit<'_>>,
    ) -> Result<Vec<Appended>, CommitError> {
        self.engine.commit_transaction(writes, group)
    }

    /// Make every append so far durable (in `os` and `interval` modes; `sync` appends are
    /// durable when acknowledged).
    pub fn flush(&self) -> Result<(), AppendError> {
        self.engine.flush()
    }

    /// Remove the partition's records below `before` (whole segments: Kafka's
    /// DeleteRecords); returns the new log start.
    pub fn delete_records(
        &self,
        topic: &str,
        partition: u32,
        before: Offset,
    ) -> Result<Offset, AppendError> {
        self.engine.delete_records(topic, partition, before)
    }

    /// Compact every partition of a compacted topic now, instead of waiting for the
    /// background pass.
    pub fn compact_topic(&self, name: &str) -> Result<Vec<Option<CompactionReport>>, AppendError> {
        self.engine.compact_topic(name)
    }

    /// Topics that could not be opened because their metadata is damaged.
    pub fn damaged_topics(&self) -> Vec<DamagedTopic> {
        self.engine.damaged_topics()
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.engine.metrics()
    }

    pub fn producer(&self, topic: &str) -> Producer {
        Producer::new(self.engine.clone(), topic)
    }

    /// A consumer of one partition, starting at offset zero (or the log start, if retention
    /// removed offset zero), in no group.
    pub fn consumer(&self, topic: &str, partition: u32) -> Consumer {
        Consumer::new(self.engine.clone(), topic, partition)
    }

    /// A consumer of one partition in consumer group `group`: it starts where the group
    /// committed last ([`Consumer::commit`]), or at the log start if it never did.
    pub fn group_consumer(&self, group: &str, topic: &str, partition: u32) -> Consumer {
        Consumer::in_group(self.engine.clone(), group, topic, partition)
    }
}
