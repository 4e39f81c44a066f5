//! Consumer offsets and transactions: commits to the offsets topic, and a transaction's
//! batches, fsyncs and end markers, which share the write path's turns.

use super::Engine;
use crate::error::{AppendError, CommitError, IoError, OpenError, ReadError, TopicError};
use crate::groups::{self, CommitKey, Committed, OFFSETS_TOPIC};
use crate::io::Io;
use crate::log::Durability;
use crate::metrics::Metrics;
use crate::partition::{Appended, Partition};
use crate::{Corruption, Offset, Record};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// A partition a transaction holds, the partition's name, and what its batch got.
type Held<'a, I> = (Arc<Partition<I>>, (&'a str, u32), Appended);

/// The consumer offsets a transaction commits ([`Engine::commit_transaction`]): for `group`,
/// each `(topic, partition, offset to read next)`.
#[derive(Clone, Copy, Debug)]
pub struct GroupCommit<'a> {
    pub group: &'a str,
    pub offsets: &'a [(&'a str, u32, Offset)],
}

/// One write of a transaction ([`Engine::commit_transaction`]).
#[derive(Clone, Copy, Debug)]
pub struct TransactionWrite<'a> {
    pub topic: &'a str,
    pub partition: u32,
    pub records: &'a [Record<'a>],
}

impl<I: Io> Engine<I> {
    /// Commit consumer positions for `group`: for each `(topic, partition, offset)`, the
    /// offset the group reads next. All of them are one batch of the internal topic
    /// `__consumer_offsets` (created at the first commit): they commit together or not at
    /// all, and are durable when this returns, in every durability mode.
    pub fn commit_offsets(
        &self,
        group: &str,
        offsets: &[(&str, u32, Offset)],
    ) -> Result<(), CommitError> {
        let keys = self.commit_keys_of(group, offsets)?;
        if keys.is_empty() {
            return Ok(());
        }
        self.commit_keys(keys)
    }

    /// The commit records of `group`'s `offsets`, checked: a valid group name, and existing
    /// partitions of user topics.
    fn commit_keys_of(
        &self,
        group: &str,
        offsets: &[(&str, u32, Offset)],
    ) -> Result<Vec<(CommitKey, Offset)>, CommitError> {
        groups::validate_group(group)?;
        let mut keys = Vec::with_capacity(offsets.len());
        for &(topic, partition, offset) in offsets {
            if self.partition(topic, partition).is_err() || groups::is_internal(topic) {
                let topic = topic.to_owned();
                return Err(CommitError::PartitionNotFound { topic, partition });
            }
            let key = CommitKey { group: group.to_owned(), topic: topic.to_owned(), partition };
            keys.push((key, offset));
        }
        Ok(keys)
    }

    /// Append to several partitions and commit consumer offsets, all or nothing: after a crash
    /// at any moment, either every write and every offset is there, or none is. Readers see
    /// a transaction's records only once it has committed, and then all of them (each
    /// partition's at once). Each `(topic, partition)` gets one batch, the records of all its
    /// writes in order; offsets are committed for `group` as [`Engine::commit_offsets`] does.
    ///
    /// How: each partition's batch is written flagged transactional and fdatasynced while the
    /// partition is held (appends and other transactions on it wait; partitions are taken in
    /// name order, so transactions never wait in a cycle); then one batch in
    /// `__consumer_offsets` holding the group's offsets and, per partition, where the
    /// transaction's batch ends, is made durable: the commit point. The partitions are then
    /// released and their records shown. Recovery removes a transactional batch at the end of
    /// a partition that no commit record covers. Any I/O failure poisons the engine; the next
    /// open decides by the commit record. Returns the offsets each write got, in the order of
    /// `writes`.
    pub fn commit_transaction(
        &self,
        writes: &[TransactionWrite<'_>],
        offsets: Option<GroupCommit<'_>>,
    ) -> Result<Vec<Appended>, CommitError> {
        let context = &self.inner.context;
        let started = context.clock.monotonic_us();
        let result = self.commit_transaction_unmeasured(writes, offsets);
        let m = &context.metrics;
        match &result {
            Ok(appended) => {
                Metrics::add(&m.appends, appended.len() as u64);
                let records = appended
                    .iter()
                    .map(|a| (a.last_offset.get() + 1).saturating_sub(a.base_offset.get()));
                Metrics::add(&m.records_appended, records.sum());
                m.append_latency.record(context.clock.monotonic_us().saturating_sub(started));
            }
            Err(_) => Metrics::add(&m.append_errors, 1),
        }
        result
    }

    fn commit_transaction_unmeasured(
        &self,
        writes: &[TransactionWrite<'_>],
        offsets: Option<GroupCommit<'_>>,
    ) -> Result<Vec<Appended>, CommitError> {
        self.check_writable()?;
        self.inner.context.poison.check().map_err(AppendError::from)?;
        let mut keys = match offsets {
            Some(GroupCommit { group, offsets }) => self.commit_keys_of(group, offsets)?,
            None => Vec::new(),
        };
        // One batch per partition, the partitions in name order.
        let mut merged: BTreeMap<(&str, u32), Vec<Record<'_>>> = BTreeMap::new();
        for write in writes {
            if groups::is_internal(write.topic)
                || self.partition(write.topic, write.partition).is_err()
            {
                let (topic, partition) = (write.topic.to_owned(), write.partition);
                return Err(CommitError::PartitionNotFound { topic, partition });
            }
            merged
                .entry((write.topic, write.partition))
                .or_default()
                .extend_from_slice(write.records);
        }
        merged.retain(|_, records| !records.is_empty());
        if merged.is_empty() {
            return if keys.is_empty() {
                Ok(Vec::new())
            } else {
                self.commit_keys(keys).map(|()| Vec::new())
            };
        }
        let mut held: Vec<Held<'_, I>> = Vec::new();
        // Every partition's end queued before any is waited for: one turn.
        let release = |held: &[Held<'_, I>], committed: bool| {
            let ends: Vec<_> = held
                .iter()
                .filter_map(|(partition, _, _)| partition.submit_end_transaction(committed))
                .collect();
            for end in ends {
                let _ = end.wait();
            }
        };
        #[cfg_attr(not(loom), allow(unused_mut))]
        let mut order: Vec<(&(&str, u32), &Vec<Record<'_>>)> = merged.iter().collect();
        #[cfg(loom)]
        if crate::sync::bugs::active(crate::sync::bugs::Bug::UnorderedTransaction) {
            let first =
                |key: &(&str, u32)| writes.iter().position(|w| (w.topic, w.partition) == *key);
            order.sort_by_key(|(key, _)| first(key));
        }
        for (&(topic, id), records) in order {
            let partition = self.partition_for_append(topic, id)?;
            match partition.begin_transaction(records) {
                Ok(appended) => held.push((partition, (topic, id), appended)),
                Err(error) => {
                    release(&held, false);
                    return Err(error.into());
                }
            }
        }
        let early =
            crate::canary::active(crate::canary::Canary::TransactionCommittedBeforeDataSynced);
        // Every partition's sync queued before any is waited for: their fdatasyncs share a turn.
        let sync_all = || -> Result<(), AppendError> {
            let syncs: Vec<_> = held
                .iter()
                .map(|(partition, _, _)| {
                    partition.submit(crate::partition::Request::SyncTransaction)
                })
                .collect::<Result<_, _>>()?;
            syncs.into_iter().try_for_each(|sync| sync.wait().map(|_| ()))
        };
        if let Err(error) = if early { Ok(()) } else { sync_all() } {
            release(&held, false);
            return Err(error.into());
        }
        for (_, (topic, id), appended) in &held {
            keys.push((CommitKey::transaction(topic, *id), appended.last_offset.plus(1)));
        }
        let committed = self
            .commit_keys(keys)
            .and_then(|()| if early { sync_all().map_err(CommitError::from) } else { Ok(()) });
        release(&held, committed.is_ok());
        committed?;
        let by_partition: BTreeMap<(&str, u32), Appended> =
            held.iter().map(|(_, key, appended)| (*key, *appended)).collect();
        // A partition written twice got one batch: each write reports the batch's range.
        Ok(writes
            .iter()
            .filter_map(|w| by_partition.get(&(w.topic, w.partition)).copied())
            .collect())
    }

    /// Append commit records to `__consumer_offsets` (creating it first) and make them
    /// durable; then take them into the committed map.
    fn commit_keys(&self, keys: Vec<(CommitKey, Offset)>) -> Result<(), CommitError> {
        let mut committed = self.inner.committed.lock();
        if self.topic(OFFSETS_TOPIC).is_none() {
            match self.create_any_topic(OFFSETS_TOPIC, groups::offsets_topic_config()) {
                Ok(()) | Err(TopicError::AlreadyExists { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        let encoded = groups::encode_commit(&keys);
        self.append(OFFSETS_TOPIC, 0, &groups::records(&encoded))?;
        if self.inner.options.durability != Durability::Sync
            && !crate::canary::active(crate::canary::Canary::CommitNotDurable)
        {
            let partition = self.partition_for_append(OFFSETS_TOPIC, 0)?;
            partition.flush()?;
        }
        for (key, offset) in keys {
            committed.insert(key, offset);
        }
        Ok(())
    }

    /// The offset `group` committed last for a partition, if any.
    pub fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Option<Offset> {
        let key = CommitKey { group: group.to_owned(), topic: topic.to_owned(), partition };
        self.inner.committed.lock().get(&key)
    }

    /// The damage in the consumer offsets topic that hid commit records at open, if any: then
    /// a group's committed offset may be an older one than its last commit, and a consumer
    /// that resumes from it would read records again.
    pub fn committed_offsets_damage(&self) -> Option<Corruption> {
        self.inner.committed.lock().damage.clone()
    }

    /// Every offset `group` committed, as `(topic, partition, offset)`, sorted.
    pub fn committed_offsets(&self, group: &str) -> Vec<(String, u32, Offset)> {
        self.inner.committed.lock().of_group(group)
    }

    /// Rebuild the committed offsets from the offsets topic, every record in order.
    pub(super) fn load_committed(
        partition: &Partition<I>,
        path: &Path,
    ) -> Result<Committed, OpenError> {
        let mut committed = Committed::default();
        let end = partition.high_watermark();
        let mut next = partition.describe().log_start_offset;
        while next < end {
            let fetch = partition.read(next, 1 << 20).map_err(|error| match error {
                ReadError::Corruption(corruption) => OpenError::Corruption(corruption),
                ReadError::Io(error) => OpenError::Io(error),
                other => OpenError::Io(IoError::new(
                    "read consumer offsets",
                    path,
                    std::io::Error::other(other.to_string()),
                )),
            })?;
            if fetch.is_empty() {
                break;
            }
            for record in fetch.records().filter(|r| r.offset() >= next) {
                committed.apply(&record, path)?;
            }
            next = fetch.next_offset();
        }
        if let Err(ReadError::Corruption(corruption)) = partition.read(next, 1) {
            // Damage (reported by the open) hides the records after it: which transaction
            // committed is unknown, so none is rolled back, and no group's position is known.
            committed.damage = Some(corruption);
        }
        Ok(committed)
    }
}
