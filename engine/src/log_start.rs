//! The per-partition offset files, one `OffsetFile` struct each, told apart by magic:
//!
//! - `log.start`: the first offset retention keeps. Written (through a temporary file, a rename
//!   and a directory fsync) before retention removes any segment file, so after a crash
//!   recovery knows that segments below it were removed on purpose, finishes removing them,
//!   and reports a missing first segment only when it is above this offset. Absent: 0.
//! - `cleaner.offset`: every offset below it was cleaned by a compaction pass, written after
//!   the pass's swaps are durable. Derived data: absent or damaged, compaction starts over
//!   from 0 (more work, never wrong).

use crate::Offset;
use crate::error::{Corruption, CorruptionKind, IoError, OpenError};
use crate::format::CHECKSUM_BYTES;
use crate::io::Io;
use crate::segment;
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const LOG_START_FILE: &str = "log.start";
pub const LOG_START_MAGIC: u32 = u32::from_le_bytes(*b"CHLS");
pub const LOG_START_VERSION: u16 = 1;
pub const CLEANER_OFFSET_FILE: &str = "cleaner.offset";
pub const CLEANER_OFFSET_MAGIC: u32 = u32::from_le_bytes(*b"CHCO");

/// `log.start`: 24 bytes.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
#[allow(clippy::struct_field_names)] // The field's name in docs/format.md.
pub struct LogStart {
    /// xxh3-64 of bytes 8..24.
    pub checksum: U64,
    pub magic: U32,
    pub version: U16,
    pub reserved: U16,
    pub log_start: U64,
}

const _: () = assert!(size_of::<LogStart>() == 24);

pub fn encode(log_start: Offset) -> Vec<u8> {
    encode_with(LOG_START_MAGIC, log_start)
}

fn encode_with(magic: u32, log_start: Offset) -> Vec<u8> {
    let mut value = LogStart {
        checksum: U64::new(0),
        magic: U32::new(magic),
        version: U16::new(LOG_START_VERSION),
        reserved: U16::new(0),
        log_start: U64::new(log_start.get()),
    };
    value.checksum = U64::new(xxh3_64(&value.as_bytes()[CHECKSUM_BYTES..]));
    value.as_bytes().to_vec()
}

pub fn decode(bytes: &[u8]) -> Result<Offset, CorruptionKind> {
    decode_with(LOG_START_MAGIC, bytes)
}

fn decode_with(magic: u32, bytes: &[u8]) -> Result<Offset, CorruptionKind> {
    let Ok(value) = LogStart::read_from_bytes(bytes) else {
        let available = bytes.len() as u64;
        return Err(if available < size_of::<LogStart>() as u64 {
            CorruptionKind::Truncated { needed: size_of::<LogStart>() as u64, available }
        } else {
            CorruptionKind::BadLength { length: available }
        });
    };
    if value.magic.get() != magic {
        return Err(CorruptionKind::BadMagic { found: value.magic.get() });
    }
    let actual = xxh3_64(&bytes[CHECKSUM_BYTES..]);
    if actual != value.checksum.get() {
        return Err(CorruptionKind::ChecksumMismatch { expected: value.checksum.get(), actual });
    }
    if value.version.get() != LOG_START_VERSION {
        return Err(CorruptionKind::UnsupportedVersion { found: value.version.get() });
    }
    Ok(Offset::new(value.log_start.get()))
}

/// The log start recorded in `directory`, or 0 if there is none. A damaged file fails the
/// open: guessing could resurrect removed offsets or hide lost ones.
pub fn read<I: Io + ?Sized>(io: &I, directory: &Path) -> Result<Offset, OpenError> {
    let path = directory.join(LOG_START_FILE);
    match segment::read_small_file(io, &path)? {
        None => Ok(Offset::ZERO),
        Some(bytes) => decode(&bytes)
            .map_err(|kind| OpenError::Corruption(Corruption { file: path, position: 0, kind })),
    }
}

/// Record `log_start` durably: the file replaced through a rename, and `directory` fsynced.
pub fn write<I: Io + ?Sized>(io: &I, directory: &Path, log_start: Offset) -> Result<(), IoError> {
    segment::write_file_durably(io, &directory.join(LOG_START_FILE), encode(log_start))?;
    crate::io::sync_directory(io, directory).map_err(|e| IoError::new("fsync", directory, e))
}

/// Where the last compaction pass ended: 0 if the file is absent or does not decode.
pub fn read_cleaner_offset<I: Io + ?Sized>(io: &I, directory: &Path) -> Offset {
    let path = directory.join(CLEANER_OFFSET_FILE);
    match segment::read_small_file(io, &path) {
        Ok(Some(bytes)) => decode_with(CLEANER_OFFSET_MAGIC, &bytes).unwrap_or(Offset::ZERO),
        _ => Offset::ZERO,
    }
}

/// Record where a compaction pass ended (after its swaps are durable).
pub fn write_cleaner_offset<I: Io + ?Sized>(
    io: &I,
    directory: &Path,
    offset: Offset,
) -> Result<(), IoError> {
    let bytes = encode_with(CLEANER_OFFSET_MAGIC, offset);
    segment::write_file_durably(io, &directory.join(CLEANER_OFFSET_FILE), bytes)?;
    crate::io::sync_directory(io, directory).map_err(|e| IoError::new("fsync", directory, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_damage_is_detected() {
        let bytes = encode(Offset::new(4711));
        assert_eq!(decode(&bytes), Ok(Offset::new(4711)));
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        assert!(matches!(decode(&flipped), Err(CorruptionKind::ChecksumMismatch { .. })));
        assert!(matches!(decode(&bytes[..10]), Err(CorruptionKind::Truncated { .. })));
    }
}
