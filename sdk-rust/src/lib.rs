//! Chronik: an embedded log engine. Topics of partitioned, append-only, segmented logs in a
//! local data directory, with no server to run.
//!
//! ```
//! use chronik::{Chronik, Options, Record, TopicConfig};
//!
//! let directory = tempfile::tempdir()?;
//! let chronik = Chronik::open(directory.path(), Options::default())?;
//! chronik.create_topic("clicks", TopicConfig::default().with_partitions(2))?;
//! let mut producer = chronik.producer("clicks");
//! let sent = producer.send(Record::new(Some(b"user-7"), b"/home"))?;
//! assert_eq!(sent.offset.get(), 0);
//!
//! let mut consumer = chronik.consumer("clicks", 0);
//! let fetch = consumer.poll(1 << 20)?;
//! let values: Vec<&[u8]> = fetch.records().map(|r| r.value()).collect();
//! assert_eq!(values, [b"/home"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Library code never unwraps: a failure is a typed error or a named invariant (`expect`).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub use chronik_engine::Appended;
pub use chronik_engine::io::{Backend, Io, PreadIo, SystemIo};
pub use chronik_engine::runtime::SystemClock;
pub use chronik_engine::{
    AppendError, Cleanup, Clock, CommitError, CompactionReport, Corruption, CorruptionKind,
    DamagedTopic, Durability, Error, Fetch, GroupCommit, Header, Headers, Offset, OpenError,
    Options, PartitionDescription, PartitionRecovery, ReadError, Record, RecordView,
    RecoveryReport, StateDir, TopicConfig, TopicDescription, TopicError, TransactionWrite,
    partition_for_key,
};

/// An append in flight from [`Producer::send_async_to`].
pub type PendingAppend = chronik_engine::PendingAppend<SystemIo>;

pub use chronik_engine::limits;
pub use chronik_engine::metrics::{HistogramSnapshot, MetricsSnapshot};

mod connect;
mod cursor;
pub mod dsl;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod processor;
mod producer;
pub mod store;
pub mod testing;

pub use connect::{Connection, ConnectionError, KAFKA_SCHEME, LogConsumer, connect, connect_with};
pub use cursor::next_fetch;
pub use producer::{PendingSend, Producer, Sent, SentBatch};

use chronik_engine::runtime::Runtime;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The engine type behind [`Chronik`]: io_uring on Linux where available, pread/pwrite
/// otherwise (see [`Options::io_backend`]).
pub type DefaultEngine = chronik_engine::Engine<SystemIo>;

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
    /// `options.write_shards` of 0 means one write shard per core.
    pub fn open(path: impl AsRef<Path>, mut options: Options) -> Result<Chronik, Error> {
        if options.write_shards == 0 {
            options.write_shards = std::thread::available_parallelism().map_or(1, usize::from);
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

/// Reads one partition in order, remembering its position; in a consumer group, commits it.
///
/// A position that retention removed (below the log start) moves to the log start, as Kafka's
/// `auto.offset.reset = earliest`. Iterating a consumer yields owned records until it is caught
/// up; [`Consumer::poll`] hands out borrowed views of whole batches instead.
///
/// Caught up means the position reached the high watermark: fetches of batches that
/// compaction emptied, and the gaps compaction, retention and `delete_records` leave, are read
/// past, never taken for the end (see [`next_fetch`]).
#[derive(Debug)]
pub struct Consumer<I: Io = SystemIo> {
    engine: chronik_engine::Engine<I>,
    topic: String,
    partition: u32,
    position: Offset,
    group: Option<String>,
    /// Records fetched for the iterator and not yet handed out; the position counts only
    /// records handed out, so a commit never skips a buffered one.
    buffered: VecDeque<OwnedRecord>,
    /// Where the position goes once `buffered` is empty: the end of its fetch.
    buffered_end: Offset,
}

/// A record copied out of a fetch, for the iterator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedRecord {
    pub offset: Offset,
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl OwnedRecord {
    /// The headers, borrowed, for [`OwnedRecord::as_record`].
    pub fn header_views(&self) -> Vec<Header<'_>> {
        self.headers.iter().map(|(key, value)| Header { key, value }).collect()
    }

    /// The record, borrowed, to write again (timestamp kept); `headers` are its
    /// [`OwnedRecord::header_views`].
    pub fn as_record<'a>(&'a self, headers: &'a [Header<'a>]) -> Record<'a> {
        Record::new(self.key.as_deref(), &self.value)
            .with_timestamp(self.timestamp)
            .with_headers(headers)
    }
}

/// Bytes one iterator step fetches.
const ITERATOR_FETCH_BYTES: usize = 1 << 20;

impl<I: Io> Clone for Consumer<I> {
    fn clone(&self) -> Self {
        Consumer {
            engine: self.engine.clone(),
            topic: self.topic.clone(),
            partition: self.partition,
            position: self.position,
            group: self.group.clone(),
            buffered: self.buffered.clone(),
            buffered_end: self.buffered_end,
        }
    }
}

impl<I: Io> Consumer<I> {
    /// A consumer of one partition of `engine`, from offset zero (or the log start), in no
    /// group. [`Chronik::consumer`] is the usual way to get one.
    pub fn new(engine: chronik_engine::Engine<I>, topic: &str, partition: u32) -> Self {
        Consumer {
            engine,
            topic: topic.to_owned(),
            partition,
            position: Offset::ZERO,
            group: None,
            buffered: VecDeque::new(),
            buffered_end: Offset::ZERO,
        }
    }

    /// A consumer in consumer group `group`, from where the group committed last (or the
    /// log start). [`Chronik::group_consumer`] is the usual way to get one.
    pub fn in_group(
        engine: chronik_engine::Engine<I>,
        group: &str,
        topic: &str,
        partition: u32,
    ) -> Self {
        let position = engine.committed_offset(group, topic, partition).unwrap_or(Offset::ZERO);
        Consumer {
            position,
            group: Some(group.to_owned()),
            ..Consumer::new(engine, topic, partition)
        }
    }

    /// The topic and partition this consumer reads.
    pub fn partition(&self) -> (&str, u32) {
        (&self.topic, self.partition)
    }

    /// The offset of the next record this consumer reads.
    pub fn position(&self) -> Offset {
        self.position
    }

    pub fn seek(&mut self, offset: Offset) {
        self.position = offset;
        self.buffered.clear();
    }

    /// The consumer group, if any.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Commit the position (the next offset to read) for the group, durably.
    pub fn commit(&self) -> Result<(), CommitError> {
        let Some(group) = &self.group else {
            return Err(CommitError::InvalidGroup {
                name: String::new(),
                reason: "this consumer is in no group (see Chronik::group_consumer)",
            });
        };
        self.engine.commit_offsets(group, &[(&self.topic, self.partition, self.position)])
    }

    /// What the group committed last for this partition.
    pub fn committed(&self) -> Option<Offset> {
        let group = self.group.as_deref()?;
        self.engine.committed_offset(group, &self.topic, self.partition)
    }

    /// Records from the current position on, about `max_bytes` of them, in whole batches;
    /// empty ([`Fetch::is_empty`]) only when caught up. Records before the position in the
    /// first batch are skipped by [`Fetch::records`]. Batches without a record at or past the
    /// position (emptied by compaction) are read past, not returned.
    pub fn poll(&mut self, max_bytes: usize) -> Result<Fetch, ReadError> {
        self.buffered.clear();
        let fetch =
            next_fetch(&self.engine, &self.topic, self.partition, self.position, max_bytes)?;
        // Past the records read (or at the log start, when retention removed the position).
        self.position = fetch.next_offset();
        Ok(fetch)
    }

    /// As [`Consumer::poll`], but when caught up waits up to `timeout` for new records.
    pub fn poll_wait(&mut self, max_bytes: usize, timeout: Duration) -> Result<Fetch, ReadError> {
        let fetch = self.poll(max_bytes)?;
        if !fetch.is_empty() {
            return Ok(fetch);
        }
        if self.engine.wait_for(&self.topic, self.partition, self.position, timeout)? {
            return self.poll(max_bytes);
        }
        Ok(fetch)
    }

    /// Whether the position has reached the high watermark (nothing more to read for now).
    /// A position past it (a seek past the end; a group's commit that a crash in `os` mode
    /// outlived) is [`ReadError::OffsetOutOfRange`], as a read from there is.
    pub fn caught_up(&self) -> Result<bool, ReadError> {
        let end = self.engine.high_watermark(&self.topic, self.partition)?;
        if self.position > end {
            // The read's own error, with the log start and the end in it.
            return self.engine.read(&self.topic, self.partition, self.position, 1).map(|_| false);
        }
        Ok(self.buffered.is_empty() && self.position == end)
    }
}

impl<I: Io> Iterator for Consumer<I> {
    type Item = Result<OwnedRecord, ReadError>;

    /// The next record, or `None` once caught up: the position reached the high watermark
    /// (iterate again later for more).
    fn next(&mut self) -> Option<Self::Item> {
        if self.buffered.is_empty() {
            let fetch = match self.poll(ITERATOR_FETCH_BYTES) {
                Ok(fetch) => fetch,
                Err(error) => return Some(Err(error)),
            };
            let from = fetch.from();
            self.buffered = fetch
                .records()
                .map(|r| OwnedRecord {
                    offset: r.offset(),
                    timestamp: r.timestamp(),
                    key: r.key().map(<[u8]>::to_vec),
                    value: r.value().to_vec(),
                    headers: r.headers().map(|h| (h.key.to_vec(), h.value.to_vec())).collect(),
                })
                .collect();
            self.buffered_end = self.position;
            if self.buffered.is_empty() {
                return None;
            }
            self.position = from;
        }
        let record = self.buffered.pop_front()?;
        self.position =
            if self.buffered.is_empty() { self.buffered_end } else { record.offset.plus(1) };
        Some(Ok(record))
    }
}

/// The README's Rust examples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// docs/operators.md's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/operators.md")]
pub struct OperatorDoctests;
