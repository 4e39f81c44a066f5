//! Topic configuration, names, and the `topic.meta` file.

use crate::error::{CorruptionKind, TopicError};
use crate::format::meta::{
    MetaFile, TOPIC_MAGIC, TOPIC_VERSION, TOPIC_VERSION_1, TopicMeta, TopicMetaV2,
};
use crate::limits::{PARTITIONS_MAX, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN, TOPIC_NAME_BYTES_MAX};
use zerocopy::little_endian::{I64, U16, U32, U64};

/// Name of the metadata file in each topic directory.
pub const TOPIC_META_FILE: &str = "topic.meta";

/// What happens to a topic's old records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cleanup {
    /// Whole old segments are removed by age (`retention_ms`) or total size
    /// (`retention_bytes`).
    #[default]
    Delete,
    /// Key-based compaction: at least the latest record of every key is kept.
    Compact,
    /// Both.
    CompactDelete,
}

impl Cleanup {
    pub fn name(self) -> &'static str {
        match self {
            Cleanup::Delete => "delete",
            Cleanup::Compact => "compact",
            Cleanup::CompactDelete => "compact+delete",
        }
    }

    /// Whether old segments are removed by retention.
    pub fn deletes(self) -> bool {
        matches!(self, Cleanup::Delete | Cleanup::CompactDelete)
    }

    /// Whether the topic is compacted.
    pub fn compacts(self) -> bool {
        matches!(self, Cleanup::Compact | Cleanup::CompactDelete)
    }

    fn code(self) -> u8 {
        match self {
            Cleanup::Delete => 0,
            Cleanup::Compact => 1,
            Cleanup::CompactDelete => 2,
        }
    }

    fn from_code(code: u8) -> Option<Cleanup> {
        [Cleanup::Delete, Cleanup::Compact, Cleanup::CompactDelete]
            .into_iter()
            .find(|c| c.code() == code)
    }
}

impl std::str::FromStr for Cleanup {
    type Err = String;

    fn from_str(text: &str) -> Result<Cleanup, String> {
        match text {
            "delete" => Ok(Cleanup::Delete),
            "compact" => Ok(Cleanup::Compact),
            "compact+delete" | "compact,delete" | "delete+compact" => Ok(Cleanup::CompactDelete),
            other => Err(format!("cleanup {other:?}: want delete, compact or compact+delete")),
        }
    }
}

/// How a topic is laid out and cleaned. Everything but `partitions` can be changed on an
/// existing topic ([`crate::Engine::alter_topic_config`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopicConfig {
    pub partitions: u32,
    /// A segment rolls when the next batch would take it past this size.
    pub segment_bytes: u64,
    /// A segment rolls when its first record is older than this.
    pub segment_ms: i64,
    /// Bytes of batches between two entries of the sparse indexes.
    pub index_interval_bytes: u32,
    pub cleanup: Cleanup,
    /// With `Delete` cleanup: a closed segment whose newest record is older than this is
    /// removed. `None`: kept forever.
    pub retention_ms: Option<i64>,
    /// With `Delete` cleanup: the oldest closed segments are removed while the partition is
    /// larger than this. `None`: no size limit.
    pub retention_bytes: Option<u64>,
    /// With `Compact` cleanup: how long a tombstone (a record with a key and no value) is kept
    /// after its segment is cleaned.
    pub delete_retention_ms: i64,
    /// With `Compact` cleanup: records younger than this are never compacted.
    pub min_compaction_lag_ms: i64,
    /// With `Compact` cleanup: a record older than this makes its log eligible for cleaning
    /// whatever the dirty ratio. `None`: no bound.
    pub max_compaction_lag_ms: Option<i64>,
    /// With `Compact` cleanup: a log is cleaned once this fraction of it is dirty (written
    /// since the last cleaning).
    pub min_cleanable_dirty_ratio: f64,
}

// Validated configs never hold a NaN ratio, the only value `==` would not be reflexive on.
impl Eq for TopicConfig {}

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            partitions: 1,
            segment_bytes: 256 * 1024 * 1024,
            segment_ms: 7 * 24 * 60 * 60 * 1000,
            index_interval_bytes: 4096,
            cleanup: Cleanup::Delete,
            retention_ms: None,
            retention_bytes: None,
            delete_retention_ms: 24 * 60 * 60 * 1000,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: None,
            min_cleanable_dirty_ratio: 0.5,
        }
    }
}

/// The keys [`TopicConfig::set`] takes, as `chronik topic config` spells them.
pub const CONFIG_KEYS: [&str; 11] = [
    "partitions",
    "segment_bytes",
    "segment_ms",
    "index_interval_bytes",
    "cleanup",
    "retention_ms",
    "retention_bytes",
    "delete_retention_ms",
    "min_compaction_lag_ms",
    "max_compaction_lag_ms",
    "min_cleanable_dirty_ratio",
];

impl TopicConfig {
    #[must_use]
    pub fn with_partitions(mut self, partitions: u32) -> Self {
        self.partitions = partitions;
        self
    }

    #[must_use]
    pub fn with_cleanup(mut self, cleanup: Cleanup) -> Self {
        self.cleanup = cleanup;
        self
    }

    /// Set one setting from text, as `KEY=VALUE` on the command line: the keys of
    /// [`CONFIG_KEYS`]; `-1` (or `none`) for "no limit" where a setting is optional. The
    /// result is checked by [`TopicConfig::validate`] only.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TopicError> {
        let invalid = |reason: String| TopicError::InvalidConfig { reason };
        let number = |value: &str| -> Result<i64, TopicError> {
            value
                .trim()
                .parse::<i64>()
                .map_err(|_| invalid(format!("{key}: {value:?} is not a whole number")))
        };
        let optional = |value: &str| -> Result<Option<i64>, TopicError> {
            if matches!(value.trim(), "none" | "-1" | "infinite") {
                return Ok(None);
            }
            let n = number(value)?;
            if n < 0 {
                return Err(invalid(format!("{key} must be -1 (no limit) or at least 0")));
            }
            Ok(Some(n))
        };
        let unsigned = |value: &str| -> Result<u64, TopicError> {
            u64::try_from(number(value)?)
                .map_err(|_| invalid(format!("{key} must not be negative")))
        };
        match key {
            "partitions" => {
                self.partitions = u32::try_from(unsigned(value)?)
                    .map_err(|_| invalid("partitions is too large".to_owned()))?;
            }
            "segment_bytes" => self.segment_bytes = unsigned(value)?,
            "segment_ms" => self.segment_ms = number(value)?,
            "index_interval_bytes" => {
                self.index_interval_bytes = u32::try_from(unsigned(value)?)
                    .map_err(|_| invalid("index_interval_bytes is too large".to_owned()))?;
            }
            "cleanup" => self.cleanup = value.trim().parse().map_err(invalid)?,
            "retention_ms" => self.retention_ms = optional(value)?,
            "retention_bytes" => {
                self.retention_bytes = optional(value)?.map(i64::unsigned_abs);
            }
            "delete_retention_ms" => self.delete_retention_ms = number(value)?,
            "min_compaction_lag_ms" => self.min_compaction_lag_ms = number(value)?,
            "max_compaction_lag_ms" => self.max_compaction_lag_ms = optional(value)?,
            "min_cleanable_dirty_ratio" => {
                self.min_cleanable_dirty_ratio = value.trim().parse().map_err(|_| {
                    invalid(format!("min_cleanable_dirty_ratio: {value:?} is not a number"))
                })?;
            }
            other => {
                return Err(invalid(format!(
                    "unknown setting {other:?}; the settings are {}",
                    CONFIG_KEYS.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Every setting as `(key, value)`, in [`CONFIG_KEYS`] order, spelled as
    /// [`TopicConfig::set`] takes them.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let optional = |v: Option<i64>| v.map_or_else(|| "-1".to_owned(), |v| v.to_string());
        vec![
            ("partitions", self.partitions.to_string()),
            ("segment_bytes", self.segment_bytes.to_string()),
            ("segment_ms", self.segment_ms.to_string()),
            ("index_interval_bytes", self.index_interval_bytes.to_string()),
            ("cleanup", self.cleanup.name().to_owned()),
            ("retention_ms", optional(self.retention_ms)),
            (
                "retention_bytes",
                self.retention_bytes.map_or_else(|| "-1".to_owned(), |v| v.to_string()),
            ),
            ("delete_retention_ms", self.delete_retention_ms.to_string()),
            ("min_compaction_lag_ms", self.min_compaction_lag_ms.to_string()),
            ("max_compaction_lag_ms", optional(self.max_compaction_lag_ms)),
            ("min_cleanable_dirty_ratio", self.min_cleanable_dirty_ratio.to_string()),
        ]
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
        if self.retention_ms.is_some_and(|ms| ms < 0) {
            return invalid("retention_ms must be at least 0, or none".to_owned());
        }
        if self.retention_bytes.is_some_and(|b| b > i64::MAX as u64) {
            return invalid("retention_bytes is too large".to_owned());
        }
        if self.delete_retention_ms < 0 || self.min_compaction_lag_ms < 0 {
            return invalid(
                "delete_retention_ms and min_compaction_lag_ms must be at least 0".to_owned(),
            );
        }
        if self.max_compaction_lag_ms.is_some_and(|ms| ms < self.min_compaction_lag_ms.max(1)) {
            return invalid(
                "max_compaction_lag_ms must be positive and at least min_compaction_lag_ms"
                    .to_owned(),
            );
        }
        if !(0.0..=1.0).contains(&self.min_cleanable_dirty_ratio) {
            return invalid("min_cleanable_dirty_ratio must be in 0..=1".to_owned());
        }
        Ok(())
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        TopicMetaV2 {
            checksum: U64::new(0),
            magic: U32::new(TOPIC_MAGIC),
            version: U16::new(TOPIC_VERSION),
            reserved: U16::new(0),
            partition_count: U32::new(self.partitions),
            index_interval_bytes: U32::new(self.index_interval_bytes),
            segment_bytes: U64::new(self.segment_bytes),
            segment_ms: I64::new(self.segment_ms),
            cleanup: self.cleanup.code(),
            reserved2: [0; 7],
            retention_ms: I64::new(self.retention_ms.unwrap_or(-1)),
            retention_bytes: I64::new(
                self.retention_bytes.map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)),
            ),
            delete_retention_ms: I64::new(self.delete_retention_ms),
            min_compaction_lag_ms: I64::new(self.min_compaction_lag_ms),
            max_compaction_lag_ms: I64::new(self.max_compaction_lag_ms.unwrap_or(-1)),
            min_cleanable_dirty_ratio: U64::new(self.min_cleanable_dirty_ratio.to_bits()),
        }
        .encode()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<TopicConfig, CorruptionKind> {
        // The version sits at bytes 12..14 in every version; the struct is chosen by it.
        let version = bytes.get(12..14).map_or(0, |v| u16::from_le_bytes([v[0], v[1]]));
        let config = if version == TOPIC_VERSION_1 {
            let meta = TopicMeta::decode(bytes)?;
            TopicConfig {
                partitions: meta.partition_count.get(),
                segment_bytes: meta.segment_bytes.get(),
                segment_ms: meta.segment_ms.get(),
                index_interval_bytes: meta.index_interval_bytes.get(),
                ..TopicConfig::default()
            }
        } else {
            let meta = TopicMetaV2::decode(bytes)?;
            if meta.version() != TOPIC_VERSION {
                return Err(CorruptionKind::UnsupportedVersion { found: meta.version() });
            }
            let optional = |v: I64| (v.get() >= 0).then(|| v.get());
            TopicConfig {
                partitions: meta.partition_count.get(),
                segment_bytes: meta.segment_bytes.get(),
                segment_ms: meta.segment_ms.get(),
                index_interval_bytes: meta.index_interval_bytes.get(),
                cleanup: Cleanup::from_code(meta.cleanup)
                    .ok_or(CorruptionKind::Malformed { reason: "unknown cleanup policy" })?,
                retention_ms: optional(meta.retention_ms),
                retention_bytes: optional(meta.retention_bytes).map(i64::unsigned_abs),
                delete_retention_ms: meta.delete_retention_ms.get(),
                min_compaction_lag_ms: meta.min_compaction_lag_ms.get(),
                max_compaction_lag_ms: optional(meta.max_compaction_lag_ms),
                min_cleanable_dirty_ratio: f64::from_bits(meta.min_cleanable_dirty_ratio.get()),
            }
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
    fn version_1_files_still_read_and_settings_parse() {
        let v1 = TopicMeta {
            checksum: U64::new(0),
            magic: U32::new(TOPIC_MAGIC),
            version: U16::new(TOPIC_VERSION_1),
            reserved: U16::new(0),
            partition_count: U32::new(3),
            index_interval_bytes: U32::new(512),
            segment_bytes: U64::new(1 << 20),
            segment_ms: I64::new(60_000),
        }
        .encode();
        let config = TopicConfig::decode(&v1).unwrap();
        assert_eq!(
            (config.partitions, config.segment_bytes, config.cleanup),
            (3, 1 << 20, Cleanup::Delete)
        );
        assert_eq!(config.retention_ms, None);

        let mut config = TopicConfig::default();
        for (key, value) in [
            ("cleanup", "compact+delete"),
            ("retention_ms", "3600000"),
            ("retention_bytes", "-1"),
            ("delete_retention_ms", "0"),
            ("max_compaction_lag_ms", "none"),
            ("min_cleanable_dirty_ratio", "0.25"),
        ] {
            config.set(key, value).unwrap();
        }
        assert_eq!(config.cleanup, Cleanup::CompactDelete);
        assert_eq!(config.retention_ms, Some(3_600_000));
        assert_eq!(config.delete_retention_ms, 0);
        assert_eq!(TopicConfig::decode(&config.encode()), Ok(config));
        let mut again = TopicConfig::default();
        for (key, value) in config.entries() {
            again.set(key, &value).unwrap();
        }
        assert_eq!(again, config);
        assert!(config.set("colour", "blue").is_err());
        assert!(config.set("retention_ms", "-5").is_err());
        assert!(config.set("cleanup", "shred").is_err());
        config.min_cleanable_dirty_ratio = 1.5;
        assert!(config.validate().is_err());
    }

    #[test]
    fn configs_are_bounded() {
        assert!(TopicConfig::default().with_partitions(0).validate().is_err());
        let tiny = TopicConfig { segment_bytes: 10, ..TopicConfig::default() };
        assert!(tiny.validate().is_err());
    }
}
