//! Processors on a Kafka-protocol cluster: the same tasks ([`Task`]) over a [`TaskLog`] that
//! reads from a consumer group and commits through Kafka transactions.
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

use super::{
    Guarantee, Processor, ProcessorConfig, ProcessorError, RunStats, Task, TaskLog, Until,
    restore,
};
use crate::kafka::{
    ClusterError, Deliveries, KafkaClient, KafkaProducer, REQUEST_TIMEOUT, base_config, owned,
    produce,
};
use crate::{Fetch, GroupCommit, Offset, OwnedRecord, Record, TransactionWrite};
use rdkafka::{ClientContext, Message};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::producer::Producer;
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn post_rebalance(&self, _rebalance: &Rebalance<'_>) {
        self.changed.store(true, Ordering::SeqCst);
    }
}

/// Records of one input partition taken from the consumer and not yet processed.
struct Buffer {
    records: VecDeque<OwnedRecord>,
    /// The offset of the last record pushed: a record at or below it again is a redelivery.
    last: Option<Offset>,
    last_arrival: Instant,
}

impl Buffer {
    fn new() -> Buffer {
        Buffer { records: VecDeque::new(), last: None, last_arrival: Instant::now() }
    }
}

fn kafka_error(operation: &'static str, error: impl std::fmt::Display) -> ProcessorError {
    ProcessorError::Kafka(ClusterError::kafka(operation, error).to_string())
}

fn cluster(error: ClusterError) -> ProcessorError {
    ProcessorError::Kafka(error.to_string())
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
    let headers: Vec<Vec<crate::Header<'_>>> = taken
        .iter()
        .map(|r| r.headers.iter().map(|(k, v)| crate::Header { key: k, value: v }).collect())
        .collect();
    let records: Vec<(Offset, Record<'_>)> = taken
        .iter()
        .zip(&headers)
        .map(|(r, headers)| {
            let record = Record::new(r.key.as_deref(), &r.value)
                .with_timestamp(r.timestamp)
                .with_headers(headers);
            (r.offset, record)
        })
        .collect();
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
        // Buffered records: more may follow. Nothing buffered and quiet for a while: caught
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

    fn read_state_file(&self, _name: &str) -> Option<Vec<u8>> {
        None // Snapshots are local files; a partition may move to another machine.
    }

    fn write_state_file(&self, _name: &str, _bytes: Vec<u8>) -> bool {
        false
    }

    fn metrics(&self) -> Option<&crate::engine::metrics::Metrics> {
        None
    }
}

impl GroupLog<'_> {
    fn commit_inner(
        &self,
        writes: &[TransactionWrite<'_>],
        group: Option<GroupCommit<'_>>,
    ) -> Result<(), ProcessorError> {
        for write in writes {
            for record in write.records {
                produce(self.producer, write.topic, write.partition, record).map_err(cluster)?;
            }
        }
        let mut offsets = TopicPartitionList::new();
        for (topic, partition, offset) in group.map_or(&[][..], |g| g.offsets) {
            let at = KafkaOffset::Offset(i64::try_from(offset.get()).unwrap_or(i64::MAX));
            offsets
                .add_partition_offset(topic, *partition as i32, at)
                .map_err(|e| kafka_error("commit", e))?;
        }
        if self.transactional {
            if offsets.count() > 0 {
                let metadata = self
                    .consumer
                    .group_metadata()
                    .ok_or_else(|| kafka_error("commit", "the consumer has no group metadata"))?;
                self.producer
                    .send_offsets_to_transaction(&offsets, &metadata, REQUEST_TIMEOUT)
                    .map_err(|e| kafka_error("send offsets to transaction", e))?;
            }
            self.producer
                .commit_transaction(REQUEST_TIMEOUT)
                .map_err(|e| kafka_error("commit transaction", e))?;
        } else {
            self.producer.flush(REQUEST_TIMEOUT).map_err(|e| kafka_error("flush", e))?;
            if offsets.count() > 0 {
                self.consumer
                    .commit(&offsets, CommitMode::Sync)
                    .map_err(|e| kafka_error("commit offsets", e))?;
            }
        }
        match self.producer.context().take_failure() {
            Some(failure) => Err(kafka_error("send", failure)),
            None => Ok(()),
        }
    }
}

/// Reads changelog partitions for restores: its own reader, outside the group.
struct RestoreLog<'a> {
    client: &'a KafkaClient,
    reader: RefCell<Option<((String, u32), crate::kafka::PartitionReader)>>,
}

impl TaskLog for RestoreLog<'_> {
    fn now_ms(&self) -> i64 {
        now_ms()
    }

    fn partition_count(&self, topic: &str) -> Option<u32> {
        self.client.partition_count(topic).ok().flatten()
    }

    fn read(
        &self,
        topic: &str,
        partition: u32,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Fetch, ProcessorError> {
        let mut slot = self.reader.borrow_mut();
        let key = (topic.to_owned(), partition);
        let reusable = slot.as_ref().is_some_and(|(k, r)| *k == key && r.next_offset() == from.get());
        if !reusable {
            let reader = self.client.reader(topic, partition, from.get()).map_err(cluster)?;
            *slot = Some((key, reader));
        }
        let (_, reader) = slot.as_mut().expect("set above");
        let records = reader.next_batch((max_bytes / 64).max(1)).map_err(cluster)?;
        // Empty only at the committed end: the restore stops there (an open transaction of a
        // process that died stays invisible, and is aborted by the cluster).
        fetch_of(from, records.iter(), usize::MAX)
    }

    fn high_watermark(&self, topic: &str, partition: u32) -> Result<Offset, ProcessorError> {
        self.client.end_offset(topic, partition).map(Offset::new).map_err(cluster)
    }

    fn commit(
        &self,
        _writes: &[TransactionWrite<'_>],
        _group: Option<GroupCommit<'_>>,
    ) -> Result<(), ProcessorError> {
        Err(kafka_error("commit", "a restore does not commit"))
    }

    fn read_state_file(&self, _name: &str) -> Option<Vec<u8>> {
        None
    }

    fn write_state_file(&self, _name: &str, _bytes: Vec<u8>) -> bool {
        false
    }

    fn metrics(&self) -> Option<&crate::engine::metrics::Metrics> {
        None
    }
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

/// The producer: transactional for exactly once (refusing to start if the cluster cannot),
/// plain otherwise.
fn producer(
    client: &KafkaClient,
    config: &ProcessorConfig,
    guarantee: Guarantee,
) -> Result<KafkaProducer, ProcessorError> {
    let mut settings: ClientConfig = base_config(client.bootstrap());
    settings.set("acks", "all").set("linger.ms", "5");
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
        .map_err(|e| kafka_error("create producer", e))?;
    if guarantee == Guarantee::ExactlyOnce {
        producer.init_transactions(REQUEST_TIMEOUT).map_err(|e| {
            ProcessorError::ExactlyOnceUnavailable(format!(
                "the cluster at {} refused Kafka transactions ({e})",
                client.bootstrap()
            ))
        })?;
    }
    Ok(producer)
}

fn group_consumer(
    client: &KafkaClient,
    config: &ProcessorConfig,
) -> Result<BaseConsumer<GroupContext>, ProcessorError> {
    let consumer: BaseConsumer<GroupContext> = base_config(client.bootstrap())
        .set("group.id", &config.application)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("partition.assignment.strategy", "range")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .create_with_context(GroupContext { changed: AtomicBool::new(false) })
        .map_err(|e| kafka_error("create consumer", e))?;
    let inputs: Vec<&str> = config.inputs.iter().map(String::as_str).collect();
    consumer.subscribe(&inputs).map_err(|e| kafka_error("subscribe", e))?;
    Ok(consumer)
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
    };
    let mut tasks: BTreeMap<u32, Task<P>> = BTreeMap::new();
    let mut stats = RunStats::default();
    let mut last_check = Instant::now();
    let mut idle = false;
    loop {
        if let Until::Stopped(stop) = until {
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
        for polled in 0..POLL_BURST {
            let wait = if polled == 0 && idle { POLL_WAIT } else { Duration::ZERO };
            let Some(message) = consumer.poll(wait) else { break };
            let message = message.map_err(|e| kafka_error("poll", e))?;
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
            if buffer.last.is_none_or(|last| record.offset > last) {
                buffer.last = Some(record.offset);
                buffer.last_arrival = Instant::now();
                buffer.records.push_back(record);
            }
        }
        if consumer.context().changed.swap(false, Ordering::SeqCst) {
            reconcile(client, config, &consumer, &log, &mut tasks, &mut stats, factory)?;
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
        let end = client.end_offset(element.topic(), element.partition() as u32).map_err(cluster)?;
        let at = match element.offset() {
            KafkaOffset::Offset(at) => u64::try_from(at).unwrap_or(0),
            _ => 0,
        };
        if at < end {
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
    let gone: Vec<u32> = tasks.keys().filter(|p| !owned.contains(p)).copied().collect();
    for partition in gone {
        if let Some(mut task) = tasks.remove(&partition) {
            stats.add(std::mem::take(&mut task.stats));
        }
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
        let restore_log = RestoreLog { client, reader: RefCell::new(None) };
        let mut restored = RunStats::default();
        let mut stores = BTreeMap::new();
        for name in &config.stores {
            let store = restore(&restore_log, config, name, partition, &mut restored)?;
            stores.insert(name.clone(), store);
        }
        tracing::info!(partition, ?positions, restored = restored.restored, "partition assigned");
        let task =
            Task::start(config, partition, factory(partition), stores, positions, now_ms());
        tasks.insert(partition, task.with_stats(config, restored)?);
        for input in &config.inputs {
            buffers.insert((input.clone(), partition), Buffer::new());
        }
    }
    Ok(())
}
