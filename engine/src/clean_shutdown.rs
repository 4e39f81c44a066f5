//! The clean-shutdown mark, `clean.shutdown` in the data directory: written by a close after
//! every partition's last fsync (its appends durable, its recovery point at its end, its sync
//! checkpoint fsynced), and removed by the next writable open before it writes anything. An
//! open that finds it trusts every partition whose files agree with it (the active segment
//! exactly covered by its recovery point) and scans, rewrites and fsyncs nothing there.
//!
//! A mark that lies is the one bug this must never have: one written before a last fsync,
//! or one left in place while a later writer ran and crashed. So it is written last, removed
//! (durably) first, and the simulator checks that an open finds it only after a close that
//! completed (docs/testing.md).

use crate::canary::{self, Canary};
use crate::error::IoError;
use crate::format::CHECKSUM_BYTES;
use crate::io::{self, Io};
use crate::layout::CLEAN_SHUTDOWN_FILE;
use crate::segment;
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: [u8; 4] = *b"CHCS";
const VERSION: u16 = 1;
/// checksum (8), magic (4), version (2), reserved (2).
const MARK_BYTES: usize = 16;

fn encode() -> Vec<u8> {
    let mut bytes = vec![0; MARK_BYTES];
    bytes[CHECKSUM_BYTES..CHECKSUM_BYTES + 4].copy_from_slice(&MAGIC);
    bytes[CHECKSUM_BYTES + 4..CHECKSUM_BYTES + 6].copy_from_slice(&VERSION.to_le_bytes());
    let checksum = xxh3_64(&bytes[CHECKSUM_BYTES..]);
    bytes[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
    bytes
}

fn is_valid(bytes: &[u8]) -> bool {
    bytes.len() == MARK_BYTES && bytes == encode().as_slice()
}

/// What a writable open found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    Absent,
    Valid,
    /// There, but not a mark this version writes: ignored (recovered as after a crash).
    Unreadable,
}

/// Read the mark and, on a writable open, remove it durably before anything else is written.
pub fn take<I: Io + ?Sized>(io: &I, root: &Path, read_only: bool) -> Result<Found, IoError> {
    let path = root.join(CLEAN_SHUTDOWN_FILE);
    let Some(bytes) = segment::read_small_file(io, &path)? else {
        return Ok(Found::Absent);
    };
    let found = if is_valid(&bytes) { Found::Valid } else { Found::Unreadable };
    if read_only {
        // A read-only open writes nothing; the writer beside it owns the mark.
        return Ok(Found::Absent);
    }
    if !canary::active(Canary::CleanMarkKeptAtOpen) {
        io::remove_if_present(io, &path)?;
        io::sync_directory(io, root).map_err(|e| IoError::new("fsync", root, e))?;
    }
    assert!(found != Found::Absent, "a file was there");
    Ok(found)
}

/// Write the mark durably: the close's last write.
pub fn write<I: Io + ?Sized>(io: &I, root: &Path) -> Result<(), IoError> {
    let path = root.join(CLEAN_SHUTDOWN_FILE);
    let bytes = encode();
    assert!(is_valid(&bytes), "the mark reads back as written");
    io::replace_file(io, &path, bytes)?;
    io::sync_directory(io, root).map_err(|e| IoError::new("fsync", root, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_mark_is_valid() {
        let mark = encode();
        assert!(is_valid(&mark));
        for i in 0..mark.len() {
            let mut flipped = mark.clone();
            flipped[i] ^= 1;
            assert!(!is_valid(&flipped), "a flip at byte {i} is caught");
        }
        assert!(!is_valid(&mark[..MARK_BYTES - 1]));
        assert!(!is_valid(&[]));
    }
}
