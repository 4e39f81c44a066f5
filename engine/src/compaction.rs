//! Key-based log compaction: the cleaner's pieces. `Partition::compact` drives them under the
//! partition's maintenance lock.
//!
//! A pass takes the *cleanable* sealed segments (from the log start up to the first one
//! holding a record younger than `min_compaction_lag_ms`), builds a bounded map from the hash
//! of each key to its latest offset over the *dirty* part (written since the last pass), and
//! rewrites the cleanable segments, in groups no larger than `segment_bytes`, keeping a record
//! unless a later record of its key is in the map, or it is a tombstone (a key with an empty
//! value) whose segment's newest record is older than `delete_retention_ms`. Records without a
//! key are always kept. Offsets never change: each output batch is a compacted (version 2)
//! batch covering the offset range of the source batches it replaces, so a group's output
//! covers exactly the group's range, gaps and all.
//!
//! The swap of a group is crash-safe (docs/format.md, "Compaction"): the output is written to
//! `<base>.cleaned` and fdatasynced, renamed to `<base>.swap` (the commit point, made durable by
//! a directory fsync), the sources' files are removed, and `<base>.swap` is renamed to
//! `<base>.log`. Recovery removes `.cleaned` files and finishes any `.swap`.

use crate::Offset;
use crate::canary::{self, Canary};
use crate::error::{Corruption, IoError};
use crate::format::{BatchInfo, RecordView, encode_compacted_batch, extend_compacted_batch};
use crate::io::{Io, OpenMode, Operation};
use crate::segment::{self, Segment, SegmentFile};
use crate::swap::{CLEANED_SUFFIX, path_with};
use crate::topic::TopicConfig;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_128;

/// Most keys one pass maps (about 40 bytes each): the rest of the dirty part waits for the next
/// pass.
pub const KEY_MAP_ENTRIES_MAX: usize = 1 << 20;
/// Output buffered before a write to the cleaned file.
const WRITE_CHUNK_BYTES: usize = 4 << 20;

/// Why a pass failed.
#[derive(Debug)]
pub(crate) enum CleanError {
    /// An I/O error after a group's swap was committed: the engine is poisoned (fail-stop)
    /// and the next open finishes the swap.
    Io(IoError),
    /// An I/O error before a group's swap was committed (reading the sources, writing or
    /// syncing the `.cleaned` file, disk full): the pass is abandoned, the group stays as it
    /// was (groups swapped before it stay swapped), and the engine goes on serving.
    Aborted(IoError),
    /// A source segment is damaged: this partition is left as it is and not compacted again
    /// until reopened; the damage is reported on reads anyway.
    Damaged(Corruption),
}

impl From<IoError> for CleanError {
    fn from(error: IoError) -> Self {
        CleanError::Io(error)
    }
}

impl CleanError {
    /// The same failure, met before anything was committed.
    pub(crate) fn before_commit(self) -> Self {
        match self {
            CleanError::Io(error) => CleanError::Aborted(error),
            other => other,
        }
    }
}

/// A sealed segment a pass may read and replace.
#[derive(Debug)]
pub(crate) struct Source<I: Io> {
    pub base: Offset,
    pub next_offset: Offset,
    pub size: u64,
    pub max_timestamp: i64,
    pub file: Arc<SegmentFile<I>>,
}

/// Hash of a key to the offset of its latest record in the mapped range.
#[derive(Debug, Default)]
pub(crate) struct KeyMap {
    latest: HashMap<u128, Offset, BuildKeyHash>,
}

/// The map's keys are xxh3-128 hashes already: its buckets take their low 64 bits as they are
/// instead of hashing them again.
#[derive(Clone, Copy, Debug, Default)]
struct BuildKeyHash;

#[derive(Default)]
struct KeyHash(u64);

impl std::hash::BuildHasher for BuildKeyHash {
    type Hasher = KeyHash;

    fn build_hasher(&self) -> KeyHash {
        KeyHash(0)
    }
}

impl std::hash::Hasher for KeyHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u128` keys are hashed; fold any other input in, for completeness.
        for chunk in bytes.chunks(8) {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
        }
    }

    fn write_u128(&mut self, value: u128) {
        self.0 = value as u64;
    }
}

impl KeyMap {
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    fn superseded(&self, hash: u128, offset: Offset) -> bool {
        let latest = self.latest.get(&hash);
        if canary::active(Canary::CompactionDropsLatest) {
            return latest.is_some_and(|&latest| latest >= offset);
        }
        latest.is_some_and(|&latest| latest > offset)
    }
}

/// Map the keys of `sources` from offset `from` on, at most `capacity` distinct keys. Returns
/// the map and the offset it ends at: records at or past it were not mapped (the map filled).
pub(crate) fn build_key_map<I: Io>(
    sources: &[Source<I>],
    from: Offset,
    capacity: usize,
) -> Result<(KeyMap, Offset), CleanError> {
    let mut map = KeyMap::default();
    let mut end = from;
    for source in sources.iter().filter(|s| s.next_offset > from) {
        let mut full = false;
        let mut hashes: Vec<(u128, Offset)> = Vec::new();
        let scanned = segment::scan(&source.file, 0, source.size, |_, batch| {
            // Whole batches only: a batch's records are all mapped or none.
            hashes.clear();
            hashes.extend(
                batch
                    .records()
                    .filter(|r| r.offset() >= from)
                    .filter_map(|r| Some((xxh3_128(r.key()?), r.offset()))),
            );
            let new_keys = hashes.iter().filter(|(h, _)| !map.latest.contains_key(h)).count();
            if map.len() + new_keys > capacity && map.len() > 0 {
                full = true;
                return false;
            }
            map.latest.extend(hashes.iter().copied());
            end = end.max(batch.next_offset());
            true
        })?;
        if let Some(corruption) = scanned.corruption(&source.file.path).filter(|_| !full) {
            return Err(CleanError::Damaged(corruption));
        }
        if full {
            break;
        }
    }
    Ok((map, end))
}

/// What cleaning one group produced.
#[derive(Debug)]
pub(crate) struct Cleaned<I: Io> {
    pub segment: Segment<I>,
    pub records_in: u64,
    pub records_kept: u64,
}

/// Write the cleaned version of `group` (consecutive sources) to `<base>.cleaned`, fdatasync
/// it, and return it as a segment whose file path is already the final `<base>.log`.
pub(crate) fn clean_group<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    group: &[Source<I>],
    map: &KeyMap,
    map_end: Offset,
    now_ms: i64,
    config: &TopicConfig,
) -> Result<Cleaned<I>, CleanError> {
    let base = group[0].base;
    let end = group.last().expect("a group holds a segment").next_offset;
    let cleaned = path_with(directory, base, CLEANED_SUFFIX);
    match io.remove_file(&cleaned) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(IoError::new("remove", &cleaned, error).into()),
    }
    let file = SegmentFile::open(io, cleaned.clone(), OpenMode::CreateNew)?;
    let mut segment = Segment::empty(base, file, config.index_interval_bytes, i64::MIN);
    let mut writer = Writer { segment: &mut segment, buffer: Vec::new(), written: 0 };
    let mut held: Option<Held> = None;
    let mut covered = base; // Every offset below this is covered by an emitted batch.
    let (mut records_in, mut records_kept) = (0, 0);
    for source in group {
        let tombstones_expire = now_ms.saturating_sub(source.max_timestamp)
            > config.delete_retention_ms
            || canary::active(Canary::CompactionDropsTombstoneEarly);
        let mut failure = None;
        let scanned = segment::scan(&source.file, 0, source.size, |_, batch| {
            // Hash every key of the batch first, then look them all up: the lookups are
            // independent, so their cache misses overlap instead of queueing.
            let records: Vec<RecordView<'_>> = batch.records().collect();
            records_in += records.len() as u64;
            let hashes: Vec<Option<u128>> = records.iter().map(|r| r.key().map(xxh3_128)).collect();
            let verdicts: Vec<bool> = records
                .iter()
                .zip(&hashes)
                .map(|(record, hash)| keep(record, *hash, map, map_end, tombstones_expire))
                .collect();
            let kept: Vec<RecordView<'_>> = records
                .into_iter()
                .zip(verdicts)
                .filter_map(|(record, keep)| keep.then_some(record))
                .collect();
            if kept.is_empty() {
                return true;
            }
            records_kept += kept.len() as u64;
            // The batch held so far ends where this one's range starts.
            if let Some(previous) = held.take() {
                let last = Offset::new(batch.base_offset().get() - 1);
                if let Err(error) = previous.emit(&mut writer, last) {
                    failure = Some(error);
                    return false;
                }
                covered = last.plus(1);
            }
            held =
                Some(Held::of(&kept, covered, batch.max_timestamp(), batch.synced_offset_hint()));
            true
        })?;
        if let Some(error) = failure {
            return Err(error.into());
        }
        if let Some(corruption) = scanned.corruption(&source.file.path) {
            // Never write a group with records missing: leave the sources as they are.
            drop(writer);
            let _ = io.remove_file(&cleaned);
            return Err(CleanError::Damaged(corruption));
        }
    }
    let last = Offset::new(end.get() - 1);
    if let Some(previous) = held {
        previous.emit(&mut writer, last)?;
    } else {
        let mut scratch = Vec::new();
        // Nothing kept: one empty batch keeps the group's offsets accounted for.
        let max_timestamp = group.iter().map(|s| s.max_timestamp).max().unwrap_or(i64::MIN);
        let info = encode_compacted_batch(&mut scratch, base, last, &[], max_timestamp, base);
        writer.push(&scratch, info)?;
    }
    writer.flush()?;
    let file = &segment.file;
    file.run(Operation::Fdatasync { file: file.handle })?;
    assert_eq!(segment.next_offset, end, "a cleaned group covers the group's offsets");
    Ok(Cleaned { segment, records_in, records_kept })
}

/// Whether cleaning keeps `record`, whose key hashes to `hash` (`None`: no key).
fn keep(
    record: &RecordView<'_>,
    hash: Option<u128>,
    map: &KeyMap,
    map_end: Offset,
    tombstones_expire: bool,
) -> bool {
    let Some(hash) = hash else { return true };
    if record.offset() < map_end && map.superseded(hash, record.offset()) {
        return false;
    }
    let tombstone = record.value().is_empty();
    !(tombstone && tombstones_expire && record.offset() < map_end)
}

/// The kept records of one source batch, not yet encoded: its range may still grow to cover
/// the source batches after it that kept nothing.
struct Held {
    /// The batch, encoded to end at its last kept record; widened on emit.
    encoded: Vec<u8>,
}

impl Held {
    fn of(kept: &[RecordView<'_>], start: Offset, max_timestamp: i64, hint: Offset) -> Held {
        let last = kept.last().expect("held batches keep a record").offset();
        let mut encoded = Vec::new();
        encode_compacted_batch(&mut encoded, start, last, kept, max_timestamp, hint.min(start));
        Held { encoded }
    }

    fn emit<I: Io>(mut self, writer: &mut Writer<'_, I>, last: Offset) -> Result<(), IoError> {
        let info = extend_compacted_batch(&mut self.encoded, last);
        writer.push(&self.encoded, info)
    }
}

/// Buffered writes of output batches to the cleaned file, accounted in its segment.
struct Writer<'a, I: Io> {
    segment: &'a mut Segment<I>,
    buffer: Vec<u8>,
    written: u64,
}

impl<I: Io> Writer<'_, I> {
    fn push(&mut self, batch: &[u8], info: BatchInfo) -> Result<(), IoError> {
        self.buffer.extend_from_slice(batch);
        self.segment.on_batch(info);
        if self.buffer.len() >= WRITE_CHUNK_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), IoError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::take(&mut self.buffer);
        let length = bytes.len() as u64;
        self.segment.file.write(self.written, bytes)?;
        self.written += length;
        Ok(())
    }
}

/// Split `sources` into consecutive groups of at most `segment_bytes` (each at least one
/// segment) and at most `u32::MAX` offsets, so small cleaned segments merge.
pub(crate) fn groups<I: Io>(
    sources: &[Source<I>],
    segment_bytes: u64,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, source) in sources.iter().enumerate() {
        let span = source.next_offset.get() - sources[start].base.get();
        if i > start && (bytes + source.size > segment_bytes || span > u64::from(u32::MAX)) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += source.size;
    }
    if start < sources.len() {
        out.push(start..sources.len());
    }
    out
}
