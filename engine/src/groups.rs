//! Consumer groups: committed offsets, stored in the internal topic `__consumer_offsets`
//! (one partition, `cleanup = compact`), the latest commit of every (group, topic, partition)
//! kept in memory and rebuilt from the topic at open.
//!
//! A commit is one batch (all its partitions commit together or not at all) and is durable
//! when it returns, whatever the engine's durability mode: in `os` and `interval` modes the
//! offsets partition is fsynced before the commit returns. Record layout (little endian):
//! key = `u16` group length, group, `u16` topic length, topic, `u32` partition; value = `u64`
//! offset.

use crate::error::{CommitError, Corruption, CorruptionKind};
use crate::topic::{Cleanup, TopicConfig, validate_name};
use crate::{Offset, Record};
use std::collections::BTreeMap;

/// The internal topic holding committed offsets. Names starting with `__` are reserved.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Whether `name` is reserved for the engine's internal topics.
pub fn is_internal(name: &str) -> bool {
    name.starts_with("__")
}

/// The internal topic's settings: one partition, compacted, segments small enough to clean.
pub fn offsets_topic_config() -> TopicConfig {
    TopicConfig {
        partitions: 1,
        segment_bytes: 16 * 1024 * 1024,
        cleanup: Cleanup::Compact,
        ..TopicConfig::default()
    }
}

/// What a commit is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitKey {
    pub group: String,
    pub topic: String,
    pub partition: u32,
}

impl CommitKey {
    /// A transaction commit record's key: the empty group name, which no consumer group may
    /// take; its value is the offset where the transaction's batch on the partition ended.
    pub fn transaction(topic: &str, partition: u32) -> CommitKey {
        CommitKey { group: String::new(), topic: topic.to_owned(), partition }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut key = Vec::with_capacity(8 + self.group.len() + self.topic.len());
        for text in [&self.group, &self.topic] {
            let length = u16::try_from(text.len()).expect("names are at most 200 bytes");
            key.extend_from_slice(&length.to_le_bytes());
            key.extend_from_slice(text.as_bytes());
        }
        key.extend_from_slice(&self.partition.to_le_bytes());
        key
    }

    pub fn decode(bytes: &[u8]) -> Option<CommitKey> {
        let mut rest = bytes;
        let mut text = || -> Option<String> {
            let length = usize::from(u16::from_le_bytes(rest.get(..2)?.try_into().ok()?));
            let value = std::str::from_utf8(rest.get(2..2 + length)?).ok()?.to_owned();
            rest = &rest[2 + length..];
            Some(value)
        };
        let group = text()?;
        let topic = text()?;
        let partition = u32::from_le_bytes(rest.try_into().ok()?);
        Some(CommitKey { group, topic, partition })
    }
}

/// Check a group name: the rules of topic names.
pub fn validate_group(group: &str) -> Result<(), CommitError> {
    validate_name(group).map_err(|_| CommitError::InvalidGroup {
        name: group.to_owned(),
        reason: "must be 1 to 200 bytes of ASCII letters, digits, '.', '_' and '-', not starting \
                 with '.'",
    })
}

/// The records of one commit.
pub fn encode_commit(keys: &[(CommitKey, Offset)]) -> Vec<(Vec<u8>, [u8; 8])> {
    keys.iter().map(|(key, offset)| (key.encode(), offset.get().to_le_bytes())).collect()
}

/// The latest committed offset per key, from the offsets topic's records in order. A record
/// that does not decode is damage, as a batch that fails its checksum is: kept in `damage`.
#[derive(Debug, Default)]
pub struct Committed {
    latest: BTreeMap<CommitKey, Offset>,
    /// The first damage found in the offsets topic (or the topic itself kept closed by
    /// damage): commit records in the damaged part could not be read, so a key's latest
    /// commit may be one of them, and which transactions committed is unknown.
    pub damage: Option<Corruption>,
}

impl Committed {
    /// Take in one record of the offsets topic.
    pub fn apply(
        &mut self,
        record: &crate::RecordView<'_>,
        file: &std::path::Path,
    ) -> Result<(), Corruption> {
        let malformed = || Corruption {
            file: file.to_path_buf(),
            position: 0,
            kind: CorruptionKind::Malformed { reason: "a consumer offset record does not decode" },
        };
        let key = record.key().and_then(CommitKey::decode).ok_or_else(malformed)?;
        if record.value().is_empty() {
            // A tombstone: the commit is forgotten.
            self.latest.remove(&key);
            return Ok(());
        }
        let value: [u8; 8] = record.value().try_into().map_err(|_| malformed())?;
        self.latest.insert(key, Offset::new(u64::from_le_bytes(value)));
        Ok(())
    }

    pub fn insert(&mut self, key: CommitKey, offset: Offset) {
        self.latest.insert(key, offset);
    }

    /// Where the last committed transaction on a partition ended (0 if none did).
    /// With the offsets topic damaged, every transaction counts as committed: keeping one
    /// that was not is reported damage, rolling back one that was would be silent loss.
    pub fn transaction_end(&self, topic: &str, partition: u32) -> Offset {
        if self.damage.is_some() {
            return Offset::new(u64::MAX);
        }
        self.get(&CommitKey::transaction(topic, partition)).unwrap_or(Offset::ZERO)
    }

    /// Every commit record of `topic`: its transaction commit records and every group's
    /// committed offsets. A deleted topic's records are all forgotten (by its delete, or by a
    /// create of the same name should a crash have come first): a topic created again under
    /// the name starts empty, and an offset of the old one would point past its end or at
    /// other records.
    pub fn keys_of_topic(&self, topic: &str) -> Vec<CommitKey> {
        self.latest.keys().filter(|key| key.topic == topic).cloned().collect()
    }

    pub fn remove(&mut self, key: &CommitKey) {
        self.latest.remove(key);
    }

    pub fn get(&self, key: &CommitKey) -> Option<Offset> {
        self.latest.get(key).copied()
    }

    /// Every committed offset of `group`, by topic and partition.
    pub fn of_group(&self, group: &str) -> Vec<(String, u32, Offset)> {
        self.latest
            .iter()
            .filter(|(key, _)| key.group == group)
            .map(|(key, offset)| (key.topic.clone(), key.partition, *offset))
            .collect()
    }
}

/// Records for `Engine::append`, borrowing `encoded`.
pub fn records(encoded: &[(Vec<u8>, [u8; 8])]) -> Vec<Record<'_>> {
    encoded.iter().map(|(key, value)| Record::new(Some(key), value)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_garbage_is_refused() {
        let key = CommitKey { group: "billing".into(), topic: "clicks".into(), partition: 7 };
        assert_eq!(CommitKey::decode(&key.encode()), Some(key.clone()));
        let bytes = key.encode();
        assert_eq!(CommitKey::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(CommitKey::decode(&[200, 0, 1]), None);
        assert_eq!(CommitKey::decode(&[]), None);
        assert!(validate_group("").is_err());
        assert!(validate_group("ok-group").is_ok());
    }
}
