//! Reads: fetches from the segment list's snapshot, timestamp lookups, waits for the
//! watermark, and a read-only partition's refresh.

use super::Partition;
use crate::Offset;
use crate::canary::{self, Canary};
use crate::error::{Corruption, CorruptionKind, ReadError};
use crate::fetch::Fetch;
use crate::format::{self, DecodeError};
use crate::io::{Io, OpenMode};
use crate::layout::{self, LOG_SUFFIX};
use crate::limits::BATCH_BYTES_MAX;
use crate::metrics::Metrics;
use crate::segment::{self, Segment, SegmentFile};
use std::sync::Arc;
use std::time::Duration;

struct Taken {
    bytes: usize,
    needed: Option<usize>,
    stop: bool,
}

/// The offset after the last batch of a buffer of validated batches (headers only).
fn last_batch_next_offset(buffer: &[u8]) -> Offset {
    let mut rest = buffer;
    let mut next = Offset::ZERO;
    while let Some(batch) = format::view_validated_batch(rest) {
        next = batch.next_offset();
        rest = &rest[batch.len()..];
    }
    next
}

impl<I: Io> Partition<I> {
    /// Block until a record at `offset` is visible or `timeout` passes. Returns whether it is.
    pub fn wait_for(&self, offset: Offset, timeout: Duration) -> Result<bool, ReadError> {
        if self.writer.is_none() {
            // Read-only: another process writes, and nothing here is notified. Look, wait,
            // look again.
            self.refresh()?;
            if self.high_watermark() <= offset {
                self.watermark.wait_change(timeout);
                self.refresh()?;
            }
            return Ok(self.high_watermark() > offset);
        }
        // Every publish wakes every waiter, also those waiting for a later offset: it waits
        // again until the offset is visible or the whole timeout has passed.
        Ok(self.watermark.wait_past(offset, timeout))
    }

    /// The base offset of the first segment that starts after `offset`, if any: where a
    /// reader that must go on past damage at `offset` picks up again.
    pub fn next_segment_base(&self, offset: Offset) -> Option<Offset> {
        let state = self.state.lock();
        state.segments.iter().map(|s| s.base_offset).find(|base| *base > offset)
    }

    /// The damage at the end of the log that refuses appends, if any.
    pub fn append_refusal(&self) -> Option<Corruption> {
        self.state.lock().damaged.as_ref().map(|(_, corruption)| corruption.clone())
    }

    /// Read whole batches starting at or before `from`, up to about `max_bytes` (at least one
    /// batch), from one segment, never past the high watermark.
    pub fn read(&self, from: Offset, max_bytes: usize) -> Result<Fetch, ReadError> {
        let fetch = self.read_unmeasured(from, max_bytes)?;
        Metrics::add(&self.metrics.fetches, 1);
        Metrics::add(&self.metrics.bytes_read, fetch.len_bytes() as u64);
        Ok(fetch)
    }

    fn read_unmeasured(&self, from: Offset, max_bytes: usize) -> Result<Fetch, ReadError> {
        self.poison.check()?;
        let high_watermark = self.high_watermark();
        let (file, mut position, limit, mut expected) = {
            let state = self.state.lock();
            let start = state.segments[0].base_offset;
            // Checked before the range: offsets past the damage were acknowledged once, and a
            // consumer asking for them must learn of the damage, not of an offset out of range.
            if let Some((_, corruption)) = state.damaged.as_ref().filter(|(at, _)| from >= *at) {
                return Err(ReadError::Corruption(corruption.clone()));
            }
            if from < start || from > high_watermark {
                let (requested, start, end) = (from.get(), start.get(), high_watermark.get());
                return Err(ReadError::OffsetOutOfRange { requested, start, end });
            }
            if from == high_watermark {
                return Ok(Fetch::empty(from));
            }
            // The segment holding `from`. Offsets between two segments belong to a segment that
            // was lost (recovery reported it): reading them is reading damage, never a skip.
            let holding = state.segments.partition_point(|s| s.base_offset <= from) - 1;
            let segment = &state.segments[holding];
            if from >= segment.next_offset {
                let after = state.segments.get(holding + 1).expect("from is below the watermark");
                let kind = CorruptionKind::OffsetMismatch {
                    expected: segment.next_offset.get(),
                    found: after.base_offset.get(),
                };
                let file = after.file.path.clone();
                return Err(ReadError::Corruption(Corruption { file, position: 0, kind }));
            }
            let (expected, position) = segment.index.entry_for_offset(from);
            (Arc::clone(&segment.file), u64::from(position), segment.size, expected)
        };
        let wanted = from..high_watermark;
        let chunk_bytes = max_bytes.clamp(format::BATCH_HEADER_BYTES, BATCH_BYTES_MAX as usize);
        let mut buffer: Vec<u8> = Vec::new();
        // Bytes the next read must cover: a batch larger than a chunk is read whole.
        let mut at_least = 0usize;
        while position < limit {
            let want = (limit - position).min(chunk_bytes.max(at_least) as u64) as usize;
            let chunk = file.read(position, want).map_err(ReadError::Io)?;
            if chunk.is_empty() {
                break;
            }
            let taken = Self::take_batches(
                &file,
                position,
                &chunk,
                wanted.clone(),
                &mut expected,
                &mut buffer,
            )?;
            if taken.bytes == 0 && !taken.stop {
                let needed = taken.needed.expect("no progress means an incomplete batch");
                let available = limit - position;
                // The batch runs past the segment's end, the file is shorter than its recorded
                // size, or a read of the whole batch still did not hold it: serve what came
                // before, else report it.
                if chunk.len() < want || needed as u64 > available || at_least >= needed {
                    if !buffer.is_empty() {
                        break;
                    }
                    return Err(Self::truncated(&file, position, needed, available).into());
                }
                at_least = needed;
                continue;
            }
            at_least = 0;
            position += taken.bytes as u64;
            // Batches below `from` fill nothing: keep going until one batch is taken, even
            // when `max_bytes` is zero.
            if taken.stop || (!buffer.is_empty() && buffer.len() >= max_bytes) {
                break;
            }
        }
        if buffer.is_empty() {
            return Ok(Fetch::empty(from));
        }
        let next_offset = last_batch_next_offset(&buffer);
        Ok(Fetch::new(buffer, from, next_offset))
    }

    fn truncated(
        file: &SegmentFile<I>,
        position: u64,
        needed: usize,
        available: u64,
    ) -> Corruption {
        let needed = needed as u64;
        Corruption {
            file: file.path.clone(),
            position,
            kind: CorruptionKind::Truncated { needed, available },
        }
    }

    /// Move the wanted batches at the start of `chunk` (read at `position`) into `out`.
    /// `wanted` is the range of offsets asked for (from `from` to the high watermark);
    /// `expected` is the base offset the next batch must have: offsets continue batch after
    /// batch, and a checksum-valid batch in the wrong place is damage, not data.
    fn take_batches(
        file: &SegmentFile<I>,
        position: u64,
        chunk: &[u8],
        wanted: std::ops::Range<Offset>,
        expected: &mut Offset,
        out: &mut Vec<u8>,
    ) -> Result<Taken, ReadError> {
        let mut cursor = 0;
        loop {
            match format::parse_batch_unless(Canary::SkipChecksumOnRead, &chunk[cursor..]) {
                Ok(batch) => {
                    if batch.base_offset() >= wanted.end {
                        return Ok(Taken { bytes: cursor, needed: None, stop: true });
                    }
                    if batch.base_offset() != *expected {
                        let kind = CorruptionKind::OffsetMismatch {
                            expected: expected.get(),
                            found: batch.base_offset().get(),
                        };
                        if out.is_empty() {
                            let position = position + cursor as u64;
                            return Err(
                                Corruption { file: file.path.clone(), position, kind }.into()
                            );
                        }
                        return Ok(Taken { bytes: cursor, needed: None, stop: true });
                    }
                    *expected = batch.next_offset();
                    if batch.next_offset() > wanted.start {
                        out.extend_from_slice(batch.as_bytes());
                    }
                    cursor += batch.len();
                }
                Err(DecodeError::Incomplete { needed, .. }) => {
                    let needed = usize::try_from(needed).unwrap_or(usize::MAX);
                    return Ok(Taken { bytes: cursor, needed: Some(needed), stop: false });
                }
                Err(DecodeError::Corrupt(kind)) => {
                    if out.is_empty() {
                        let position = position + cursor as u64;
                        return Err(Corruption { file: file.path.clone(), position, kind }.into());
                    }
                    // Serve what came before the damage; the next read starts at it and fails.
                    return Ok(Taken { bytes: cursor, needed: None, stop: true });
                }
            }
        }
    }

    /// The first offset whose record timestamp is `>= timestamp`, below the high watermark.
    pub fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<Offset>, ReadError> {
        self.poison.check()?;
        let high_watermark = self.high_watermark();
        let (candidates, damaged): (Vec<_>, _) = {
            let state = self.state.lock();
            let candidates = state
                .segments
                .iter()
                .filter(|s| s.index.max_timestamp() >= timestamp || s.size == 0)
                .map(|s| (Arc::clone(&s.file), s.index.position_for_timestamp(timestamp), s.size))
                .collect();
            (candidates, state.damaged.as_ref().map(|(_, corruption)| corruption.clone()))
        };
        for (file, position, size) in candidates {
            let mut found = None;
            let end = segment::scan(&file, u64::from(position), size, |_, batch| {
                if batch.base_offset() >= high_watermark {
                    return false;
                }
                if batch.max_timestamp() >= timestamp {
                    found =
                        batch.records().find(|r| r.timestamp() >= timestamp).map(|r| r.offset());
                    if canary::active(Canary::TimestampLookupTakesBatchStart) {
                        found = Some(batch.base_offset());
                    }
                }
                found.is_none()
            })?;
            if found.is_some() {
                return Ok(found);
            }
            if let Some(error) = end.damage {
                let kind = error.into();
                return Err(
                    Corruption { file: file.path.clone(), position: end.position, kind }.into()
                );
            }
        }
        // The answer may lie in the damaged data at the end of the log: report it, not `None`.
        if let Some(corruption) = damaged {
            return Err(corruption.into());
        }
        Ok(None)
    }

    /// Read-only partitions: pick up what the writing process appended since the last look,
    /// including segments it rolled to. A tail that does not parse yet is a write in progress
    /// and is left for the next call.
    pub fn refresh(&self) -> Result<(), ReadError> {
        if self.writer.is_some() {
            return Ok(());
        }
        let mut state = self.state.lock();
        loop {
            let active = state.segments.last_mut().expect("active segment");
            let file = Arc::clone(&active.file);
            let size = file.size()?;
            let mut contiguous = true;
            let end = segment::scan(&file, active.size, size, |_, batch| {
                contiguous = batch.base_offset() == active.next_offset;
                if contiguous {
                    active.on_batch(batch.info());
                }
                contiguous
            })?;
            // An incomplete batch is a write in progress. Anything else means the writer
            // recovered and rewrote what this reader had already seen.
            // Zeros padding the last block of a direct write are a write in progress too.
            let known_tail = state.unread_tail == Some(end.position)
                || segment::is_block_padding(&file, end.position, size)?;
            let rewritten = matches!(end.damage, Some(DecodeError::Corrupt(_))) && !known_tail;
            let active = state.segments.last().expect("active segment");
            if size < active.size || (!contiguous && !known_tail) || rewritten {
                return Err(ReadError::Changed { path: file.path.clone() });
            }
            // The writer creates the next segment only once this one is complete, named by the
            // offset after its last record: if it exists, everything before it has been read.
            let base = active.next_offset;
            let next_path = self.directory.join(layout::file_name(base, LOG_SUFFIX));
            let next = match SegmentFile::open(&self.io, next_path, OpenMode::Read) {
                Ok(file) => file,
                Err(error) if error.source.kind() == std::io::ErrorKind::NotFound => break,
                Err(error) => return Err(error.into()),
            };
            let now = self.clock.now_ms();
            let interval = state.config.index_interval_bytes;
            state.segments.push(Segment::empty(base, next, interval, now));
            state.unread_tail = None;
        }
        let end = state.next_offset();
        drop(state);
        self.publish(end);
        Ok(())
    }
}
