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

/// The engine type behind [`Chronik`]: io_uring on Linux where available, pread/pwrite
/// otherwise (see [`Options::io_backend`]).
pub type DefaultEngine = chronik_engine::Engine<SystemIo>;

pub use chronik_engine::metrics::{HistogramSnapshot, MetricsSnapshot};

mod chronik;
mod connect;
mod consumer;
mod cursor;
pub mod dsl;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod processor;
mod producer;
pub mod store;
pub mod testing;

pub use chronik::Chronik;
#[cfg(feature = "kafka")]
pub use connect::connect_kafka;
pub use connect::{
    Connection, ConnectionError, KAFKA_SCHEME, Log, LogConsumer, connect, connect_with,
};
pub use consumer::{Consumer, OwnedRecord};
pub use cursor::next_fetch;
pub use producer::{PendingSend, Producer, Sent, SentBatch};

/// The README's Rust examples, compiled as doc tests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// docs/operators.md's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/operators.md")]
pub struct OperatorDoctests;
