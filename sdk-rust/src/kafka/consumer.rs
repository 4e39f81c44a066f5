//! A consumer of one partition of a cluster, in a consumer group or outside one: the cluster
//! side of [`crate::LogConsumer`].

// Kafka numbers partitions with i32, Chronik with u32 (see the module above).
#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

use super::{ClusterError, KafkaConfig, PartitionReader, REQUEST_TIMEOUT};
use crate::{Offset, OwnedRecord};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};

/// Records one step of a [`ClusterConsumer`]'s iteration reads at most.
const CONSUMER_BATCH: usize = 1_000;

/// A consumer of one partition of a cluster, as [`crate::Consumer`] is of a data directory.
///
/// In a group, it starts where the group committed last and [`ClusterConsumer::commit`]
/// stores its position as the group's committed offset in the cluster. As on the engine, a
/// group is only committed positions here: no membership, no rebalances (processors use
/// Kafka's group membership; see [`crate::processor`]). Iterating stops once caught up;
/// iterate again later for more.
pub struct ClusterConsumer {
    config: std::sync::Arc<KafkaConfig>,
    topic: String,
    partition: u32,
    reader: PartitionReader,
    /// The group's name and the client that reads and commits its offsets.
    group: Option<(String, BaseConsumer)>,
    buffered: std::collections::VecDeque<OwnedRecord>,
    /// The offset after the last record handed out.
    position: u64,
}

impl std::fmt::Debug for ClusterConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConsumer")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("group", &self.group.as_ref().map(|(name, _)| name))
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl ClusterConsumer {
    pub(super) fn new(
        config: std::sync::Arc<KafkaConfig>,
        topic: &str,
        partition: u32,
        group: Option<&str>,
    ) -> Result<ClusterConsumer, ClusterError> {
        let group = group
            .map(|name| {
                let mut settings = config.client_config()?;
                settings.set("group.id", name).set("enable.auto.commit", "false");
                let client: BaseConsumer = settings
                    .create()
                    .map_err(|e| config.client_error("create group client", &e))?;
                Ok::<_, ClusterError>((name.to_owned(), client))
            })
            .transpose()?;
        let position = match &group {
            Some((_, client)) => committed(client, topic, partition)?.unwrap_or(0),
            None => 0,
        };
        Ok(ClusterConsumer {
            reader: PartitionReader::new(&config, topic, partition, position)?,
            config,
            topic: topic.to_owned(),
            partition,
            group,
            buffered: std::collections::VecDeque::new(),
            position,
        })
    }

    /// The offset of the next record this consumer reads.
    pub fn position(&self) -> Offset {
        Offset::new(self.position)
    }

    /// Read from `offset` on.
    pub fn seek(&mut self, offset: Offset) -> Result<(), ClusterError> {
        let offset = offset.get();
        self.reader = PartitionReader::new(&self.config, &self.topic, self.partition, offset)?;
        self.buffered.clear();
        self.position = offset;
        Ok(())
    }

    /// The consumer group, if any.
    pub fn group(&self) -> Option<&str> {
        self.group.as_ref().map(|(name, _)| name.as_str())
    }

    /// Commit the position (the next offset to read) as the group's offset, synchronously.
    pub fn commit(&self) -> Result<(), ClusterError> {
        let Some((_, client)) = &self.group else {
            return Err(ClusterError::kafka("commit", "this consumer is in no group"));
        };
        let mut offsets = TopicPartitionList::new();
        let offset = KafkaOffset::Offset(i64::try_from(self.position).unwrap_or(i64::MAX));
        offsets
            .add_partition_offset(&self.topic, self.partition as i32, offset)
            .map_err(|e| ClusterError::kafka("commit", e))?;
        client
            .commit(&offsets, rdkafka::consumer::CommitMode::Sync)
            .map_err(|e| ClusterError::kafka("commit", e))
    }

    /// What the group committed last for this partition.
    pub fn committed(&self) -> Result<Option<Offset>, ClusterError> {
        match &self.group {
            Some((_, client)) => {
                Ok(committed(client, &self.topic, self.partition)?.map(Offset::new))
            }
            None => Ok(None),
        }
    }

    /// Up to `max` records from the position on; empty when caught up. Reads the cluster
    /// [`CONSUMER_BATCH`] records at a time, whatever `max` is.
    pub fn next_batch(&mut self, max: usize) -> Result<Vec<OwnedRecord>, ClusterError> {
        if self.buffered.is_empty() {
            self.buffered.extend(self.reader.next_batch(CONSUMER_BATCH)?);
        }
        let records: Vec<OwnedRecord> =
            self.buffered.drain(..max.min(self.buffered.len())).collect();
        if let Some(last) = records.last() {
            self.position = last.offset.get() + 1;
        }
        Ok(records)
    }
}

impl Iterator for ClusterConsumer {
    type Item = Result<OwnedRecord, ClusterError>;

    /// The next record, or `None` once caught up (iterate again later for more).
    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch(1).map(|batch| batch.into_iter().next()).transpose()
    }
}

/// The offset `client`'s group committed for `topic`/`partition`, if any.
fn committed(
    client: &BaseConsumer,
    topic: &str,
    partition: u32,
) -> Result<Option<u64>, ClusterError> {
    let mut asked = TopicPartitionList::new();
    asked.add_partition(topic, partition as i32);
    let answer = client
        .committed_offsets(asked, REQUEST_TIMEOUT)
        .map_err(|e| ClusterError::kafka("committed offsets", e))?;
    let offset = answer.find_partition(topic, partition as i32).map(|e| e.offset());
    Ok(match offset {
        Some(KafkaOffset::Offset(offset)) => u64::try_from(offset).ok(),
        _ => None,
    })
}
