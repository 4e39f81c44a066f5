//! Consumer offsets and transactions: commits to the offsets topic, and a transaction's
//! batches, fsyncs and end markers, which share the write path's turns.

use super::{Engine, Missing};
use crate::error::{AppendError, CommitError, IoError, ReadError, TopicError};
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
            self.check_committable(topic, partition)?;
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
    /// a partition that no commit record covers. Any I/O failure poisons the engine, and so does
    /// a commit point refused once batches are written; the next open decides by the commit
    /// record. Refused before anything is written while `__consumer_offsets` is damaged so that
    /// it takes no commit record (see [`Engine::committed_offsets_damage`]). Returns the
    /// offsets each write got, in the order of `writes`.
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
            self.check_committable(write.topic, write.partition)?;
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
        // Before any batch is written: a batch left uncommitted because the commit point was
        // refused for damage would be kept by the next open, which with the offsets topic
        // damaged cannot tell which transactions committed.
        self.check_offsets_appendable()?;
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
        if let Err(error) = &committed
            && self.inner.context.poison.check().is_ok()
        {
            // The batches are written and synced, and nothing takes them back from a log:
            // fail-stop, so the next open decides by the commit records (none: rolled back).
            // Left running, the partitions would wait behind batches never shown.
            let reason = format!("a transaction's commit failed after its batches: {error}");
            self.inner.context.poison.set(reason);
        }
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

    /// A partition of a user topic that exists: `PartitionNotFound`, or the damage that keeps
    /// its topic closed.
    fn check_committable(&self, topic: &str, partition: u32) -> Result<(), CommitError> {
        match self.partition(topic, partition) {
            Ok(_) if !groups::is_internal(topic) => Ok(()),
            Err(Missing::Damaged(damage)) if !groups::is_internal(topic) => {
                Err(TopicError::Corruption(damage).into())
            }
            _ => {
                let topic = topic.to_owned();
                Err(CommitError::PartitionNotFound { topic, partition })
            }
        }
    }

    /// Whether a commit record could be appended now: not when `__consumer_offsets` is kept
    /// closed by damage, or its partition refuses appends for damage at its end.
    fn check_offsets_appendable(&self) -> Result<(), CommitError> {
        if let Some(damage) = self.damage_of(OFFSETS_TOPIC) {
            return Err(TopicError::Corruption(damage).into());
        }
        let partition = self.topic(OFFSETS_TOPIC).and_then(|t| t.partitions.first().cloned());
        match partition.and_then(|p| p.append_refusal()) {
            Some(damage) => Err(AppendError::Corruption(damage).into()),
            None => Ok(()),
        }
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

    /// The damage in the consumer offsets topic that hid commit records at open, if any (the
    /// first found; also the topic's own damage when it is kept closed). Then a group's
    /// committed offset may be an older one than its last commit (whose record was in the
    /// damaged part), and a consumer that resumes from it would read records again; recovery
    /// rolled no transaction back, since which committed is unknown. Commits go on while the
    /// topic takes appends (damage in a sealed segment), after the damage, and the next open
    /// reads them; they are refused with the `Corruption` when the damage is at the end of its
    /// log or the topic is kept closed.
    pub fn committed_offsets_damage(&self) -> Option<Corruption> {
        self.inner.committed.lock().damage.clone()
    }

    /// Every offset `group` committed, as `(topic, partition, offset)`, sorted.
    pub fn committed_offsets(&self, group: &str) -> Vec<(String, u32, Offset)> {
        self.inner.committed.lock().of_group(group)
    }

    /// Rebuild the committed offsets from the offsets topic, every record in order. Damage
    /// (a batch that fails its checks, a lost segment, a record that does not decode) never
    /// fails the open: the first is kept as `damage`, the rest of the damaged segment is
    /// skipped, and reading goes on at the next segment, so commits acknowledged after the
    /// damage (they are appended after it) are still known. Only I/O errors fail.
    pub(super) fn load_committed(
        partition: &Partition<I>,
        path: &Path,
    ) -> Result<Committed, IoError> {
        let mut committed = Committed::default();
        let end = partition.high_watermark();
        let mut next = partition.describe().log_start_offset;
        loop {
            let fetch = match partition.read(next, 1 << 20) {
                Ok(fetch) => fetch,
                Err(ReadError::Corruption(corruption)) => {
                    // Damage at the end of the log is found here too (reads from there
                    // report it), also when `next` has reached the high watermark.
                    committed.damage.get_or_insert(corruption);
                    match partition.next_segment_base(next) {
                        Some(base) if base < end => {
                            next = base;
                            continue;
                        }
                        _ => break,
                    }
                }
                Err(ReadError::Io(error)) => return Err(error),
                Err(other) => {
                    let error = std::io::Error::other(other.to_string());
                    return Err(IoError::new("read consumer offsets", path, error));
                }
            };
            if fetch.is_empty() {
                break;
            }
            for record in fetch.records().filter(|r| r.offset() >= next) {
                if let Err(corruption) = committed.apply(&record, path) {
                    committed.damage.get_or_insert(corruption);
                }
            }
            assert!(fetch.next_offset() > next, "a read that is not empty moves forward");
            next = fetch.next_offset();
        }
        Ok(committed)
    }
}
