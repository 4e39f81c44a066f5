//! What the bytes where a segment's scan stopped are: one classification, shared by recovery
//! (which acts on it at open) and [`crate::verify`] (which only reports it), so that
//! `chronik verify` can never call harmless what the next open keeps as damage, or the
//! reverse.
//!
//! A sealed segment was fsynced before the next one was created: wherever its scan stops, that
//! is damage to synced data. The active segment's scan stopping early is either a torn tail of
//! unsynced writes (cut at open), the zeros a direct write padded its last block with (cut,
//! nothing lost), or damage inside synced data (kept and reported). The evidence that separates
//! them is the partition's sync checkpoint and the `synced_offset_hint`s of the chain of valid
//! batches after the damaged one (see [`later_evidence`] and docs/format.md). A scan that does
//! not stop early can still end below the checkpoint's synced position: synced bytes are gone.

use crate::Offset;
use crate::checkpoint::Checkpoint;
use crate::error::{Corruption, CorruptionKind, IoError};
use crate::format::{BATCH_HEADER_BYTES, BATCH_MAGIC, BatchHeader, BatchView, DecodeError};
use crate::index::SegmentIndex;
use crate::io::Io;
use crate::layout::{self, INDEX_SUFFIX, TIME_INDEX_SUFFIX};
use crate::limits::{BATCH_BYTES_MAX, BATCH_RECORDS_MAX};
use crate::segment::{self, SegmentFile};
use std::path::Path;
use zerocopy::FromBytes;

/// Where and why a scan of a segment stopped before its end.
#[derive(Debug)]
pub(crate) struct Damage {
    pub position: u64,
    pub error: DecodeError,
}

impl Damage {
    pub fn kind(&self) -> CorruptionKind {
        self.error.clone().into()
    }

    pub fn corruption(&self, file: &Path) -> Corruption {
        Corruption { file: file.to_path_buf(), position: self.position, kind: self.kind() }
    }
}

/// A scan of one segment file from its start.
#[derive(Debug)]
pub(crate) struct Scanned {
    /// The size of the file (where the scan was to end).
    pub size: u64,
    /// The offset after the last valid batch: what the damaged batch's base should be.
    pub next_offset: Offset,
    /// Why the scan stopped early, if it did; its position is the end of the last valid batch.
    pub damage: Option<Damage>,
}

/// Visit the valid batches of a segment starting at `base`, in order, up to `size` bytes: a
/// batch that does not continue the offsets of the one before it stops the scan as damage,
/// like bytes that are not a batch at all.
pub(crate) fn scan<I: Io>(
    file: &SegmentFile<I>,
    base: Offset,
    size: u64,
    visit: impl FnMut(u64, &BatchView<'_>),
) -> Result<Scanned, IoError> {
    scan_from(file, 0, base, size, visit)
}

/// As [`scan`], from byte `start` (a batch boundary) where the offsets reach `start_offset`.
pub(crate) fn scan_from<I: Io>(
    file: &SegmentFile<I>,
    start: u64,
    start_offset: Offset,
    size: u64,
    mut visit: impl FnMut(u64, &BatchView<'_>),
) -> Result<Scanned, IoError> {
    assert!(start <= size, "a scan starts inside the file");
    let base = start_offset;
    let mut next_offset = base;
    let mut mismatch = None;
    let end = segment::scan(file, start, size, |position, batch| {
        if batch.base_offset() != next_offset {
            let kind = CorruptionKind::OffsetMismatch {
                expected: next_offset.get(),
                found: batch.base_offset().get(),
            };
            mismatch = Some(Damage { position, error: DecodeError::Corrupt(kind) });
            return false;
        }
        visit(position, batch);
        next_offset = batch.next_offset();
        true
    })?;
    let damage = mismatch.or(end.damage.map(|error| Damage { position: end.position, error }));
    assert!(damage.is_some() || end.position == size, "a clean scan covers the whole file");
    assert!(next_offset >= base, "offsets only grow");
    Ok(Scanned { size, next_offset, damage })
}

/// What the end of a segment holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tail {
    /// The scan covered the whole file, and no checkpoint says more was synced.
    Clean,
    /// Damage inside data that was synced: kept in place, reported, appends refused.
    SyncedDamage(Corruption),
    /// The file ends, at a batch boundary, below the checkpoint's synced position.
    SyncedBytesMissing(Corruption),
    /// A torn tail of unsynced writes from `why.position` to the end: cut at the next open.
    Torn {
        why: Corruption,
        bytes: u64,
        /// Records whose batch headers can still be read in the tail.
        records: u64,
    },
    /// The zeros a direct write padded its last block with, from `position` to the end: cut
    /// at the next open, and nothing is lost.
    BlockPadding { position: u64, bytes: u64 },
}

/// The verdict on the active (last) segment of a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ActiveVerdict {
    pub tail: Tail,
    /// The checkpoint names a later segment than this one: a synced segment is gone (and this
    /// one was sealed, so every byte of it was synced).
    pub missing_segment: Option<Corruption>,
    /// Bytes of this segment the checkpoint proves were fsynced.
    pub checkpointed: u64,
}

/// Classify a sealed segment's scan: anywhere it stops is damage to synced data.
pub(crate) fn classify_sealed(path: &Path, scanned: &Scanned) -> Tail {
    scanned.damage.as_ref().map_or(Tail::Clean, |damage| {
        assert!(damage.position <= scanned.size, "the scan stops inside the file");
        Tail::SyncedDamage(damage.corruption(path))
    })
}

/// Classify the active segment `file` starting at `base`, from its scan and the partition's
/// newest valid sync checkpoint (stored at `checkpoint_path`). Reads the file past the damage
/// for evidence, and changes nothing.
pub(crate) fn classify_active<I: Io>(
    file: &SegmentFile<I>,
    base: Offset,
    scanned: &Scanned,
    checkpoint: Option<Checkpoint>,
    checkpoint_path: &Path,
) -> Result<ActiveVerdict, IoError> {
    let size = scanned.size;
    let missing_segment = checkpoint.filter(|c| c.segment_base > base).map(|_| {
        let kind = CorruptionKind::Malformed { reason: "a synced segment is missing" };
        Corruption { file: checkpoint_path.to_path_buf(), position: 0, kind }
    });
    let checkpointed = match checkpoint {
        Some(c) if c.segment_base == base => c.synced_position,
        Some(_) if missing_segment.is_some() => size,
        _ => 0,
    };
    let tail = if let Some(damage) = &scanned.damage {
        assert!(damage.position <= size, "the scan stops inside the file");
        let evidence = later_evidence(file, damage.position, size, scanned.next_offset)?;
        if damage.position < checkpointed || evidence.max_synced_hint > scanned.next_offset {
            // The checkpoint, or a batch written after the damaged one, says the damaged one was
            // already durable: this is corruption of synced data.
            Tail::SyncedDamage(damage.corruption(&file.path))
        } else if segment::is_block_padding(file, damage.position, size)? {
            assert_eq!(evidence.records, 0, "zeros hold no batch");
            Tail::BlockPadding { position: damage.position, bytes: size - damage.position }
        } else {
            let (bytes, records) = (size - damage.position, evidence.records);
            Tail::Torn { why: damage.corruption(&file.path), bytes, records }
        }
    } else if size < checkpointed {
        let kind = CorruptionKind::Truncated { needed: checkpointed, available: size };
        Tail::SyncedBytesMissing(Corruption { file: file.path.clone(), position: size, kind })
    } else {
        Tail::Clean
    };
    Ok(ActiveVerdict { tail, missing_segment, checkpointed })
}

/// The sync checkpoint, strengthened by the recovery point: every byte it covers was
/// fdatasynced before its files were written, so it is evidence of synced data too.
pub(crate) fn with_recovery_point(
    checkpoint: Option<Checkpoint>,
    base: Offset,
    covered: u64,
    next_offset: Offset,
) -> Option<Checkpoint> {
    match checkpoint {
        _ if covered == 0 => checkpoint,
        Some(c) if c.segment_base > base => Some(c),
        Some(c) if c.segment_base == base && c.synced_position >= covered => Some(c),
        other => Some(Checkpoint {
            sequence: other.map_or(0, |c| c.sequence),
            segment_base: base,
            synced_position: covered,
            synced_offset: next_offset,
        }),
    }
}

/// The active segment's recovery point: the index of its first bytes, how many, and the
/// offset they end at.
pub(crate) type RecoveryPoint = (SegmentIndex, u64, Offset);

/// Read the recovery point of the active segment at `base` (its index files), which is `size`
/// bytes long: `None` without one, else the point or why it is unusable. Recovery and
/// `chronik verify` both read it here, so they weigh the same evidence.
pub(crate) fn read_recovery_point<I: Io + ?Sized>(
    io: &I,
    directory: &Path,
    base: Offset,
    size: u64,
    interval_bytes: u32,
) -> Result<Option<Result<RecoveryPoint, &'static str>>, IoError> {
    let read =
        |suffix| segment::read_small_file(io, &directory.join(layout::file_name(base, suffix)));
    let decoded = match (read(INDEX_SUFFIX)?, read(TIME_INDEX_SUFFIX)?) {
        (None, None) => return Ok(None),
        (Some(offsets), Some(times)) => {
            SegmentIndex::decode_prefix(&offsets, &times, base, size, interval_bytes)
        }
        _ => Err("one of its two index files is missing"),
    };
    if let Ok((_, covered, _)) = &decoded {
        assert!(*covered <= size, "a usable recovery point lies inside the segment");
    }
    Ok(Some(decoded))
}

/// What the bytes after a damaged batch tell.
#[derive(Debug, Default)]
struct Evidence {
    /// The largest `synced_offset_hint` of the chain of batches that continues the damaged one.
    max_synced_hint: Offset,
    /// Records in the damaged batch (if its header is readable) and in valid batches after it.
    records: u64,
}

/// Read the evidence after the batch damaged at `damaged_at`, whose base offset should be
/// `expected`. Only a chain of valid batches that starts where the damaged batch's own header
/// says it ends, and that continues this partition's offsets, is trusted: a batch found anywhere
/// else could be one carried inside a record's value. One forward pass, bounded by the file.
fn later_evidence<I: Io>(
    file: &SegmentFile<I>,
    damaged_at: u64,
    end: u64,
    expected: Offset,
) -> Result<Evidence, IoError> {
    let mut evidence = Evidence::default();
    let header = file.read(damaged_at, BATCH_HEADER_BYTES)?;
    let Some(header) =
        BatchHeader::read_from_bytes(&header).ok().filter(|h| h.magic.get() == BATCH_MAGIC)
    else {
        return Ok(evidence);
    };
    evidence.records += u64::from(header.record_count.get().min(BATCH_RECORDS_MAX));
    let length = u64::from(header.length.get());
    let after = u64::from(header.last_offset_delta.get()) + 1;
    let plausible = header.base_offset.get() == expected.get()
        && (BATCH_HEADER_BYTES as u64..=u64::from(BATCH_BYTES_MAX)).contains(&length)
        && damaged_at + length <= end
        && expected.get().checked_add(after).is_some();
    if !plausible {
        return Ok(evidence);
    }
    let mut next = expected.plus(after);
    segment::scan(file, damaged_at + length, end, |_, batch| {
        let continues = batch.base_offset() == next && batch.synced_offset_hint() <= next;
        if continues {
            evidence.max_synced_hint = evidence.max_synced_hint.max(batch.synced_offset_hint());
            evidence.records += u64::from(batch.record_count());
            next = batch.next_offset();
        }
        continues
    })?;
    Ok(evidence)
}
