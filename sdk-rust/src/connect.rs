//! One API over both logs: an embedded data directory, or (feature `kafka`) a Kafka-protocol
//! cluster. Code written against [`Connection`] runs unchanged on either; the target string
//! decides:
//!
//! - `kafka://host:port[,host:port...]`: a Kafka-protocol cluster;
//! - anything else (optionally `file://`): a Chronik data directory, opened embedded.
//!
//! ```
//! use chronik::processor::{Guarantee, ProcessorConfig, Until};
//! use chronik::{Connection, Record};
//!
//! let directory = tempfile::tempdir()?;
//! let log = chronik::connect(directory.path().to_str().unwrap())?;
//! log.ensure_topic("lines", 2)?;
//! log.send("lines", 0, &[Record::new(Some(b"k"), b"hello world")])?;
//! assert_eq!(log.records("lines", 0)?.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::processor::{Guarantee, Processor, ProcessorConfig, ProcessorError, RunStats, Until};
use crate::{AppendError, Chronik, Error, Options, OwnedRecord, ReadError, Record, TopicError};
use crate::{CommitError, TopicConfig, TransactionWrite};

#[cfg(feature = "kafka")]
use crate::kafka::{ClusterError, KafkaClient};

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

impl Connection {
    /// Whether this is a Kafka-protocol cluster.
    pub fn is_kafka(&self) -> bool {
        !matches!(self, Connection::Embedded(_))
    }

    /// The partition count of `topic`, or `None` if it does not exist.
    pub fn partition_count(&self, topic: &str) -> Result<Option<u32>, ConnectionError> {
        match self {
            Connection::Embedded(chronik) => Ok(chronik.partition_count(topic)),
            #[cfg(feature = "kafka")]
            Connection::Kafka(client) => Ok(client.partition_count(topic)?),
        }
    }

    /// Create `topic` with `partitions` partitions unless it exists; returns whether it
    /// created it. An existing topic with another partition count is an error.
    pub fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<bool, ConnectionError> {
        match self.partition_count(topic)? {
            Some(count) if count == partitions => return Ok(false),
            Some(_) => {
                return Err(TopicError::AlreadyExists { name: topic.to_owned() }.into());
            }
            None => {}
        }
        match self {
            Connection::Embedded(chronik) => {
                chronik.create_topic(topic, TopicConfig::default().with_partitions(partitions))?;
            }
            #[cfg(feature = "kafka")]
            Connection::Kafka(client) => match client.create_topic(topic, partitions, false) {
                Ok(()) | Err(ClusterError::TopicExists { .. }) => {}
                Err(error) => return Err(error.into()),
            },
        }
        Ok(true)
    }

    /// Append `records` to `partition` of `topic`, acknowledged when this returns.
    pub fn send(
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
    pub fn send_all(&self, writes: &[TransactionWrite<'_>]) -> Result<(), ConnectionError> {
        match self {
            Connection::Embedded(chronik) => {
                chronik.commit_transaction(writes, None)?;
            }
            #[cfg(feature = "kafka")]
            Connection::Kafka(client) => client.send_all(writes)?,
        }
        Ok(())
    }

    /// The offset the next record of `topic`/`partition` will get. With plain sends only it
    /// is also the number of records ever written there (on a cluster, a transaction's commit
    /// marker takes an offset too).
    pub fn end_offset(&self, topic: &str, partition: u32) -> Result<u64, ConnectionError> {
        match self {
            Connection::Embedded(chronik) => Ok(chronik.high_watermark(topic, partition)?.get()),
            #[cfg(feature = "kafka")]
            Connection::Kafka(client) => Ok(client.end_offset(topic, partition)?),
        }
    }

    /// How many records `topic`/`partition` holds: embedded, its end offset (every offset
    /// below it was a record); on a cluster, the committed records counted by reading them.
    pub fn record_count(&self, topic: &str, partition: u32) -> Result<u64, ConnectionError> {
        match self {
            Connection::Embedded(chronik) => Ok(chronik.high_watermark(topic, partition)?.get()),
            #[cfg(feature = "kafka")]
            Connection::Kafka(client) => Ok(client.records(topic, partition)?.len() as u64),
        }
    }

    /// Every committed record of `topic`/`partition`, in offset order.
    pub fn records(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Vec<OwnedRecord>, ConnectionError> {
        match self {
            Connection::Embedded(chronik) => {
                Ok(chronik.consumer(topic, partition).collect::<Result<Vec<_>, _>>()?)
            }
            #[cfg(feature = "kafka")]
            Connection::Kafka(client) => Ok(client.records(topic, partition)?),
        }
    }

    /// A consumer of one partition: in `group`, from where the group committed last (or the
    /// start), with [`LogConsumer::commit`]; outside a group, from the start.
    pub fn consumer(
        &self,
        topic: &str,
        partition: u32,
        group: Option<&str>,
    ) -> Result<LogConsumer, ConnectionError> {
        match self {
            Connection::Embedded(chronik) => Ok(LogConsumer::Embedded(match group {
                Some(group) => chronik.group_consumer(group, topic, partition),
                None => chronik.consumer(topic, partition),
            })),
            #[cfg(feature = "kafka")]
            Connection::Kafka(client) => {
                Ok(LogConsumer::Kafka(client.consumer(topic, partition, group)?))
            }
        }
    }

    /// Run a processor application until `until`. Embedded: every partition's task in this
    /// process, exactly once. On a cluster: the partitions this process gets in the consumer
    /// group `config.application`, with `guarantee`; start the same program several times
    /// to share the partitions.
    pub fn run<P: Processor>(
        &self,
        config: ProcessorConfig,
        guarantee: Guarantee,
        #[allow(unused_mut)] mut factory: impl FnMut(u32) -> P,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError> {
        match self {
            Connection::Embedded(chronik) => {
                let _ = guarantee; // Exactly once, always.
                let mut runner = crate::processor::Runner::new(chronik.engine(), config, factory)?;
                match until {
                    Until::CaughtUp => runner.run_until_caught_up(),
                    Until::Stopped(stop) => runner.run_until(stop),
                }
            }
            #[cfg(feature = "kafka")]
            Connection::Kafka(client) => {
                crate::kafka::group::run(client, &config, guarantee, &mut factory, until)
            }
        }
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
    pub fn position(&self) -> u64 {
        match self {
            LogConsumer::Embedded(consumer) => consumer.position().get(),
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
