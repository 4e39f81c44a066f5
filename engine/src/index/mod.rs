//! Sparse per-segment indexes: offset to file position, and timestamp to offset.
//!
//! Both are kept in memory for every segment and written to `<base>.index` and
//! `<base>.timeindex` when a segment is sealed. A sealed segment's index file is trusted only if
//! it validates and covers exactly the segment's current length; otherwise it is rebuilt by
//! scanning the segment. The active segment's index is always rebuilt at open.

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
            max_timestamp: I64::new(self.max_timestamp),
        };
        let mut offsets = header(KIND_OFFSET, self.offsets.len()).as_bytes().to_vec();
        for &(relative, position) in &self.offsets {
            let entry =
                OffsetEntry { relative_offset: U32::new(relative), position: U32::new(position) };
            offsets.extend_from_slice(entry.as_bytes());
        }
        let mut times = header(KIND_TIME, self.times.len()).as_bytes().to_vec();
        for &(timestamp, relative) in &self.times {
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
        let span = offset_header.next_offset.get() - base_offset.get();
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
                || u64::from(position) >= covered_length
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
