//! Sparse per-segment indexes: offset to file position, and timestamp to offset.
//!
//! Both are kept in memory for every segment and written to `<base>.index` and
//! `<base>.timeindex` when a segment is sealed. A sealed segment's index file is trusted only if
//! it validates and covers exactly the segment's current length; otherwise it is rebuilt by
//! scanning the segment. The active segment's index files are its recovery point: written
//! periodically for a durable prefix of it ([`SegmentIndex::encode_prefix`]), loaded at open
//! ([`SegmentIndex::decode_prefix`]), and the bytes past the prefix scanned.

use crate::Offset;
use crate::canary::{self, Canary};
use crate::format::CHECKSUM_BYTES;
use xxhash_rust::xxh3::xxh3_64;
use zerocopy::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const INDEX_MAGIC: u32 = u32::from_le_bytes(*b"CHIX");
pub const INDEX_VERSION: u16 = 1;
pub const KIND_OFFSET: u16 = 1;
pub const KIND_TIME: u16 = 2;

/// Header of both index files; the checksum covers the rest of the header and every entry.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct IndexFileHeader {
    pub checksum: U64,
    pub magic: U32,
    pub version: U16,
    /// [`KIND_OFFSET`] or [`KIND_TIME`].
    pub kind: U16,
    pub entry_count: U32,
    pub reserved: U32,
    /// Length of the segment file this index describes; any other length invalidates it.
    pub covered_length: U64,
    pub base_offset: U64,
    /// The offset after the segment's last record.
    pub next_offset: U64,
    /// Largest record timestamp in the segment (`i64::MIN` if empty).
    pub max_timestamp: I64,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct OffsetEntry {
    pub relative_offset: U32,
    pub position: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct TimeEntry {
    /// Largest timestamp of every batch up to and including the one at `relative_offset`.
    pub timestamp: I64,
    pub relative_offset: U32,
}

const _: () = assert!(size_of::<IndexFileHeader>() == 56);
const _: () = assert!(size_of::<OffsetEntry>() == 8);
const _: () = assert!(size_of::<TimeEntry>() == 12);

/// The in-memory indexes of one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentIndex {
    base_offset: Offset,
    interval_bytes: u32,
    /// (relative offset, position), both strictly increasing.
    offsets: Vec<(u32, u32)>,
    /// (running maximum timestamp, relative offset), both strictly increasing.
    times: Vec<(i64, u32)>,
    bytes_since_offset_entry: u64,
    bytes_since_time_entry: u64,
    max_timestamp: i64,
}

impl SegmentIndex {
    pub fn new(base_offset: Offset, interval_bytes: u32) -> Self {
        assert!(interval_bytes > 0);
        SegmentIndex {
            base_offset,
            interval_bytes,
            offsets: Vec::new(),
            times: Vec::new(),
            bytes_since_offset_entry: 0,
            bytes_since_time_entry: 0,
            max_timestamp: i64::MIN,
        }
    }

    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }

    pub fn offset_entries(&self) -> &[(u32, u32)] {
        &self.offsets
    }

    fn relative(&self, offset: Offset) -> u32 {
        let relative = offset.get().checked_sub(self.base_offset.get()).expect("offset below base");
        u32::try_from(relative).expect("segment holds more than u32::MAX offsets")
    }

    /// Account for a batch appended at `position`.
    pub fn on_batch(
        &mut self,
        position: u32,
        base_offset: Offset,
        max_timestamp: i64,
        length: u32,
    ) {
        let relative = self.relative(base_offset);
        if self.bytes_since_offset_entry >= u64::from(self.interval_bytes) {
            assert!(self.offsets.last().is_none_or(|&(r, p)| r < relative && p < position));
            self.offsets.push((relative, position));
            self.bytes_since_offset_entry = 0;
        }
        self.max_timestamp = self.max_timestamp.max(max_timestamp);
        let grows = self.times.last().is_none_or(|&(t, _)| self.max_timestamp > t);
        if grows
            && (self.times.is_empty()
                || self.bytes_since_time_entry >= u64::from(self.interval_bytes))
        {
            self.times.push((self.max_timestamp, relative));
            self.bytes_since_time_entry = 0;
        }
        self.bytes_since_offset_entry += u64::from(length);
        self.bytes_since_time_entry += u64::from(length);
    }

    /// A position at or before the batch holding `offset`, from which a scan finds it.
    pub fn position_for_offset(&self, offset: Offset) -> u32 {
        self.entry_for_offset(offset).1
    }

    /// As [`SegmentIndex::position_for_offset`], with the base offset of the batch that starts
    /// at that position, so a reader can check that the batches it finds are the expected ones.
    pub fn entry_for_offset(&self, offset: Offset) -> (Offset, u32) {
        if offset <= self.base_offset {
            return (self.base_offset, 0);
        }
        let relative = u32::try_from(offset.get() - self.base_offset.get()).unwrap_or(u32::MAX);
        let after = self.offsets.partition_point(|&(r, _)| r <= relative);
        if after == 0 {
            return (self.base_offset, 0);
        }
        let mut chosen = after - 1;
        if canary::active(Canary::IndexLookupOverruns) && after < self.offsets.len() {
            chosen = after;
        }
        let (relative, position) = self.offsets[chosen];
        (self.base_offset.plus(u64::from(relative)), position)
    }

    /// A position at or before the first batch that may hold a timestamp `>= timestamp`.
    pub fn position_for_timestamp(&self, timestamp: i64) -> u32 {
        let below = self.times.partition_point(|&(t, _)| t < timestamp);
        if below == 0 {
            return 0;
        }
        let (_, relative) = self.times[below - 1];
        self.position_for_offset(self.base_offset.plus(u64::from(relative)))
    }

    /// Encode both index files for a segment of `covered_length` bytes ending at `next_offset`.
    pub fn encode(&self, covered_length: u64, next_offset: Offset) -> (Vec<u8>, Vec<u8>) {
        self.encode_prefix(covered_length, next_offset, self.max_timestamp)
    }

    /// Encode both index files for the first `covered_length` bytes of the segment, which end
    /// at `next_offset` and whose largest timestamp is `max_timestamp`: only the entries of
    /// batches below it (the index may hold later ones already).
    pub fn encode_prefix(
        &self,
        covered_length: u64,
        next_offset: Offset,
        max_timestamp: i64,
    ) -> (Vec<u8>, Vec<u8>) {
        assert!(next_offset >= self.base_offset, "a prefix ends at or after the base");
        assert!(max_timestamp <= self.max_timestamp, "a prefix's timestamps are the segment's");
        let past = canary::active(Canary::RecoveryPointIndexPastPoint);
        let span = next_offset.get() - self.base_offset.get();
        let offsets_below =
            self.offsets.partition_point(|&(_, p)| past || u64::from(p) < covered_length);
        let times_below = self.times.partition_point(|&(_, r)| past || u64::from(r) < span);
        let (offset_entries, time_entries) =
            (&self.offsets[..offsets_below], &self.times[..times_below]);
        let header = |kind: u16, entry_count: usize| IndexFileHeader {
            checksum: U64::new(0),
            magic: U32::new(INDEX_MAGIC),
            version: U16::new(INDEX_VERSION),
            kind: U16::new(kind),
            entry_count: U32::new(entry_count as u32),
            reserved: U32::new(0),
            covered_length: U64::new(covered_length),
            base_offset: U64::new(self.base_offset.get()),
            next_offset: U64::new(next_offset.get()),
            max_timestamp: I64::new(max_timestamp),
        };
        let mut offsets = header(KIND_OFFSET, offset_entries.len()).as_bytes().to_vec();
        for &(relative, position) in offset_entries {
            let entry =
                OffsetEntry { relative_offset: U32::new(relative), position: U32::new(position) };
            offsets.extend_from_slice(entry.as_bytes());
        }
        let mut times = header(KIND_TIME, time_entries.len()).as_bytes().to_vec();
        for &(timestamp, relative) in time_entries {
            let entry =
                TimeEntry { timestamp: I64::new(timestamp), relative_offset: U32::new(relative) };
            times.extend_from_slice(entry.as_bytes());
        }
        for file in [&mut offsets, &mut times] {
            let checksum = xxh3_64(&file[CHECKSUM_BYTES..]);
            file[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
        }
        (offsets, times)
    }

    /// Decode both index files of the segment at `base_offset` that is `covered_length` bytes
    /// long. Returns the index and the segment's next offset, or why the files are unusable.
    pub fn decode(
        offsets: &[u8],
        times: &[u8],
        base_offset: Offset,
        covered_length: u64,
        interval_bytes: u32,
    ) -> Result<(SegmentIndex, Offset), &'static str> {
        let (length, checked) = (covered_length, covered_length);
        SegmentIndex::decode_covering(offsets, times, base_offset, length, checked, interval_bytes)
    }

    /// [`SegmentIndex::decode`], with the entries' positions checked against `checked_length`
    /// (only a canary makes it differ from `covered_length`).
    fn decode_covering(
        offsets: &[u8],
        times: &[u8],
        base_offset: Offset,
        covered_length: u64,
        checked_length: u64,
        interval_bytes: u32,
    ) -> Result<(SegmentIndex, Offset), &'static str> {
        let (offset_header, offset_entries) = decode_file::<OffsetEntry>(offsets, KIND_OFFSET)?;
        let (time_header, time_entries) = decode_file::<TimeEntry>(times, KIND_TIME)?;
        for header in [offset_header, time_header] {
            if header.base_offset.get() != base_offset.get() {
                return Err("base offset differs from the segment's");
            }
            if header.covered_length.get() != covered_length {
                return Err("segment length differs from the one indexed");
            }
            if header.next_offset.get() < base_offset.get() {
                return Err("next offset below the base offset");
            }
        }
        if offset_header.next_offset != time_header.next_offset
            || offset_header.max_timestamp != time_header.max_timestamp
        {
            return Err("offset and time index disagree");
        }
        // Every entry must point inside the segment's offsets, so lookups cannot overflow.
        let mut span = offset_header.next_offset.get() - base_offset.get();
        if checked_length > covered_length {
            span = u64::MAX; // Only the canary trusting entries past a recovery point.
        }
        let inside = |relative: u32| u64::from(relative) < span;
        if !offset_entries.iter().all(|e| inside(e.relative_offset.get()))
            || !time_entries.iter().all(|e| inside(e.relative_offset.get()))
        {
            return Err("index entry beyond the segment's offsets");
        }
        let mut index = SegmentIndex::new(base_offset, interval_bytes);
        index.max_timestamp = offset_header.max_timestamp.get();
        for entry in offset_entries {
            let (relative, position) = (entry.relative_offset.get(), entry.position.get());
            if index.offsets.last().is_some_and(|&(r, p)| r >= relative || p >= position)
                || u64::from(position) >= checked_length
            {
                return Err("offset index entries out of order or range");
            }
            index.offsets.push((relative, position));
        }
        for entry in time_entries {
            let (timestamp, relative) = (entry.timestamp.get(), entry.relative_offset.get());
            if index.times.last().is_some_and(|&(t, r)| t >= timestamp || r >= relative) {
                return Err("time index entries out of order");
            }
            index.times.push((timestamp, relative));
        }
        Ok((index, Offset::new(offset_header.next_offset.get())))
    }
}

impl SegmentIndex {
    /// Decode the index files of the active segment at `base_offset`, which is `size` bytes
    /// long now: its recovery point. Returns the index of the prefix they cover, the prefix's
    /// length and its next offset, or why the files are unusable. The index then continues
    /// with the batches past the prefix ([`SegmentIndex::on_batch`]).
    pub fn decode_prefix(
        offsets: &[u8],
        times: &[u8],
        base_offset: Offset,
        size: u64,
        interval_bytes: u32,
    ) -> Result<(SegmentIndex, u64, Offset), &'static str> {
        let (header, _) = decode_file::<OffsetEntry>(offsets, KIND_OFFSET)?;
        let covered = header.covered_length.get();
        if covered > size {
            return Err("it covers more bytes than the segment holds");
        }
        let mut checked = covered;
        if canary::active(Canary::RecoveryPointIndexPastPoint) {
            checked = size;
        }
        let (mut index, next_offset) = SegmentIndex::decode_covering(
            offsets,
            times,
            base_offset,
            covered,
            checked,
            interval_bytes,
        )?;
        // Where the next entries go: as if the prefix had been indexed batch by batch (the
        // time entry's position is known only to the offset entry before it, so the next time
        // entry may come a little early; lookups only need entries in order).
        let last_offset_entry = index.offsets.last().map_or(0, |&(_, p)| u64::from(p));
        index.bytes_since_offset_entry = covered - last_offset_entry;
        let last_time_entry = index.times.last().map_or(0, |&(_, r)| {
            u64::from(index.position_for_offset(index.base_offset.plus(u64::from(r))))
        });
        index.bytes_since_time_entry = covered.saturating_sub(last_time_entry);
        assert!(
            checked > covered || index.offsets.last().is_none_or(|&(_, p)| u64::from(p) < covered),
            "the prefix's entries point inside it"
        );
        Ok((index, covered, next_offset))
    }
}

fn decode_file<E: FromBytes + KnownLayout + Immutable>(
    bytes: &[u8],
    kind: u16,
) -> Result<(IndexFileHeader, &[E]), &'static str> {
    let (header, rest) = IndexFileHeader::read_from_prefix(bytes).map_err(|_| "file too short")?;
    if header.magic.get() != INDEX_MAGIC || header.kind.get() != kind {
        return Err("bad magic or kind");
    }
    if header.version.get() != INDEX_VERSION {
        return Err("unsupported version");
    }
    if xxh3_64(&bytes[CHECKSUM_BYTES..]) != header.checksum.get() {
        return Err("checksum mismatch");
    }
    let entries = <[E]>::ref_from_bytes(rest).map_err(|_| "entries do not fill the file")?;
    if entries.len() != header.entry_count.get() as usize {
        return Err("entry count differs from the file length");
    }
    Ok((header, entries))
}

#[cfg(test)]
mod tests;
