//! Topic configuration, names, and the `topic.meta` file.

use crate::error::{CorruptionKind, TopicError};
use crate::format::meta::{MetaFile, TOPIC_MAGIC, TOPIC_VERSION, TopicMeta};
use crate::limits::{PARTITIONS_MAX, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN, TOPIC_NAME_BYTES_MAX};
use zerocopy::little_endian::{I64, U16, U32, U64};

/// Name of the metadata file in each topic directory.
pub const TOPIC_META_FILE: &str = "topic.meta";

/// How a topic is laid out. Fixed at creation in this version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicConfig {
    pub partitions: u32,
    /// A segment rolls when the next batch would take it past this size.
    pub segment_bytes: u64,
    /// A segment rolls when its first record is older than this.
    pub segment_ms: i64,
    /// Bytes of batches between two entries of the sparse indexes.
    pub index_interval_bytes: u32,
}

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            partitions: 1,
            segment_bytes: 256 * 1024 * 1024,
            segment_ms: 7 * 24 * 60 * 60 * 1000,
            index_interval_bytes: 4096,
        }
    }
}

impl TopicConfig {
    #[must_use]
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    pub fn validate(&self) -> Result<(), TopicError> {
        let invalid = |reason: String| Err(TopicError::InvalidConfig { reason });
        if self.partitions == 0 || self.partitions > PARTITIONS_MAX {
            return invalid(format!("partitions must be in 1..={PARTITIONS_MAX}"));
        }
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes) {
            return invalid(format!(
                "segment_bytes must be in {SEGMENT_BYTES_MIN}..={SEGMENT_BYTES_MAX}"
            ));
        }
        if self.segment_ms <= 0 {
            return invalid("segment_ms must be positive".to_owned());
        }
        if self.index_interval_bytes == 0 {
            return invalid("index_interval_bytes must be positive".to_owned());
        }
        Ok(())
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        TopicMeta {
            checksum: U64::new(0),
            magic: U32::new(TOPIC_MAGIC),
            version: U16::new(TOPIC_VERSION),
            reserved: U16::new(0),
            partition_count: U32::new(self.partitions),
            index_interval_bytes: U32::new(self.index_interval_bytes),
            segment_bytes: U64::new(self.segment_bytes),
            segment_ms: I64::new(self.segment_ms),
        }
        .encode()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<TopicConfig, CorruptionKind> {
        let meta = TopicMeta::decode(bytes)?;
        if meta.version() != TOPIC_VERSION {
            return Err(CorruptionKind::UnsupportedVersion { found: meta.version() });
        }
        let config = TopicConfig {
            partitions: meta.partition_count.get(),
            segment_bytes: meta.segment_bytes.get(),
            segment_ms: meta.segment_ms.get(),
            index_interval_bytes: meta.index_interval_bytes.get(),
        };
        config
            .validate()
            .map_err(|_| CorruptionKind::Malformed { reason: "invalid topic config" })?;
        Ok(config)
    }
}

/// Check a topic name: 1 to 200 bytes of ASCII letters, digits, `.`, `_` and `-`, not starting
/// with `.` (names starting with `.` are the engine's own temporary directories).
pub fn validate_name(name: &str) -> Result<(), TopicError> {
    let invalid = |reason| Err(TopicError::InvalidName { name: name.to_owned(), reason });
    if name.is_empty() || name.len() > TOPIC_NAME_BYTES_MAX {
        return invalid("must be 1 to 200 bytes long");
    }
    if name.starts_with('.') {
        return invalid("must not start with '.'");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return invalid("may hold only ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_and_damage_is_detected() {
        let config = TopicConfig::default().with_partitions(7);
        let mut bytes = config.encode();
        assert_eq!(TopicConfig::decode(&bytes), Ok(config));
        bytes[20] ^= 1;
        assert!(matches!(
            TopicConfig::decode(&bytes),
            Err(CorruptionKind::ChecksumMismatch { .. })
        ));
        assert!(matches!(TopicConfig::decode(&bytes[..10]), Err(CorruptionKind::Truncated { .. })));
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("clicks.v2_raw-1").is_ok());
        for bad in ["", ".hidden", "a/b", "sp ace", "é", &"x".repeat(201)] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn configs_are_bounded() {
        assert!(TopicConfig::default().with_partitions(0).validate().is_err());
        let tiny = TopicConfig { segment_bytes: 10, ..TopicConfig::default() };
        assert!(tiny.validate().is_err());
    }
}
