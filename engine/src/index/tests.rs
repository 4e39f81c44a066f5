//! Tests of the sparse indexes: lookups checked against a scan of real encoded batches, and
//! the index files' encode/decode with each way decode refuses a file.

// quickcheck hands generated values to properties by value.
#![allow(clippy::needless_pass_by_value)]

use super::*;
use crate::format::{Record, encode_batch, parse_batch};
use quickcheck::{Arbitrary, Gen, QuickCheck};

// Generation bounds: a segment of at most 24 batches of at most 20 records keeps each case to a
// few kilobytes.
const GENERATED_BATCHES_MAX: usize = 24;
const GENERATED_RECORDS_MAX: usize = 20;
const GENERATED_VALUE_BYTES_MAX: usize = 40;
const INTERVALS: [u32; 6] = [1, 64, 150, 400, 1_000, 4_096];

/// One batch to append: the timestamp and value length of each of its records.
#[derive(Clone, Debug)]
struct GeneratedBatch {
    records: Vec<(i64, usize)>,
}

/// A segment's worth of batches, and the index settings to build over it.
#[derive(Clone, Debug)]
struct GeneratedSegment {
    base_offset: u64,
    interval_bytes: u32,
    batches: Vec<GeneratedBatch>,
}

impl Arbitrary for GeneratedSegment {
    fn arbitrary(g: &mut Gen) -> Self {
        let monotone = bool::arbitrary(g);
        let mut clock = i64::from(i16::arbitrary(g));
        let mut timestamp = |g: &mut Gen| {
            if monotone {
                clock += i64::from(u8::arbitrary(g) % 4);
                clock
            } else if u8::arbitrary(g) % 16 == 0 {
                // Extremes now and then: the running maximum must cope with them.
                *g.choose(&[i64::MIN, i64::MAX]).unwrap()
            } else {
                // A narrow range, so that timestamps repeat and go backwards.
                i64::from(i8::arbitrary(g) % 50)
            }
        };
        let batch_count = 1 + usize::arbitrary(g) % GENERATED_BATCHES_MAX;
        let batches = (0..batch_count)
            .map(|_| {
                let record_count = 1 + usize::arbitrary(g) % GENERATED_RECORDS_MAX;
                let records = (0..record_count)
                    .map(|_| (timestamp(g), usize::arbitrary(g) % GENERATED_VALUE_BYTES_MAX))
                    .collect();
                GeneratedBatch { records }
            })
            .collect();
        GeneratedSegment {
            base_offset: u64::arbitrary(g) % (1 << 40),
            interval_bytes: *g.choose(&INTERVALS).unwrap(),
            batches,
        }
    }

    /// Drop one batch, or halve one batch. Coarse on purpose: each candidate costs a full
    /// check of every offset, and finer steps made shrinking a failure take minutes.
    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        let mut candidates = Vec::new();
        for i in 0..self.batches.len() {
            if self.batches.len() > 1 {
                let mut fewer = self.clone();
                fewer.batches.remove(i);
                candidates.push(fewer);
            }
            let records = &self.batches[i].records;
            if records.len() > 1 {
                let mut halved = self.clone();
                halved.batches[i].records.truncate(records.len() / 2);
                candidates.push(halved);
            }
        }
        Box::new(candidates.into_iter())
    }
}

/// A segment file built from real encoded batches, its index, and the truth to check it by.
struct Built {
    bytes: Vec<u8>,
    index: SegmentIndex,
    /// (position, base offset, next offset) of every batch, in order.
    batches: Vec<(u32, Offset, Offset)>,
    /// (offset, timestamp) of every record, in offset order.
    records: Vec<(Offset, i64)>,
}

impl Built {
    fn next_offset(&self) -> Offset {
        self.batches.last().map_or(Offset::ZERO, |&(_, _, next)| next)
    }

    fn is_batch_start(&self, position: u32) -> bool {
        self.batches.iter().any(|&(p, _, _)| p == position)
    }

    /// Index of the batch holding `offset`.
    fn batch_holding(&self, offset: Offset) -> usize {
        self.batches.iter().position(|&(_, base, next)| base <= offset && offset < next).unwrap()
    }

    /// Scan the segment bytes from `position`, as a read does, and return the first record
    /// for which `wanted` holds.
    fn scan_from(&self, position: u32, wanted: impl Fn(Offset, i64) -> bool) -> Option<Offset> {
        let mut rest = &self.bytes[position as usize..];
        while !rest.is_empty() {
            let batch = parse_batch(rest).expect("the scan starts at a batch boundary");
            if let Some(record) = batch.records().find(|r| wanted(r.offset(), r.timestamp())) {
                return Some(record.offset());
            }
            rest = &rest[batch.len()..];
        }
        None
    }
}

fn build(segment: &GeneratedSegment) -> Built {
    let base_offset = Offset::new(segment.base_offset);
    let mut built = Built {
        bytes: Vec::new(),
        index: SegmentIndex::new(base_offset, segment.interval_bytes),
        batches: Vec::new(),
        records: Vec::new(),
    };
    let value = [0x42; GENERATED_VALUE_BYTES_MAX];
    let mut next = base_offset;
    for batch in &segment.batches {
        let records: Vec<Record<'_>> = batch
            .records
            .iter()
            .map(|&(timestamp, length)| {
                Record::new(None, &value[..length]).with_timestamp(timestamp)
            })
            .collect();
        let position = built.bytes.len();
        encode_batch(&mut built.bytes, next, &records, 0, Offset::ZERO).unwrap();
        let view = parse_batch(&built.bytes[position..]).unwrap();
        let position = u32::try_from(position).unwrap();
        built.index.on_batch(position, next, view.max_timestamp(), view.len() as u32);
        built.batches.push((position, next, view.next_offset()));
        built.records.extend(view.records().map(|r| (r.offset(), r.timestamp())));
        next = view.next_offset();
    }
    built
}

/// Base offset, offset entries, time entries and maximum timestamp.
type Persisted = (Offset, Vec<(u32, u32)>, Vec<(i64, u32)>, i64);

/// The index fields that the files hold. The byte counters since the last entries are not
/// persisted: a decoded index belongs to a sealed segment, which takes no more batches.
fn persisted(index: &SegmentIndex) -> Persisted {
    (index.base_offset, index.offsets.clone(), index.times.clone(), index.max_timestamp)
}

// Properties.

#[test]
fn offset_lookup_agrees_with_a_scan() {
    fn property(segment: GeneratedSegment) {
        let built = build(&segment);
        let base = Offset::new(segment.base_offset);
        for target in base.get()..built.next_offset().get() {
            let target = Offset::new(target);
            let position = built.index.position_for_offset(target);
            let holding = built.batch_holding(target);
            let (batch_position, _, _) = built.batches[holding];
            assert!(built.is_batch_start(position), "{target:?}: {position} is no batch start");
            assert!(position <= batch_position, "{target:?}: {position} > {batch_position}");
            if segment.interval_bytes == 1 {
                // Every batch but the first has an entry: the lookup is exact.
                assert_eq!(position, batch_position, "{target:?}");
            }
            assert_eq!(built.scan_from(position, |offset, _| offset == target), Some(target));
        }
        assert_eq!(built.index.position_for_offset(base), 0);
        if let Some(below) = base.get().checked_sub(1) {
            assert_eq!(built.index.position_for_offset(Offset::new(below)), 0);
        }
        for beyond in [built.next_offset(), Offset::new(u64::MAX)] {
            assert!(built.is_batch_start(built.index.position_for_offset(beyond)));
        }
    }
    QuickCheck::new().quickcheck(property as fn(GeneratedSegment));
}

#[test]
fn timestamp_lookup_agrees_with_a_scan() {
    fn property(segment: GeneratedSegment) {
        let built = build(&segment);
        let mut targets = vec![i64::MIN, i64::MAX];
        for &(_, timestamp) in &built.records {
            targets.extend([timestamp.saturating_sub(1), timestamp, timestamp.saturating_add(1)]);
        }
        for target in targets {
            let position = built.index.position_for_timestamp(target);
            assert!(built.is_batch_start(position), "{target}: {position} is no batch start");
            // Brute force over every record: the first offset with a timestamp >= target.
            let first = built.records.iter().find(|&&(_, t)| t >= target).map(|&(o, _)| o);
            if let Some(first) = first {
                let (batch_position, _, _) = built.batches[built.batch_holding(first)];
                assert!(position <= batch_position, "{target}: {position} > {batch_position}");
            }
            assert_eq!(built.scan_from(position, |_, t| t >= target), first, "{target}");
        }
    }
    QuickCheck::new().quickcheck(property as fn(GeneratedSegment));
}

#[test]
fn the_index_stays_sparse() {
    fn property(segment: GeneratedSegment) {
        let built = build(&segment);
        let interval = segment.interval_bytes as usize;
        let bound = built.bytes.len() / interval + 1;
        assert!(built.index.offsets.len() <= bound, "{} > {bound}", built.index.offsets.len());
        assert!(built.index.times.len() <= bound, "{} > {bound}", built.index.times.len());
        let all_maxima = built.records.iter().map(|&(_, t)| t).max().unwrap();
        assert_eq!(built.index.max_timestamp(), all_maxima);
        assert_eq!(built.index.offset_entries(), built.index.offsets.as_slice());
    }
    QuickCheck::new().quickcheck(property as fn(GeneratedSegment));
}

#[test]
fn decode_inverts_encode() {
    fn property(segment: GeneratedSegment) {
        let built = build(&segment);
        let (offsets, times) = built.index.encode(built.bytes.len() as u64, built.next_offset());
        let base = Offset::new(segment.base_offset);
        let covered = built.bytes.len() as u64;
        let (decoded, next_offset) =
            SegmentIndex::decode(&offsets, &times, base, covered, segment.interval_bytes).unwrap();
        assert_eq!(next_offset, built.next_offset());
        assert_eq!(persisted(&decoded), persisted(&built.index));
        assert_eq!(decoded.interval_bytes, segment.interval_bytes);
        // Lookups on the decoded index answer as on the original.
        for &(offset, timestamp) in &built.records {
            let expected = built.index.position_for_offset(offset);
            assert_eq!(decoded.position_for_offset(offset), expected);
            let expected = built.index.position_for_timestamp(timestamp);
            assert_eq!(decoded.position_for_timestamp(timestamp), expected);
        }
    }
    QuickCheck::new().quickcheck(property as fn(GeneratedSegment));
}

// Unit tests: lookups on hand-built indexes.

#[test]
fn an_empty_index_points_at_the_start() {
    let index = SegmentIndex::new(Offset::new(10), 100);
    assert_eq!(index.position_for_offset(Offset::new(0)), 0);
    assert_eq!(index.position_for_offset(Offset::new(500)), 0);
    assert_eq!(index.position_for_timestamp(i64::MIN), 0);
    assert_eq!(index.position_for_timestamp(i64::MAX), 0);
    assert_eq!(index.max_timestamp(), i64::MIN);
}

#[test]
fn entries_are_added_once_interval_bytes_have_passed() {
    let mut index = SegmentIndex::new(Offset::new(100), 100);
    // (position, base offset, max timestamp, length)
    let batches = [(0, 100, 5, 60), (60, 103, 4, 60), (120, 110, 9, 30), (150, 111, 7, 80)];
    for (position, base, max_timestamp, length) in batches {
        index.on_batch(position, Offset::new(base), max_timestamp, length);
    }
    // 120 bytes had passed when the third batch came; only 30 + 80 since, the fourth got none.
    assert_eq!(index.offsets, [(10, 120)]);
    // The first batch always gets a time entry; the third raised the maximum after 120 bytes.
    assert_eq!(index.times, [(5, 0), (9, 10)]);
    assert_eq!(index.max_timestamp(), 9);
    assert_eq!(index.position_for_offset(Offset::new(109)), 0);
    assert_eq!(index.position_for_offset(Offset::new(110)), 120);
    assert_eq!(index.position_for_offset(Offset::new(111)), 120);
    assert_eq!(index.position_for_timestamp(5), 0);
    assert_eq!(index.position_for_timestamp(6), 0, "the maximum before offset 110 is 5");
    assert_eq!(index.position_for_timestamp(10), 120, "no record reaches 10: scan the tail");
}

// Unit tests: decode refuses damaged or foreign files.

/// A small index with several entries of each kind, over a segment of `COVERED` bytes.
fn sample() -> (SegmentIndex, Vec<u8>, Vec<u8>) {
    let mut index = SegmentIndex::new(Offset::new(BASE), INTERVAL);
    let mut position = 0;
    for (i, max_timestamp) in [3, 1, 8, 8, 12, 20].into_iter().enumerate() {
        index.on_batch(position, Offset::new(BASE + 2 * i as u64), max_timestamp, 100);
        position += 100;
    }
    assert_eq!(index.offsets.len(), 5);
    assert_eq!(index.times.len(), 4);
    let (offsets, times) = index.encode(COVERED, Offset::new(BASE + 12));
    (index, offsets, times)
}

const BASE: u64 = 500;
const COVERED: u64 = 1_000;
const INTERVAL: u32 = 10;

fn decode(offsets: &[u8], times: &[u8]) -> Result<(SegmentIndex, Offset), &'static str> {
    SegmentIndex::decode(offsets, times, Offset::new(BASE), COVERED, INTERVAL)
}

fn reseal(file: &mut [u8]) {
    let checksum = xxh3_64(&file[CHECKSUM_BYTES..]);
    file[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
}

fn header_mut(file: &mut [u8]) -> &mut IndexFileHeader {
    IndexFileHeader::mut_from_prefix(file).unwrap().0
}

const HEADER_BYTES: usize = size_of::<IndexFileHeader>();
const OFFSET_ENTRY_BYTES: usize = size_of::<OffsetEntry>();
const TIME_ENTRY_BYTES: usize = size_of::<TimeEntry>();

#[test]
fn the_sample_decodes() {
    let (index, offsets, times) = sample();
    let (decoded, next_offset) = decode(&offsets, &times).unwrap();
    assert_eq!(persisted(&decoded), persisted(&index));
    assert_eq!(next_offset, Offset::new(BASE + 12));
    assert_eq!(&offsets[8..12], b"CHIX");
    assert_eq!(offsets.len(), HEADER_BYTES + 5 * OFFSET_ENTRY_BYTES);
    assert_eq!(times.len(), HEADER_BYTES + 4 * TIME_ENTRY_BYTES);
}

#[test]
fn decode_rejects_another_covered_length_or_base_offset() {
    let (_, offsets, times) = sample();
    for covered in [0, COVERED - 1, COVERED + 1] {
        let result = SegmentIndex::decode(&offsets, &times, Offset::new(BASE), covered, INTERVAL);
        assert_eq!(result.err(), Some("segment length differs from the one indexed"));
    }
    for base in [0, BASE - 1, BASE + 1] {
        let result = SegmentIndex::decode(&offsets, &times, Offset::new(base), COVERED, INTERVAL);
        assert_eq!(result.err(), Some("base offset differs from the segment's"));
    }
}

#[test]
fn decode_rejects_every_flipped_byte() {
    let (_, offsets, times) = sample();
    for which in 0..2 {
        let original = if which == 0 { &offsets } else { &times };
        for position in 0..original.len() {
            for mask in [0x01, 0x80, 0xFF] {
                let mut damaged = original.clone();
                damaged[position] ^= mask;
                let result =
                    if which == 0 { decode(&damaged, &times) } else { decode(&offsets, &damaged) };
                assert!(result.is_err(), "file {which} byte {position} ^ {mask:#04x}");
            }
        }
    }
}

#[test]
fn decode_rejects_truncated_and_extended_files() {
    let (_, offsets, times) = sample();
    for length in 0..offsets.len() {
        assert!(decode(&offsets[..length], &times).is_err(), "offsets cut at {length}");
    }
    for length in 0..times.len() {
        assert!(decode(&offsets, &times[..length]).is_err(), "times cut at {length}");
    }
    // A whole entry cut off, with a checksum that matches what is left.
    let mut cut = offsets[..offsets.len() - OFFSET_ENTRY_BYTES].to_vec();
    reseal(&mut cut);
    assert_eq!(decode(&cut, &times).err(), Some("entry count differs from the file length"));
    let mut cut = times[..times.len() - 1].to_vec();
    reseal(&mut cut);
    assert_eq!(decode(&offsets, &cut).err(), Some("entries do not fill the file"));
    // Bytes appended after the last entry.
    let mut extended = offsets.clone();
    extended.push(0);
    assert_eq!(decode(&extended, &times).err(), Some("checksum mismatch"));
    reseal(&mut extended);
    assert_eq!(decode(&extended, &times).err(), Some("entries do not fill the file"));
}

#[test]
fn decode_rejects_offset_entries_out_of_order() {
    let (_, offsets, times) = sample();
    // Swap two entries; then repeat one; then repeat only the position; then only the offset.
    let edits: [fn(&mut [u8]); 4] = [
        |f| {
            let (a, b) = f[HEADER_BYTES..].split_at_mut(OFFSET_ENTRY_BYTES);
            a.swap_with_slice(&mut b[..OFFSET_ENTRY_BYTES]);
        },
        |f| f.copy_within(HEADER_BYTES..HEADER_BYTES + 8, HEADER_BYTES + 8),
        |f| f.copy_within(HEADER_BYTES + 4..HEADER_BYTES + 8, HEADER_BYTES + 12),
        |f| f.copy_within(HEADER_BYTES..HEADER_BYTES + 4, HEADER_BYTES + 8),
    ];
    for (i, edit) in edits.into_iter().enumerate() {
        let mut damaged = offsets.clone();
        edit(&mut damaged);
        reseal(&mut damaged);
        assert_eq!(
            decode(&damaged, &times).err(),
            Some("offset index entries out of order or range"),
            "edit {i}"
        );
    }
}

#[test]
fn decode_rejects_a_position_beyond_the_segment() {
    let (_, mut offsets, times) = sample();
    let last = offsets.len() - 4;
    offsets[last..].copy_from_slice(&(COVERED as u32).to_le_bytes());
    reseal(&mut offsets);
    assert_eq!(decode(&offsets, &times).err(), Some("offset index entries out of order or range"));
}

#[test]
fn decode_rejects_time_entries_out_of_order() {
    let (_, offsets, times) = sample();
    let entry = |i: usize| HEADER_BYTES + i * TIME_ENTRY_BYTES;
    // Swap two entries; repeat a timestamp; repeat a relative offset.
    let mut swapped = times.clone();
    let (a, b) = swapped[entry(1)..].split_at_mut(TIME_ENTRY_BYTES);
    a.swap_with_slice(&mut b[..TIME_ENTRY_BYTES]);
    let mut same_timestamp = times.clone();
    same_timestamp.copy_within(entry(1)..entry(1) + 8, entry(2));
    let mut same_offset = times.clone();
    same_offset.copy_within(entry(1) + 8..entry(2), entry(2) + 8);
    for (name, mut damaged) in
        [("swapped", swapped), ("same timestamp", same_timestamp), ("same offset", same_offset)]
    {
        reseal(&mut damaged);
        assert_eq!(
            decode(&offsets, &damaged).err(),
            Some("time index entries out of order"),
            "{name}"
        );
    }
}

#[test]
fn decode_rejects_foreign_and_disagreeing_files() {
    let (_, offsets, times) = sample();
    assert_eq!(decode(&times, &offsets).err(), Some("bad magic or kind"));
    assert_eq!(decode(&offsets, &offsets).err(), Some("bad magic or kind"));

    let mut other = times.clone();
    header_mut(&mut other).version = U16::new(INDEX_VERSION + 1);
    reseal(&mut other);
    assert_eq!(decode(&offsets, &other).err(), Some("unsupported version"));

    let mut other = times.clone();
    header_mut(&mut other).next_offset = U64::new(BASE + 13);
    reseal(&mut other);
    assert_eq!(decode(&offsets, &other).err(), Some("offset and time index disagree"));

    let mut other = times.clone();
    header_mut(&mut other).max_timestamp = I64::new(19);
    reseal(&mut other);
    assert_eq!(decode(&offsets, &other).err(), Some("offset and time index disagree"));

    let (mut low_offsets, mut low_times) = (offsets.clone(), times.clone());
    for file in [&mut low_offsets, &mut low_times] {
        header_mut(file).next_offset = U64::new(BASE - 1);
        reseal(file);
    }
    assert_eq!(decode(&low_offsets, &low_times).err(), Some("next offset below the base offset"));

    let mut other = offsets.clone();
    header_mut(&mut other).entry_count = U32::new(4);
    reseal(&mut other);
    assert_eq!(decode(&other, &times).err(), Some("entry count differs from the file length"));
}
