//! Metadata files: the data directory marker (`chronik.meta`) and each topic's `topic.meta`.
//! Both are small fixed structs with an xxh3 checksum over every byte after it.

use super::CHECKSUM_BYTES;
use crate::error::CorruptionKind;
use xxhash_rust::xxh3::xxh3_64;
use zerocopy::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const DATA_DIRECTORY_MAGIC: u32 = u32::from_le_bytes(*b"CHMD");
pub const DATA_DIRECTORY_VERSION: u16 = 1;
pub const TOPIC_MAGIC: u32 = u32::from_le_bytes(*b"CHTP");
/// The version written. Version 1 (`TopicMeta`, without cleanup settings) is still read.
pub const TOPIC_VERSION: u16 = 2;
pub const TOPIC_VERSION_1: u16 = 1;

/// `chronik.meta` at the root of a data directory.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct DataDirectoryMeta {
    pub checksum: U64,
    pub magic: U32,
    pub version: U16,
    pub reserved: U16,
}

/// `topic.meta` in each topic directory.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct TopicMeta {
    pub checksum: U64,
    pub magic: U32,
    pub version: U16,
    pub reserved: U16,
    pub partition_count: U32,
    pub index_interval_bytes: U32,
    pub segment_bytes: U64,
    pub segment_ms: I64,
}

/// `topic.meta`, version 2: version 1's fields, then the cleanup settings. `-1` means "no
/// limit" in the fields documented so.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct TopicMetaV2 {
    pub checksum: U64,
    pub magic: U32,
    pub version: U16,
    pub reserved: U16,
    pub partition_count: U32,
    pub index_interval_bytes: U32,
    pub segment_bytes: U64,
    pub segment_ms: I64,
    /// 0 `delete`, 1 `compact`, 2 `compact+delete`.
    pub cleanup: u8,
    pub reserved2: [u8; 7],
    /// -1: forever.
    pub retention_ms: I64,
    /// -1: no size limit.
    pub retention_bytes: I64,
    pub delete_retention_ms: I64,
    pub min_compaction_lag_ms: I64,
    /// -1: no bound.
    pub max_compaction_lag_ms: I64,
    /// The bits of an `f64`.
    pub min_cleanable_dirty_ratio: U64,
}

const _: () = assert!(size_of::<DataDirectoryMeta>() == 16);
const _: () = assert!(size_of::<TopicMeta>() == 40);
const _: () = assert!(size_of::<TopicMetaV2>() == 96);

/// A metadata struct with a leading checksum and a magic number.
pub trait MetaFile: FromBytes + IntoBytes + KnownLayout + Immutable + Copy {
    const MAGIC: u32;
    fn magic(&self) -> u32;
    fn version(&self) -> u16;
    fn checksum(&self) -> u64;
    fn set_checksum(&mut self, checksum: u64);

    /// The bytes to write, with the checksum filled in.
    fn encode(mut self) -> Vec<u8> {
        let checksum = xxh3_64(&self.as_bytes()[CHECKSUM_BYTES..]);
        self.set_checksum(checksum);
        self.as_bytes().to_vec()
    }

    /// Validate and decode. The version is returned to the caller to judge.
    fn decode(bytes: &[u8]) -> Result<Self, CorruptionKind> {
        let Ok(value) = Self::read_from_bytes(bytes) else {
            let (needed, available) = (size_of::<Self>() as u64, bytes.len() as u64);
            if available < needed {
                return Err(CorruptionKind::Truncated { needed, available });
            }
            return Err(CorruptionKind::BadLength { length: available });
        };
        if value.magic() != Self::MAGIC {
            return Err(CorruptionKind::BadMagic { found: value.magic() });
        }
        let actual = xxh3_64(&bytes[CHECKSUM_BYTES..]);
        if actual != value.checksum() {
            return Err(CorruptionKind::ChecksumMismatch { expected: value.checksum(), actual });
        }
        Ok(value)
    }
}

macro_rules! meta_file {
    ($type:ty, $magic:expr) => {
        impl MetaFile for $type {
            const MAGIC: u32 = $magic;
            fn magic(&self) -> u32 {
                self.magic.get()
            }
            fn version(&self) -> u16 {
                self.version.get()
            }
            fn checksum(&self) -> u64 {
                self.checksum.get()
            }
            fn set_checksum(&mut self, checksum: u64) {
                self.checksum = U64::new(checksum);
            }
        }
    };
}

meta_file!(DataDirectoryMeta, DATA_DIRECTORY_MAGIC);
meta_file!(TopicMeta, TOPIC_MAGIC);
meta_file!(TopicMetaV2, TOPIC_MAGIC);

impl DataDirectoryMeta {
    pub fn current() -> Self {
        DataDirectoryMeta {
            checksum: U64::new(0),
            magic: U32::new(DATA_DIRECTORY_MAGIC),
            version: U16::new(DATA_DIRECTORY_VERSION),
            reserved: U16::new(0),
        }
    }
}
