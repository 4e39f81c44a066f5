//! Sorted runs: the immutable files of a disk store, each a store's entries (and deletions) in
//! key order, in checksummed blocks, with an index of the blocks and a Bloom filter of the keys.
//! The layout is in docs/format.md ("Disk store runs").

use super::files::{Damage, Files, StoreError, canary_trusts_damage};
use chronik_engine::canary::{self, Canary};
use chronik_engine::io::{FileHandle, OpenMode, Operation};
use std::path::PathBuf;
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"CHSR";
const VERSION: u16 = 1;
const FOOTER_BYTES: usize = 64;
/// A data block closes once it holds at least this many bytes.
pub const BLOCK_BYTES: usize = 4096;
/// Length field of a deletion.
const TOMBSTONE: u32 = u32::MAX;
/// Bytes written out at once while a run is built: every merge under way holds one, so with
/// many stores in one budget it stays small.
const WRITE_BUFFER_BYTES: usize = 128 << 10;
const BLOOM_BITS_PER_KEY: u64 = 10;
const BLOOM_PROBES: u32 = 7;

/// The checksum of run blocks, manifests and footers: xxh3-64.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The hash a key's Bloom probes derive from.
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, 0x6368_726f_6e69_6b21)
}

/// A block's place in its run, and the last key in it.
#[derive(Debug)]
struct BlockEntry {
    last_key: Box<[u8]>,
    offset: u64,
    /// With the checksum.
    length: u32,
}

/// A blocked Bloom filter over a run's keys: a key's probes all fall in one 64-byte block, so
/// a lookup costs one cache miss per run, not one per probe.
#[derive(Debug)]
struct Bloom {
    bits: Vec<u8>,
}

/// Bytes of one Bloom block (a cache line).
const BLOOM_BLOCK_BYTES: usize = 64;

impl Bloom {
    fn for_keys(keys: u64) -> Bloom {
        let bytes = (keys.max(1) * BLOOM_BITS_PER_KEY).div_ceil(8);
        let bytes =
            usize::try_from(bytes).unwrap_or(usize::MAX).next_multiple_of(BLOOM_BLOCK_BYTES);
        // Pair with `Run::load`, which refuses a filter of another shape as damage.
        assert!(bytes > 0 && bytes.is_multiple_of(BLOOM_BLOCK_BYTES), "Bloom blocks are whole");
        Bloom { bits: vec![0; bytes] }
    }

    /// The byte and bit of each probe of `hash`.
    fn probes(&self, hash: u64) -> impl Iterator<Item = (usize, u8)> + use<> {
        // Per key (every lookup and every entry written), so debug only.
        debug_assert!(
            !self.bits.is_empty() && self.bits.len().is_multiple_of(BLOOM_BLOCK_BYTES),
            "a Bloom filter probed is whole blocks"
        );
        let blocks = (self.bits.len() / BLOOM_BLOCK_BYTES) as u64;
        let block =
            ((u128::from(hash >> 32) * u128::from(blocks)) >> 32) as usize * BLOOM_BLOCK_BYTES;
        debug_assert!(
            block + BLOOM_BLOCK_BYTES <= self.bits.len(),
            "a key's Bloom block is inside"
        );
        let mixed = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..BLOOM_PROBES).map(move |i| {
            let bit = (mixed >> (9 * i)) as usize & (BLOOM_BLOCK_BYTES * 8 - 1);
            (block + bit / 8, 1 << (bit % 8))
        })
    }

    fn insert(&mut self, hash: u64) {
        // Per entry written, so debug only; the filter's shape is `for_keys`'s.
        debug_assert!(!self.bits.is_empty(), "a Bloom filter takes keys once sized");
        for (byte, mask) in self.probes(hash) {
            self.bits[byte] |= mask;
        }
        debug_assert!(self.may_contain(hash), "a Bloom filter has no false negative");
    }

    fn may_contain(&self, hash: u64) -> bool {
        // Per lookup, so debug only: a probe is one bit.
        self.probes(hash).all(|(byte, mask)| {
            debug_assert!(mask.is_power_of_two(), "a Bloom probe tests one bit");
            self.bits[byte] & mask != 0
        })
    }
}

/// What a run holds, as its manifest entry records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunMeta {
    pub id: u64,
    /// 0 for a run written from memory; a merge of runs of level `l` has level `l + 1`.
    pub level: u8,
    pub bytes: u64,
    /// Entries, deletions included.
    pub entries: u64,
    /// The change in live keys this run makes over the runs older than it: for a flushed
    /// run, its values of keys no older run's Bloom filter may hold less its deletions of
    /// keys one may; for a merge, the sum of its inputs'; exact (its values) for a merge that
    /// drops deletions. So the sum over a store's runs estimates its keys.
    pub live: i64,
}

/// Builds a run file from entries given in strictly increasing key order.
pub struct RunWriter {
    files: Arc<Files>,
    path: PathBuf,
    file: FileHandle,
    meta: RunMeta,
    position: u64,
    buffer: Vec<u8>,
    block: Vec<u8>,
    last_key: Vec<u8>,
    index: Vec<BlockEntry>,
    bloom: Bloom,
}

impl RunWriter {
    /// A new run file `id`, for about `expected_entries` entries (the Bloom filter's size).
    pub fn create(
        files: &Arc<Files>,
        id: u64,
        level: u8,
        expected_entries: u64,
    ) -> Result<RunWriter, StoreError> {
        let path = files.path(&run_name(id));
        assert_eq!(path.parent(), Some(files.directory.as_path()), "a run lies in its store");
        // A file left by a build a crash interrupted (never in a manifest) is replaced.
        files.remove_if_present(&path)?;
        let file = files
            .io
            .open(&path, OpenMode::CreateNew)
            .map_err(|e| Files::error("create", &path, e))?;
        let writer = RunWriter {
            files: Arc::clone(files),
            path,
            file,
            meta: RunMeta { id, level, bytes: 0, entries: 0, live: 0 },
            position: 0,
            buffer: Vec::with_capacity(WRITE_BUFFER_BYTES),
            block: Vec::with_capacity(BLOCK_BYTES * 2),
            last_key: Vec::new(),
            index: Vec::new(),
            bloom: Bloom::for_keys(expected_entries),
        };
        // Sized for the entries expected (a merge may write fewer, never a filter of none).
        assert!(
            writer.bloom.bits.len() as u64 * 8 >= expected_entries * BLOOM_BITS_PER_KEY,
            "a run's Bloom filter has its bits per key"
        );
        Ok(writer)
    }

    /// Bytes the writer keeps in memory: its buffers, index and Bloom filter.
    pub fn resident_bytes(&self) -> usize {
        self.buffer.capacity()
            + self.block.capacity()
            + self.bloom.bits.len()
            + self.index.iter().map(|e| e.last_key.len() + 40).sum::<usize>()
    }

    /// Add an entry: `None` records a deletion. Keys come in strictly increasing order; a
    /// merge of runs whose blocks were believed out of order (damage) is refused, not written.
    pub fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        assert!(self.block.len() < BLOCK_BYTES, "a block closes once it holds BLOCK_BYTES");
        if self.meta.entries > 0 && key <= self.last_key.as_slice() {
            let name = run_name(self.meta.id);
            return Err(StoreError::Damaged(Damage::new(&name, "keys out of order in a merge")));
        }
        let key_length = u32::try_from(key.len()).expect("keys are under 4 GiB");
        let value_length = match value {
            Some(value) => {
                let length = u32::try_from(value.len()).expect("values are under 4 GiB");
                assert!(length != TOMBSTONE, "values are under 4 GiB");
                length
            }
            None => TOMBSTONE,
        };
        let before = self.block.len();
        self.block.extend_from_slice(&key_length.to_le_bytes());
        self.block.extend_from_slice(&value_length.to_le_bytes());
        self.block.extend_from_slice(key);
        self.block.extend_from_slice(value.unwrap_or_default());
        // Pair with `BlockEntries::next`, which reads back its two length fields, the key and
        // the value, and nothing more.
        assert_eq!(
            self.block.len() - before,
            8 + key.len() + value.map_or(0, <[u8]>::len),
            "an entry is its length fields, key and value"
        );
        self.bloom.insert(key_hash(key));
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        self.meta.entries += 1;
        if self.block.len() >= BLOCK_BYTES {
            self.close_block()?;
        }
        Ok(())
    }

    fn close_block(&mut self) -> Result<(), StoreError> {
        if self.block.is_empty() {
            return Ok(());
        }
        // Pair with `Run::read_block`, which refuses a block out of order as damage: before it
        // is written, a block parses to its end, keys strictly increasing, ending at the last
        // key added. (Debug only: it parses the block again.)
        debug_assert!(
            {
                let keys: Option<Vec<&[u8]>> =
                    BlockEntries::new(&self.block).map(|e| e.map(|(key, _)| key)).collect();
                keys.is_some_and(|keys| {
                    keys.windows(2).all(|pair| pair[0] < pair[1])
                        && keys.last() == Some(&self.last_key.as_slice())
                })
            },
            "a block is written with its keys in strictly increasing order"
        );
        let offset = self.position + self.buffer.len() as u64;
        assert!(
            self.index.last().is_none_or(|previous| {
                previous.offset + u64::from(previous.length) == offset
                    && *previous.last_key < *self.last_key
            }),
            "blocks are contiguous and in key order"
        );
        let sum = checksum(&self.block);
        self.block.extend_from_slice(&sum.to_le_bytes());
        let length = u32::try_from(self.block.len()).expect("blocks are under 4 GiB");
        // Pair with `Run::load`, which refuses an index entry shorter than a checksum.
        assert!(length > 8, "a block holds an entry and its checksum");
        self.index.push(BlockEntry { last_key: self.last_key.as_slice().into(), offset, length });
        self.buffer.extend_from_slice(&self.block);
        self.block.clear();
        assert_eq!(
            self.position + self.buffer.len() as u64,
            offset + u64::from(length),
            "a block ends where its index entry says"
        );
        if self.buffer.len() >= WRITE_BUFFER_BYTES {
            self.write_out()?;
        }
        Ok(())
    }

    fn write_out(&mut self) -> Result<(), StoreError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let buffer = std::mem::replace(&mut self.buffer, Vec::with_capacity(WRITE_BUFFER_BYTES));
        let length = buffer.len() as u64;
        assert!(
            self.index.last().is_none_or(|last| last.offset < self.position + length),
            "the last block indexed lies in what is written"
        );
        chronik_engine::io::write_all(&*self.files.io, self.file, self.position, buffer)
            .map_err(|e| Files::error("write", &self.path, e))?;
        self.position = self.position.checked_add(length).expect("run files are under 16 EiB");
        // Blocks go out whole: everything indexed is written once the buffer is.
        assert!(
            self.index
                .last()
                .is_none_or(|last| last.offset + u64::from(last.length) <= self.position),
            "every block indexed is written"
        );
        Ok(())
    }

    /// Write the index, the Bloom filter and the footer, and make the file durable (its data;
    /// the directory entry is the caller's, see [`Files::sync`]).
    pub fn finish(mut self) -> Result<RunMeta, StoreError> {
        self.close_block()?;
        // The index follows the last block, so no entry is left outside one.
        assert!(self.block.is_empty(), "every entry added is in a closed block");
        let index_offset = self.position + self.buffer.len() as u64;
        let mut index = Vec::with_capacity(self.index.len() * 32);
        for entry in &self.index {
            index.extend_from_slice(&(entry.last_key.len() as u32).to_le_bytes());
            index.extend_from_slice(&entry.last_key);
            index.extend_from_slice(&entry.offset.to_le_bytes());
            index.extend_from_slice(&entry.length.to_le_bytes());
        }
        // Pair with `Run::load`, which parses exactly these fields: a key's length, the key,
        // the offset and the length of each block.
        assert_eq!(
            index.len(),
            self.index.iter().map(|e| 16 + e.last_key.len()).sum::<usize>(),
            "the index is its entries"
        );
        let sum = checksum(&index);
        index.extend_from_slice(&sum.to_le_bytes());
        // A run with entries has blocks, and one without has none.
        assert_eq!(self.meta.entries == 0, self.index.is_empty(), "entries iff blocks");
        self.buffer.extend_from_slice(&index);
        let bloom_offset = index_offset + index.len() as u64;
        let mut bloom = std::mem::take(&mut self.bloom.bits);
        let sum = checksum(&bloom);
        bloom.extend_from_slice(&sum.to_le_bytes());
        // Pair with `Run::load`, which refuses a smaller filter as damage.
        assert!(bloom.len() >= BLOOM_BLOCK_BYTES + 8, "a Bloom filter is a block or more");
        self.buffer.extend_from_slice(&bloom);
        let mut footer = Vec::with_capacity(FOOTER_BYTES);
        footer.extend_from_slice(MAGIC);
        footer.extend_from_slice(&VERSION.to_le_bytes());
        footer.extend_from_slice(&[0, 0]);
        for field in [
            index_offset,
            index.len() as u64,
            bloom_offset,
            bloom.len() as u64,
            self.meta.entries,
            self.meta.id,
        ] {
            footer.extend_from_slice(&field.to_le_bytes());
        }
        let sum = checksum(&footer);
        footer.extend_from_slice(&sum.to_le_bytes());
        assert_eq!(footer.len(), FOOTER_BYTES, "the footer has its fixed size");
        // Pair with `Run::load`: the index covers the blocks from the start of the file.
        assert_eq!(
            self.index.last().map_or(0, |last| last.offset + u64::from(last.length)),
            index_offset,
            "the index covers the blocks"
        );
        assert!(self.index.first().is_none_or(|first| first.offset == 0), "blocks start at 0");
        self.buffer.extend_from_slice(&footer);
        self.write_out()?;
        assert_eq!(
            self.position,
            bloom_offset + bloom.len() as u64 + FOOTER_BYTES as u64,
            "the footer ends the file"
        );
        // The bug under the canary: the run is named before its data are durable.
        if !canary::active(Canary::StoreRunNamedBeforeDurable) {
            chronik_engine::io::run_plain(
                &*self.files.io,
                Operation::Fdatasync { file: self.file },
            )
            .map_err(|e| Files::error("fdatasync", &self.path, e))?;
        }
        self.meta.bytes = self.position;
        Ok(self.meta)
    }
}

impl Drop for RunWriter {
    fn drop(&mut self) {
        self.files.io.close(self.file);
    }
}

impl std::fmt::Debug for RunWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWriter")
            .field("path", &self.path)
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

/// The file name of run `id`.
pub fn run_name(id: u64) -> String {
    let name = format!("{id:016}.run");
    debug_assert_eq!(parse_run_name(&name), Some(id), "a run's name parses back to its id");
    name
}

/// The id of a run file's name.
pub fn parse_run_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".run")?;
    (digits.len() == 16 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())?
}

/// An open run: its index and Bloom filter in memory, its blocks read on demand.
pub struct Run {
    files: Arc<Files>,
    file: FileHandle,
    pub meta: RunMeta,
    index: Vec<BlockEntry>,
    bloom: Bloom,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("meta", &self.meta)
            .field("blocks", &self.index.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.files.io.close(self.file);
    }
}

/// Little-endian fields of `bytes`, in turn; `None` once they run out.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = self.rest.split_at_checked(n)?;
        self.rest = tail;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// `bytes` without its trailing checksum, if the checksum matches.
pub fn verified(bytes: &[u8]) -> Option<&[u8]> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    if canary_trusts_damage() {
        return Some(body);
    }
    (checksum(body) == u64::from_le_bytes(sum.try_into().ok()?)).then_some(body)
}

impl Run {
    /// Open run `meta.id` and read its index and Bloom filter, checking that they, the footer
    /// and the manifest's record of the run agree.
    pub fn open(files: &Arc<Files>, meta: RunMeta) -> Result<Run, StoreError> {
        let name = run_name(meta.id);
        let path = files.path(&name);
        // Pair with `RunWriter::create`: a run is opened where it was written.
        assert_eq!(path.parent(), Some(files.directory.as_path()), "a run lies in its store");
        let damaged = |detail: &'static str| StoreError::Damaged(Damage::new(&name, detail));
        let file = files.io.open(&path, OpenMode::Read).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                damaged("missing")
            } else {
                Files::error("open", &path, e)
            }
        })?;
        let mut run = Run {
            files: Arc::clone(files),
            file,
            meta,
            index: Vec::new(),
            bloom: Bloom { bits: Vec::new() },
        };
        let (index, bloom) = run.load(meta).map_err(|detail| match detail {
            Loaded::Damaged(detail) => damaged(detail),
            Loaded::Io(error) => error,
        })?;
        run.index = index;
        run.bloom = bloom;
        Ok(run)
    }

    fn load(&self, meta: RunMeta) -> Result<(Vec<BlockEntry>, Bloom), Loaded> {
        let size =
            self.files.io.file_size(self.file).map_err(|e| Loaded::Io(self.io_error("size", e)))?;
        if size != meta.bytes || size < FOOTER_BYTES as u64 {
            return Err(Loaded::Damaged("size differs from the manifest's"));
        }
        let footer = self.read(size - FOOTER_BYTES as u64, FOOTER_BYTES).map_err(Loaded::Io)?;
        let body = verified(&footer).ok_or(Loaded::Damaged("footer checksum"))?;
        let mut fields = Fields { rest: body };
        let mut parse = || -> Option<[u64; 6]> {
            if fields.take(4)? != MAGIC || fields.take(2)? != VERSION.to_le_bytes() {
                return None;
            }
            fields.take(2)?;
            let mut values = [0; 6];
            for value in &mut values {
                *value = fields.u64()?;
            }
            Some(values)
        };
        let [index_offset, index_length, bloom_offset, bloom_length, entries, id] =
            parse().ok_or(Loaded::Damaged("footer"))?;
        let end = size - FOOTER_BYTES as u64;
        if id != meta.id
            || entries != meta.entries
            || index_offset.checked_add(index_length) != Some(bloom_offset)
            || bloom_offset.checked_add(bloom_length) != Some(end)
            || bloom_length < (BLOOM_BLOCK_BYTES + 8) as u64
        {
            return Err(Loaded::Damaged("footer disagrees with the file or the manifest"));
        }
        let index_bytes = self.read(index_offset, index_length as usize).map_err(Loaded::Io)?;
        let index_body = verified(&index_bytes).ok_or(Loaded::Damaged("index checksum"))?;
        let mut fields = Fields { rest: index_body };
        let mut index = Vec::new();
        let mut next_offset = 0;
        while !fields.rest.is_empty() {
            let mut entry = || -> Option<BlockEntry> {
                let length = fields.u32()? as usize;
                let last_key = fields.take(length)?.into();
                Some(BlockEntry { last_key, offset: fields.u64()?, length: fields.u32()? })
            };
            let entry = entry().ok_or(Loaded::Damaged("index"))?;
            let in_order = index.last().is_none_or(|l: &BlockEntry| l.last_key < entry.last_key);
            if entry.offset != next_offset || entry.length < 8 || !in_order {
                return Err(Loaded::Damaged("index out of order"));
            }
            next_offset = entry.offset + u64::from(entry.length);
            index.push(entry);
        }
        if next_offset != index_offset {
            return Err(Loaded::Damaged("index does not cover the blocks"));
        }
        let bloom_bytes = self.read(bloom_offset, bloom_length as usize).map_err(Loaded::Io)?;
        let bits = verified(&bloom_bytes).ok_or(Loaded::Damaged("Bloom filter checksum"))?;
        if bits.is_empty() || !bits.len().is_multiple_of(BLOOM_BLOCK_BYTES) {
            return Err(Loaded::Damaged("Bloom filter size"));
        }
        // What was refused as damage above leaves the blocks, index and Bloom filter inside
        // the file, in that order, before the footer.
        assert!(
            index.last().map_or(0, |e| e.offset + u64::from(e.length)) == index_offset
                && index_offset < bloom_offset
                && bloom_offset < end,
            "blocks, index and Bloom filter lie in order inside the file"
        );
        Ok((index, Bloom { bits: bits.to_vec() }))
    }

    fn io_error(&self, operation: &'static str, error: std::io::Error) -> StoreError {
        Files::error(operation, &self.files.path(&run_name(self.meta.id)), error)
    }

    fn read(&self, position: u64, length: usize) -> Result<Vec<u8>, StoreError> {
        // Positions come from the footer and index only once checked against the file's size
        // (the manifest's, which `load` compared first).
        assert!(
            position.checked_add(length as u64).is_some_and(|end| end <= self.meta.bytes),
            "a run read lies inside its file"
        );
        let bytes = chronik_engine::io::read_exact(&*self.files.io, self.file, position, length)
            .map_err(|e| self.io_error("read", e))?;
        assert_eq!(bytes.len(), length, "a read gives what was asked");
        Ok(bytes)
    }

    pub fn blocks(&self) -> usize {
        self.index.len()
    }

    /// Bytes this run keeps in memory (index and Bloom filter).
    pub fn resident_bytes(&self) -> usize {
        assert!(!self.bloom.bits.is_empty(), "an open run holds its Bloom filter");
        self.bloom.bits.len() + self.index.iter().map(|e| e.last_key.len() + 40).sum::<usize>()
    }

    pub fn may_contain(&self, hash: u64) -> bool {
        // Per lookup, so debug only.
        debug_assert!(!self.bloom.bits.is_empty(), "an open run holds its Bloom filter");
        self.bloom.may_contain(hash)
    }

    /// The block that holds `key` if this run has it.
    pub fn block_for(&self, key: &[u8]) -> Option<usize> {
        let i = self.index.partition_point(|e| &*e.last_key < key);
        // Per lookup, so debug only: the block found is the first whose last key is not
        // below `key` (the index's keys are in order, as `load` checked).
        debug_assert!(i == 0 || *self.index[i - 1].last_key < *key, "blocks before are below");
        debug_assert!(i == self.index.len() || *key <= *self.index[i].last_key, "within block");
        (i < self.index.len()).then_some(i)
    }

    /// Block `i`, checksum verified and parsed.
    pub fn read_block(&self, i: usize) -> Result<Block, StoreError> {
        assert!(i < self.index.len(), "a block read is one of its run's");
        let entry = &self.index[i];
        let mut bytes = self.read(entry.offset, entry.length as usize)?;
        let damaged =
            || StoreError::Damaged(Damage::new(&run_name(self.meta.id), "block checksum"));
        let body_length = verified(&bytes).ok_or_else(damaged)?.len();
        bytes.truncate(body_length);
        assert_eq!(bytes.len() + 8, entry.length as usize, "a block read is its entry's length");
        // A block must parse to the end, in key order above the previous block's last key,
        // its last key the index's.
        let mut entries = Vec::new();
        let below = i.checked_sub(1).map(|previous| &*self.index[previous].last_key);
        let mut last: Option<&[u8]> = below;
        let mut rest = BlockEntries::new(&bytes);
        loop {
            let at = bytes.len() - rest.fields.rest.len();
            let Some(entry) = rest.next() else { break };
            let (key, value) = entry.ok_or_else(damaged)?;
            if last.is_some_and(|l| l >= key) && !canary_trusts_damage() {
                return Err(damaged());
            }
            last = Some(key);
            let value_length = value.map_or(TOMBSTONE, |v| v.len() as u32);
            entries.push(EntryAt { at: at as u32, key_length: key.len() as u32, value_length });
        }
        if last != Some(&*self.index[i].last_key) && !canary_trusts_damage() {
            return Err(damaged());
        }
        // Verified and checked above, so (but under the canary that trusts damage) the block
        // holds entries, within its bytes, ending at its index key.
        assert!(!entries.is_empty() || canary_trusts_damage(), "a block read holds entries");
        // A cached block is counted by what it holds: no spare capacity beside it.
        entries.shrink_to_fit();
        let key_at = |e: &EntryAt| &bytes[e.at as usize + 8..][..e.key_length as usize];
        assert!(
            entries.first().is_none_or(|e| below.is_none_or(|b| b < key_at(e)))
                && entries.last().is_none_or(|e| key_at(e) == &*self.index[i].last_key)
                || canary_trusts_damage(),
            "a block read holds keys of its own range of the run"
        );
        assert!(
            entries.iter().all(|e| {
                let value = if e.value_length == TOMBSTONE { 0 } else { e.value_length };
                e.at as usize + 8 + e.key_length as usize + value as usize <= bytes.len()
            }),
            "a block's entries lie within its bytes"
        );
        Ok(Block { bytes, entries })
    }
}

enum Loaded {
    Damaged(&'static str),
    Io(StoreError),
}

/// The entries of a block's bytes: key and value (`None`: deleted); an item is `None` where
/// the bytes do not parse.
struct BlockEntries<'a> {
    fields: Fields<'a>,
}

impl<'a> BlockEntries<'a> {
    fn new(block: &'a [u8]) -> BlockEntries<'a> {
        BlockEntries { fields: Fields { rest: block } }
    }
}

impl<'a> Iterator for BlockEntries<'a> {
    type Item = Option<(&'a [u8], Option<&'a [u8]>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.fields.rest.is_empty() {
            return None;
        }
        let before = self.fields.rest.len();
        let mut entry = || -> Option<(&'a [u8], Option<&'a [u8]>)> {
            let key_length = self.fields.u32()? as usize;
            let value_length = self.fields.u32()?;
            let key = self.fields.take(key_length)?;
            let value = match value_length {
                TOMBSTONE => None,
                length => Some(self.fields.take(length as usize)?),
            };
            Some((key, value))
        };
        let entry = entry();
        if entry.is_none() {
            self.fields.rest = &[];
        }
        // Per entry, so debug only: each entry takes its length fields at least, so the
        // iteration ends.
        debug_assert!(
            entry.is_none() || self.fields.rest.len() + 8 <= before,
            "an entry takes its length fields"
        );
        Some(entry)
    }
}

/// Where a key stands in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup<'a> {
    Absent,
    Deleted,
    Value(&'a [u8]),
}

/// Where an entry of a parsed block lies in its bytes.
#[derive(Clone, Copy, Debug)]
struct EntryAt {
    /// Where the entry (its length fields) starts.
    at: u32,
    key_length: u32,
    /// [`TOMBSTONE`] for a deletion.
    value_length: u32,
}

/// A verified block, parsed: its entries found by binary search.
#[derive(Debug)]
pub struct Block {
    bytes: Vec<u8>,
    entries: Vec<EntryAt>,
}

impl Block {
    fn key(&self, entry: EntryAt) -> &[u8] {
        let start = entry.at as usize + 8;
        // Per entry, so debug only (slicing checks it too, without naming it).
        debug_assert!(start + entry.key_length as usize <= self.bytes.len(), "a key is inside");
        &self.bytes[start..start + entry.key_length as usize]
    }

    fn entry(&self, entry: EntryAt) -> (&[u8], Option<&[u8]>) {
        let key = self.key(entry);
        let start = entry.at as usize + 8 + key.len();
        debug_assert!(
            entry.value_length == TOMBSTONE
                || start + entry.value_length as usize <= self.bytes.len(),
            "a value is inside its block"
        );
        let value = (entry.value_length != TOMBSTONE)
            .then(|| &self.bytes[start..start + entry.value_length as usize]);
        (key, value)
    }

    /// Where `key` stands in this block.
    pub fn find(&self, key: &[u8]) -> Lookup<'_> {
        let found = self.entries.binary_search_by(|e| self.key(*e).cmp(key));
        // Per lookup, so debug only: an absent key falls between its neighbours (the
        // entries are in key order, as `Run::read_block` checked).
        debug_assert!(
            found.is_ok()
                || found.is_err_and(|i| {
                    (i == 0 || self.key(self.entries[i - 1]) < key)
                        && self.entries.get(i).is_none_or(|e| key < self.key(*e))
                })
                || canary_trusts_damage(),
            "a key absent from a block falls between its neighbours"
        );
        match found {
            Ok(i) => match self.entry(self.entries[i]) {
                (_, Some(value)) => Lookup::Value(value),
                (_, None) => Lookup::Deleted,
            },
            Err(_) => Lookup::Absent,
        }
    }

    /// Entries in the block (at least one, as read).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entry `i`: its key and value (`None`: deleted), borrowed from the block.
    pub fn entry_at(&self, i: usize) -> (&[u8], Option<&[u8]>) {
        assert!(i < self.entries.len(), "an entry read is one of its block's");
        self.entry(self.entries[i])
    }

    /// The first entry whose key is at or above `key` (strictly above with `exclusive`).
    pub fn seek(&self, key: &[u8], exclusive: bool) -> usize {
        let i = self
            .entries
            .partition_point(|e| if exclusive { self.key(*e) <= key } else { self.key(*e) < key });
        debug_assert!(i <= self.entries.len(), "a seek lands within or at the end of its block");
        i
    }

    /// A block of `bytes` bytes and no entry, for the cache's tests.
    #[cfg(test)]
    pub fn for_test(bytes: usize) -> Block {
        Block { bytes: vec![0; bytes], entries: Vec::new() }
    }

    /// Bytes the block takes in memory: its buffers' capacities and a share for the two
    /// heap allocations, the `Arc` and the cache slot it sits in.
    pub fn bytes(&self) -> usize {
        assert!(self.bytes.len() >= self.entries.len() * 8, "each entry holds its lengths");
        self.bytes.capacity() + self.entries.capacity() * std::mem::size_of::<EntryAt>() + 128
    }
}
