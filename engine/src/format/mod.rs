//! The on-disk record batch: zerocopy little-endian structs, encoding, and validated borrowed
//! views. `docs/format.md` is the byte-level specification of everything here.

use crate::Offset;
use crate::canary::{self, Canary};
use crate::error::{AppendError, CorruptionKind};
use crate::limits::{BATCH_BYTES_MAX, BATCH_RECORDS_MAX};
use xxhash_rust::xxh3::xxh3_64;
use zerocopy::little_endian::{I32, I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub mod meta;

/// `b"CHRB"` read as a little-endian `u32`.
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"CHRB");
/// The version appends write: dense batches, record `i` at `base_offset + i`.
pub const BATCH_VERSION: u16 = 1;
/// The version compaction writes: a batch covers `base_offset ..= base_offset +
/// last_offset_delta` and holds the records kept from it, their offset deltas increasing with
/// gaps where records were removed, possibly none at all.
pub const BATCH_VERSION_COMPACTED: u16 = 2;
pub const BATCH_HEADER_BYTES: usize = size_of::<BatchHeader>();
const _: () = assert!(BATCH_HEADER_BYTES == crate::limits::BATCH_HEADER_BYTES);
pub const RECORD_HEADER_BYTES: usize = size_of::<RecordHeader>();
pub const HEADER_ENTRY_BYTES: usize = size_of::<HeaderEntry>();
/// Bytes at the start of a batch that its checksum does not cover: the checksum itself.
pub const CHECKSUM_BYTES: usize = 8;

/// The fixed header of every batch. The checksum covers every byte of the batch after itself.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct BatchHeader {
    pub checksum: U64,
    /// Bytes of the whole batch, this header included.
    pub length: U32,
    pub magic: U32,
    pub version: U16,
    /// Flags: bit 4 ([`ATTRIBUTE_TRANSACTIONAL`]) marks a transaction's batch; every other
    /// bit is reserved and zero (no compression yet).
    pub attributes: U16,
    pub record_count: U32,
    pub base_offset: U64,
    /// Offset of the last record minus `base_offset`.
    pub last_offset_delta: U32,
    pub reserved: U32,
    pub first_timestamp: I64,
    pub max_timestamp: I64,
    /// Every offset below this one had been fsynced when this batch was written. Recovery uses
    /// it to tell a torn unsynced tail from damage inside synced data.
    pub synced_offset_hint: U64,
}

/// The fixed header of every record inside a batch.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct RecordHeader {
    /// Bytes of the whole record, this header included.
    pub length: U32,
    pub offset_delta: U32,
    pub timestamp_delta: I64,
    /// -1 for a record without a key.
    pub key_length: I32,
    pub value_length: U32,
    pub header_count: U32,
}

/// The length prefix of one record header (a key-value pair of metadata).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct HeaderEntry {
    pub key_length: U32,
    pub value_length: U32,
}

const _: () = assert!(BATCH_HEADER_BYTES == 64);
const _: () = assert!(RECORD_HEADER_BYTES == 28);
const _: () = assert!(HEADER_ENTRY_BYTES == 8);

/// A record header: metadata attached to a record, as in Kafka.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// A record to append. Borrowed, so producing does not copy the caller's bytes before encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
    /// Milliseconds since the Unix epoch; `None` takes the engine clock at append time.
    pub timestamp: Option<i64>,
    pub headers: &'a [Header<'a>],
}

impl<'a> Record<'a> {
    pub fn new(key: Option<&'a [u8]>, value: &'a [u8]) -> Self {
        Record { key, value, timestamp: None, headers: &[] }
    }

    #[must_use]
    pub fn with_timestamp(mut self, timestamp: i64) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    #[must_use]
    pub fn with_headers(mut self, headers: &'a [Header<'a>]) -> Self {
        self.headers = headers;
        self
    }

    /// Bytes this record takes inside a batch.
    pub fn encoded_bytes(&self) -> u64 {
        let headers: u64 = self
            .headers
            .iter()
            .map(|h| (HEADER_ENTRY_BYTES + h.key.len() + h.value.len()) as u64)
            .sum();
        (RECORD_HEADER_BYTES + self.key.map_or(0, <[u8]>::len) + self.value.len()) as u64 + headers
    }
}

/// The xxh3-64 checksum of an encoded batch: every byte after the checksum field.
pub fn batch_checksum(batch: &[u8]) -> u64 {
    xxh3_64(&batch[CHECKSUM_BYTES..])
}

/// The hash used to map keys to partitions: xxh3-64 of the key bytes.
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64(key)
}

/// The partition of `key` among `partitions`: xxh3-64 of the key modulo the count (a count of
/// zero is taken as one). Stable across versions, so records with the same key keep their
/// order in one partition; the SDKs' producers use it when given a key and no partition.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    let partitions = u64::from(partitions.max(1));
    let partition = key_hash(key) % partitions;
    assert!(partition < partitions, "a key maps to one of the partitions");
    partition as u32
}

/// What the writer needs to know of a batch, without parsing it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchInfo {
    pub base_offset: Offset,
    /// The offset after the batch's last record.
    pub next_offset: Offset,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
    /// Bytes of the whole batch.
    pub length: u32,
}

/// Encode `records` as one batch at the end of `out`.
pub fn encode_batch(
    out: &mut Vec<u8>,
    base_offset: Offset,
    records: &[Record<'_>],
    default_timestamp: i64,
    synced_offset_hint: Offset,
) -> Result<BatchInfo, AppendError> {
    if records.is_empty() {
        return Err(AppendError::Empty);
    }
    if records.len() > BATCH_RECORDS_MAX as usize {
        return Err(AppendError::TooManyRecords { records: records.len(), max: BATCH_RECORDS_MAX });
    }
    let bytes = BATCH_HEADER_BYTES as u64 + records.iter().map(Record::encoded_bytes).sum::<u64>();
    if bytes > u64::from(BATCH_BYTES_MAX) {
        return Err(AppendError::BatchTooLarge { bytes, max: u64::from(BATCH_BYTES_MAX) });
    }
    let timestamp_of = |r: &Record<'_>| r.timestamp.unwrap_or(default_timestamp);
    let first_timestamp = timestamp_of(&records[0]);
    let max_timestamp = records.iter().map(timestamp_of).max().expect("non-empty");
    let start = out.len();
    out.reserve(bytes as usize);
    out.extend_from_slice(&[0; BATCH_HEADER_BYTES]);
    for (delta, record) in records.iter().enumerate() {
        let header = RecordHeader {
            length: U32::new(record.encoded_bytes() as u32),
            offset_delta: U32::new(delta as u32),
            timestamp_delta: I64::new(timestamp_of(record).wrapping_sub(first_timestamp)),
            // Keys fit: the whole batch is at most BATCH_BYTES_MAX, which is below i32::MAX.
            key_length: I32::new(
                record
                    .key
                    .map_or(-1, |k| i32::try_from(k.len()).expect("bounded by BATCH_BYTES_MAX")),
            ),
            value_length: U32::new(record.value.len() as u32),
            header_count: U32::new(record.headers.len() as u32),
        };
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(record.key.unwrap_or_default());
        out.extend_from_slice(record.value);
        for h in record.headers {
            let entry = HeaderEntry {
                key_length: U32::new(h.key.len() as u32),
                value_length: U32::new(h.value.len() as u32),
            };
            out.extend_from_slice(entry.as_bytes());
            out.extend_from_slice(h.key);
            out.extend_from_slice(h.value);
        }
    }
    let header = BatchHeader {
        checksum: U64::new(0),
        length: U32::new(bytes as u32),
        magic: U32::new(BATCH_MAGIC),
        version: U16::new(BATCH_VERSION),
        attributes: U16::new(0),
        record_count: U32::new(records.len() as u32),
        base_offset: U64::new(base_offset.get()),
        last_offset_delta: U32::new(records.len() as u32 - 1),
        reserved: U32::new(0),
        first_timestamp: I64::new(first_timestamp),
        max_timestamp: I64::new(max_timestamp),
        synced_offset_hint: U64::new(synced_offset_hint.get()),
    };
    let batch = &mut out[start..];
    assert_eq!(batch.len() as u64, bytes, "encoded length disagrees with the computed one");
    batch[..BATCH_HEADER_BYTES].copy_from_slice(header.as_bytes());
    let checksum = batch_checksum(batch);
    batch[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
    // Pair assertion: what is about to be written must read back as written.
    debug_assert!(parse_batch(batch).is_ok(), "encoded batch does not parse");
    Ok(BatchInfo {
        base_offset,
        next_offset: base_offset.plus(records.len() as u64),
        first_timestamp,
        max_timestamp,
        length: bytes as u32,
    })
}

/// Append to `out` a compacted (version 2) batch covering `base_offset ..= last_offset`, holding
/// `records` (already validated, in offset order, each within the range) copied as they are,
/// with the timestamps and hint of the batches they came from. Returns its [`BatchInfo`].
pub fn encode_compacted_batch(
    out: &mut Vec<u8>,
    base_offset: Offset,
    last_offset: Offset,
    records: &[RecordView<'_>],
    max_timestamp: i64,
    synced_offset_hint: Offset,
) -> BatchInfo {
    assert!(last_offset >= base_offset, "a batch covers at least one offset");
    let last_delta = u32::try_from(last_offset.get() - base_offset.get())
        .expect("a compacted batch covers at most u32::MAX offsets");
    assert!(records.len() <= BATCH_RECORDS_MAX as usize, "too many records for one batch");
    let first_timestamp = records.first().map_or(max_timestamp, |r| r.timestamp);
    let start = out.len();
    out.extend_from_slice(&[0; BATCH_HEADER_BYTES]);
    for record in records {
        assert!(record.offset >= base_offset && record.offset <= last_offset, "record in range");
        let header = RecordHeader {
            length: U32::new(0),
            offset_delta: U32::new((record.offset.get() - base_offset.get()) as u32),
            timestamp_delta: I64::new(record.timestamp.wrapping_sub(first_timestamp)),
            key_length: I32::new(
                record.key.map_or(-1, |k| i32::try_from(k.len()).expect("bounded by the batch")),
            ),
            value_length: U32::new(record.value.len() as u32),
            header_count: U32::new(record.headers.remaining),
        };
        let record_start = out.len();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(record.key.unwrap_or_default());
        out.extend_from_slice(record.value);
        out.extend_from_slice(record.headers.bytes);
        let length = u32::try_from(out.len() - record_start).expect("a record fits a batch");
        out[record_start..record_start + 4].copy_from_slice(&length.to_le_bytes());
    }
    let bytes = out.len() - start;
    assert!(bytes <= BATCH_BYTES_MAX as usize, "kept records of one batch fit a batch");
    let header = BatchHeader {
        checksum: U64::new(0),
        length: U32::new(bytes as u32),
        magic: U32::new(BATCH_MAGIC),
        version: U16::new(BATCH_VERSION_COMPACTED),
        attributes: U16::new(0),
        record_count: U32::new(records.len() as u32),
        base_offset: U64::new(base_offset.get()),
        last_offset_delta: U32::new(last_delta),
        reserved: U32::new(0),
        first_timestamp: I64::new(first_timestamp),
        max_timestamp: I64::new(max_timestamp),
        synced_offset_hint: U64::new(synced_offset_hint.get()),
    };
    let batch = &mut out[start..];
    batch[..BATCH_HEADER_BYTES].copy_from_slice(header.as_bytes());
    let checksum = batch_checksum(batch);
    batch[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
    debug_assert!(parse_batch(batch).is_ok(), "a compacted batch parses");
    BatchInfo {
        base_offset,
        next_offset: last_offset.plus(1),
        first_timestamp,
        max_timestamp,
        length: bytes as u32,
    }
}

/// Widen the compacted batch at the start of `batch` to end at `last_offset` (covering offsets
/// after its last record that compaction removed) and recompute its checksum. Returns its
/// [`BatchInfo`].
pub fn extend_compacted_batch(batch: &mut [u8], last_offset: Offset) -> BatchInfo {
    let (header, _) = BatchHeader::mut_from_prefix(batch).expect("an encoded batch");
    assert_eq!(header.version.get(), BATCH_VERSION_COMPACTED, "only compacted batches widen");
    let base = header.base_offset.get();
    let delta = u32::try_from(last_offset.get() - base)
        .expect("a compacted batch covers at most u32::MAX offsets");
    assert!(delta >= header.last_offset_delta.get(), "a batch only widens");
    header.last_offset_delta = U32::new(delta);
    let info = BatchInfo {
        base_offset: Offset::new(base),
        next_offset: last_offset.plus(1),
        first_timestamp: header.first_timestamp.get(),
        max_timestamp: header.max_timestamp.get(),
        length: header.length.get(),
    };
    let length = header.length.get() as usize;
    let checksum = batch_checksum(&batch[..length]);
    batch[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
    debug_assert!(parse_batch(batch).is_ok(), "a widened batch parses");
    info
}

/// Batch attribute: the batch was written by [`crate::Engine::commit_transaction`]. Recovery
/// keeps such a batch at the end of a partition only if the transaction's commit record (in
/// `__consumer_offsets`) covers it.
pub const ATTRIBUTE_TRANSACTIONAL: u16 = 0x0010;

/// Mark an encoded batch transactional; [`set_batch_offsets`] then seals its checksum.
pub fn set_transactional(batch: &mut [u8]) {
    let (header, _) = BatchHeader::mut_from_prefix(batch).expect("an encoded batch");
    assert_eq!(header.magic.get(), BATCH_MAGIC, "only an encoded batch is marked");
    assert_eq!(header.attributes.get(), 0, "a batch is marked once, before its offsets are set");
    header.attributes = U16::new(ATTRIBUTE_TRANSACTIONAL);
}

/// Set the base offset and synced-offset hint of an encoded batch (the first batch of `batch`)
/// and recompute its checksum. Lets appenders encode outside the partition lock.
pub fn set_batch_offsets(batch: &mut [u8], base_offset: Offset, synced_offset_hint: Offset) {
    let (header, _) = BatchHeader::mut_from_prefix(batch).expect("an encoded batch");
    assert_eq!(header.magic.get(), BATCH_MAGIC, "only an encoded batch gets offsets");
    assert!(
        base_offset.get().checked_add(u64::from(header.last_offset_delta.get())).is_some(),
        "the batch's last offset fits in 64 bits"
    );
    header.base_offset = U64::new(base_offset.get());
    header.synced_offset_hint = U64::new(synced_offset_hint.get());
    let length = header.length.get() as usize;
    let checksum = batch_checksum(&batch[..length]);
    batch[..CHECKSUM_BYTES].copy_from_slice(&checksum.to_le_bytes());
}

/// Why bytes do not hold a valid batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes end before the batch does: a torn write, or a read that stopped early.
    Incomplete { needed: u64, available: u64 },
    /// The bytes are there and wrong.
    Corrupt(CorruptionKind),
}

/// The one conversion of a decode failure into what a [`crate::Corruption`] reports: bytes
/// that end early are a truncation, wrong bytes keep their kind.
impl From<DecodeError> for CorruptionKind {
    fn from(error: DecodeError) -> Self {
        match error {
            DecodeError::Corrupt(kind) => kind,
            DecodeError::Incomplete { needed, available } => {
                CorruptionKind::Truncated { needed, available }
            }
        }
    }
}

/// A validated batch borrowed from a buffer.
#[derive(Clone, Copy, Debug)]
pub struct BatchView<'a> {
    header: &'a BatchHeader,
    bytes: &'a [u8],
}

/// View the batch at the start of bytes that [`parse_batch`] already validated, without checking
/// the checksum or the records again: the read path validates once, when bytes come off the
/// disk, and iterates many times. Still never panics: inconsistent bytes end the iteration.
pub fn view_validated_batch(bytes: &[u8]) -> Option<BatchView<'_>> {
    let (header, _) = BatchHeader::ref_from_prefix(bytes).ok()?;
    let length = header.length.get() as usize;
    if header.magic.get() != BATCH_MAGIC || length < BATCH_HEADER_BYTES {
        return None;
    }
    let bytes = bytes.get(..length)?;
    debug_assert!(
        parse_batch(bytes).is_ok() || cfg!(feature = "canaries"),
        "only validated bytes are viewed"
    );
    Some(BatchView { header, bytes })
}

/// Parse and fully validate the batch at the start of `bytes`: magic, length, checksum, version
/// and the layout of every record. Never panics, whatever the bytes.
pub fn parse_batch(bytes: &[u8]) -> Result<BatchView<'_>, DecodeError> {
    parse(bytes, true)
}

/// [`parse_batch`], except that while the mutation canary `skipping` is active (only possible
/// under the `canaries` feature) the checksum is not compared.
pub(crate) fn parse_batch_unless(
    skipping: Canary,
    bytes: &[u8],
) -> Result<BatchView<'_>, DecodeError> {
    parse(bytes, !canary::active(skipping))
}

fn parse(bytes: &[u8], verify_checksum: bool) -> Result<BatchView<'_>, DecodeError> {
    let available = bytes.len() as u64;
    let Ok((header, _)) = BatchHeader::ref_from_prefix(bytes) else {
        return Err(DecodeError::Incomplete { needed: BATCH_HEADER_BYTES as u64, available });
    };
    if header.magic.get() != BATCH_MAGIC {
        return Err(DecodeError::Corrupt(CorruptionKind::BadMagic { found: header.magic.get() }));
    }
    let length = header.length.get();
    if (length as usize) < BATCH_HEADER_BYTES || length > BATCH_BYTES_MAX {
        let length = u64::from(length);
        return Err(DecodeError::Corrupt(CorruptionKind::BadLength { length }));
    }
    if available < u64::from(length) {
        return Err(DecodeError::Incomplete { needed: u64::from(length), available });
    }
    let bytes = &bytes[..length as usize];
    let actual = batch_checksum(bytes);
    let expected = header.checksum.get();
    if actual != expected && verify_checksum {
        return Err(DecodeError::Corrupt(CorruptionKind::ChecksumMismatch { expected, actual }));
    }
    let version = header.version.get();
    if version != BATCH_VERSION && version != BATCH_VERSION_COMPACTED {
        return Err(DecodeError::Corrupt(CorruptionKind::UnsupportedVersion { found: version }));
    }
    let view = BatchView { header, bytes };
    view.validate_records()
        .map_err(|reason| DecodeError::Corrupt(CorruptionKind::Malformed { reason }))?;
    Ok(view)
}

impl<'a> BatchView<'a> {
    pub fn header(&self) -> &'a BatchHeader {
        self.header
    }

    /// Written by a transaction ([`ATTRIBUTE_TRANSACTIONAL`]).
    pub fn is_transactional(&self) -> bool {
        self.header.attributes.get() & ATTRIBUTE_TRANSACTIONAL != 0
    }

    pub fn base_offset(&self) -> Offset {
        Offset::new(self.header.base_offset.get())
    }

    pub fn last_offset(&self) -> Offset {
        self.base_offset().plus(u64::from(self.header.last_offset_delta.get()))
    }

    /// The offset after the last record.
    pub fn next_offset(&self) -> Offset {
        self.last_offset().plus(1)
    }

    pub fn record_count(&self) -> u32 {
        self.header.record_count.get()
    }

    pub fn max_timestamp(&self) -> i64 {
        self.header.max_timestamp.get()
    }

    pub fn info(&self) -> BatchInfo {
        BatchInfo {
            base_offset: self.base_offset(),
            next_offset: self.next_offset(),
            first_timestamp: self.header.first_timestamp.get(),
            max_timestamp: self.max_timestamp(),
            length: self.bytes.len() as u32,
        }
    }

    pub fn synced_offset_hint(&self) -> Offset {
        Offset::new(self.header.synced_offset_hint.get())
    }

    /// Bytes of the whole batch.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The records, in offset order, as borrowed views.
    pub fn records(&self) -> Records<'a> {
        Records {
            body: &self.bytes[BATCH_HEADER_BYTES..],
            remaining: self.record_count(),
            base_offset: self.base_offset(),
            first_timestamp: self.header.first_timestamp.get(),
        }
    }

    /// Whether compaction wrote this batch (version 2: offsets with gaps, maybe no record).
    pub fn is_compacted(&self) -> bool {
        self.header.version.get() == BATCH_VERSION_COMPACTED
    }

    fn validate_records(&self) -> Result<(), &'static str> {
        let count = self.record_count();
        let compacted = self.is_compacted();
        if (count == 0 && !compacted) || count > BATCH_RECORDS_MAX {
            return Err("record count out of range");
        }
        // `next_offset()` and every record's offset must be representable, so that a view
        // that parsed can be used without panicking.
        let last_delta = u64::from(self.header.last_offset_delta.get());
        if self.header.base_offset.get().checked_add(last_delta + 1).is_none() {
            return Err("offsets overflow");
        }
        let mut body = &self.bytes[BATCH_HEADER_BYTES..];
        let mut previous_delta: Option<u32> = None;
        for index in 0..count {
            let (header, rest) = split_record(body).ok_or("record exceeds its batch")?;
            let delta = header.offset_delta.get();
            if previous_delta.is_some_and(|previous| delta <= previous) {
                return Err("record offsets do not increase");
            }
            // Version 1 batches are dense: the writer never leaves gaps, and a gap would let a
            // checksum-valid batch push offsets past what a segment can index. Version 2
            // (compacted) ones keep their offsets within the range the header states.
            if !compacted && delta != index {
                return Err("record offsets are not contiguous");
            }
            if compacted && delta > self.header.last_offset_delta.get() {
                return Err("record offset past the batch's last offset");
            }
            previous_delta = Some(delta);
            body = rest;
        }
        if !body.is_empty() {
            return Err("bytes after the last record");
        }
        if !compacted && previous_delta != Some(self.header.last_offset_delta.get()) {
            return Err("last offset delta disagrees with the records");
        }
        Ok(())
    }
}

/// Split one record off the front of `body`, checking that every length fits. Returns the
/// record's header and the bytes after the record.
fn split_record(body: &[u8]) -> Option<(&RecordHeader, &[u8])> {
    let (header, _) = RecordHeader::ref_from_prefix(body).ok()?;
    let length = header.length.get() as usize;
    if length < RECORD_HEADER_BYTES || length > body.len() {
        return None;
    }
    let key_length = header.key_length.get();
    let key_bytes = if key_length == -1 { 0 } else { usize::try_from(key_length).ok()? };
    let mut used = RECORD_HEADER_BYTES
        .checked_add(key_bytes)?
        .checked_add(header.value_length.get() as usize)?;
    for _ in 0..header.header_count.get() {
        let (entry, _) = HeaderEntry::ref_from_prefix(body.get(used..length)?).ok()?;
        used = used
            .checked_add(HEADER_ENTRY_BYTES)?
            .checked_add(entry.key_length.get() as usize)?
            .checked_add(entry.value_length.get() as usize)?;
    }
    (used == length).then(|| (header, &body[length..]))
}

/// Iterator over the records of a validated batch.
#[derive(Clone, Debug)]
pub struct Records<'a> {
    body: &'a [u8],
    remaining: u32,
    base_offset: Offset,
    first_timestamp: i64,
}

impl<'a> Iterator for Records<'a> {
    type Item = RecordView<'a>;

    fn next(&mut self) -> Option<RecordView<'a>> {
        if self.remaining == 0 {
            return None;
        }
        // The batch was validated when parsed, so this split cannot fail.
        let (header, rest) = split_record(self.body)?;
        let record_bytes = &self.body[RECORD_HEADER_BYTES..header.length.get() as usize];
        let (key, after_key) = match usize::try_from(header.key_length.get()) {
            Err(_) => (None, record_bytes),
            Ok(key_length) => {
                let (key, after) = record_bytes.split_at(key_length);
                (Some(key), after)
            }
        };
        let (value, headers) = after_key.split_at(header.value_length.get() as usize);
        self.body = rest;
        self.remaining -= 1;
        Some(RecordView {
            offset: self.base_offset.plus(u64::from(header.offset_delta.get())),
            timestamp: self.first_timestamp.wrapping_add(header.timestamp_delta.get()),
            key,
            value,
            headers: Headers { bytes: headers, remaining: header.header_count.get() },
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining as usize, Some(self.remaining as usize))
    }
}

/// A record borrowed from the bytes it was read in. No copy, no allocation.
#[derive(Clone, Debug)]
pub struct RecordView<'a> {
    offset: Offset,
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: &'a [u8],
    headers: Headers<'a>,
}

impl<'a> RecordView<'a> {
    pub fn offset(&self) -> Offset {
        self.offset
    }

    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    pub fn key(&self) -> Option<&'a [u8]> {
        self.key
    }

    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    pub fn headers(&self) -> Headers<'a> {
        self.headers.clone()
    }
}

/// Iterator over the headers of a record.
#[derive(Clone, Debug)]
pub struct Headers<'a> {
    bytes: &'a [u8],
    remaining: u32,
}

impl<'a> Iterator for Headers<'a> {
    type Item = Header<'a>;

    fn next(&mut self) -> Option<Header<'a>> {
        if self.remaining == 0 {
            return None;
        }
        let (entry, rest) = HeaderEntry::ref_from_prefix(self.bytes).ok()?;
        let (key, rest) = rest.split_at_checked(entry.key_length.get() as usize)?;
        let (value, rest) = rest.split_at_checked(entry.value_length.get() as usize)?;
        self.bytes = rest;
        self.remaining -= 1;
        Some(Header { key, value })
    }
}

#[cfg(test)]
mod tests;
