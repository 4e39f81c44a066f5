//! Tests of the batch format: quickcheck properties for encode/parse and damage detection, and
//! unit tests for each way `encode_batch` and `parse_batch` refuse bytes.

// quickcheck hands generated values to properties by value.
#![allow(clippy::needless_pass_by_value)]

use super::meta::{DATA_DIRECTORY_MAGIC, DataDirectoryMeta, MetaFile, TOPIC_MAGIC, TopicMeta};
use super::*;
use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};

// Generation bounds: small batches keep every property fast.
const GENERATED_RECORDS_MAX: usize = 8;
const GENERATED_BYTES_MAX: usize = 24;
const GENERATED_HEADERS_MAX: usize = 3;
/// Generated base offsets stay far from `u64::MAX`; offset overflow has its own unit test.
const GENERATED_OFFSET_MAX: u64 = 1 << 62;

/// An owned record, so quickcheck can generate and shrink it; [`encode`] borrows it as a
/// [`Record`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct OwnedRecord {
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    timestamp: Option<i64>,
    headers: Vec<OwnedHeader>,
}

/// A record header's key and value.
type OwnedHeader = (Vec<u8>, Vec<u8>);

fn small_bytes(g: &mut Gen) -> Vec<u8> {
    let length = usize::arbitrary(g) % (GENERATED_BYTES_MAX + 1);
    (0..length).map(|_| u8::arbitrary(g)).collect()
}

impl Arbitrary for OwnedRecord {
    fn arbitrary(g: &mut Gen) -> Self {
        // `None` and `Some(empty)` are different on disk (-1 and 0); both must be generated.
        let key = match u8::arbitrary(g) % 3 {
            0 => None,
            1 => Some(Vec::new()),
            _ => Some(small_bytes(g)),
        };
        let header_count = usize::arbitrary(g) % (GENERATED_HEADERS_MAX + 1);
        OwnedRecord {
            key,
            value: small_bytes(g),
            timestamp: Option::<i64>::arbitrary(g),
            headers: (0..header_count).map(|_| (small_bytes(g), small_bytes(g))).collect(),
        }
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        let record = self.clone();
        let fewer_headers =
            self.headers.shrink().map(move |headers| OwnedRecord { headers, ..record.clone() });
        let record = self.clone();
        let shorter_values =
            self.value.shrink().map(move |value| OwnedRecord { value, ..record.clone() });
        Box::new(fewer_headers.chain(shorter_values))
    }
}

/// Everything `encode_batch` takes, generated.
#[derive(Clone, Debug)]
struct BatchInput {
    base_offset: u64,
    default_timestamp: i64,
    synced_offset_hint: u64,
    records: Vec<OwnedRecord>,
}

impl Arbitrary for BatchInput {
    fn arbitrary(g: &mut Gen) -> Self {
        let count = 1 + usize::arbitrary(g) % GENERATED_RECORDS_MAX;
        BatchInput {
            base_offset: u64::arbitrary(g) % GENERATED_OFFSET_MAX,
            default_timestamp: i64::arbitrary(g),
            synced_offset_hint: u64::arbitrary(g),
            records: (0..count).map(|_| OwnedRecord::arbitrary(g)).collect(),
        }
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        let input = self.clone();
        Box::new(
            self.records
                .shrink()
                .filter(|records| !records.is_empty())
                .map(move |records| BatchInput { records, ..input.clone() }),
        )
    }
}

impl BatchInput {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        encode(
            out,
            Offset::new(self.base_offset),
            &self.records,
            self.default_timestamp,
            Offset::new(self.synced_offset_hint),
        )
        .expect("generated batches are within limits");
    }
}

/// Borrow `records` as [`Record`]s and encode them.
fn encode(
    out: &mut Vec<u8>,
    base_offset: Offset,
    records: &[OwnedRecord],
    default_timestamp: i64,
    synced_offset_hint: Offset,
) -> Result<BatchInfo, AppendError> {
    let headers: Vec<Vec<Header<'_>>> = records
        .iter()
        .map(|r| r.headers.iter().map(|(key, value)| Header { key, value }).collect())
        .collect();
    let borrowed: Vec<Record<'_>> = records
        .iter()
        .zip(&headers)
        .map(|(r, headers)| Record {
            key: r.key.as_deref(),
            value: &r.value,
            timestamp: r.timestamp,
            headers,
        })
        .collect();
    let start = out.len();
    let info = encode_batch(out, base_offset, &borrowed, default_timestamp, synced_offset_hint)?;
    // Pair check: what the encoder reports is what a reader parses back.
    assert_eq!(parse_batch(&out[start..]).map(|b| b.info()), Ok(info));
    Ok(info)
}

/// Check that `view` holds exactly `input`, with `base_offset` and `hint` in place of the
/// input's (they differ after `set_batch_offsets`).
fn assert_holds(view: &BatchView<'_>, input: &BatchInput, base_offset: u64, hint: u64) {
    let count = input.records.len() as u64;
    let timestamp_of = |r: &OwnedRecord| r.timestamp.unwrap_or(input.default_timestamp);
    assert_eq!(view.base_offset(), Offset::new(base_offset));
    assert_eq!(view.last_offset(), Offset::new(base_offset + count - 1));
    assert_eq!(view.next_offset(), Offset::new(base_offset + count));
    assert_eq!(u64::from(view.record_count()), count);
    assert_eq!(view.synced_offset_hint(), Offset::new(hint));
    let max_timestamp = input.records.iter().map(timestamp_of).max().unwrap();
    assert_eq!(view.max_timestamp(), max_timestamp);
    assert_eq!(view.header().first_timestamp.get(), timestamp_of(&input.records[0]));
    assert_eq!(view.records().size_hint(), (count as usize, Some(count as usize)));
    let mut seen = 0;
    for (i, (got, want)) in view.records().zip(&input.records).enumerate() {
        assert_eq!(got.offset(), Offset::new(base_offset + i as u64));
        assert_eq!(got.timestamp(), timestamp_of(want));
        assert_eq!(got.key(), want.key.as_deref());
        assert_eq!(got.value(), want.value.as_slice());
        let headers: Vec<OwnedHeader> =
            got.headers().map(|h| (h.key.to_vec(), h.value.to_vec())).collect();
        assert_eq!(headers, want.headers);
        seen += 1;
    }
    assert_eq!(seen, input.records.len());
    assert_eq!(view.records().count(), input.records.len(), "no records after the last");
}

/// Recompute the checksum of the batch at the start of `bytes` after a test edited it, so that
/// the check being tested is the one that fails, not the checksum.
fn reseal(bytes: &mut [u8]) {
    let length = BatchHeader::ref_from_prefix(bytes).unwrap().0.length.get() as usize;
    let checksum = batch_checksum(&bytes[..length.min(bytes.len())]);
    bytes[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
}

fn batch_header_mut(bytes: &mut [u8]) -> &mut BatchHeader {
    BatchHeader::mut_from_prefix(bytes).unwrap().0
}

/// The header of the record that starts `position` bytes into the batch.
fn record_header_mut(bytes: &mut [u8], position: usize) -> &mut RecordHeader {
    RecordHeader::mut_from_prefix(&mut bytes[position..]).unwrap().0
}

fn malformed(reason: &'static str) -> Result<(), DecodeError> {
    Err(DecodeError::Corrupt(CorruptionKind::Malformed { reason }))
}

fn parse_result(bytes: &[u8]) -> Result<(), DecodeError> {
    parse_batch(bytes).map(|_| ())
}

/// Touch every byte a view exposes, so that a view over bad bytes would panic here.
fn walk(view: &BatchView<'_>) -> usize {
    let mut records = 0;
    for record in view.records() {
        let _ = (record.offset(), record.timestamp(), record.key(), record.value());
        for header in record.headers() {
            let _ = (header.key, header.value);
        }
        records += 1;
    }
    let _ = (view.last_offset(), view.next_offset(), view.max_timestamp());
    records
}

fn plain_records(count: usize) -> Vec<OwnedRecord> {
    (0..count)
        .map(|i| OwnedRecord {
            key: Some(vec![b'k'; i]),
            value: vec![b'v'; 3 + i],
            timestamp: Some(1_000 + i64::try_from(i).unwrap()),
            headers: vec![(b"h".to_vec(), vec![b'x'; i])],
        })
        .collect()
}

fn plain_batch(count: usize) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&mut out, Offset::new(100), &plain_records(count), 7, Offset::new(50)).unwrap();
    out
}

// Properties.

#[test]
fn encode_then_parse_round_trips_every_field() {
    fn property(input: BatchInput) {
        let bytes = input.encode();
        let view = parse_batch(&bytes).expect("an encoded batch parses");
        assert_eq!(view.len(), bytes.len());
        assert_eq!(view.as_bytes(), bytes.as_slice());
        assert!(!view.is_empty());
        assert_holds(&view, &input, input.base_offset, input.synced_offset_hint);
    }
    QuickCheck::new().quickcheck(property as fn(BatchInput));
}

#[test]
fn batches_encoded_back_to_back_parse_one_after_the_other() {
    fn property(first: BatchInput, second: BatchInput) {
        let mut bytes = vec![0xAB; 3];
        first.encode_into(&mut bytes);
        let first_end = bytes.len();
        second.encode_into(&mut bytes);
        assert_eq!(&bytes[..3], &[0xAB; 3], "encoding keeps what `out` held");
        let view = parse_batch(&bytes[3..]).unwrap();
        assert_eq!(view.len(), first_end - 3, "a batch ends where the next one starts");
        assert_holds(&view, &first, first.base_offset, first.synced_offset_hint);
        let view = parse_batch(&bytes[first_end..]).unwrap();
        assert_holds(&view, &second, second.base_offset, second.synced_offset_hint);
    }
    QuickCheck::new().quickcheck(property as fn(BatchInput, BatchInput));
}

#[test]
fn set_batch_offsets_moves_the_batch_and_keeps_it_valid() {
    fn property(input: BatchInput, base_offset: u64, hint: u64, trailing: Vec<u8>) {
        let base_offset = base_offset % GENERATED_OFFSET_MAX;
        let original = input.encode();
        let mut bytes = original.clone();
        bytes.extend_from_slice(&trailing);
        set_batch_offsets(&mut bytes, Offset::new(base_offset), Offset::new(hint));
        assert_eq!(&bytes[original.len()..], trailing.as_slice(), "bytes after are untouched");
        let view = parse_batch(&bytes).expect("a batch with new offsets still parses");
        assert_eq!(view.len(), original.len());
        assert_holds(&view, &input, base_offset, hint);
        // Only the checksum, the base offset and the hint change.
        let changed: Vec<usize> =
            (0..original.len()).filter(|&i| original[i] != bytes[i]).collect();
        assert!(changed.iter().all(|&i| i < 8 || (24..32).contains(&i) || (56..64).contains(&i)));
    }
    QuickCheck::new().quickcheck(property as fn(BatchInput, u64, u64, Vec<u8>));
}

#[test]
fn flipping_any_byte_is_detected() {
    fn property(input: BatchInput, position: usize, mask: u8) -> TestResult {
        if mask == 0 {
            return TestResult::discard();
        }
        let mut bytes = input.encode();
        let position = position % bytes.len();
        bytes[position] ^= mask;
        match parse_batch(&bytes) {
            Ok(view) => TestResult::error(format!(
                "flipping byte {position} with {mask:#04x} went unnoticed: {:?}",
                view.header()
            )),
            Err(_) => TestResult::passed(),
        }
    }
    QuickCheck::new().quickcheck(property as fn(BatchInput, usize, u8) -> TestResult);
}

#[test]
fn parse_never_panics_on_arbitrary_bytes() {
    fn property(bytes: Vec<u8>) {
        if let Ok(view) = parse_batch(&bytes) {
            assert_eq!(walk(&view), view.record_count() as usize);
        }
    }
    QuickCheck::new().tests(1_000).quickcheck(property as fn(Vec<u8>));
}

/// Arbitrary bytes behind a header with the right magic, length, version and checksum, so that
/// the record-layout validation, not the checksum, is what sees the garbage.
#[test]
fn parse_never_panics_on_garbage_with_a_valid_checksum() {
    fn property(body: Vec<u8>, record_count: u8, last_offset_delta: u8) {
        let mut bytes = vec![0; BATCH_HEADER_BYTES];
        bytes.extend_from_slice(&body);
        let header = batch_header_mut(&mut bytes);
        header.length = U32::new((BATCH_HEADER_BYTES + body.len()) as u32);
        header.magic = U32::new(BATCH_MAGIC);
        header.version = U16::new(BATCH_VERSION);
        header.record_count = U32::new(u32::from(record_count % 4));
        header.last_offset_delta = U32::new(u32::from(last_offset_delta % 4));
        reseal(&mut bytes);
        match parse_batch(&bytes) {
            Ok(view) => assert_eq!(walk(&view), view.record_count() as usize),
            Err(error) => assert!(matches!(error, DecodeError::Corrupt(_)), "{error:?}"),
        }
    }
    QuickCheck::new().tests(1_000).quickcheck(property as fn(Vec<u8>, u8, u8));
}

/// A valid batch with one byte changed and the checksum recomputed: whatever the structural
/// validation lets through must be safe to iterate.
#[test]
fn parse_never_panics_on_a_resealed_damaged_batch() {
    fn property(input: BatchInput, position: usize, value: u8) {
        let mut bytes = input.encode();
        // Skip the checksum (resealing rewrites it) and the length (changing it only moves
        // what the checksum covers).
        let position = 12 + position % (bytes.len() - 12);
        bytes[position] = value;
        reseal(&mut bytes);
        if let Ok(view) = parse_batch(&bytes) {
            assert_eq!(walk(&view), view.record_count() as usize);
        }
    }
    QuickCheck::new().tests(1_000).quickcheck(property as fn(BatchInput, usize, u8));
}

#[test]
fn every_strict_prefix_is_incomplete() {
    fn property(input: BatchInput) {
        let bytes = input.encode();
        for length in 0..bytes.len() {
            match parse_batch(&bytes[..length]) {
                Err(DecodeError::Incomplete { available, .. }) => {
                    assert_eq!(available, length as u64);
                }
                other => panic!("prefix of {length} of {} bytes: {other:?}", bytes.len()),
            }
        }
    }
    QuickCheck::new().quickcheck(property as fn(BatchInput));
}

// Unit tests: encoding.

#[test]
fn encode_rejects_an_empty_batch() {
    let mut out = vec![1, 2, 3];
    let result = encode_batch(&mut out, Offset::ZERO, &[], 0, Offset::ZERO);
    assert!(matches!(result, Err(AppendError::Empty)), "{result:?}");
    assert_eq!(out, [1, 2, 3], "a refused batch writes nothing");
}

#[test]
fn encode_accepts_the_largest_batch_and_rejects_one_byte_more() {
    let overhead = BATCH_HEADER_BYTES + RECORD_HEADER_BYTES;
    let value = vec![0x5A; BATCH_BYTES_MAX as usize - overhead + 1];
    let mut out = Vec::new();
    let record = [Record::new(None, &value[1..])];
    encode_batch(&mut out, Offset::ZERO, &record, 0, Offset::ZERO).unwrap();
    assert_eq!(out.len(), BATCH_BYTES_MAX as usize);
    assert_eq!(parse_batch(&out).unwrap().len(), BATCH_BYTES_MAX as usize);

    let mut out = Vec::new();
    let record = [Record::new(None, &value)];
    let result = encode_batch(&mut out, Offset::ZERO, &record, 0, Offset::ZERO);
    let max = u64::from(BATCH_BYTES_MAX);
    assert!(
        matches!(
            result,
            Err(AppendError::BatchTooLarge { bytes, max: m }) if bytes == max + 1 && m == max
        ),
        "{result:?}"
    );
    assert!(out.is_empty());
}

#[test]
fn encode_rejects_too_many_records() {
    let records = vec![Record::new(None, b""); BATCH_RECORDS_MAX as usize + 1];
    let mut out = Vec::new();
    let result = encode_batch(&mut out, Offset::ZERO, &records, 0, Offset::ZERO);
    assert!(
        matches!(
            result,
            Err(AppendError::TooManyRecords { records, max: BATCH_RECORDS_MAX })
                if records == BATCH_RECORDS_MAX as usize + 1
        ),
        "{result:?}"
    );
    assert!(out.is_empty());
}

#[test]
fn header_fields_sit_where_the_format_says() {
    let bytes = plain_batch(2);
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    assert_eq!(u64_at(0), batch_checksum(&bytes));
    assert_eq!(u32_at(8) as usize, bytes.len());
    assert_eq!(&bytes[12..16], b"CHRB");
    assert_eq!(&bytes[16..18], &BATCH_VERSION.to_le_bytes());
    assert_eq!(&bytes[18..20], &[0, 0], "attributes are zero but for a transaction's batch");
    assert_eq!(u32_at(20), 2, "record count");
    assert_eq!(u64_at(24), 100, "base offset");
    assert_eq!(u32_at(32), 1, "last offset delta");
    assert_eq!(u32_at(36), 0, "reserved");
    assert_eq!(u64_at(40), 1_000, "first timestamp");
    assert_eq!(u64_at(48), 1_001, "max timestamp");
    assert_eq!(u64_at(56), 50, "synced offset hint");
    // The first record: no key bytes for `Some(empty)`, key length 0 rather than -1.
    assert_eq!(u32_at(64) as usize, RECORD_HEADER_BYTES + 3 + HEADER_ENTRY_BYTES + 1);
    assert_eq!(u32_at(68), 0, "offset delta");
    assert_eq!(u64_at(72), 0, "timestamp delta");
    assert_eq!(u32_at(80), 0, "key length");
    assert_eq!(u32_at(84), 3, "value length");
    assert_eq!(u32_at(88), 1, "header count");
}

#[test]
fn a_record_without_key_is_encoded_with_key_length_minus_one() {
    let mut bytes = Vec::new();
    encode_batch(&mut bytes, Offset::ZERO, &[Record::new(None, b"v")], 0, Offset::ZERO).unwrap();
    let header = RecordHeader::ref_from_prefix(&bytes[BATCH_HEADER_BYTES..]).unwrap().0;
    assert_eq!(header.key_length.get(), -1);
    let view = parse_batch(&bytes).unwrap();
    assert_eq!(view.records().next().unwrap().key(), None);
}

#[test]
fn timestamps_far_apart_wrap_and_still_round_trip() {
    let records = [
        Record::new(None, b"a").with_timestamp(i64::MAX),
        Record::new(None, b"b").with_timestamp(i64::MIN),
        Record::new(None, b"c"),
    ];
    let mut bytes = Vec::new();
    encode_batch(&mut bytes, Offset::ZERO, &records, -5, Offset::ZERO).unwrap();
    let view = parse_batch(&bytes).unwrap();
    let timestamps: Vec<i64> = view.records().map(|r| r.timestamp()).collect();
    assert_eq!(timestamps, [i64::MAX, i64::MIN, -5]);
    assert_eq!(view.max_timestamp(), i64::MAX);
}

// Unit tests: parsing refuses bad bytes, each for its own reason.

#[test]
fn parse_rejects_bad_magic() {
    let mut bytes = plain_batch(1);
    batch_header_mut(&mut bytes).magic = U32::new(u32::from_le_bytes(*b"CHRX"));
    reseal(&mut bytes);
    let found = u32::from_le_bytes(*b"CHRX");
    assert_eq!(parse_result(&bytes), Err(DecodeError::Corrupt(CorruptionKind::BadMagic { found })));
}

#[test]
fn parse_rejects_an_unsupported_version_with_a_valid_checksum() {
    let mut bytes = plain_batch(1);
    batch_header_mut(&mut bytes).version = U16::new(BATCH_VERSION_COMPACTED + 1);
    let checksum_before = batch_checksum(&bytes);
    assert!(matches!(
        parse_result(&bytes),
        Err(DecodeError::Corrupt(CorruptionKind::ChecksumMismatch { actual, .. }))
            if actual == checksum_before
    ));
    reseal(&mut bytes);
    let found = BATCH_VERSION_COMPACTED + 1;
    let expected = Err(DecodeError::Corrupt(CorruptionKind::UnsupportedVersion { found }));
    assert_eq!(parse_result(&bytes), expected);
}

#[test]
fn parse_reports_a_checksum_mismatch_with_both_values() {
    let mut bytes = plain_batch(2);
    let expected = batch_checksum(&bytes);
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let actual = batch_checksum(&bytes);
    let error = DecodeError::Corrupt(CorruptionKind::ChecksumMismatch { expected, actual });
    assert_eq!(parse_result(&bytes), Err(error));
}

#[test]
fn parse_rejects_impossible_lengths() {
    for length in [0, BATCH_HEADER_BYTES as u32 - 1, BATCH_BYTES_MAX + 1, u32::MAX] {
        let mut bytes = plain_batch(1);
        batch_header_mut(&mut bytes).length = U32::new(length);
        let error = DecodeError::Corrupt(CorruptionKind::BadLength { length: length.into() });
        assert_eq!(parse_result(&bytes), Err(error), "length {length}");
    }
}

#[test]
fn a_length_beyond_the_buffer_is_incomplete() {
    let mut bytes = plain_batch(1);
    let length = bytes.len() as u32 + 1;
    batch_header_mut(&mut bytes).length = U32::new(length);
    let available = bytes.len() as u64;
    let error = DecodeError::Incomplete { needed: length.into(), available };
    assert_eq!(parse_result(&bytes), Err(error));
}

#[test]
fn flipping_each_byte_of_a_small_batch_is_detected() {
    let original = plain_batch(3);
    for position in 0..original.len() {
        for mask in [0x01, 0x80, 0xFF] {
            let mut bytes = original.clone();
            bytes[position] ^= mask;
            assert!(parse_batch(&bytes).is_err(), "byte {position} ^ {mask:#04x}");
        }
    }
}

#[test]
fn parse_rejects_a_record_length_that_overruns_the_batch() {
    let mut bytes = plain_batch(2);
    let header = record_header_mut(&mut bytes, BATCH_HEADER_BYTES);
    header.length = U32::new(header.length.get() + 1_000);
    reseal(&mut bytes);
    assert_eq!(parse_result(&bytes), malformed("record exceeds its batch"));
}

#[test]
fn parse_rejects_a_record_length_that_disagrees_with_its_fields() {
    // Shorter than the record header, shorter than its fields, longer than its fields (the
    // next record's bytes are then claimed).
    for delta in [-1_000_i64, -1, 1] {
        let mut bytes = plain_batch(2);
        let header = record_header_mut(&mut bytes, BATCH_HEADER_BYTES);
        let length = (i64::from(header.length.get()) + delta).max(0);
        header.length = U32::new(u32::try_from(length).unwrap());
        reseal(&mut bytes);
        assert_eq!(parse_result(&bytes), malformed("record exceeds its batch"), "{delta}");
    }
}

#[test]
fn parse_rejects_bad_key_value_and_header_lengths() {
    type Edit = fn(&mut RecordHeader);
    let edits: [(&str, Edit); 5] = [
        ("key length -2", |h| h.key_length = I32::new(-2)),
        ("key length i32::MIN", |h| h.key_length = I32::new(i32::MIN)),
        ("key overruns", |h| h.key_length = I32::new(i32::MAX)),
        ("value overruns", |h| h.value_length = U32::new(u32::MAX)),
        ("too many headers", |h| h.header_count = U32::new(h.header_count.get() + 1)),
    ];
    for (name, edit) in edits {
        let mut bytes = plain_batch(2);
        edit(record_header_mut(&mut bytes, BATCH_HEADER_BYTES));
        reseal(&mut bytes);
        assert_eq!(parse_result(&bytes), malformed("record exceeds its batch"), "{name}");
    }
}

#[test]
fn parse_rejects_a_header_entry_that_overruns_its_record() {
    let mut bytes = plain_batch(1);
    // The single record's only header entry starts after its header, (empty) key and value.
    let entry = BATCH_HEADER_BYTES + RECORD_HEADER_BYTES + 3;
    let (entry, _) = HeaderEntry::mut_from_prefix(&mut bytes[entry..]).unwrap();
    entry.value_length = U32::new(u32::MAX);
    reseal(&mut bytes);
    assert_eq!(parse_result(&bytes), malformed("record exceeds its batch"));
}

#[test]
fn parse_rejects_offsets_that_do_not_increase() {
    let mut bytes = plain_batch(2);
    let first_length = record_header_mut(&mut bytes, BATCH_HEADER_BYTES).length.get();
    let second = BATCH_HEADER_BYTES + first_length as usize;
    record_header_mut(&mut bytes, second).offset_delta = U32::new(0);
    batch_header_mut(&mut bytes).last_offset_delta = U32::new(0);
    reseal(&mut bytes);
    assert_eq!(parse_result(&bytes), malformed("record offsets do not increase"));
}

#[test]
fn parse_rejects_gaps_between_record_offsets() {
    // Version 1 batches are dense; a gap could push offsets past what a segment can index.
    let mut bytes = plain_batch(2);
    let first_length = record_header_mut(&mut bytes, BATCH_HEADER_BYTES).length.get();
    let second = BATCH_HEADER_BYTES + first_length as usize;
    record_header_mut(&mut bytes, second).offset_delta = U32::new(u32::MAX);
    batch_header_mut(&mut bytes).last_offset_delta = U32::new(u32::MAX);
    reseal(&mut bytes);
    assert_eq!(parse_result(&bytes), malformed("record offsets are not contiguous"));
}

#[test]
fn parse_rejects_a_last_offset_delta_that_disagrees_with_the_records() {
    let mut bytes = plain_batch(2);
    batch_header_mut(&mut bytes).last_offset_delta = U32::new(2);
    reseal(&mut bytes);
    assert_eq!(parse_result(&bytes), malformed("last offset delta disagrees with the records"));
}

#[test]
fn parse_rejects_a_record_count_that_disagrees_with_the_records() {
    let cases = [
        (0, "record count out of range"),
        (BATCH_RECORDS_MAX + 1, "record count out of range"),
        (1, "bytes after the last record"),
        (3, "record exceeds its batch"),
    ];
    for (count, reason) in cases {
        let mut bytes = plain_batch(2);
        batch_header_mut(&mut bytes).record_count = U32::new(count);
        reseal(&mut bytes);
        assert_eq!(parse_result(&bytes), malformed(reason), "record count {count}");
    }
}

#[test]
fn parse_rejects_trailing_bytes_inside_the_declared_length() {
    let mut bytes = plain_batch(2);
    bytes.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
    let length = bytes.len() as u32;
    batch_header_mut(&mut bytes).length = U32::new(length);
    reseal(&mut bytes);
    assert_eq!(parse_result(&bytes), malformed("bytes after the last record"));
}

#[test]
fn parse_rejects_offsets_that_would_overflow() {
    let mut bytes = plain_batch(2);
    batch_header_mut(&mut bytes).base_offset = u64::MAX.into();
    reseal(&mut bytes);
    assert_eq!(parse_result(&bytes), malformed("offsets overflow"));
    // The last offset that fits: the offset after the batch is `u64::MAX`.
    batch_header_mut(&mut bytes).base_offset = (u64::MAX - 2).into();
    reseal(&mut bytes);
    let view = parse_batch(&bytes).unwrap();
    assert_eq!(view.next_offset(), Offset::new(u64::MAX));
    assert_eq!(walk(&view), 2);
}

#[test]
fn bytes_after_a_batch_are_not_part_of_it() {
    let mut bytes = plain_batch(1);
    let length = bytes.len();
    bytes.extend_from_slice(b"whatever follows");
    let view = parse_batch(&bytes).unwrap();
    assert_eq!(view.len(), length);
    assert_eq!(view.as_bytes(), &bytes[..length]);
}

// Unit tests: views.

#[test]
fn records_and_headers_iterate_in_order() {
    let headers = [Header { key: b"trace", value: b"abc" }, Header { key: b"", value: b"" }];
    let records = [
        Record::new(Some(b"user-1"), b"home").with_timestamp(10).with_headers(&headers),
        Record::new(None, b""),
        Record::new(Some(b""), b"x").with_timestamp(8),
    ];
    let mut bytes = Vec::new();
    encode_batch(&mut bytes, Offset::new(41), &records, 12, Offset::new(3)).unwrap();
    let view = parse_batch(&bytes).unwrap();
    let mut iterator = view.records();
    assert_eq!(iterator.size_hint(), (3, Some(3)));

    let first = iterator.next().unwrap();
    assert_eq!(iterator.size_hint(), (2, Some(2)));
    assert_eq!((first.offset(), first.timestamp()), (Offset::new(41), 10));
    assert_eq!((first.key(), first.value()), (Some(&b"user-1"[..]), &b"home"[..]));
    assert_eq!(first.headers().collect::<Vec<_>>(), headers);
    assert_eq!(first.headers().count(), 2, "headers() starts over on each call");

    let second = iterator.next().unwrap();
    assert_eq!((second.offset(), second.timestamp()), (Offset::new(42), 12));
    assert_eq!((second.key(), second.value()), (None, &b""[..]));
    assert_eq!(second.headers().next(), None);

    let third = iterator.next().unwrap();
    assert_eq!((third.offset(), third.timestamp()), (Offset::new(43), 8));
    assert_eq!((third.key(), third.value()), (Some(&b""[..]), &b"x"[..]));

    assert!(iterator.next().is_none());
    assert!(iterator.next().is_none(), "a finished iterator stays finished");
    assert_eq!((view.last_offset(), view.next_offset()), (Offset::new(43), Offset::new(44)));
    assert_eq!(view.max_timestamp(), 12);
    assert_eq!(view.synced_offset_hint(), Offset::new(3));
}

#[test]
fn record_encoded_bytes_matches_the_encoding() {
    let headers = [Header { key: b"ab", value: b"cde" }];
    let record = Record::new(Some(b"key"), b"value").with_headers(&headers);
    let expected = RECORD_HEADER_BYTES + 3 + 5 + HEADER_ENTRY_BYTES + 2 + 3;
    assert_eq!(record.encoded_bytes(), expected as u64);
    let mut bytes = Vec::new();
    encode_batch(&mut bytes, Offset::ZERO, &[record], 0, Offset::ZERO).unwrap();
    assert_eq!(bytes.len(), BATCH_HEADER_BYTES + expected);
}

#[test]
fn key_hash_is_stable() {
    // Keys are mapped to partitions by this hash; changing it would move existing keys. These
    // values are xxh3-64 with the default secret and seed 0.
    assert_eq!(key_hash(b""), 0x2d06_8005_38d3_94c2);
    assert_eq!(key_hash(b"user-1"), 0x7c76_15c1_1438_e5c9);
    assert_ne!(key_hash(b"user-1"), key_hash(b"user-2"));
}

// Metadata files.

#[test]
fn data_directory_meta_round_trips() {
    let bytes = DataDirectoryMeta::current().encode();
    assert_eq!(bytes.len(), size_of::<DataDirectoryMeta>());
    assert_eq!(&bytes[8..12], b"CHMD");
    assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()), xxh3_64(&bytes[8..]));
    let meta = DataDirectoryMeta::decode(&bytes).unwrap();
    assert_eq!(meta.magic(), DATA_DIRECTORY_MAGIC);
    assert_eq!(meta.version(), meta::DATA_DIRECTORY_VERSION);
    assert_eq!(meta.reserved.get(), 0);
    assert_eq!(meta.as_bytes(), bytes.as_slice());
}

#[test]
fn data_directory_meta_detects_every_flipped_bit() {
    let original = DataDirectoryMeta::current().encode();
    for position in 0..original.len() {
        for bit in 0..8 {
            let mut bytes = original.clone();
            bytes[position] ^= 1 << bit;
            let result = DataDirectoryMeta::decode(&bytes);
            assert!(
                matches!(
                    result,
                    Err(CorruptionKind::ChecksumMismatch { .. } | CorruptionKind::BadMagic { .. })
                ),
                "byte {position} bit {bit}: {result:?}"
            );
        }
    }
}

#[test]
fn data_directory_meta_rejects_wrong_sizes() {
    let bytes = DataDirectoryMeta::current().encode();
    let needed = bytes.len() as u64;
    for length in [0, 1, bytes.len() - 1] {
        let result = DataDirectoryMeta::decode(&bytes[..length]);
        let available = length as u64;
        assert_eq!(result.err(), Some(CorruptionKind::Truncated { needed, available }));
    }
    let mut longer = bytes.clone();
    longer.push(0);
    let result = DataDirectoryMeta::decode(&longer);
    assert_eq!(result.err(), Some(CorruptionKind::BadLength { length: needed + 1 }));
}

#[test]
fn data_directory_meta_rejects_another_magic_even_with_a_valid_checksum() {
    let mut meta = DataDirectoryMeta::current();
    meta.magic = U32::new(TOPIC_MAGIC);
    let bytes = meta.encode();
    let result = DataDirectoryMeta::decode(&bytes);
    assert_eq!(result.err(), Some(CorruptionKind::BadMagic { found: TOPIC_MAGIC }));
}

#[test]
fn data_directory_meta_leaves_the_version_to_the_caller() {
    let mut meta = DataDirectoryMeta::current();
    meta.version = U16::new(9);
    let decoded = DataDirectoryMeta::decode(&meta.encode()).unwrap();
    assert_eq!(decoded.version(), 9);
}

#[test]
fn topic_meta_round_trips_and_is_not_a_data_directory_meta() {
    let meta = TopicMeta {
        checksum: 0.into(),
        magic: U32::new(TOPIC_MAGIC),
        version: U16::new(meta::TOPIC_VERSION),
        reserved: U16::new(0),
        partition_count: U32::new(12),
        index_interval_bytes: U32::new(4096),
        segment_bytes: (1_u64 << 30).into(),
        segment_ms: I64::new(-1),
    };
    let bytes = meta.encode();
    let decoded = TopicMeta::decode(&bytes).unwrap();
    assert_eq!(decoded.as_bytes(), bytes.as_slice());
    assert_eq!(decoded.partition_count.get(), 12);
    assert_eq!(decoded.segment_ms.get(), -1);
    let result = DataDirectoryMeta::decode(&bytes);
    assert_eq!(result.err(), Some(CorruptionKind::BadLength { length: bytes.len() as u64 }));
    let short = DataDirectoryMeta::current().encode();
    let result = TopicMeta::decode(&short);
    let (needed, available) = (size_of::<TopicMeta>() as u64, short.len() as u64);
    assert_eq!(result.err(), Some(CorruptionKind::Truncated { needed, available }));
}

#[test]
fn compacted_batches_keep_offsets_with_gaps_and_may_hold_no_record() {
    let headers = [Header { key: b"h", value: b"v" }];
    let values: Vec<Vec<u8>> = (0..5).map(|i| format!("value-{i}").into_bytes()).collect();
    let records: Vec<Record<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let record =
                Record::new(Some(b"key"), v).with_timestamp(1000 + i64::try_from(i).unwrap());
            if i == 3 { record.with_headers(&headers) } else { record }
        })
        .collect();
    let mut dense = Vec::new();
    encode_batch(&mut dense, Offset::new(100), &records, 0, Offset::new(90)).unwrap();
    let batch = parse_batch(&dense).unwrap();
    let kept: Vec<RecordView<'_>> = batch.records().filter(|r| r.offset().get() % 2 == 1).collect();
    let mut compacted = Vec::new();
    // Covers 98..=106: two offsets before the source batch, two after, as when the batches
    // around it lost every record.
    let info = encode_compacted_batch(
        &mut compacted,
        Offset::new(98),
        Offset::new(106),
        &kept,
        batch.max_timestamp(),
        batch.synced_offset_hint(),
    );
    assert_eq!((info.base_offset, info.next_offset), (Offset::new(98), Offset::new(107)));
    let parsed = parse_batch(&compacted).unwrap();
    assert!(parsed.is_compacted());
    assert_eq!((parsed.base_offset(), parsed.next_offset()), (Offset::new(98), Offset::new(107)));
    let read: Vec<_> = parsed
        .records()
        .map(|r| {
            let headers: Vec<_> = r.headers().map(|h| (h.key.to_vec(), h.value.to_vec())).collect();
            (r.offset().get(), r.timestamp(), r.value().to_vec(), headers)
        })
        .collect();
    assert_eq!(
        read,
        vec![
            (101, 1001, b"value-1".to_vec(), vec![]),
            (103, 1003, b"value-3".to_vec(), vec![(b"h".to_vec(), b"v".to_vec())]),
        ]
    );
    assert_eq!(parsed.max_timestamp(), 1004, "the source batch's newest timestamp stays");

    let mut empty = Vec::new();
    encode_compacted_batch(&mut empty, Offset::new(5), Offset::new(9), &[], 7, Offset::ZERO);
    let parsed = parse_batch(&empty).unwrap();
    assert_eq!((parsed.record_count(), parsed.next_offset()), (0, Offset::new(10)));

    // A version 2 batch whose record lies past its last offset is refused, and so is a
    // version 1 batch with no record.
    let mut past = compacted.clone();
    past[32..36].copy_from_slice(&2u32.to_le_bytes());
    let checksum = batch_checksum(&past);
    past[..8].copy_from_slice(&checksum.to_le_bytes());
    assert!(matches!(
        parse_batch(&past),
        Err(DecodeError::Corrupt(CorruptionKind::Malformed { .. }))
    ));
    let mut dense_empty = empty.clone();
    dense_empty[16..18].copy_from_slice(&BATCH_VERSION.to_le_bytes());
    let checksum = batch_checksum(&dense_empty);
    dense_empty[..8].copy_from_slice(&checksum.to_le_bytes());
    assert!(matches!(parse_batch(&dense_empty), Err(DecodeError::Corrupt(_))));
}
