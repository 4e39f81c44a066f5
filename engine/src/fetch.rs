//! The result of a read: whole validated batches in one owned buffer, and borrowed views of
//! their records. Iterating allocates nothing per record.

use crate::format::{BatchView, Record, encode_batch, parse_batch, view_validated_batch};
pub use crate::format::{Header, Headers, RecordView};
use crate::limits::{BATCH_BYTES_MAX, BATCH_RECORDS_MAX};
use crate::{AppendError, Offset};

/// Validated batches read from one segment, starting at or before `from`.
#[derive(Debug, Clone, Default)]
pub struct Fetch {
    buffer: Vec<u8>,
    from: Offset,
    next_offset: Offset,
}

impl Fetch {
    /// `buffer` must hold only whole batches that passed [`parse_batch`].
    pub(crate) fn new(buffer: Vec<u8>, from: Offset, next_offset: Offset) -> Self {
        debug_assert!(parse_batch(&buffer).is_ok(), "a fetch starts with a valid batch");
        let next_offset = if crate::canary::active(crate::canary::Canary::FetchNextOffsetOverruns) {
            next_offset.plus(1)
        } else {
            next_offset
        };
        Fetch { buffer, from, next_offset }
    }

    /// A fetch of records held elsewhere (read from another log, say), each with its offset:
    /// offsets strictly increasing and below `next_offset`, gaps allowed (a Kafka log skips the
    /// offsets of its transaction markers). Each run of consecutive offsets is encoded as
    /// batches of the on-disk format, so the records read back as [`RecordView`]s. A record
    /// without a timestamp gets 0.
    pub fn from_records(
        from: Offset,
        next_offset: Offset,
        records: &[(Offset, Record<'_>)],
    ) -> Result<Fetch, AppendError> {
        let increasing = records.windows(2).all(|pair| pair[0].0 < pair[1].0);
        let bounded = records.last().is_none_or(|(offset, _)| *offset < next_offset);
        if !increasing || !bounded || next_offset < from {
            return Err(AppendError::OffsetsOutOfOrder);
        }
        let mut buffer = Vec::new();
        let mut start = 0;
        while start < records.len() {
            let mut end = start + 1;
            let mut bytes = records[start].1.encoded_bytes();
            while end < records.len()
                && records[end].0 == records[end - 1].0.plus(1)
                && end - start < BATCH_RECORDS_MAX as usize
                && bytes + records[end].1.encoded_bytes() + 64 < u64::from(BATCH_BYTES_MAX) / 2
            {
                bytes += records[end].1.encoded_bytes();
                end += 1;
            }
            let run: Vec<Record<'_>> = records[start..end].iter().map(|(_, r)| *r).collect();
            encode_batch(&mut buffer, records[start].0, &run, 0, Offset::ZERO)?;
            start = end;
        }
        Ok(if buffer.is_empty() {
            Fetch { buffer, from, next_offset }
        } else {
            Fetch::new(buffer, from, next_offset)
        })
    }

    pub(crate) fn empty(from: Offset) -> Self {
        Fetch { buffer: Vec::new(), from, next_offset: from }
    }

    /// The first offset asked for.
    pub fn from(&self) -> Offset {
        self.from
    }

    /// The offset to read next to continue after this fetch.
    pub fn next_offset(&self) -> Offset {
        self.next_offset
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// Bytes of batches held.
    pub fn len_bytes(&self) -> usize {
        self.buffer.len()
    }

    /// The raw bytes of the batches, as they are on disk.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buffer
    }

    /// The batches, in offset order.
    pub fn batches(&self) -> impl Iterator<Item = BatchView<'_>> {
        let mut rest = self.buffer.as_slice();
        std::iter::from_fn(move || {
            // Bytes were validated when read (checksums included) and are not checked again; a
            // failure here would be a bug, and ends the iteration rather than panicking.
            let batch = view_validated_batch(rest)?;
            rest = &rest[batch.len()..];
            Some(batch)
        })
    }

    /// The records at or after `from`, in offset order.
    pub fn records(&self) -> impl Iterator<Item = RecordView<'_>> {
        let from = self.from;
        self.batches().flat_map(|batch| batch.records()).filter(move |r| r.offset() >= from)
    }
}
