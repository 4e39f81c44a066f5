//! Producers: append records to one topic of an embedded data directory.
//!
//! A record with a key goes to the key's partition ([`partition_for_key`]), one without to
//! partition 0, unless a partition is named (the `_to` methods). The names match Python's
//! `Producer` (see docs/api.md): `send`, `send_batch`, `send_async`, `flush`.
//!
//! Invariants: records of one partition are appended in the order of the calls; a batch
//! never passes the engine's limits (`send_batch` cuts it, `send_to` leaves it whole for the
//! engine to refuse); a batch is acknowledged whole or not at all.

use crate::limits::{BATCH_BYTES_MAX, BATCH_HEADER_BYTES, BATCH_RECORDS_MAX};
use crate::{AppendError, Appended, DefaultEngine, Offset, PendingAppend, Record, TopicError};
use chronik_engine::partition_for_key;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Appends records to one topic.
#[derive(Debug, Clone)]
pub struct Producer {
    engine: DefaultEngine,
    topic: String,
}

/// Where a record went: its partition and offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub partition: u32,
    pub offset: Offset,
}

/// One batch [`Producer::send_batch`] appended: its partition and offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SentBatch {
    pub partition: u32,
    pub appended: Appended,
}

impl Producer {
    pub(crate) fn new(engine: DefaultEngine, topic: &str) -> Producer {
        Producer { engine, topic: topic.to_owned() }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Append one record to its key's partition (partition 0 without a key); returns once
    /// acknowledged under the directory's durability.
    pub fn send(&mut self, record: Record<'_>) -> Result<Sent, AppendError> {
        let partition = self.partition_of(record.key)?;
        let appended = self.engine.append(&self.topic, partition, &[record])?;
        assert_eq!(appended.base_offset, appended.last_offset, "one record, one offset");
        Ok(Sent { partition, offset: appended.base_offset })
    }

    /// Append `records` as one batch to `partition`, atomically; returns once acknowledged.
    pub fn send_to(
        &mut self,
        partition: u32,
        records: &[Record<'_>],
    ) -> Result<Appended, AppendError> {
        self.engine.append(&self.topic, partition, records)
    }

    /// Append many records: each to its key's partition (or all to `partition`), one batch
    /// per partition, cut further where a batch would pass the engine's limits. Batches are
    /// appended in order, each atomic on its own: when one fails, the earlier ones stay.
    pub fn send_batch(
        &mut self,
        records: &[Record<'_>],
        partition: Option<u32>,
    ) -> Result<Vec<SentBatch>, AppendError> {
        // The partition count is looked up once for the batch, not once per record.
        let count = if partition.is_none() && !records.is_empty() { self.partitions()? } else { 1 };
        let mut by_partition: BTreeMap<u32, Vec<Record<'_>>> = BTreeMap::new();
        for record in records {
            let target = partition
                .unwrap_or_else(|| record.key.map_or(0, |key| partition_for_key(key, count)));
            by_partition.entry(target).or_default().push(*record);
        }
        let mut sent = Vec::with_capacity(by_partition.len());
        for (partition, records) in by_partition {
            for batch in split_batch(records) {
                let appended = self.engine.append(&self.topic, partition, &batch)?;
                sent.push(SentBatch { partition, appended });
            }
        }
        assert!(sent.len() <= records.len(), "no batch is empty");
        Ok(sent)
    }

    /// Queue one record for its key's partition and return at once with the append in
    /// flight: many sends share the engine's turns and, in `sync` mode, their fdatasyncs.
    /// Offsets follow the order of the calls per partition; [`Producer::flush`] waits for
    /// everything queued so far.
    pub fn send_async(&mut self, record: Record<'_>) -> Result<PendingSend, AppendError> {
        let partition = self.partition_of(record.key)?;
        let append = self.engine.append_nowait(&self.topic, partition, &[record])?;
        Ok(PendingSend { partition, append })
    }

    /// Queue `records` as one batch to `partition` and return at once, with the append in
    /// flight. Wait for the [`PendingAppend`], poll it, or `.await` it (the directory's
    /// runtime drives the engine meanwhile).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let db = chronik::Chronik::open(dir.path(), chronik::Options::default()).unwrap();
    /// db.create_topic("clicks", chronik::TopicConfig::default()).unwrap();
    /// let mut producer = db.producer("clicks");
    /// let pending: Vec<_> = (0..1000u32)
    ///     .map(|i| producer.send_async_to(0, &[chronik::Record::new(None, &i.to_le_bytes())]))
    ///     .collect::<Result<_, _>>()
    ///     .unwrap();
    /// let last = pending.into_iter().map(|p| p.wait().unwrap()).last().unwrap();
    /// assert_eq!(last.last_offset.get(), 999);
    /// ```
    pub fn send_async_to(
        &mut self,
        partition: u32,
        records: &[Record<'_>],
    ) -> Result<PendingAppend, AppendError> {
        self.engine.append_nowait(&self.topic, partition, records)
    }

    /// Make every batch queued so far (to any topic of the directory) durable.
    pub fn flush(&mut self) -> Result<(), AppendError> {
        self.engine.flush()
    }

    /// The partition for a key: xxh3 of the key modulo the partition count, so records with the
    /// same key keep their order in one partition.
    pub fn partition_for_key(&self, key: &[u8]) -> Result<u32, AppendError> {
        Ok(partition_for_key(key, self.partitions()?))
    }

    /// The topic's partition count, as an append's error when the topic is missing or damaged.
    fn partitions(&self) -> Result<u32, AppendError> {
        self.engine.topic_partitions(&self.topic).map_err(|error| match error {
            TopicError::Corruption(corruption) => AppendError::Corruption(corruption),
            _ => AppendError::TopicNotFound { topic: self.topic.clone() },
        })
    }

    fn partition_of(&self, key: Option<&[u8]>) -> Result<u32, AppendError> {
        key.map_or(Ok(0), |key| self.partition_for_key(key))
    }
}

/// A record [`Producer::send_async`] queued.
#[derive(Debug)]
pub struct PendingSend {
    partition: u32,
    append: PendingAppend,
}

impl PendingSend {
    /// The partition the record goes to.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// Wait for the acknowledgement.
    pub fn wait(self) -> Result<Sent, AppendError> {
        let appended = self.append.wait()?;
        Ok(Sent { partition: self.partition, offset: appended.base_offset })
    }
}

impl Future for PendingSend {
    type Output = Result<Sent, AppendError>;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let partition = self.partition;
        Pin::new(&mut self.append)
            .poll(context)
            .map(|result| result.map(|a| Sent { partition, offset: a.base_offset }))
    }
}

/// `records` cut, in order, into batches within the engine's limits: at most
/// `BATCH_RECORDS_MAX` records and `BATCH_BYTES_MAX` encoded bytes each. A record too large
/// for any batch stays alone in one, for the engine to refuse with `BatchTooLarge`.
pub(crate) fn split_batch(records: Vec<Record<'_>>) -> Vec<Vec<Record<'_>>> {
    let records_max = BATCH_RECORDS_MAX as usize;
    let bytes_max = u64::from(BATCH_BYTES_MAX);
    let header_bytes = BATCH_HEADER_BYTES as u64;
    let total: u64 = records.iter().map(Record::encoded_bytes).sum();
    if records.len() <= records_max && header_bytes + total <= bytes_max {
        // The common case: one batch, not copied.
        return vec![records];
    }
    let count = records.len();
    let mut batches = Vec::new();
    let mut batch: Vec<Record<'_>> = Vec::new();
    let mut bytes = header_bytes;
    for record in records {
        let size = record.encoded_bytes();
        if !batch.is_empty() && (batch.len() == records_max || bytes + size > bytes_max) {
            batches.push(std::mem::take(&mut batch));
            bytes = header_bytes;
        }
        bytes += size;
        batch.push(record);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    assert!(batches.iter().all(|b| !b.is_empty() && b.len() <= records_max), "batches fit");
    assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), count, "no record lost or doubled");
    batches
}
