//! One API over both logs, the [`Log`] trait: an embedded data directory, or (feature `kafka`)
//! a Kafka-protocol cluster. Code written against it runs unchanged on either; for a
//! [`Connection`], the target string decides:
//!
//! - `kafka://host:port[,host:port...]`: a Kafka-protocol cluster;
//! - anything else (optionally `file://`): a Chronik data directory, opened embedded.
//!
//! ```
//! use chronik::processor::{Guarantee, ProcessorConfig, Until};
//! use chronik::{Log, Record};
//!
//! let directory = tempfile::tempdir()?;
//! let log = chronik::connect(directory.path().to_str().unwrap())?;
//! log.ensure_topic("lines", 2)?;
//! log.send("lines", 0, &[Record::new(Some(b"k"), b"hello world")])?;
//! assert_eq!(log.records("lines", 0)?.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::dsl::Topology;
use crate::processor::{Guarantee, Processor, ProcessorConfig, ProcessorError, RunStats, Until};
use crate::{AppendError, Chronik, Error, Options, OwnedRecord, ReadError, Record, TopicError};
use crate::{CommitError, Offset, TopicConfig, TransactionWrite};

#[cfg(feature = "kafka")]
use crate::kafka::{ClusterError, KafkaClient, KafkaConfig};

/// The scheme of a Kafka-protocol target.
pub const KAFKA_SCHEME: &str = "kafka://";

/// An embedded data directory or a Kafka-protocol cluster, behind one API.
#[derive(Debug)]
#[non_exhaustive]
pub enum Connection {
    Embedded(Chronik),
    #[cfg(feature = "kafka")]
    Kafka(KafkaClient),
}

/// Errors of [`Connection`]'s calls, whichever log is behind it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    #[error(transparent)]
    Open(#[from] Error),
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(
        "{target:?} is a Kafka-protocol cluster, and this build has no Kafka support (build \
         chronik with the cargo feature `kafka`)"
    )]
    KafkaNotBuilt { target: String },
}

/// Connect to `target` with default [`Options`] for an embedded directory.
pub fn connect(target: &str) -> Result<Connection, ConnectionError> {
    connect_with(target, Options::default())
}

/// Connect to a Kafka-protocol cluster as `config` says: TLS, SASL and any other client
/// property (see [`KafkaConfig`]). `chronik::connect("kafka://...")` is this with no
/// properties: plaintext.
///
/// ```no_run
/// use chronik::kafka::KafkaConfig;
///
/// let config = KafkaConfig::new("broker.example.com:9093")
///     .set("security.protocol", "SSL")
///     .set("ssl.ca.location", "/etc/kafka/ca.pem");
/// let log = chronik::connect_kafka(config)?;
/// # Ok::<(), chronik::ConnectionError>(())
/// ```
#[cfg(feature = "kafka")]
pub fn connect_kafka(config: KafkaConfig) -> Result<Connection, ConnectionError> {
    Ok(Connection::Kafka(KafkaClient::connect_with(config)?))
}

/// Connect to `target`; `options` apply when it is an embedded directory.
pub fn connect_with(target: &str, options: Options) -> Result<Connection, ConnectionError> {
    if let Some(bootstrap) = target.strip_prefix(KAFKA_SCHEME) {
        #[cfg(feature = "kafka")]
        return Ok(Connection::Kafka(KafkaClient::connect(bootstrap)?));
        #[cfg(not(feature = "kafka"))]
        {
            let _ = bootstrap;
            return Err(ConnectionError::KafkaNotBuilt { target: target.to_owned() });
        }
    }
    let path = target.strip_prefix("file://").unwrap_or(target);
    Ok(Connection::Embedded(Chronik::open(path, options)?))
}

/// A log an application writes and reads: an embedded data directory ([`Chronik`]) or, with
/// the cargo feature `kafka`, a Kafka-protocol cluster ([`KafkaClient`]); a [`Connection`] is
/// either, chosen by a target string. Code written against this trait runs unchanged on both.
/// Its consumers are [`LogConsumer`]s, whichever log is behind them.
pub trait Log {
    /// Whether this is a Kafka-protocol cluster.
    fn is_kafka(&self) -> bool;

    /// The partition count of `topic`, or `None` if it does not exist.
    fn partition_count(&self, topic: &str) -> Result<Option<u32>, ConnectionError>;

    /// Create `topic` with `partitions` partitions unless it exists; returns whether it
    /// created it. An existing topic with another partition count is an error.
    fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<bool, ConnectionError>;

    /// Append `records` to `partition` of `topic`, acknowledged when this returns.
    fn send(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record<'_>],
    ) -> Result<(), ConnectionError> {
        self.send_all(&[TransactionWrite { topic, partition, records }])
    }

    /// Append several partitions' records. Embedded: one transaction, all or nothing. On a
    /// cluster: plain sends, each partition's in order, all acknowledged when this returns
    /// (a failure midway may leave some written).
    fn send_all(&self, writes: &[TransactionWrite<'_>]) -> Result<(), ConnectionError>;

    /// The offset the next record of `topic`/`partition` will get. With plain sends only it
    /// is also the number of records ever written there (on a cluster, a transaction's commit
    /// marker takes an offset too).
    fn end_offset(&self, topic: &str, partition: u32) -> Result<Offset, ConnectionError>;

    /// How many records `topic`/`partition` holds: embedded, its end offset (every offset
    /// below it was a record); on a cluster, the committed records counted by reading them.
    fn record_count(&self, topic: &str, partition: u32) -> Result<u64, ConnectionError>;

    /// Every committed record of `topic`/`partition`, in offset order.
    fn records(&self, topic: &str, partition: u32) -> Result<Vec<OwnedRecord>, ConnectionError>;

    /// A consumer of one partition: in `group`, from where the group committed last (or the
    /// start), with [`LogConsumer::commit`]; outside a group, from the start.
    fn consumer(
        &self,
        topic: &str,
        partition: u32,
        group: Option<&str>,
    ) -> Result<LogConsumer, ConnectionError>;

    /// Run a processor application until `until`. Embedded: every partition's task in this
    /// process, exactly once. On a cluster: the partitions this process gets in the consumer
    /// group `config.application`, with `guarantee`; start the same program several times
    /// to share the partitions.
    fn run<P: Processor>(
        &self,
        config: ProcessorConfig,
        guarantee: Guarantee,
        factory: impl FnMut(u32) -> P,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError>;

    /// Run a topology ([`crate::dsl`]) until `until`: its internal topics created, each stage
    /// run as a processor application in the consumer group named after the topology's
    /// application. Embedded: every stage in this process, exactly once. On a cluster: the
    /// partitions this process gets, with `guarantee`; at least once, a stage drops the
    /// records an upstream stage wrote again, so state stays exact and outputs may repeat
    /// (but after a join of two streams: see docs/kafka.md). Start the same program several
    /// times to share the partitions.
    fn run_topology(
        &self,
        topology: &Topology,
        guarantee: Guarantee,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError>;
}

impl Log for Chronik {
    fn is_kafka(&self) -> bool {
        false
    }

    fn partition_count(&self, topic: &str) -> Result<Option<u32>, ConnectionError> {
        Ok(Chronik::partition_count(self, topic))
    }

    fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<bool, ConnectionError> {
        match Chronik::partition_count(self, topic) {
            Some(count) if count == partitions => Ok(false),
            Some(_) => Err(TopicError::AlreadyExists { name: topic.to_owned() }.into()),
            None => {
                self.create_topic(topic, TopicConfig::default().with_partitions(partitions))?;
                Ok(true)
            }
        }
    }

    fn send_all(&self, writes: &[TransactionWrite<'_>]) -> Result<(), ConnectionError> {
        let appended = self.commit_transaction(writes, None)?;
        assert!(appended.len() <= writes.len(), "one batch per write at most");
        Ok(())
    }

    fn end_offset(&self, topic: &str, partition: u32) -> Result<Offset, ConnectionError> {
        Ok(self.high_watermark(topic, partition)?)
    }

    fn record_count(&self, topic: &str, partition: u32) -> Result<u64, ConnectionError> {
        Ok(self.high_watermark(topic, partition)?.get())
    }

    fn records(&self, topic: &str, partition: u32) -> Result<Vec<OwnedRecord>, ConnectionError> {
        Ok(Chronik::consumer(self, topic, partition).collect::<Result<Vec<_>, _>>()?)
    }

    fn consumer(
        &self,
        topic: &str,
        partition: u32,
        group: Option<&str>,
    ) -> Result<LogConsumer, ConnectionError> {
        Ok(LogConsumer::Embedded(match group {
            Some(group) => self.group_consumer(group, topic, partition),
            None => Chronik::consumer(self, topic, partition),
        }))
    }

    fn run<P: Processor>(
        &self,
        config: ProcessorConfig,
        _guarantee: Guarantee, // Exactly once, always.
        factory: impl FnMut(u32) -> P,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError> {
        let mut runner = crate::processor::Runner::new(self.engine(), config, factory)?;
        match until {
            Until::CaughtUp => runner.run_until_caught_up(),
            Until::Stopped(stop) => runner.run_until(stop),
        }
    }

    fn run_topology(
        &self,
        topology: &Topology,
        _guarantee: Guarantee, // Exactly once, always.
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError> {
        let mut runner = topology.runner(self.engine())?;
        match until {
            Until::CaughtUp => runner.run_until_caught_up(),
            Until::Stopped(stop) => runner.run_until(stop),
        }
    }
}

#[cfg(feature = "kafka")]
impl Log for KafkaClient {
    fn is_kafka(&self) -> bool {
        true
    }

    fn partition_count(&self, topic: &str) -> Result<Option<u32>, ConnectionError> {
        Ok(KafkaClient::partition_count(self, topic)?)
    }

    fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<bool, ConnectionError> {
        match KafkaClient::partition_count(self, topic)? {
            Some(count) if count == partitions => return Ok(false),
            Some(_) => return Err(TopicError::AlreadyExists { name: topic.to_owned() }.into()),
            None => {}
        }
        match self.create_topic(topic, partitions, false) {
            Ok(()) => Ok(true),
            // Created meanwhile by another process: as if it had existed.
            Err(ClusterError::TopicExists { .. }) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    fn send_all(&self, writes: &[TransactionWrite<'_>]) -> Result<(), ConnectionError> {
        Ok(KafkaClient::send_all(self, writes)?)
    }

    fn end_offset(&self, topic: &str, partition: u32) -> Result<Offset, ConnectionError> {
        Ok(KafkaClient::end_offset(self, topic, partition)?)
    }

    fn record_count(&self, topic: &str, partition: u32) -> Result<u64, ConnectionError> {
        Ok(KafkaClient::records(self, topic, partition)?.len() as u64)
    }

    fn records(&self, topic: &str, partition: u32) -> Result<Vec<OwnedRecord>, ConnectionError> {
        Ok(KafkaClient::records(self, topic, partition)?)
    }

    fn consumer(
        &self,
        topic: &str,
        partition: u32,
        group: Option<&str>,
    ) -> Result<LogConsumer, ConnectionError> {
        Ok(LogConsumer::Kafka(KafkaClient::consumer(self, topic, partition, group)?))
    }

    fn run<P: Processor>(
        &self,
        config: ProcessorConfig,
        guarantee: Guarantee,
        mut factory: impl FnMut(u32) -> P,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError> {
        crate::kafka::group::run(self, &config, guarantee, &mut factory, until)
    }

    fn run_topology(
        &self,
        topology: &Topology,
        guarantee: Guarantee,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError> {
        crate::kafka::topology::run(self, topology, guarantee, until)
    }
}

/// Each call goes to the log behind the connection.
macro_rules! on_either {
    ($connection:expr, $log:ident => $call:expr) => {
        match $connection {
            Connection::Embedded($log) => $call,
            #[cfg(feature = "kafka")]
            Connection::Kafka($log) => $call,
        }
    };
}

impl Log for Connection {
    fn is_kafka(&self) -> bool {
        on_either!(self, log => log.is_kafka())
    }

    fn partition_count(&self, topic: &str) -> Result<Option<u32>, ConnectionError> {
        on_either!(self, log => Log::partition_count(log, topic))
    }

    fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<bool, ConnectionError> {
        on_either!(self, log => log.ensure_topic(topic, partitions))
    }

    fn send_all(&self, writes: &[TransactionWrite<'_>]) -> Result<(), ConnectionError> {
        on_either!(self, log => Log::send_all(log, writes))
    }

    fn end_offset(&self, topic: &str, partition: u32) -> Result<Offset, ConnectionError> {
        on_either!(self, log => Log::end_offset(log, topic, partition))
    }

    fn record_count(&self, topic: &str, partition: u32) -> Result<u64, ConnectionError> {
        on_either!(self, log => log.record_count(topic, partition))
    }

    fn records(&self, topic: &str, partition: u32) -> Result<Vec<OwnedRecord>, ConnectionError> {
        on_either!(self, log => Log::records(log, topic, partition))
    }

    fn consumer(
        &self,
        topic: &str,
        partition: u32,
        group: Option<&str>,
    ) -> Result<LogConsumer, ConnectionError> {
        on_either!(self, log => Log::consumer(log, topic, partition, group))
    }

    fn run<P: Processor>(
        &self,
        config: ProcessorConfig,
        guarantee: Guarantee,
        factory: impl FnMut(u32) -> P,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError> {
        on_either!(self, log => Log::run(log, config, guarantee, factory, until))
    }

    fn run_topology(
        &self,
        topology: &Topology,
        guarantee: Guarantee,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError> {
        on_either!(self, log => log.run_topology(topology, guarantee, until))
    }
}

/// A consumer of one partition of a [`Connection`]: iterate for the records from its position
/// on (the iteration stops once caught up; iterate again later for more).
#[derive(Debug)]
#[non_exhaustive]
pub enum LogConsumer {
    Embedded(crate::Consumer),
    #[cfg(feature = "kafka")]
    Kafka(crate::kafka::ClusterConsumer),
}

impl LogConsumer {
    /// The offset of the next record this consumer reads.
    pub fn position(&self) -> Offset {
        match self {
            LogConsumer::Embedded(consumer) => consumer.position(),
            #[cfg(feature = "kafka")]
            LogConsumer::Kafka(consumer) => consumer.position(),
        }
    }

    /// Commit the position for the consumer's group (an error outside a group).
    pub fn commit(&self) -> Result<(), ConnectionError> {
        match self {
            LogConsumer::Embedded(consumer) => Ok(consumer.commit()?),
            #[cfg(feature = "kafka")]
            LogConsumer::Kafka(consumer) => Ok(consumer.commit()?),
        }
    }
}

impl Iterator for LogConsumer {
    type Item = Result<OwnedRecord, ConnectionError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            LogConsumer::Embedded(consumer) => consumer.next().map(|r| r.map_err(Into::into)),
            #[cfg(feature = "kafka")]
            LogConsumer::Kafka(consumer) => consumer.next().map(|r| r.map_err(Into::into)),
        }
    }
}
