//! The per-partition sync checkpoint, `synced.checkpoint`: the position of the active segment
//! up to which every byte is known to have been fsynced.
//!
//! Recovery uses it as evidence: damage below that position is corruption of synced data and is
//! kept and reported, never cut as a torn tail. Every checkpoint states something that was
//! already true when it was written (the fdatasync it describes had completed), so a checkpoint
//! write that a crash loses only weakens the evidence, never falsifies it. That is why the group
//! commit writes it without an fsync of its own; close fsyncs it.
//!
//! The file holds two slots in separate 512-byte sectors, written alternately, each with an xxh3
//! checksum, so a torn write of one slot leaves the other one valid.

use crate::Offset;
use crate::error::IoError;
use crate::format::CHECKSUM_BYTES;
use crate::io::{self, Io, OpenMode, Operation};
use crate::segment::SegmentFile;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const CHECKPOINT_FILE: &str = "synced.checkpoint";
pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"CHCP");
pub const CHECKPOINT_VERSION: u16 = 1;
/// Distance between the two slots: one sector each.
pub const SLOT_STRIDE: u64 = 512;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct CheckpointSlot {
    pub checksum: U64,
    pub magic: U32,
    pub version: U16,
    pub reserved: U16,
    /// Grows by one per write; the valid slot with the larger sequence wins.
    pub sequence: U64,
    /// Base offset of the segment the position is in.
    pub segment_base: U64,
    /// Every byte of that segment below this position was fsynced.
    pub synced_position: U64,
    /// Every offset below this one was fsynced.
    pub synced_offset: U64,
}

const _: () = assert!(size_of::<CheckpointSlot>() == 48);
const _: () = assert!(size_of::<CheckpointSlot>() as u64 <= SLOT_STRIDE);

/// A decoded checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Checkpoint {
    pub sequence: u64,
    pub segment_base: Offset,
    pub synced_position: u64,
    pub synced_offset: Offset,
}

impl Checkpoint {
    fn encode(&self) -> Vec<u8> {
        let mut slot = CheckpointSlot {
            checksum: U64::new(0),
            magic: U32::new(CHECKPOINT_MAGIC),
            version: U16::new(CHECKPOINT_VERSION),
            reserved: U16::new(0),
            sequence: U64::new(self.sequence),
            segment_base: U64::new(self.segment_base.get()),
            synced_position: U64::new(self.synced_position),
            synced_offset: U64::new(self.synced_offset.get()),
        };
        slot.checksum = U64::new(xxh3_64(&slot.as_bytes()[CHECKSUM_BYTES..]));
        slot.as_bytes().to_vec()
    }

    fn decode(bytes: &[u8]) -> Option<Checkpoint> {
        let (slot, _) = CheckpointSlot::read_from_prefix(bytes).ok()?;
        let checksum = xxh3_64(&slot.as_bytes()[CHECKSUM_BYTES..]);
        let valid = slot.magic.get() == CHECKPOINT_MAGIC
            && slot.version.get() == CHECKPOINT_VERSION
            && slot.checksum.get() == checksum;
        valid.then(|| Checkpoint {
            sequence: slot.sequence.get(),
            segment_base: Offset::new(slot.segment_base.get()),
            synced_position: slot.synced_position.get(),
            synced_offset: Offset::new(slot.synced_offset.get()),
        })
    }

    /// The newest valid slot of a checkpoint file's bytes.
    pub fn newest(bytes: &[u8]) -> Option<Checkpoint> {
        let second = bytes.get(SLOT_STRIDE as usize..).unwrap_or_default();
        let slots = [Checkpoint::decode(bytes), Checkpoint::decode(second)];
        slots.into_iter().flatten().max_by_key(|c| c.sequence)
    }
}

/// Writes a partition's checkpoint file.
#[derive(Debug)]
pub struct CheckpointWriter<I: Io> {
    file: SegmentFile<I>,
    last: Checkpoint,
}

impl<I: Io> CheckpointWriter<I> {
    /// Open the checkpoint file in `directory`, creating it (and fsyncing the directory) if it
    /// is missing. `last` is the checkpoint recovery read, if any.
    pub fn open(io: &Arc<I>, directory: &Path, last: Option<Checkpoint>) -> Result<Self, IoError> {
        let path = directory.join(CHECKPOINT_FILE);
        let file = match SegmentFile::open(io, path.clone(), OpenMode::ReadWrite) {
            Ok(file) => file,
            Err(error) if error.source.kind() == std::io::ErrorKind::NotFound => {
                let file = SegmentFile::open(io, path, OpenMode::CreateNew)?;
                io::sync_directory(&**io, directory)
                    .map_err(|e| IoError::new("fsync", directory, e))?;
                file
            }
            Err(error) => return Err(error),
        };
        Ok(CheckpointWriter { file, last: last.unwrap_or_default() })
    }

    /// Record that `segment_base`'s bytes below `synced_position` and the offsets below
    /// `synced_offset` were fsynced. Ignores claims weaker than the last one. Not fsynced.
    pub fn record(
        &mut self,
        segment_base: Offset,
        synced_position: u64,
        synced_offset: Offset,
    ) -> Result<(), IoError> {
        let Some((write, checkpoint)) = self.plan(segment_base, synced_position, synced_offset)
        else {
            return Ok(());
        };
        self.file.run(write)?;
        self.written(checkpoint);
        Ok(())
    }

    /// The write that records a checkpoint (see [`CheckpointWriter::record`]), for a caller
    /// that runs it in a batch of its own and then reports it with
    /// [`CheckpointWriter::written`]; `None` for a claim weaker than the last one.
    pub fn plan(
        &self,
        segment_base: Offset,
        synced_position: u64,
        synced_offset: Offset,
    ) -> Option<(Operation, Checkpoint)> {
        let last = self.last;
        let newer = (segment_base, synced_position) > (last.segment_base, last.synced_position);
        if !newer {
            return None;
        }
        let checkpoint = Checkpoint {
            sequence: last.sequence + 1,
            segment_base,
            synced_position,
            synced_offset,
        };
        let position = (checkpoint.sequence % 2) * SLOT_STRIDE;
        let file = self.file.handle;
        Some((Operation::Write { file, position, buffer: checkpoint.encode() }, checkpoint))
    }

    /// The write [`CheckpointWriter::plan`] gave succeeded.
    pub fn written(&mut self, checkpoint: Checkpoint) {
        assert_eq!(checkpoint.sequence, self.last.sequence + 1, "checkpoints are written in turn");
        self.last = checkpoint;
    }

    /// Make the last recorded checkpoint durable.
    pub fn sync(&self) -> Result<(), IoError> {
        self.file.run(Operation::Fdatasync { file: self.file.handle })
    }

    pub fn path(&self) -> &PathBuf {
        &self.file.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_valid_slot_wins_and_a_torn_slot_is_ignored() {
        let older = Checkpoint {
            sequence: 4,
            segment_base: Offset::new(0),
            synced_position: 10,
            synced_offset: Offset::new(3),
        };
        let newer = Checkpoint { sequence: 5, synced_position: 20, ..older };
        let mut bytes = vec![0; 2 * SLOT_STRIDE as usize];
        bytes[..48].copy_from_slice(&older.encode());
        bytes[512..560].copy_from_slice(&newer.encode());
        assert_eq!(Checkpoint::newest(&bytes), Some(newer));
        bytes[530] ^= 1;
        assert_eq!(Checkpoint::newest(&bytes), Some(older));
        bytes[3] ^= 1;
        assert_eq!(Checkpoint::newest(&bytes), None);
        assert_eq!(Checkpoint::newest(&[]), None);
    }
}
