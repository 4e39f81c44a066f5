//! A Kafka-protocol cluster as the log (feature `kafka`): Apache Kafka, Redpanda, tansu and
//! others, through librdkafka (the `rdkafka` crate linked against the system library).
//!
//! What maps to what:
//! - a Chronik topic is a Kafka topic; a changelog is a compacted one (`cleanup.policy=compact`);
//! - a record keeps its key, value, headers and timestamp (create time); an empty value is
//!   sent as a null one (Chronik has no null values, so a null reads back empty);
//! - Kafka offsets are the records' offsets. They may have gaps: a transaction's commit
//!   marker takes an offset that no reader sees;
//! - everything read here is read `read_committed`: records of an aborted or still-open
//!   transaction are never seen.
//!
//! This file is the client (topics, producing, reading); `group` runs processors on the
//! cluster, through the processor module's tasks. Invariant: the client names nothing of the
//! processors, so the processor module never depends on Kafka, only the group runner on both.

// Kafka numbers partitions with i32, Chronik with u32; partition counts stay far below
// i32::MAX on both sides, so the casts between them are exact.
#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

mod config;
mod consumer;
pub(crate) mod group;
mod restore;
#[cfg(test)]
mod restore_tests;
pub(crate) mod topology;

pub use config::KafkaConfig;
pub use consumer::ClusterConsumer;

use crate::{Offset, OwnedRecord, Record};
use rdkafka::ClientContext;
use rdkafka::Message;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, DeliveryResult, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long one request to the cluster may take before it is an error.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a consumer's error event is one librdkafka recovers from by itself (a connection
/// lost, a coordinator moving): polling goes on, for [`REQUEST_TIMEOUT`] at most. One
/// machine's broker restarting, or closing an idle connection, gives `AllBrokersDown`.
pub(crate) fn transient(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as E;
    matches!(
        error,
        KafkaError::MessageConsumption(
            E::AllBrokersDown
                | E::BrokerTransportFailure
                | E::Resolve
                | E::OperationTimedOut
                | E::TimedOutQueue
                | E::RequestTimedOut
                | E::NetworkException
                | E::LeaderNotAvailable
                | E::NotLeaderForPartition
                | E::CoordinatorLoadInProgress
                | E::CoordinatorNotAvailable
                | E::NotCoordinator
                | E::WaitingForCoordinator
        )
    )
}

/// An error of the Kafka backend: what the cluster or the client said, with what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error("kafka: {operation}: {message}")]
    Kafka { operation: &'static str, message: String },
    #[error("topic {topic:?} does not exist on the cluster")]
    TopicNotFound { topic: String },
    #[error("topic {topic:?} already exists on the cluster")]
    TopicExists { topic: String },
    #[error("invalid Kafka address {address:?}: {reason}")]
    Address { address: String, reason: &'static str },
    /// A client property refused, by name (its value is never shown: it may be a secret).
    #[error("kafka property {key:?}: {reason}")]
    Config { key: String, reason: String },
}

/// A cluster error as a processor's (used as `map_err(cluster)`).
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn cluster(error: ClusterError) -> crate::processor::ProcessorError {
    crate::processor::ProcessorError::Kafka(error.to_string())
}

impl ClusterError {
    pub(crate) fn kafka(operation: &'static str, error: impl std::fmt::Display) -> ClusterError {
        ClusterError::Kafka { operation, message: error.to_string() }
    }
}

/// What a producer's delivery reports said: the first failure (kept until asked for), where
/// each partition's acknowledged records end, and the offsets the records of tracked sends got.
#[derive(Debug, Default)]
pub(crate) struct Deliveries {
    failed: Mutex<Option<String>>,
    /// Per topic and partition, the offset after the last record acknowledged.
    acknowledged: Mutex<HashMap<(String, u32), u64>>,
    /// The last tag handed out by [`Deliveries::tags`]; tag 0 is "not tracked".
    tag_last: AtomicUsize,
    /// Per tag, the first and last offsets of its acknowledged records and how many there were.
    tagged: Mutex<HashMap<usize, (u64, u64, usize)>>,
    /// librdkafka's last error logged (a failed TLS handshake or SASL login, a refused
    /// connection), else its first error event: the reason a failed request does not give.
    reported: Mutex<Option<String>>,
}

impl Deliveries {
    /// The failure seen since the last call, if any.
    pub(crate) fn take_failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|mut failed| failed.take())
    }

    /// `count` fresh tags, for the messages of one send (one tag per partition written).
    fn tags(&self, count: usize) -> std::ops::Range<usize> {
        let first = self.tag_last.fetch_add(count, Ordering::Relaxed) + 1;
        first..first + count
    }

    /// The offset after the last record acknowledged in `topic`/`partition`, if any.
    pub(crate) fn acknowledged_at(&self, topic: &str, partition: u32) -> Option<u64> {
        let acknowledged = self.acknowledged.lock().ok()?;
        acknowledged.get(&(topic.to_owned(), partition)).copied()
    }

    /// What was acknowledged for `tag`, forgotten here: first and last offsets, and how many.
    fn take_tagged(&self, tag: usize) -> Option<(u64, u64, usize)> {
        self.tagged.lock().ok().and_then(|mut tagged| tagged.remove(&tag))
    }
}

impl ClientContext for Deliveries {
    /// librdkafka logs a failed TLS handshake or SASL login at level error, and reports no
    /// error event for it: kept, and passed on to `tracing` (target `librdkafka`).
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel::{Alert, Critical, Emerg, Error, Warning};
        if matches!(level, Emerg | Alert | Critical | Error) {
            tracing::error!(target: "librdkafka", facility, "{message}");
            if let Ok(mut reported) = self.reported.lock() {
                *reported = Some(message.to_owned());
            }
        } else if matches!(level, Warning) {
            tracing::warn!(target: "librdkafka", facility, "{message}");
        } else {
            tracing::debug!(target: "librdkafka", facility, "{message}");
        }
    }

    /// An error event ("all brokers are down") says less than a logged reason: kept only
    /// when nothing was logged.
    fn error(&self, error: KafkaError, reason: &str) {
        if let Ok(mut reported) = self.reported.lock() {
            reported.get_or_insert_with(|| format!("{error}: {reason}"));
        }
    }
}

impl ProducerContext for Deliveries {
    /// A send's tag ([`Deliveries::tags`]), or 0 for a message nobody asks about.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, tag: usize) {
        match result {
            Ok(message) => {
                let Ok(offset) = u64::try_from(message.offset()) else { return };
                if let Ok(mut acknowledged) = self.acknowledged.lock() {
                    let key = (message.topic().to_owned(), message.partition() as u32);
                    let next = acknowledged.entry(key).or_default();
                    *next = (*next).max(offset + 1);
                }
                if tag != 0
                    && let Ok(mut tagged) = self.tagged.lock()
                {
                    let range = tagged.entry(tag).or_insert((offset, offset, 0));
                    *range = (range.0.min(offset), range.1.max(offset), range.2 + 1);
                }
            }
            Err((error, message)) => {
                if let Ok(mut failed) = self.failed.lock() {
                    failed.get_or_insert_with(|| {
                        format!("{}/{}: {error}", message.topic(), message.partition())
                    });
                }
            }
        }
    }
}

/// The records of one partition that a send wrote, as the cluster acknowledged them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub partition: u32,
    /// The lowest offset the cluster gave one of them.
    pub first: u64,
    /// The highest: `last - first + 1` records unless a broker left gaps.
    pub last: u64,
}

pub(crate) type KafkaProducer = BaseProducer<Deliveries>;

/// A connection to a Kafka-protocol cluster: topics, and plain (not transactional) sends.
pub struct KafkaClient {
    config: std::sync::Arc<KafkaConfig>,
    admin: AdminClient<DefaultClientContext>,
    producer: KafkaProducer,
}

impl std::fmt::Debug for KafkaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaClient").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Ask the cluster for its metadata until it answers, [`REQUEST_TIMEOUT`] at most; refused at
/// once when librdkafka reports a refused certificate or SASL login (retrying cannot mend a
/// certificate or a password), with librdkafka's reason, redacted.
fn reach(producer: &KafkaProducer, config: &KafkaConfig) -> Result<(), ClusterError> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    loop {
        let Err(error) = producer.client().fetch_metadata(None, Duration::from_secs(1)) else {
            return Ok(());
        };
        // The reason (a certificate, a login, a protocol) is in librdkafka's log, which a
        // poll serves.
        producer.poll(Duration::ZERO);
        let reported = producer.context().reported.lock().ok().and_then(|r| r.clone());
        // What no retry mends: a certificate refused, a TLS alert, a login refused.
        let refused = reported.as_deref().is_some_and(|reason| {
            ["certificate", "alert", "SASL", "uthenticat", "security.protocol"]
                .iter()
                .any(|word| reason.contains(word))
        });
        if refused || Instant::now() >= deadline {
            let mut message = match reported {
                Some(reason) => format!("{error}: {reason}"),
                None => error.to_string(),
            };
            if !refused {
                // Silence (a TLS listener closes on a plaintext client without a word).
                let protocol = config.get("security.protocol").unwrap_or("PLAINTEXT");
                message = format!(
                    "{message}; no broker at {} answered over {protocol} in {} s: check the \
                     address, and that security.protocol matches the listener (a TLS \
                     listener needs SSL or SASL_SSL)",
                    config.bootstrap(),
                    REQUEST_TIMEOUT.as_secs()
                );
            }
            let message = config.redact(&message);
            return Err(ClusterError::Kafka { operation: "reach the cluster", message });
        }
    }
}

/// A consumer outside any group, for reading partitions by offset.
pub(crate) fn reader_config(config: &KafkaConfig) -> Result<ClientConfig, ClusterError> {
    let mut config = config.client_config()?;
    config
        .set("group.id", "chronik-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", READER_FETCH_WAIT_MS)
        .set("auto.offset.reset", "earliest");
    Ok(config)
}

impl KafkaClient {
    /// Connect to `bootstrap` (`host:port[,host:port...]`) over plaintext and check that the
    /// cluster answers.
    pub fn connect(bootstrap: &str) -> Result<KafkaClient, ClusterError> {
        KafkaClient::connect_with(KafkaConfig::new(bootstrap))
    }

    /// Connect as `config` says (TLS, SASL, any librdkafka property), with the
    /// `CHRONIK_KAFKA_*` environment variables for properties it does not set
    /// ([`KafkaConfig::fill_from_env`]), and check that the cluster answers. A refused property
    /// is named in the error; no error shows a secret.
    pub fn connect_with(config: KafkaConfig) -> Result<KafkaClient, ClusterError> {
        let config = config.fill_from_env("CHRONIK_KAFKA_", std::env::vars_os());
        let admin = config
            .client_config()?
            .create()
            .map_err(|e| config.client_error("create admin client", &e))?;
        let producer: KafkaProducer = config
            .client_config()?
            .set("acks", "all")
            .set("linger.ms", "5")
            .create_with_context(Deliveries::default())
            .map_err(|e| config.client_error("create producer", &e))?;
        reach(&producer, &config)?;
        Ok(KafkaClient { config: std::sync::Arc::new(config), admin, producer })
    }

    /// The bootstrap address this client was made with.
    pub fn bootstrap(&self) -> &str {
        self.config.bootstrap()
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// The names of the cluster's topics, sorted.
    pub fn topics(&self) -> Result<Vec<String>, ClusterError> {
        let metadata = self
            .producer
            .client()
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map_err(|e| ClusterError::kafka("fetch metadata", e))?;
        let mut names: Vec<String> =
            metadata.topics().iter().map(|t| t.name().to_owned()).collect();
        names.sort();
        Ok(names)
    }

    /// Partitions of `topic`, or `None` if the cluster has no such topic.
    pub fn partition_count(&self, topic: &str) -> Result<Option<u32>, ClusterError> {
        partition_count(self.producer.client(), topic)
    }

    /// Create `topic` with `partitions` partitions (replication 1 on a one-broker cluster, the
    /// cluster's default otherwise); compacted if `compacted`.
    pub fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
        compacted: bool,
    ) -> Result<(), ClusterError> {
        let count = i32::try_from(partitions).unwrap_or(i32::MAX);
        let mut new = NewTopic::new(topic, count, TopicReplication::Fixed(-1));
        if compacted {
            new = new.set("cleanup.policy", "compact");
        }
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = block_on(self.admin.create_topics([&new], &options))
            .map_err(|e| ClusterError::kafka("create topic", e))?;
        for result in results {
            match result {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    return Err(ClusterError::TopicExists { topic: topic.to_owned() });
                }
                Err((_, code)) => return Err(ClusterError::kafka("create topic", code)),
            }
        }
        // Topic creation is asynchronous on some brokers: wait until its metadata shows.
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        while self.partition_count(topic)? != Some(partitions) {
            if Instant::now() > deadline {
                return Err(ClusterError::kafka("create topic", "metadata never showed it"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Delete `topic` from the cluster.
    pub fn delete_topic(&self, topic: &str) -> Result<(), ClusterError> {
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = block_on(self.admin.delete_topics(&[topic], &options))
            .map_err(|e| ClusterError::kafka("delete topic", e))?;
        for result in results {
            match result {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {
                    return Err(ClusterError::TopicNotFound { topic: topic.to_owned() });
                }
                Err((_, code)) => return Err(ClusterError::kafka("delete topic", code)),
            }
        }
        Ok(())
    }

    /// The topic's settings as the cluster reports them (Kafka's names: `cleanup.policy`,
    /// `retention.ms`, ...), sorted by name; settings without a value are left out.
    pub fn topic_config(&self, topic: &str) -> Result<Vec<(String, String)>, ClusterError> {
        let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        let specifier = ResourceSpecifier::Topic(topic);
        let results = block_on(self.admin.describe_configs([&specifier], &options))
            .map_err(|e| ClusterError::kafka("describe configs", e))?;
        let mut config = Vec::new();
        for result in results {
            let resource = match result {
                Ok(resource) => resource,
                Err(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                    return Err(ClusterError::TopicNotFound { topic: topic.to_owned() });
                }
                Err(code) => return Err(ClusterError::kafka("describe configs", code)),
            };
            config.extend(resource.entries.into_iter().filter_map(|e| Some((e.name, e.value?))));
        }
        config.sort();
        Ok(config)
    }

    /// Where `topic`/`partition` starts and ends: its low and high watermarks.
    pub fn watermarks(&self, topic: &str, partition: u32) -> Result<(u64, u64), ClusterError> {
        let (low, high) = self
            .producer
            .client()
            .fetch_watermarks(topic, partition as i32, REQUEST_TIMEOUT)
            .map_err(|e| ClusterError::kafka("fetch watermarks", e))?;
        Ok((u64::try_from(low).unwrap_or(0), u64::try_from(high).unwrap_or(0)))
    }

    /// Delete the records of `topic`/`partition` below `before` (Kafka's DeleteRecords);
    /// returns the partition's start after the call, as the cluster reports it.
    pub fn delete_records(
        &self,
        topic: &str,
        partition: u32,
        before: u64,
    ) -> Result<u64, ClusterError> {
        let mut offsets = TopicPartitionList::new();
        let offset = KafkaOffset::Offset(i64::try_from(before).unwrap_or(i64::MAX));
        offsets
            .add_partition_offset(topic, partition as i32, offset)
            .map_err(|e| ClusterError::kafka("delete records", e))?;
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let answer = block_on(self.admin.delete_records(&offsets, &options))
            .map_err(|e| ClusterError::kafka("delete records", e))?;
        let element = answer
            .find_partition(topic, partition as i32)
            .ok_or_else(|| ClusterError::kafka("delete records", "no answer for the partition"))?;
        element.error().map_err(|e| ClusterError::kafka("delete records", e))?;
        match element.offset() {
            KafkaOffset::Offset(start) => Ok(u64::try_from(start).unwrap_or(0)),
            other => Err(ClusterError::kafka("delete records", format!("log start {other:?}"))),
        }
    }

    /// Send `records` to `partition` of `topic` and wait until the cluster acknowledged them
    /// (`acks=all`); the offsets they got (`None` for no records). Not transactional: a
    /// failure midway may leave some of them written.
    pub fn send(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record<'_>],
    ) -> Result<Option<Sent>, ClusterError> {
        let sent =
            self.send_acknowledged(&[crate::TransactionWrite { topic, partition, records }])?;
        Ok(sent.into_iter().next().flatten())
    }

    /// [`KafkaClient::send`] for several partitions' records, acknowledged together.
    pub fn send_all(&self, writes: &[crate::TransactionWrite<'_>]) -> Result<(), ClusterError> {
        self.send_acknowledged(writes).map(drop)
    }

    /// [`KafkaClient::send_all`], returning per write the offsets its records got, as the
    /// cluster's delivery reports said (`None` for a write of no records). Each write's
    /// messages carry a tag of their own, so sends of other threads on this client do not
    /// mix in.
    pub fn send_acknowledged(
        &self,
        writes: &[crate::TransactionWrite<'_>],
    ) -> Result<Vec<Option<Sent>>, ClusterError> {
        let tags = self.producer.context().tags(writes.len());
        for (write, tag) in writes.iter().zip(tags.clone()) {
            for record in write.records {
                produce_tagged(&self.producer, write.topic, write.partition, record, tag)?;
            }
        }
        self.producer.flush(REQUEST_TIMEOUT).map_err(|e| ClusterError::kafka("flush", e))?;
        let acknowledged: Vec<_> =
            tags.map(|tag| self.producer.context().take_tagged(tag)).collect();
        if let Some(failure) = self.producer.context().take_failure() {
            return Err(ClusterError::kafka("send", failure));
        }
        let mut sent = Vec::with_capacity(writes.len());
        for (write, acknowledged) in writes.iter().zip(acknowledged) {
            let count = acknowledged.map_or(0, |(_, _, count)| count);
            // A failure another thread's send took would show here: records unacknowledged.
            if count != write.records.len() {
                let message = format!(
                    "{}/{}: {count} of {} records acknowledged",
                    write.topic,
                    write.partition,
                    write.records.len()
                );
                return Err(ClusterError::kafka("send", message));
            }
            let partition = write.partition;
            sent.push(acknowledged.map(|(first, last, _)| Sent { partition, first, last }));
        }
        Ok(sent)
    }

    /// The offset after the last record this client's sends got acknowledged in
    /// `topic`/`partition` (`None` before any).
    pub fn acknowledged(&self, topic: &str, partition: u32) -> Option<u64> {
        self.producer.context().acknowledged_at(topic, partition)
    }

    /// A reader of one partition from `from`, read committed.
    pub fn reader(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
    ) -> Result<PartitionReader, ClusterError> {
        PartitionReader::new(&self.config, topic, partition, from)
    }

    /// A consumer of one partition: in `group`, from where the group committed last (or
    /// offset zero), committing to the cluster; outside a group, from offset zero.
    pub fn consumer(
        &self,
        topic: &str,
        partition: u32,
        group: Option<&str>,
    ) -> Result<ClusterConsumer, ClusterError> {
        ClusterConsumer::new(std::sync::Arc::clone(&self.config), topic, partition, group)
    }

    /// Every committed record of `topic`/`partition`, in offset order.
    pub fn records(&self, topic: &str, partition: u32) -> Result<Vec<OwnedRecord>, ClusterError> {
        let mut reader = self.reader(topic, partition, 0)?;
        let mut records = Vec::new();
        loop {
            let batch = reader.next_batch(100_000)?;
            if batch.is_empty() && reader.at_end() {
                return Ok(records);
            }
            records.extend(batch);
        }
    }

    /// Where `topic`/`partition` ends: the offset the next record will get.
    pub fn end_offset(&self, topic: &str, partition: u32) -> Result<Offset, ClusterError> {
        let (_, high) = self
            .producer
            .client()
            .fetch_watermarks(topic, partition as i32, REQUEST_TIMEOUT)
            .map_err(|e| ClusterError::kafka("fetch watermarks", e))?;
        Ok(Offset::new(u64::try_from(high).unwrap_or(0)))
    }
}

/// Partitions of `topic` as the cluster's metadata says.
pub(crate) fn partition_count<C: ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) -> Result<Option<u32>, ClusterError> {
    let metadata = client
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .map_err(|e| ClusterError::kafka("fetch metadata", e))?;
    let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    match found.error() {
        None if !found.partitions().is_empty() => Ok(Some(found.partitions().len() as u32)),
        _ => Ok(None),
    }
}

/// Queue one record for sending, waiting for room in the producer's queue.
pub(crate) fn produce(
    producer: &KafkaProducer,
    topic: &str,
    partition: u32,
    record: &Record<'_>,
) -> Result<(), ClusterError> {
    produce_tagged(producer, topic, partition, record, 0)
}

/// [`produce`], the delivery report tagged with `tag` (see [`Deliveries::tags`]).
fn produce_tagged(
    producer: &KafkaProducer,
    topic: &str,
    partition: u32,
    record: &Record<'_>,
    tag: usize,
) -> Result<(), ClusterError> {
    let mut headers = None;
    for header in record.headers {
        // Kafka header keys are strings: a key that is not UTF-8 cannot go there unchanged.
        let key = std::str::from_utf8(header.key)
            .map_err(|_| ClusterError::kafka("send", "a header key is not UTF-8"))?;
        let all = headers.take().unwrap_or_else(|| OwnedHeaders::new_with_capacity(4));
        headers = Some(all.insert(Header { key, value: Some(header.value) }));
    }
    let mut message: BaseRecord<'_, [u8], [u8], usize> =
        BaseRecord::with_opaque_to(topic, tag).partition(partition as i32);
    if let Some(key) = record.key {
        message = message.key(key);
    }
    if !record.value.is_empty() {
        message = message.payload(record.value);
    }
    if let Some(timestamp) = record.timestamp {
        message = message.timestamp(timestamp);
    }
    if let Some(headers) = headers {
        message = message.headers(headers);
    }
    loop {
        match producer.send(message) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                message = back;
                producer.poll(Duration::from_millis(10));
            }
            Err((error, _)) => return Err(ClusterError::kafka("send", error)),
        }
    }
}

/// A consumed message as an owned record.
pub(crate) fn owned(message: &BorrowedMessage<'_>) -> OwnedRecord {
    OwnedRecord {
        offset: crate::Offset::new(u64::try_from(message.offset()).unwrap_or(0)),
        timestamp: message.timestamp().to_millis().unwrap_or(0),
        key: message.key().map(<[u8]>::to_vec),
        value: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        headers: message.headers().map_or_else(Vec::new, |headers| {
            headers
                .iter()
                .map(|h| {
                    (h.key.as_bytes().to_vec(), h.value.map(<[u8]>::to_vec).unwrap_or_default())
                })
                .collect()
        }),
    }
}

/// How far back a reader first looks when a fetch from an offset inside a batch came back
/// without that batch (some brokers, tansu 0.6 among them, answer a fetch from the middle of
/// a batch with the next batch). Grows eightfold per retry, down to offset zero.
pub(crate) const SEEK_BACK_FIRST: u64 = 256;
/// How long a reader not yet known to start right waits for a first answer before it looks
/// further back.
const UNVERIFIED_WAIT: Duration = Duration::from_millis(500);
/// How long a reader already at the end of its partition waits for more before it answers
/// that there is nothing new: several fetch rounds of `READER_FETCH_WAIT_MS`.
const AT_END_WAIT: Duration = Duration::from_millis(500);
/// How long the broker may hold a reader's fetch waiting for records.
const READER_FETCH_WAIT_MS: &str = "100";

/// Reads one partition in offset order, read committed, outside any consumer group.
///
/// It starts exactly at the offset asked for, whatever the broker does with a fetch from the
/// middle of a batch: until it sees a record at or before that offset (or reads from zero), it
/// fetches from further back and drops what comes before the offset.
pub struct PartitionReader {
    consumer: BaseConsumer,
    topic: String,
    partition: u32,
    at_end: bool,
    /// The offset after the last record handed out (Kafka's next offset may be further: a
    /// commit marker).
    next: u64,
    /// Where the current fetch started, while the start is not yet known to be right.
    unverified: Option<u64>,
    window: u64,
    /// When the current fetch was set up: a broker may answer a fetch from past a skipped
    /// last batch with nothing at all, not even an end-of-partition event.
    assigned_at: Instant,
}

impl std::fmt::Debug for PartitionReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionReader").field("next", &self.next).finish_non_exhaustive()
    }
}

impl PartitionReader {
    fn new(
        config: &KafkaConfig,
        topic: &str,
        partition: u32,
        from: u64,
    ) -> Result<PartitionReader, ClusterError> {
        let consumer: BaseConsumer = reader_config(config)?
            .create()
            .map_err(|e| config.client_error("create reader", &e))?;
        let mut reader = PartitionReader {
            consumer,
            topic: topic.to_owned(),
            partition,
            at_end: false,
            next: from,
            unverified: (from > 0).then_some(from),
            window: SEEK_BACK_FIRST,
            assigned_at: Instant::now(),
        };
        reader.assign(from)?;
        Ok(reader)
    }

    fn assign(&mut self, at: u64) -> Result<(), ClusterError> {
        let mut assignment = TopicPartitionList::new();
        let offset = KafkaOffset::Offset(i64::try_from(at).unwrap_or(i64::MAX));
        assignment
            .add_partition_offset(&self.topic, self.partition as i32, offset)
            .map_err(|e| ClusterError::kafka("assign", e))?;
        self.assigned_at = Instant::now();
        self.consumer.assign(&assignment).map_err(|e| ClusterError::kafka("assign", e))
    }

    /// The fetch from `start` may have skipped records at or after `next`: start further back.
    fn back_off(&mut self) -> Result<(), ClusterError> {
        let start = self.next.saturating_sub(self.window);
        self.window = self.window.saturating_mul(8);
        self.unverified = (start > 0).then_some(start);
        self.consumer.unassign().map_err(|e| ClusterError::kafka("unassign", e))?;
        self.assign(start)
    }

    /// Up to `max` records; fewer when the partition's committed end is reached (then
    /// [`PartitionReader::at_end`] is true until more arrive).
    pub fn next_batch(&mut self, max: usize) -> Result<Vec<OwnedRecord>, ClusterError> {
        let mut records = Vec::new();
        let started = Instant::now();
        let deadline = started + REQUEST_TIMEOUT;
        while records.len() < max {
            let wait = if records.is_empty() { Duration::from_millis(100) } else { Duration::ZERO };
            match self.consumer.poll(wait) {
                Some(Ok(message)) => {
                    self.at_end = false;
                    let record = owned(&message);
                    let offset = record.offset.get();
                    if self.unverified.is_some() {
                        if offset > self.next {
                            self.back_off()?;
                            continue;
                        }
                        self.unverified = None;
                    }
                    if offset < self.next {
                        continue;
                    }
                    self.next = offset + 1;
                    records.push(record);
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    if self.unverified.is_some() {
                        // The end, or a last batch skipped: look again from further back.
                        self.back_off()?;
                        continue;
                    }
                    self.at_end = true;
                    break;
                }
                Some(Err(error)) if transient(&error) && Instant::now() <= deadline => {
                    tracing::warn!(target: "chronik::kafka", "read: {error} (librdkafka recovers)");
                }
                Some(Err(error)) => return Err(ClusterError::kafka("read", error)),
                None if !records.is_empty() => break,
                // At the end already: the client signals the end once, so "still at the end"
                // is nothing new for AT_END_WAIT (a few fetch rounds).
                None if self.at_end && started.elapsed() >= AT_END_WAIT => break,
                None if self.unverified.is_some()
                    && self.assigned_at.elapsed() >= UNVERIFIED_WAIT =>
                {
                    self.back_off()?;
                }
                None if Instant::now() > deadline => {
                    return Err(ClusterError::kafka("read", "no answer from the cluster"));
                }
                None => {}
            }
        }
        Ok(records)
    }

    /// Whether the last read reached the end of what is committed.
    pub fn at_end(&self) -> bool {
        self.at_end
    }

    /// The offset after the last record read.
    pub fn next_offset(&self) -> Offset {
        Offset::new(self.next)
    }
}

/// Run a future of the admin client to completion on this thread. librdkafka completes it
/// from its own threads and wakes us; a park/unpark waker is all it needs (no async runtime).
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::transient;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode as E};

    /// A lost connection is polled through; a fatal error, or one about the data, ends the run.
    #[test]
    fn only_errors_librdkafka_recovers_from_are_transient() {
        assert!(transient(&KafkaError::MessageConsumption(E::AllBrokersDown)));
        assert!(transient(&KafkaError::MessageConsumption(E::NotCoordinator)));
        assert!(!transient(&KafkaError::MessageConsumptionFatal(E::AllBrokersDown)));
        assert!(!transient(&KafkaError::MessageConsumption(E::UnknownTopicOrPartition)));
        assert!(!transient(&KafkaError::MessageConsumption(E::TopicAuthorizationFailed)));
        assert!(!transient(&KafkaError::PartitionEOF(0)));
    }
}
