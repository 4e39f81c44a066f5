//! Segment files: naming, the open-file handle shared with readers, sequential scanning, and the
//! index files written when a segment is sealed.

use crate::Offset;
use crate::canary::{self, Canary};
use crate::error::{CorruptionKind, IoError};
use crate::format::{BATCH_HEADER_BYTES, BatchInfo, BatchView, DecodeError};
use crate::index::SegmentIndex;
use crate::io::{self, DIRECT_ALIGNMENT, FileHandle, Io, OpenMode, Operation};
use crate::layout::{INDEX_SUFFIX, TIME_INDEX_SUFFIX, file_name};
use crate::limits::{SCAN_CHUNK_BYTES, SEGMENT_BYTES_MAX};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open segment file, shared by the writer and by readers in flight. Closed when the last
/// user drops it, so a reader keeps a consistent view even if the segment is removed meanwhile.
#[derive(Debug)]
pub struct SegmentFile<I: Io> {
    io: Arc<I>,
    pub handle: FileHandle,
    pub path: PathBuf,
    /// Opened for direct writes: every write covers whole blocks of [`DIRECT_ALIGNMENT`].
    pub direct: bool,
}

impl<I: Io> SegmentFile<I> {
    pub fn open(io: &Arc<I>, path: PathBuf, mode: OpenMode) -> Result<Self, IoError> {
        let handle = io.open(&path, mode).map_err(|e| IoError::new("open", &path, e))?;
        Ok(SegmentFile { io: Arc::clone(io), handle, path, direct: mode.is_direct() })
    }

    /// Write `bytes` at `position`, which must be block-aligned on a direct file.
    pub fn write(&self, position: u64, bytes: Vec<u8>) -> Result<(), IoError> {
        io::write_all(&*self.io, self.handle, position, bytes)
            .map_err(|e| IoError::new("write", &self.path, e))
    }

    pub fn io(&self) -> &I {
        &self.io
    }

    pub fn size(&self) -> Result<u64, IoError> {
        self.io.file_size(self.handle).map_err(|e| IoError::new("stat", &self.path, e))
    }

    pub fn run(&self, operation: Operation) -> Result<(), IoError> {
        let name = operation.name();
        io::run_plain(&*self.io, operation).map_err(|e| IoError::new(name, &self.path, e))
    }

    pub fn read(&self, position: u64, length: usize) -> Result<Vec<u8>, IoError> {
        self.read_into(position, length, Vec::new())
    }

    /// As [`SegmentFile::read`], into `buffer`, resized to `length` first: a buffer reused
    /// from read to read is overwritten, not zeroed and faulted in again.
    pub fn read_into(
        &self,
        position: u64,
        length: usize,
        mut buffer: Vec<u8>,
    ) -> Result<Vec<u8>, IoError> {
        buffer.resize(length, 0);
        let completion =
            io::run(&*self.io, Operation::Read { file: self.handle, position, buffer });
        completion.result.map_err(|e| IoError::new("read", &self.path, e))?;
        Ok(completion.buffer)
    }
}

impl<I: Io> Drop for SegmentFile<I> {
    fn drop(&mut self) {
        self.io.close(self.handle);
    }
}

/// One segment of a partition's log, as the writer sees it.
#[derive(Debug)]
pub struct Segment<I: Io> {
    pub base_offset: Offset,
    pub file: Arc<SegmentFile<I>>,
    /// Bytes of complete batches in the file.
    pub size: u64,
    /// The offset after the segment's last record.
    pub next_offset: Offset,
    /// Clock time the segment's age counts from, for rolling by `segment_ms`.
    pub created_ms: i64,
    pub index: SegmentIndex,
    /// On a direct file: the bytes of the last, partial block (`size % DIRECT_ALIGNMENT` of
    /// them), as recovery found them; the partition log keeps them from there and rewrites
    /// them in front of its next write. Empty otherwise.
    pub tail: Vec<u8>,
}

impl<I: Io> Segment<I> {
    pub fn empty(
        base_offset: Offset,
        file: SegmentFile<I>,
        interval_bytes: u32,
        now_ms: i64,
    ) -> Self {
        Segment {
            base_offset,
            file: Arc::new(file),
            size: 0,
            next_offset: base_offset,
            created_ms: now_ms,
            index: SegmentIndex::new(base_offset, interval_bytes),
            tail: Vec::new(),
        }
    }

    /// As [`Segment::empty`], for a file the write path holds too.
    pub fn empty_shared(
        base_offset: Offset,
        file: Arc<SegmentFile<I>>,
        interval_bytes: u32,
        now_ms: i64,
    ) -> Self {
        Segment {
            base_offset,
            file,
            size: 0,
            next_offset: base_offset,
            created_ms: now_ms,
            index: SegmentIndex::new(base_offset, interval_bytes),
            tail: Vec::new(),
        }
    }

    /// On a direct file, read the partial last block into `tail`, after recovery set `size`.
    pub fn load_tail(&mut self) -> Result<(), IoError> {
        if !self.file.direct {
            return Ok(());
        }
        let block = DIRECT_ALIGNMENT as u64;
        let length = (self.size % block) as usize;
        let tail = self.file.read(self.size - length as u64, length)?;
        if tail.len() != length {
            let error = std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the segment is shorter than recovery found it",
            );
            return Err(IoError::new("read", &self.file.path, error));
        }
        self.tail = tail;
        Ok(())
    }

    /// Make everything written to the segment durable before it is sealed. On a direct file
    /// the zeros past `size` are cut first, and an fsync makes the new length durable too:
    /// every segment but the last ends exactly at its last batch.
    pub fn sync_for_seal(&self) -> Result<(), IoError> {
        let file = &self.file;
        if file.direct && !canary::active(Canary::SealKeepsDirectPadding) {
            file.run(Operation::Truncate { file: file.handle, length: self.size })?;
            return file.run(Operation::Fsync { file: file.handle });
        }
        file.run(Operation::Fdatasync { file: file.handle })
    }

    /// Account for a batch written at the end of the file.
    pub fn on_batch(&mut self, batch: BatchInfo) {
        assert_eq!(batch.base_offset, self.next_offset, "batches must be contiguous");
        assert!(batch.next_offset > batch.base_offset, "a batch holds at least one record");
        let position = u32::try_from(self.size).expect("segment position exceeds u32");
        self.index.on_batch(position, batch.base_offset, batch.max_timestamp, batch.length);
        self.size += u64::from(batch.length);
        self.next_offset = batch.next_offset;
    }

    pub fn directory(&self) -> &Path {
        self.file.path.parent().expect("segment files live in a partition directory")
    }

    /// Write this segment's index files through temporary files and renames. The caller fsyncs
    /// the directory afterwards to make the renames durable.
    pub fn write_index_files(&self) -> Result<(), IoError> {
        let (offsets, times) = self.index.encode(self.size, self.next_offset);
        let directory = self.directory().to_path_buf();
        for (suffix, bytes) in [(INDEX_SUFFIX, offsets), (TIME_INDEX_SUFFIX, times)] {
            let path = directory.join(file_name(self.base_offset, suffix));
            write_file_durably(self.file.io(), &path, bytes)?;
        }
        Ok(())
    }
}

/// Write `bytes` to `path` through `path.tmp`: create, write, fdatasync, rename. The caller
/// fsyncs the directory to make the rename durable.
pub fn write_file_durably<I: Io + ?Sized>(
    io: &I,
    path: &Path,
    bytes: Vec<u8>,
) -> Result<(), IoError> {
    io::replace_file(io, path, bytes)
}

/// Longest small file (metadata, index, checkpoint) that can be intact: the time index of the
/// largest segment with a batch at every position a batch can start, the largest kind of
/// small file there is.
pub const SMALL_FILE_BYTES_MAX: u64 = (size_of::<crate::index::IndexFileHeader>()
    + (SEGMENT_BYTES_MAX as usize / BATCH_HEADER_BYTES + 1) * size_of::<crate::index::TimeEntry>())
    as u64;

/// Read a whole small file, or `None` if it does not exist.
///
/// Of a file longer than [`SMALL_FILE_BYTES_MAX`] (damaged, whatever it holds: a size set
/// wrong by a broken file system, a sparse file) only the first `SMALL_FILE_BYTES_MAX + 1`
/// bytes are read: each caller's decoder then sees a length no such file has and treats it as
/// any damage (an index is rebuilt, metadata is reported), without a read of the whole file
/// (a 20 GiB sparse index took 23 GB of memory at open).
pub fn read_small_file<I: Io + ?Sized>(io: &I, path: &Path) -> Result<Option<Vec<u8>>, IoError> {
    io::read_file_bounded(io, path, SMALL_FILE_BYTES_MAX)
}

/// Whether the bytes of `file` from `position` to its end (`size`) are the zeros a direct
/// write pads its last block with: fewer than a block, all zero, up to a block boundary.
pub fn is_block_padding<I: Io>(
    file: &SegmentFile<I>,
    position: u64,
    size: u64,
) -> Result<bool, IoError> {
    let block = DIRECT_ALIGNMENT as u64;
    if position >= size || !size.is_multiple_of(block) || size - position >= block {
        return Ok(false);
    }
    let bytes = file.read(position, (size - position) as usize)?;
    Ok(bytes.len() as u64 == size - position && bytes.iter().all(|&b| b == 0))
}

/// Where a sequential scan stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanEnd {
    /// Position after the last valid batch visited.
    pub position: u64,
    /// Why the scan stopped before `end`, if it did: bytes at `position` that are not a batch.
    pub damage: Option<DecodeError>,
}

impl ScanEnd {
    /// The damage the scan stopped at, as a `Corruption` of `file`.
    pub fn corruption(&self, file: &Path) -> Option<crate::error::Corruption> {
        let kind = self.damage.clone()?.into();
        Some(crate::error::Corruption { file: file.to_path_buf(), position: self.position, kind })
    }
}

/// Visit the valid batches of `file` from `start` to `end` in order, reading in bounded
/// chunks. `visit` returns `false` to stop early.
pub fn scan<I: Io>(
    file: &SegmentFile<I>,
    start: u64,
    end: u64,
    mut visit: impl FnMut(u64, &BatchView<'_>) -> bool,
) -> Result<ScanEnd, IoError> {
    let mut buffer: Vec<u8> = Vec::new();
    // The buffer before the last read: the next read goes into it.
    let mut spare: Vec<u8> = Vec::new();
    let mut buffer_start = start;
    let mut cursor = 0usize;
    loop {
        let position = buffer_start + cursor as u64;
        if position >= end {
            return Ok(ScanEnd { position, damage: None });
        }
        match crate::format::parse_batch_unless(Canary::RecoveryTrustsTornTail, &buffer[cursor..]) {
            Ok(batch) => {
                // Positions are u32 in the index files and in memory: the engine never writes a
                // segment past 4 GiB (`SEGMENT_BYTES_MAX` plus one batch), so a batch beyond
                // that was not written by it. Damage, not a panic in `Segment::on_batch`.
                if position + batch.len() as u64 > u64::from(u32::MAX) {
                    let reason = "a batch past the 4 GiB a segment can hold";
                    let damage = Some(DecodeError::Corrupt(CorruptionKind::Malformed { reason }));
                    return Ok(ScanEnd { position, damage });
                }
                if !visit(position, &batch) {
                    return Ok(ScanEnd { position, damage: None });
                }
                cursor += batch.len();
            }
            Err(DecodeError::Incomplete { needed, .. }) => {
                let loaded_end = buffer_start + buffer.len() as u64;
                if loaded_end >= end {
                    let available = end - position;
                    let damage = Some(DecodeError::Incomplete { needed, available });
                    return Ok(ScanEnd { position, damage });
                }
                // Read again from the incomplete batch's start (its first bytes come from the
                // page cache a second time): the chunk then replaces the buffer whole, with no
                // copy in memory, and the old buffer takes the next read.
                let held = (buffer.len() - cursor) as u64;
                let length = needed.max(SCAN_CHUNK_BYTES as u64).min(end - position);
                let chunk =
                    file.read_into(position, length as usize, std::mem::take(&mut spare))?;
                if chunk.len() as u64 <= held {
                    let damage =
                        Some(DecodeError::Incomplete { needed, available: end - position });
                    return Ok(ScanEnd { position, damage });
                }
                spare = std::mem::replace(&mut buffer, chunk);
                buffer_start = position;
                cursor = 0;
            }
            Err(damage @ DecodeError::Corrupt(_)) => {
                return Ok(ScanEnd { position, damage: Some(damage) });
            }
        }
    }
}
