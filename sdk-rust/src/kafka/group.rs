//! Processors on a Kafka-protocol cluster: the same tasks ([`Task`]) over a [`TaskLog`] that
//! reads from a consumer group and commits through Kafka transactions. It depends on the
//! processor module and on the client (`kafka`), and neither of them on it (`Connection::run`
//! calls [`run`]): that is why [`KafkaClient::run`] is defined here, not beside the client.
//!
//! - Input partitions are spread over the processes of the group `application` (range
//!   assignment, so partition `p` of every co-partitioned input goes to one process).
//! - A process that gets a partition restores its stores from the changelog partitions (read
//!   committed, to their end), and starts at the group's committed position.
//! - Exactly once: one transactional producer per process; a commit is one transaction
//!   holding the changelog records, the outputs, and the input positions (sent to the
//!   transaction with the consumer's group metadata, so a member fenced out of the group
//!   cannot commit). A cluster without transactions makes the run refuse to start.
//! - At least once (asked for): outputs and changelog records flushed, then the positions
//!   committed to the group; a crash between the two repeats work.
//! - A rebalance drops every task without committing what it had not committed: whoever gets
//!   the partition next restores the committed state and goes on from the committed position.

// Kafka numbers partitions with i32, Chronik with u32; partition counts stay far below
// i32::MAX on both sides, so the casts between them are exact.
#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

use super::restore::{LocalState, restore_partition};
use super::{
    ClusterError, Deliveries, KafkaClient, KafkaProducer, REQUEST_TIMEOUT, SEEK_BACK_FIRST,
    cluster, owned, produce, transient,
};
use crate::processor::{
    Guarantee, MARKER_HEADER, MARKER_KEY, MARKER_MAGIC, Processor, ProcessorConfig, ProcessorError,
    RunStats, Task, TaskLog, Until, disk_budgets,
};
use crate::store::StoreKind;
use crate::{Fetch, GroupCommit, Offset, OwnedRecord, Record, TransactionWrite};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::producer::Producer;
use rdkafka::{ClientContext, Message};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The topic an exactly-once run commits one record to before it starts, to learn whether
/// the cluster runs transactions to their end.
const EOS_PROBE_TOPIC: &str = "chronik-transactions-probe";
/// How long an input partition with nothing buffered must stay quiet before the merge of
/// several inputs takes it as caught up (Kafka Streams' `max.task.idle.ms`).
const MAX_TASK_IDLE: Duration = Duration::from_millis(500);
/// How long one poll of the group consumer waits when there is nothing to do.
const POLL_WAIT: Duration = Duration::from_millis(50);
/// Messages taken from the consumer between two rounds of processing.
const POLL_BURST: usize = 20_000;
/// How often a run that stops when caught up asks the group where it is.
const CAUGHT_UP_CHECK: Duration = Duration::from_millis(500);

/// Tells the loop that the group's assignment changed (called inside `poll`).
struct GroupContext {
    changed: AtomicBool,
}

impl ClientContext for GroupContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        if std::env::var_os("CHRONIK_KAFKA_DEBUG").is_some() {
            eprintln!("librdkafka {level:?} {fac}: {log_message}");
        }
    }
}

impl ConsumerContext for GroupContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, _rebalance: &Rebalance<'_>) {
        self.changed.store(true, Ordering::SeqCst);
    }
}

/// Records of one input partition taken from the consumer and not yet processed.
struct Buffer {
    records: VecDeque<OwnedRecord>,
    /// The offset of the last record pushed: a record at or below it again is a redelivery.
    last: Option<Offset>,
    last_arrival: Instant,
    /// Until a record at or before the task's position arrives, the fetch may have started
    /// past it (see [`SEEK_BACK_FIRST`]).
    verify: Option<Verify>,
}

struct Verify {
    expected: Offset,
    /// Where the consumer was last sent to fetch from, and when.
    start: u64,
    window: u64,
    since: Instant,
}

/// How long an unverified partition waits for a record before its fetch goes further back.
const VERIFY_WAIT: Duration = Duration::from_millis(500);

impl Buffer {
    fn new(position: Offset) -> Buffer {
        let verify = (position > Offset::ZERO).then(|| Verify {
            expected: position,
            start: position.get(),
            window: SEEK_BACK_FIRST,
            since: Instant::now(),
        });
        Buffer { records: VecDeque::new(), last: None, last_arrival: Instant::now(), verify }
    }

    /// Whether `record` may go in: verified, or the record that verifies. A record past the
    /// position while unverified is dropped, and the fetch sent further back (at most once per
    /// [`VERIFY_WAIT`], since records of the earlier fetch may still be queued).
    fn admit<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: u32,
        offset: Offset,
    ) -> Result<bool, ProcessorError> {
        let Some(verify) = &self.verify else { return Ok(true) };
        if offset <= verify.expected || verify.start == 0 {
            self.verify = None;
            return Ok(true);
        }
        if verify.since.elapsed() >= VERIFY_WAIT / 5 {
            self.seek_back(consumer, topic, partition)?;
        }
        Ok(false)
    }

    fn seek_back<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: u32,
    ) -> Result<(), ProcessorError> {
        let Some(verify) = &mut self.verify else { return Ok(()) };
        verify.start = verify.expected.get().saturating_sub(verify.window);
        verify.window = verify.window.saturating_mul(8);
        verify.since = Instant::now();
        let at = KafkaOffset::Offset(i64::try_from(verify.start).unwrap_or(0));
        consumer
            .seek(topic, partition as i32, at, REQUEST_TIMEOUT)
            .map_err(|e| kafka_error("seek", e))
    }
}

fn kafka_error(operation: &'static str, error: impl std::fmt::Display) -> ProcessorError {
    ProcessorError::Kafka(ClusterError::kafka(operation, error).to_string())
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A fetch of `records` (offset order) from `from`.
fn fetch_of<'r>(
    from: Offset,
    records: impl Iterator<Item = &'r OwnedRecord>,
    max_bytes: usize,
) -> Result<Fetch, ProcessorError> {
    let mut taken: Vec<&OwnedRecord> = Vec::new();
    let mut bytes = 0;
    for record in records {
        if bytes >= max_bytes && !taken.is_empty() {
            break;
        }
        bytes += record.value.len() + record.key.as_ref().map_or(0, Vec::len) + 32;
        taken.push(record);
    }
    let headers: Vec<Vec<crate::Header<'_>>> = taken.iter().map(|r| r.header_views()).collect();
    let records: Vec<(Offset, Record<'_>)> =
        taken.iter().zip(&headers).map(|(r, h)| (r.offset, r.as_record(h))).collect();
    let next = records.last().map_or(from, |(offset, _)| offset.plus(1));
    Fetch::from_records(from, next, &records).map_err(|e| kafka_error("read", e))
}

/// The log of a process in the group: reads from what the group consumer delivered, commits
/// through the producer.
struct GroupLog<'a> {
    client: &'a KafkaClient,
    consumer: &'a BaseConsumer<GroupContext>,
    producer: &'a KafkaProducer,
    transactional: bool,
    buffers: RefCell<HashMap<(String, u32), Buffer>>,
    partition_counts: RefCell<HashMap<String, u32>>,
    /// The changelog topics, one per store: every commit ends each with a marker.
    changelogs: Vec<String>,
    /// Per task partition: the last commit's sequence number, and the repairs its next
    /// commit writes first.
    commits: RefCell<HashMap<u32, Fenced>>,
    /// Per changelog partition, the offset after the marker of the task's last commit: a
    /// disk store flushed there holds exactly that commit.
    ends: RefCell<HashMap<(String, u32), Offset>>,
    /// Where disk stores are kept (`None`: the application has none).
    local: Option<LocalState>,
    /// Per task partition, the locks of its disk stores' directories.
    locks: RefCell<HashMap<u32, Vec<std::fs::File>>>,
}

/// What a task's commits carry besides its own writes.
#[derive(Default)]
struct Fenced {
    seq: u64,
    /// (changelog, key, changelog value): the committed value, written again, of every key
    /// that an unfinished commit of an earlier owner left after the last marker.
    repairs: Vec<(String, Vec<u8>, Vec<u8>)>,
}

impl TaskLog for GroupLog<'_> {
    fn now_ms(&self) -> i64 {
        now_ms()
    }

    fn partition_count(&self, topic: &str) -> Option<u32> {
        if let Some(count) = self.partition_counts.borrow().get(topic) {
            return Some(*count);
        }
        let count = self.client.partition_count(topic).ok().flatten()?;
        self.partition_counts.borrow_mut().insert(topic.to_owned(), count);
        Some(count)
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Fetch, ProcessorError> {
        let mut buffers = self.buffers.borrow_mut();
        let Some(buffer) = buffers.get_mut(&(topic.to_owned(), partition)) else {
            return fetch_of(from, std::iter::empty(), max_bytes);
        };
        while buffer.records.front().is_some_and(|r| r.offset < from) {
            buffer.records.pop_front();
        }
        fetch_of(from, buffer.records.iter(), max_bytes)
    }

    fn high_watermark(&self, topic: &str, partition: u32) -> Result<Offset, ProcessorError> {
        // A changelog (asked when a disk store flushes): where the last commit ended.
        if let Some(end) = self.ends.borrow().get(&(topic.to_owned(), partition)) {
            return Ok(*end);
        }
        // An input. Buffered records: more may follow. Nothing buffered and quiet for a while: caught
        // up for now (offset zero: any fetch reaches it).
        let buffers = self.buffers.borrow();
        let quiet = buffers.get(&(topic.to_owned(), partition)).is_none_or(|buffer| {
            buffer.records.is_empty() && buffer.last_arrival.elapsed() >= MAX_TASK_IDLE
        });
        Ok(if quiet { Offset::ZERO } else { Offset::new(u64::MAX) })
    }

    fn commit(
        &self,
        writes: &[TransactionWrite<'_>],
        group: Option<GroupCommit<'_>>,
    ) -> Result<(), ProcessorError> {
        if self.transactional {
            self.producer.begin_transaction().map_err(|e| kafka_error("begin transaction", e))?;
        }
        let result = self.commit_inner(writes, group);
        if result.is_err() && self.transactional {
            // Nothing of it becomes visible; the run ends and a restart restores.
            let _ = self.producer.abort_transaction(REQUEST_TIMEOUT);
        }
        result
    }
}

impl GroupLog<'_> {
    fn commit_inner(
        &self,
        writes: &[TransactionWrite<'_>],
        group: Option<GroupCommit<'_>>,
    ) -> Result<(), ProcessorError> {
        let offsets_of = group.map_or(&[][..], |g| g.offsets);
        let partition = offsets_of.first().map(|(_, partition, _)| *partition);
        let mut commits = self.commits.borrow_mut();
        let fenced = partition.map(|p| commits.entry(p).or_default());
        // 1. The repairs, the store changes and the outputs.
        if let (Some(partition), Some(fenced)) = (partition, &fenced) {
            for (topic, key, value) in &fenced.repairs {
                let record = Record::new(Some(key), value);
                produce(self.producer, topic, partition, &record).map_err(cluster)?;
            }
        }
        for write in writes {
            for record in write.records {
                produce(self.producer, write.topic, write.partition, record).map_err(cluster)?;
            }
        }
        if !self.transactional {
            // Acknowledged before any marker: a marker never covers a lost write.
            self.flushed()?;
        }
        // 2. A marker at the end of every changelog: the state up to here is committed, with
        //    these input positions.
        let Some(fenced) = fenced else { return self.finish(&TopicPartitionList::new()) };
        let partition = partition.expect("a fenced commit has a partition");
        let seq = fenced.seq + 1;
        let positions: Vec<Offset> = offsets_of.iter().map(|(_, _, offset)| *offset).collect();
        let marker = encode_marker(seq, &positions);
        let headers = [crate::Header { key: MARKER_HEADER.as_bytes(), value: &[] }];
        let record = Record::new(Some(MARKER_KEY), &marker).with_headers(&headers);
        for changelog in &self.changelogs {
            produce(self.producer, changelog, partition, &record).map_err(cluster)?;
        }
        let mut offsets = TopicPartitionList::new();
        for (topic, partition, offset) in offsets_of {
            let at = KafkaOffset::Offset(i64::try_from(offset.get()).unwrap_or(i64::MAX));
            offsets
                .add_partition_offset(topic, *partition as i32, at)
                .map_err(|e| kafka_error("commit", e))?;
        }
        self.finish(&offsets)?;
        fenced.seq = seq;
        fenced.repairs.clear();
        let mut ends = self.ends.borrow_mut();
        for changelog in &self.changelogs {
            let acknowledged = self.producer.context().acknowledged_at(changelog, partition);
            let end = Offset::new(acknowledged.ok_or_else(|| {
                kafka_error("commit", format!("no offset acknowledged for {changelog}"))
            })?);
            let before = ends.insert((changelog.clone(), partition), end);
            // Pair with the restore's ends: a commit's marker lands after the last one.
            if let Some(before) = before.filter(|b| *b >= end) {
                let (before, end) = (before.get(), end.get());
                let message =
                    format!("{changelog}: a marker acknowledged before {end}, after {before}");
                return Err(kafka_error("commit", message));
            }
        }
        Ok(())
    }

    /// Wait for every record sent to be acknowledged; fail if any was not.
    fn flushed(&self) -> Result<(), ProcessorError> {
        self.producer.flush(REQUEST_TIMEOUT).map_err(|e| kafka_error("flush", e))?;
        match self.producer.context().take_failure() {
            Some(failure) => Err(kafka_error("send", failure)),
            None => Ok(()),
        }
    }

    /// Commit the input positions: inside the transaction (exactly once), or after the writes
    /// are acknowledged (at least once).
    fn finish(&self, offsets: &TopicPartitionList) -> Result<(), ProcessorError> {
        if self.transactional {
            if offsets.count() > 0 {
                let metadata = self
                    .consumer
                    .group_metadata()
                    .ok_or_else(|| kafka_error("commit", "the consumer has no group metadata"))?;
                self.producer
                    .send_offsets_to_transaction(offsets, &metadata, REQUEST_TIMEOUT)
                    .map_err(|e| kafka_error("send offsets to transaction", e))?;
            }
            self.producer
                .commit_transaction(REQUEST_TIMEOUT)
                .map_err(|e| kafka_error("commit transaction", e))?;
            return match self.producer.context().take_failure() {
                Some(failure) => Err(kafka_error("send", failure)),
                None => Ok(()),
            };
        }
        self.flushed()?;
        if offsets.count() > 0 {
            self.consumer
                .commit(offsets, CommitMode::Sync)
                .map_err(|e| kafka_error("commit offsets", e))?;
        }
        Ok(())
    }
}

/// A marker's value: magic, the commit's sequence number, then the input positions
/// (little-endian `u64`s).
pub(super) fn encode_marker(seq: u64, positions: &[Offset]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(12 + 8 * positions.len());
    bytes.extend_from_slice(MARKER_MAGIC);
    bytes.extend_from_slice(&seq.to_le_bytes());
    for position in positions {
        bytes.extend_from_slice(&position.get().to_le_bytes());
    }
    bytes
}

/// Check the inputs and create the changelogs that are missing; returns the partition count.
fn prepare(client: &KafkaClient, config: &ProcessorConfig) -> Result<u32, ProcessorError> {
    let first = config.inputs.first().ok_or_else(|| ProcessorError::Config("no input".into()))?;
    if config.commit_interval_ms == 0 {
        return Err(ProcessorError::Config("commit interval must be > 0".into()));
    }
    let count_of = |topic: &str| client.partition_count(topic).map_err(cluster);
    let partitions = count_of(first)?.ok_or_else(|| {
        ProcessorError::Kafka(ClusterError::TopicNotFound { topic: first.clone() }.to_string())
    })?;
    for input in &config.inputs {
        let count = count_of(input)?.ok_or_else(|| {
            ProcessorError::Kafka(ClusterError::TopicNotFound { topic: input.clone() }.to_string())
        })?;
        if count != partitions {
            return Err(ProcessorError::Config(format!(
                "input {input} has {count} partitions, {first} {partitions}: inputs must be \
                 co-partitioned"
            )));
        }
    }
    for store in &config.stores {
        let topic = config.changelog(store);
        match count_of(&topic)? {
            Some(count) if count == partitions => {}
            Some(count) => {
                return Err(ProcessorError::Config(format!(
                    "changelog {topic} has {count} partitions, the input {partitions}"
                )));
            }
            None => match client.create_topic(&topic, partitions, true) {
                Ok(()) | Err(ClusterError::TopicExists { .. }) => {}
                Err(error) => return Err(cluster(error)),
            },
        }
    }
    Ok(partitions)
}

/// Where the application's disk stores are kept on this machine: the connection's
/// `state.dir` ([`super::KafkaConfig::state_dir`]), in the I/O the engine uses; `None` if it
/// has no disk store.
fn local_state(
    client: &KafkaClient,
    config: &ProcessorConfig,
    producer: &KafkaProducer,
) -> Result<Option<LocalState>, ProcessorError> {
    if config.stores.iter().all(|store| config.kind_of(store) == StoreKind::Memory) {
        return Ok(None);
    }
    let directory = client.config().state_dir();
    std::fs::create_dir_all(&directory).map_err(|error| {
        ProcessorError::Config(format!("state.dir {}: {error}", directory.display()))
    })?;
    let io = chronik_engine::io::SystemIo::new(chronik_engine::io::Backend::Auto)
        .map_err(|error| ProcessorError::Config(format!("state.dir: I/O: {error}")))?;
    // A cluster without an id (old brokers) is known by its address.
    let cluster = producer.client().fetch_cluster_id(REQUEST_TIMEOUT).unwrap_or_else(|| {
        tracing::warn!(target: "chronik::kafka", "no cluster id: stores are named by address");
        format!("at {}", client.bootstrap())
    });
    tracing::info!(state_dir = %directory.display(), cluster, "disk stores kept here");
    let budgets = disk_budgets(config)?;
    let budgets = budgets.into_iter().map(|(name, budget)| (name.to_owned(), budget)).collect();
    Ok(Some(LocalState { directory, io: std::sync::Arc::new(io), cluster, budgets }))
}

/// The producer: transactional for exactly once (refusing to start if the cluster cannot),
/// plain otherwise.
fn producer(
    client: &KafkaClient,
    config: &ProcessorConfig,
    guarantee: Guarantee,
) -> Result<KafkaProducer, ProcessorError> {
    let mut settings: ClientConfig = client.config().client_config().map_err(cluster)?;
    settings.set("acks", "all").set("linger.ms", "5").set("enable.idempotence", "true");
    if guarantee == Guarantee::AtLeastOnce {
        // A batch lost for good while later ones land would leave a gap that a replay cannot
        // fill (a repartition topic's reader drops marks at or below the last it took): fail.
        settings.set("enable.gapless.guarantee", "true");
    }
    if guarantee == Guarantee::ExactlyOnce {
        // One transactional id per process instance; fencing of a zombie goes through the
        // group metadata sent with the offsets (KIP-447), not through reusing ids.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let id = format!("{}-{}-{nanos}", config.application, std::process::id());
        settings.set("transactional.id", &id).set("transaction.timeout.ms", "10000");
    }
    let producer: KafkaProducer = settings
        .create_with_context(Deliveries::default())
        .map_err(|e| cluster(client.config().client_error("create producer", &e)))?;
    if guarantee == Guarantee::ExactlyOnce {
        let refused = |e: &dyn std::fmt::Display| {
            ProcessorError::ExactlyOnceUnavailable(format!(
                "the cluster at {} cannot run Kafka transactions ({e})",
                client.bootstrap()
            ))
        };
        producer.init_transactions(REQUEST_TIMEOUT).map_err(|e| refused(&e))?;
        // Some brokers take a transaction's first steps and not its end: commit one record
        // to a probe topic to know before any work depends on it.
        match client.create_topic(EOS_PROBE_TOPIC, 1, false) {
            Ok(()) | Err(ClusterError::TopicExists { .. }) => {}
            Err(error) => return Err(cluster(error)),
        }
        producer.begin_transaction().map_err(|e| refused(&e))?;
        let probe = Record::new(Some(config.application.as_bytes()), b"probe");
        produce(&producer, EOS_PROBE_TOPIC, 0, &probe).map_err(cluster)?;
        if let Err(error) = producer.commit_transaction(REQUEST_TIMEOUT) {
            let _ = producer.abort_transaction(REQUEST_TIMEOUT);
            return Err(refused(&error));
        }
    } else {
        producer.context().take_failure();
    }
    Ok(producer)
}

fn group_consumer(
    client: &KafkaClient,
    config: &ProcessorConfig,
) -> Result<BaseConsumer<GroupContext>, ProcessorError> {
    let mut settings = client.config().client_config().map_err(cluster)?;
    let consumer: BaseConsumer<GroupContext> = settings
        .set("group.id", &config.application)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("partition.assignment.strategy", "range")
        .set("session.timeout.ms", session_timeout_ms(client).to_string())
        .set("heartbeat.interval.ms", "1000")
        .create_with_context(GroupContext { changed: AtomicBool::new(false) })
        .map_err(|e| cluster(client.config().client_error("create consumer", &e)))?;
    let inputs: Vec<&str> = config.inputs.iter().map(String::as_str).collect();
    consumer.subscribe(&inputs).map_err(|e| kafka_error("subscribe", e))?;
    Ok(consumer)
}

/// How long the group waits for a silent process before moving its partitions: the
/// connection's `session.timeout.ms` (`CHRONIK_KAFKA_SESSION_TIMEOUT_MS` sets it), 20 s by
/// default. Brokers that take a member waiting in a rebalance for a silent one (tansu 0.6
/// does) need it well above their rebalance time.
fn session_timeout_ms(client: &KafkaClient) -> u64 {
    client
        .config()
        .get("session.timeout.ms")
        .and_then(|ms| ms.trim().parse().ok())
        .unwrap_or(20_000)
}

impl KafkaClient {
    /// Run a processor application in the consumer group `config.application` on this
    /// cluster (what [`crate::Connection::run`] does for a `kafka://` target).
    #[allow(clippy::needless_pass_by_value)] // the same signature as Connection::run
    pub fn run<P: Processor>(
        &self,
        config: ProcessorConfig,
        guarantee: Guarantee,
        mut factory: impl FnMut(u32) -> P,
        until: Until<'_>,
    ) -> Result<RunStats, ProcessorError> {
        run(self, &config, guarantee, &mut factory, until)
    }
}

/// Run `config`'s processors in the consumer group `config.application` until `until`.
pub(crate) fn run<P: Processor>(
    client: &KafkaClient,
    config: &ProcessorConfig,
    guarantee: Guarantee,
    factory: &mut dyn FnMut(u32) -> P,
    until: Until<'_>,
) -> Result<RunStats, ProcessorError> {
    let partitions = prepare(client, config)?;
    let producer = producer(client, config, guarantee)?;
    let consumer = group_consumer(client, config)?;
    let log = GroupLog {
        client,
        consumer: &consumer,
        producer: &producer,
        transactional: guarantee == Guarantee::ExactlyOnce,
        buffers: RefCell::new(HashMap::new()),
        partition_counts: RefCell::new(HashMap::new()),
        changelogs: config.stores.iter().map(|store| config.changelog(store)).collect(),
        commits: RefCell::new(HashMap::new()),
        ends: RefCell::new(HashMap::new()),
        local: local_state(client, config, &producer)?,
        locks: RefCell::new(HashMap::new()),
    };
    let mut tasks: BTreeMap<u32, Task<P>> = BTreeMap::new();
    let mut stats = RunStats::default();
    let mut last_check = Instant::now();
    let mut idle = false;
    loop {
        if let Until::Stopped(stop) = until
            && stop.load(Ordering::Relaxed)
        {
            break;
        }
        for polled in 0..POLL_BURST {
            let wait = if polled == 0 && idle { POLL_WAIT } else { Duration::ZERO };
            let Some(message) = consumer.poll(wait) else { break };
            let message = match message {
                Ok(message) => message,
                // librdkafka reconnects by itself; a cluster gone for good fails the next
                // commit or watermark request, each bounded by REQUEST_TIMEOUT.
                Err(error) if transient(&error) => {
                    tracing::warn!(target: "chronik::kafka", "poll: {error} (librdkafka recovers)");
                    break;
                }
                Err(error) => return Err(kafka_error("poll", error)),
            };
            let key = (message.topic().to_owned(), message.partition() as u32);
            if consumer.context().changed.swap(false, Ordering::SeqCst)
                || !log.buffers.borrow().contains_key(&key)
            {
                reconcile(client, config, &consumer, &log, &mut tasks, &mut stats, factory)?;
            }
            let record = owned(&message);
            let mut buffers = log.buffers.borrow_mut();
            let buffer = buffers.get_mut(&key).ok_or_else(|| {
                kafka_error("poll", format!("a record of {}/{} not assigned here", key.0, key.1))
            })?;
            if !buffer.admit(&consumer, &key.0, key.1, record.offset)? {
                continue;
            }
            if buffer.last.is_none_or(|last| record.offset > last) {
                buffer.last = Some(record.offset);
                buffer.last_arrival = Instant::now();
                buffer.records.push_back(record);
            }
        }
        if consumer.context().changed.swap(false, Ordering::SeqCst) {
            reconcile(client, config, &consumer, &log, &mut tasks, &mut stats, factory)?;
        }
        for ((topic, partition), buffer) in log.buffers.borrow_mut().iter_mut() {
            if buffer.verify.as_ref().is_some_and(|v| v.since.elapsed() >= VERIFY_WAIT) {
                // Nothing came: the fetch may have skipped the partition's last batch.
                buffer.seek_back(&consumer, topic, *partition)?;
            }
        }
        let mut processed = 0;
        for task in tasks.values_mut() {
            processed += task.step(&log, config)?;
        }
        idle = processed == 0;
        if idle {
            for task in tasks.values_mut() {
                task.commit_if_due(&log, config, true)?;
            }
            if matches!(until, Until::CaughtUp) && last_check.elapsed() >= CAUGHT_UP_CHECK {
                last_check = Instant::now();
                if group_caught_up(client, &consumer, config, partitions)? {
                    break;
                }
            }
        }
    }
    for task in tasks.values_mut() {
        task.close(&log, config)?;
    }
    for task in tasks.values_mut() {
        stats.add(std::mem::take(&mut task.stats));
    }
    consumer.unsubscribe();
    Ok(stats)
}

/// Whether the group's committed position of every input partition (whoever owns it) is at
/// the partition's end.
fn group_caught_up<C: ConsumerContext>(
    client: &KafkaClient,
    consumer: &BaseConsumer<C>,
    config: &ProcessorConfig,
    partitions: u32,
) -> Result<bool, ProcessorError> {
    let mut wanted = TopicPartitionList::new();
    for input in &config.inputs {
        for partition in 0..partitions {
            wanted.add_partition(input, partition as i32);
        }
    }
    let committed = consumer
        .committed_offsets(wanted, REQUEST_TIMEOUT)
        .map_err(|e| kafka_error("fetch committed offsets", e))?;
    for element in committed.elements() {
        let at = match element.offset() {
            KafkaOffset::Offset(at) => u64::try_from(at).unwrap_or(0),
            _ => 0,
        };
        // Whether anything committed lies at or after the group's position (the end offset
        // alone cannot tell: a transaction marker takes one, and some brokers misreport it).
        // The reader starts exactly there, even on a broker that fetches from the next batch.
        let mut reader =
            client.reader(element.topic(), element.partition() as u32, at).map_err(cluster)?;
        if !reader.next_batch(1).map_err(cluster)?.is_empty() || !reader.at_end() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Make the tasks match the group's assignment: tasks of partitions no longer here are
/// dropped with what they had not committed; partitions new here get a task, restored from
/// the changelogs, starting at the group's committed positions.
fn reconcile<P: Processor>(
    client: &KafkaClient,
    config: &ProcessorConfig,
    consumer: &BaseConsumer<GroupContext>,
    log: &GroupLog<'_>,
    tasks: &mut BTreeMap<u32, Task<P>>,
    stats: &mut RunStats,
    factory: &mut dyn FnMut(u32) -> P,
) -> Result<(), ProcessorError> {
    let assignment = consumer.assignment().map_err(|e| kafka_error("assignment", e))?;
    let owned: BTreeSet<u32> = assignment
        .elements()
        .iter()
        .filter(|e| e.topic() == config.inputs[0])
        .map(|e| e.partition() as u32)
        .collect();
    if std::env::var_os("CHRONIK_KAFKA_DEBUG").is_some() {
        eprintln!("chronik: group {} assigned here: {owned:?}", config.application);
    }
    let gone: Vec<u32> = tasks.keys().filter(|p| !owned.contains(p)).copied().collect();
    for partition in gone {
        if let Some(mut task) = tasks.remove(&partition) {
            stats.add(std::mem::take(&mut task.stats));
        }
        // After the task and its stores are gone: another process may open them now.
        log.locks.borrow_mut().remove(&partition);
        log.ends.borrow_mut().retain(|(_, p), _| *p != partition);
        tracing::info!(partition, "partition revoked; its uncommitted work is dropped");
    }
    let mut buffers = log.buffers.borrow_mut();
    buffers.retain(|(_, partition), _| owned.contains(partition) && tasks.contains_key(partition));
    let new: Vec<u32> = owned.iter().filter(|p| !tasks.contains_key(p)).copied().collect();
    for partition in new {
        let mut wanted = TopicPartitionList::new();
        for input in &config.inputs {
            wanted.add_partition(input, partition as i32);
        }
        let committed = consumer
            .committed_offsets(wanted, REQUEST_TIMEOUT)
            .map_err(|e| kafka_error("fetch committed offsets", e))?;
        let positions: Vec<Offset> = config
            .inputs
            .iter()
            .map(|input| {
                let at = committed
                    .find_partition(input, partition as i32)
                    .map_or(KafkaOffset::Invalid, |e| e.offset());
                match at {
                    KafkaOffset::Offset(at) => Offset::new(u64::try_from(at).unwrap_or(0)),
                    _ => Offset::ZERO,
                }
            })
            .collect();
        let restored = restore_partition(client, config, partition, log.local.as_ref())?;
        let group_positions = positions.clone();
        let positions =
            restored.positions.filter(|p| p.len() == positions.len()).unwrap_or(positions);
        let fenced = Fenced { seq: restored.seq, repairs: restored.repairs };
        log.commits.borrow_mut().insert(partition, fenced);
        let mut ends = log.ends.borrow_mut();
        ends.extend(restored.ends.into_iter().map(|(topic, end)| ((topic, partition), end)));
        drop(ends);
        log.locks.borrow_mut().insert(partition, restored.locks);
        let commit = restored.commit;
        let (stores, restored) = (restored.stores, restored.stats);
        tracing::info!(partition, ?positions, commit, restored = restored.restored, "assigned");
        let task =
            Task::start(config, partition, factory(partition), stores, positions.clone(), now_ms());
        // Ahead of the group's offsets after a crash between the two writes of an at least
        // once commit: without a commit the group would stay behind (and never be caught up).
        let task = task.committed_at(group_positions);
        tasks.insert(partition, task.with_stats(config, restored)?);
        for (input, position) in config.inputs.iter().zip(&positions) {
            buffers.insert((input.clone(), partition), Buffer::new(*position));
        }
    }
    Ok(())
}
