//! The simulated disk: an in-memory, deterministic implementation of [`Io`] that can crash.
//!
//! # What is modelled
//!
//! The namespace is a tree of inodes. A directory inode holds two entry sets, name to inode: the
//! *current* set, which every call sees, and the *durable* set, what a crash restores.
//! [`Namespace::open`] with [`OpenMode::CreateNew`], [`Namespace::lock`] creating its file,
//! [`Namespace::rename`], [`Namespace::remove_file`], [`Namespace::create_directory`] and
//! [`Namespace::remove_directory`] change only the current set of the directories involved. An
//! [`Operation::Fsync`] of a handle opened with [`OpenMode::Directory`] copies that directory's
//! current set into its durable set; it does not make the directory's own entry in its parent
//! durable (that needs the parent's fsync). A new directory starts with an empty durable set.
//!
//! A file inode holds its *current* bytes (what reads see; the length is the file size), a
//! *durable* image, and the ordered list of *pending* changes since the last successful sync:
//! writes (position and bytes) and size changes (a truncate, or an allocate that extended the
//! file). [`Operation::Fdatasync`] and [`Operation::Fsync`] of a file apply the pending
//! changes, in order, to the durable image and clear the list. They do not copy the current
//! bytes: after a failed sync (below) the durable image deliberately lags behind them.
//!
//! [`SimDisk::crash`] models a power loss:
//! - every handle is closed and every lock released; handle numbers are never reused, so a
//!   leaked engine's stale handles fail instead of aliasing new ones;
//! - every directory independently loses all its entry changes since its last fsync (created
//!   entries vanish, removed ones come back, renames revert) or, with the probabilities in
//!   [`Faults`], keeps them all (the kernel wrote the directory back on its own), keeps a
//!   random prefix of them (a journaling file system commits them in order), or keeps a random
//!   subset of them (a directory's blocks written back independently; a rename within one
//!   directory stays whole, one across two may not). The result becomes its durable set;
//! - every file is rebuilt from its durable image plus its pending changes: each pending write
//!   is cut at 512-byte sector boundaries and each piece is independently kept, torn (a random
//!   prefix of it is kept) or dropped; each pending size change is kept or lost; the surviving
//!   pieces and size changes are applied in a random order. A piece landing past the end
//!   extends the file with zeros before it. The result becomes the durable image;
//! - inodes no longer reachable from the root are freed.
//!
//! # Faults
//!
//! [`Faults`] holds per-operation probabilities, drawn from the disk's own [`Rng`] stream:
//! EIO on read and on write (nothing is transferred), sync failure with Linux semantics (the
//! fsync fails and the file's pending changes are dropped from the pending list, so they stay
//! visible in the current bytes until a crash but a retried fsync succeeds without making them
//! durable), and disk full (a write or size change that would take the total current size of
//! all files past `capacity_bytes` fails with `StorageFull`). [`SimDisk::fail_next_syncs`] and
//! [`SimDisk::cut_power_after`] inject a fault at an exact point.
//!
//! [`SimDisk::flip_bit`] rots one bit of synced data (the durable image, and the current
//! bytes where no pending write has changed that byte since), as a medium error the drive's
//! own checks missed. The operations of one [`Io::submit`] batch run in a seeded random order
//! (the trait allows them to run concurrently); their completions come back in order.
//!
//! With [`SimDisk::set_deferred_completions`], a batch of [`Io::start_linked`] runs later: each
//! [`InFlight::reap`] runs a seeded number of the operations of every deferred batch (each
//! chain in order, chains interleaved) and hands back a seeded subset of its own that ran,
//! each chain's completions in order, as a ring posts them. So an
//! operation takes effect at one point and completes, to its caller, in a later turn, as on a
//! ring: a write may land while an fdatasync submitted before it is still in flight, after the
//! fdatasync took effect. Writes that may run concurrently (in different chains, or in
//! different batches not reaped yet) must not overlap; the disk asserts it.
//!
//! Not modelled yet: writes that report an error after transferring some bytes; misdirected
//! writes; timestamps. Disk full is implemented but the engine test does not switch it on yet.

use crate::rng::Rng;
use chronik_engine::io::{
    self as io_trait, Completed, Completion, DirectoryEntry, FileHandle, InFlight, Io, Linked,
    Namespace, OpenMode, Operation,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// The unit a crash keeps, tears or drops.
pub const SECTOR_BYTES: u64 = 512;

/// Largest file the simulated disk accepts, to keep a buggy size from exhausting memory.
pub const FILE_BYTES_MAX: u64 = 1 << 32;

/// Probabilities, in parts per million per operation, of the faults the disk injects, and
/// the crash outcome weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults {
    /// A read fails with EIO.
    pub read_error_per_million: u32,
    /// A write fails with EIO and transfers nothing.
    pub write_error_per_million: u32,
    /// A file or directory sync fails (Linux semantics, see the module documentation).
    pub sync_error_per_million: u32,
    /// Writes and size changes fail with `StorageFull` beyond this many bytes in all files.
    pub capacity_bytes: Option<u64>,
    /// At a crash, a sector piece of a pending write is kept whole.
    pub sector_kept_per_million: u32,
    /// At a crash, a sector piece is torn (a prefix kept); otherwise it is dropped.
    pub sector_torn_per_million: u32,
    /// At a crash, a pending size change is kept.
    pub resize_kept_per_million: u32,
    /// At a crash, a directory keeps its unsynced entry changes instead of reverting them.
    pub directory_kept_per_million: u32,
    /// At a crash, a directory keeps a random prefix of its unsynced entry changes.
    pub directory_prefix_per_million: u32,
    /// At a crash, a directory keeps a random subset of its unsynced entry changes.
    pub directory_subset_per_million: u32,
}

impl Faults {
    /// No I/O errors; crashes keep, tear and drop sectors evenly and revert directories.
    pub const NONE: Faults = Faults {
        read_error_per_million: 0,
        write_error_per_million: 0,
        sync_error_per_million: 0,
        capacity_bytes: None,
        sector_kept_per_million: 400_000,
        sector_torn_per_million: 300_000,
        resize_kept_per_million: 500_000,
        directory_kept_per_million: 0,
        directory_prefix_per_million: 0,
        directory_subset_per_million: 0,
    };
}

impl Default for Faults {
    fn default() -> Self {
        Faults::NONE
    }
}

/// Counters of what the disk did, for tests and run summaries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Every call that counts against an armed power cut.
    pub calls: u64,
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub directory_syncs: u64,
    pub failed_syncs: u64,
    pub crashes: u64,
}

/// Where [`SimDisk::flip_bit`] rotted a bit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitFlip {
    pub path: PathBuf,
    pub position: u64,
    pub bit: u8,
}

/// The simulated disk. Cheap to clone: clones share the same state, so a test keeps one
/// while the engine owns another, and crashes the disk through its own.
#[derive(Clone, Debug)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

type InodeId = u64;

const ROOT: InodeId = 0;

#[derive(Debug)]
enum Inode {
    File(FileNode),
    Directory(DirectoryNode),
}

#[derive(Debug, Default)]
struct FileNode {
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Clone, Debug)]
enum Pending {
    Write { position: u64, bytes: Vec<u8> },
    Resize { length: u64 },
}

#[derive(Debug, Default)]
struct DirectoryNode {
    current: BTreeMap<String, InodeId>,
    durable: BTreeMap<String, InodeId>,
    /// The entry changes of every operation since the last fsync, in order: a name set to an
    /// inode or removed.
    unsynced: Vec<Vec<(String, Option<InodeId>)>>,
}

impl DirectoryNode {
    /// One namespace operation's changes to this directory, made and lost at a crash together
    /// (a rename within one directory is one operation).
    fn change(&mut self, changes: Vec<(String, Option<InodeId>)>) {
        for (name, inode) in &changes {
            match inode {
                Some(inode) => self.current.insert(name.clone(), *inode),
                None => self.current.remove(name),
            };
        }
        self.unsynced.push(changes);
    }

    fn set(&mut self, name: String, inode: Option<InodeId>) {
        self.change(vec![(name, inode)]);
    }

    fn sync(&mut self) {
        self.durable = self.current.clone();
        self.unsynced.clear();
    }

    /// A crash: the durable set plus the unsynced operations `keep` selects, applied in order.
    fn crash(&mut self, mut keep: impl FnMut(usize) -> bool) {
        let mut entries = self.durable.clone();
        for (i, changes) in std::mem::take(&mut self.unsynced).into_iter().enumerate() {
            if keep(i) {
                for (name, inode) in changes {
                    match inode {
                        Some(inode) => entries.insert(name, inode),
                        None => entries.remove(&name),
                    };
                }
            }
        }
        self.current = entries;
        self.sync();
    }
}

#[derive(Debug)]
struct Handle {
    inode: InodeId,
    mode: OpenMode,
    /// The path the handle was opened with, for locks and error messages.
    path: PathBuf,
    locked: bool,
}

#[derive(Debug)]
struct State {
    inodes: BTreeMap<InodeId, Inode>,
    next_inode: InodeId,
    handles: BTreeMap<u64, Handle>,
    next_handle: u64,
    locks: BTreeSet<PathBuf>,
    faults: Faults,
    rng: Rng,
    fail_next_syncs: u32,
    fail_next_file_syncs: u32,
    /// Operations left before the power is cut; `None` when no cut is armed.
    power_left: Option<u64>,
    /// Directory entry changes (creates, renames, removes) left before the power is cut.
    entry_changes_left: Option<u64>,
    /// Directory fsyncs left until the one the power is cut at.
    directory_syncs_left: Option<u64>,
    stats: Stats,
    /// FNV-1a over every call and its outcome, to compare two runs of a seed cheaply.
    trace: u64,
    /// Whether [`Io::start_linked`] defers its batch (see the module documentation).
    deferred: bool,
    /// The next deferred batch's number.
    next_batch: u64,
    /// The writes of deferred batches not handed back yet, by batch and index in it.
    writes_in_flight: BTreeMap<(u64, usize), WriteRange>,
    /// The deferred batches in flight, by number.
    deferred_batches: BTreeMap<u64, DeferredBatch>,
}

/// The bytes of one file a write covers, and the chain it runs in: `(batch, chain)`. A
/// synchronous batch's chains are `(u64::MAX, chain)`.
#[derive(Clone, Copy, Debug)]
struct WriteRange {
    chain: (u64, usize),
    inode: InodeId,
    start: u64,
    end: u64,
}

/// The batch number of a synchronous submission, for [`WriteRange::chain`].
const NOW: u64 = u64::MAX;

fn error(kind: io::ErrorKind, message: impl Into<String>) -> io::Error {
    io::Error::new(kind, message.into())
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated EIO on {what}"))
}

/// The normal components of an absolute path; `..` and relative paths are refused.
fn components(path: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    let mut absolute = false;
    for component in path.components() {
        match component {
            Component::RootDir => absolute = true,
            Component::CurDir => {}
            Component::Normal(name) => names.push(
                name.to_str()
                    .ok_or_else(|| error(io::ErrorKind::InvalidInput, "non-UTF-8 name"))?
                    .to_owned(),
            ),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(error(io::ErrorKind::InvalidInput, "unsupported path component"));
            }
        }
    }
    if !absolute {
        return Err(error(io::ErrorKind::InvalidInput, "the simulated disk wants absolute paths"));
    }
    Ok(names)
}

/// Apply one change to a file image, extending it with zeros where a write lands past the end.
fn apply(image: &mut Vec<u8>, change: &Pending) {
    match change {
        Pending::Write { position, bytes } => {
            let position = usize::try_from(*position).expect("position fits in memory");
            let end = position + bytes.len();
            if image.len() < end {
                image.resize(end, 0);
            }
            image[position..end].copy_from_slice(bytes);
        }
        Pending::Resize { length } => {
            image.resize(usize::try_from(*length).expect("length fits in memory"), 0);
        }
    }
}

impl State {
    fn new(rng: Rng) -> State {
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT, Inode::Directory(DirectoryNode::default()));
        State {
            inodes,
            next_inode: ROOT + 1,
            handles: BTreeMap::new(),
            next_handle: 1,
            locks: BTreeSet::new(),
            faults: Faults::NONE,
            rng,
            fail_next_syncs: 0,
            fail_next_file_syncs: 0,
            power_left: None,
            entry_changes_left: None,
            directory_syncs_left: None,
            stats: Stats::default(),
            trace: 0xCBF2_9CE4_8422_2325,
            deferred: false,
            next_batch: 0,
            writes_in_flight: BTreeMap::new(),
            deferred_batches: BTreeMap::new(),
        }
    }

    fn record(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.trace ^= u64::from(byte);
            self.trace = self.trace.wrapping_mul(0x0100_0000_01B3);
        }
    }

    fn record_call(&mut self, name: &str, path: &Path, result: &io::Result<u64>) {
        self.record(name.as_bytes());
        self.record(path.as_os_str().as_encoded_bytes());
        match result {
            Ok(value) => self.record(&value.to_le_bytes()),
            Err(e) => self.record(format!("{:?}", e.kind()).as_bytes()),
        }
    }

    /// Counts one call against an armed power cut; once it is reached every call fails.
    fn check_power(&mut self) -> io::Result<()> {
        self.stats.calls += 1;
        match &mut self.power_left {
            None => Ok(()),
            Some(0) => Err(error(io::ErrorKind::BrokenPipe, "simulated power cut")),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
        }
    }

    fn directory(&self, inode: InodeId) -> io::Result<&DirectoryNode> {
        match self.inodes.get(&inode).expect("a live inode id") {
            Inode::Directory(directory) => Ok(directory),
            Inode::File(_) => Err(error(io::ErrorKind::NotADirectory, "not a directory")),
        }
    }

    fn directory_mut(&mut self, inode: InodeId) -> io::Result<&mut DirectoryNode> {
        match self.inodes.get_mut(&inode).expect("a live inode id") {
            Inode::Directory(directory) => Ok(directory),
            Inode::File(_) => Err(error(io::ErrorKind::NotADirectory, "not a directory")),
        }
    }

    fn file_mut(&mut self, inode: InodeId) -> io::Result<&mut FileNode> {
        match self.inodes.get_mut(&inode).expect("a live inode id") {
            Inode::File(file) => Ok(file),
            Inode::Directory(_) => Err(error(io::ErrorKind::IsADirectory, "is a directory")),
        }
    }

    /// The inode at `path` in the current namespace.
    fn resolve(&self, path: &Path) -> io::Result<InodeId> {
        let mut inode = ROOT;
        for name in components(path)? {
            inode = *self
                .directory(inode)?
                .current
                .get(&name)
                .ok_or_else(|| error(io::ErrorKind::NotFound, format!("{}", path.display())))?;
        }
        Ok(inode)
    }

    /// The parent directory's inode and the last name of `path`.
    fn parent(&self, path: &Path) -> io::Result<(InodeId, String)> {
        let mut names = components(path)?;
        let name = names
            .pop()
            .ok_or_else(|| error(io::ErrorKind::InvalidInput, "the root has no parent"))?;
        let mut inode = ROOT;
        for part in names {
            inode = *self
                .directory(inode)?
                .current
                .get(&part)
                .ok_or_else(|| error(io::ErrorKind::NotFound, format!("{}", path.display())))?;
        }
        self.directory(inode)?;
        Ok((inode, name))
    }

    fn allocate_inode(&mut self, inode: Inode) -> InodeId {
        let id = self.next_inode;
        self.next_inode += 1;
        let previous = self.inodes.insert(id, inode);
        assert!(previous.is_none(), "inode id reused");
        id
    }

    fn insert_handle(&mut self, inode: InodeId, mode: OpenMode, path: &Path, locked: bool) -> u64 {
        let id = self.next_handle;
        self.next_handle += 1;
        let handle = Handle { inode, mode, path: path.to_path_buf(), locked };
        assert!(self.handles.insert(id, handle).is_none(), "handle id reused");
        id
    }

    /// Assert the contract every batch of writes keeps, as the kernel requires of what it
    /// does: two writes that may run concurrently (in different chains, or one of them still in
    /// flight in a deferred batch) never touch the same bytes of a file, since the kernel
    /// orders them in no way and either may land last. A write may overlap one earlier in its
    /// own chain (it runs only after that one completed). `operations` are each with their
    /// chain. Returns the batch's writes.
    fn assert_no_overlapping_writes<'a>(
        &self,
        operations: impl Iterator<Item = ((u64, usize), usize, &'a Operation)>,
    ) -> Vec<(usize, WriteRange)> {
        let mut writes: Vec<(usize, WriteRange)> = Vec::new();
        for (chain, index, operation) in operations {
            if let Operation::Write { file, position, buffer } = operation
                && let Ok(handle) = self.handle(*file)
            {
                let end = position + buffer.len() as u64;
                let range = WriteRange { chain, inode: handle.inode, start: *position, end };
                writes.push((index, range));
            }
        }
        let in_flight = self.writes_in_flight.values();
        for (i, (_, write)) in writes.iter().enumerate() {
            for other in writes[i + 1..].iter().map(|(_, w)| w).chain(in_flight.clone()) {
                assert!(
                    write.chain == other.chain
                        || write.inode != other.inode
                        || write.end <= other.start
                        || other.end <= write.start,
                    "writes that may run concurrently overlap: bytes {}..{} and {}..{} of one \
                     file, in different chains",
                    write.start,
                    write.end,
                    other.start,
                    other.end
                );
            }
        }
        writes
    }

    fn handle(&self, file: FileHandle) -> io::Result<&Handle> {
        self.handles
            .get(&file.0)
            .ok_or_else(|| error(io::ErrorKind::InvalidInput, format!("bad handle {}", file.0)))
    }

    fn open(&mut self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        let inode = match mode {
            OpenMode::CreateNew | OpenMode::CreateNewDirect => {
                let (parent, name) = self.parent(path)?;
                if self.directory(parent)?.current.contains_key(&name) {
                    return Err(error(io::ErrorKind::AlreadyExists, format!("{}", path.display())));
                }
                let inode = self.allocate_inode(Inode::File(FileNode::default()));
                self.directory_mut(parent)?.set(name, Some(inode));
                inode
            }
            OpenMode::Read | OpenMode::ReadWrite | OpenMode::ReadWriteDirect => {
                let inode = self.resolve(path)?;
                self.file_mut(inode)?;
                inode
            }
            OpenMode::Directory => {
                let inode = self.resolve(path)?;
                self.directory(inode)?;
                inode
            }
        };
        Ok(FileHandle(self.insert_handle(inode, mode, path, false)))
    }

    fn lock(&mut self, path: &Path) -> io::Result<FileHandle> {
        let inode = match self.resolve(path) {
            Ok(inode) => inode,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (parent, name) = self.parent(path)?;
                let inode = self.allocate_inode(Inode::File(FileNode::default()));
                self.directory_mut(parent)?.set(name, Some(inode));
                inode
            }
            Err(e) => return Err(e),
        };
        self.file_mut(inode)?;
        if !self.locks.insert(path.to_path_buf()) {
            return Err(error(io::ErrorKind::WouldBlock, "locked by another holder"));
        }
        Ok(FileHandle(self.insert_handle(inode, OpenMode::ReadWrite, path, true)))
    }

    fn close(&mut self, file: FileHandle) {
        if let Some(handle) = self.handles.remove(&file.0)
            && handle.locked
        {
            assert!(self.locks.remove(&handle.path), "a locked handle holds its lock");
        }
    }

    fn total_bytes(&self) -> u64 {
        self.inodes
            .values()
            .map(|inode| match inode {
                Inode::File(file) => file.current.len() as u64,
                Inode::Directory(_) => 0,
            })
            .sum()
    }

    /// Fails with `StorageFull` when growing the files by `growth` bytes passes the capacity.
    fn check_space(&self, growth: u64) -> io::Result<()> {
        match self.faults.capacity_bytes {
            Some(capacity) if growth > 0 && self.total_bytes() + growth > capacity => {
                Err(error(io::ErrorKind::StorageFull, "simulated disk full"))
            }
            _ => Ok(()),
        }
    }

    /// A file handle for data operations, refusing directory handles and `write` on read-only.
    fn data_handle(&self, file: FileHandle, writes: bool) -> io::Result<InodeId> {
        let handle = self.handle(file)?;
        match handle.mode {
            OpenMode::Directory => Err(error(io::ErrorKind::IsADirectory, "directory handle")),
            OpenMode::Read if writes => {
                Err(error(io::ErrorKind::PermissionDenied, "handle opened read only"))
            }
            _ => Ok(handle.inode),
        }
    }

    fn read(&mut self, file: FileHandle, position: u64, buffer: &mut Vec<u8>) -> io::Result<u64> {
        let inode = self.data_handle(file, false)?;
        if self.rng.chance(self.faults.read_error_per_million) {
            return Err(eio("read"));
        }
        self.stats.reads += 1;
        let current = &self.file_mut(inode)?.current;
        let start = usize::try_from(position).unwrap_or(usize::MAX).min(current.len());
        let end = start.saturating_add(buffer.len()).min(current.len());
        buffer.truncate(end - start);
        buffer.copy_from_slice(&current[start..end]);
        Ok(buffer.len() as u64)
    }

    fn change(&mut self, file: FileHandle, change: &Pending) -> io::Result<u64> {
        let inode = self.data_handle(file, true)?;
        if let Pending::Write { position, bytes } = change
            && self.handle(file)?.mode.is_direct()
            && !io_trait::is_direct_aligned(*position, bytes.len())
        {
            // As `O_DIRECT` refuses it: the engine must never send one.
            return Err(io_trait::misaligned_direct_write(*position, bytes.len()));
        }
        let (end, transferred) = match change {
            Pending::Write { position, bytes } => (position + bytes.len() as u64, bytes.len()),
            Pending::Resize { length } => (*length, 0),
        };
        if end > FILE_BYTES_MAX {
            return Err(error(io::ErrorKind::FileTooLarge, "past the simulated file size limit"));
        }
        if matches!(change, Pending::Write { .. })
            && self.rng.chance(self.faults.write_error_per_million)
        {
            return Err(eio("write"));
        }
        let length = self.file_mut(inode)?.current.len() as u64;
        self.check_space(end.saturating_sub(length))?;
        let node = self.file_mut(inode)?;
        apply(&mut node.current, change);
        node.pending.push(change.clone());
        if transferred > 0 {
            self.stats.writes += 1;
        }
        Ok(transferred as u64)
    }

    fn sync(&mut self, file: FileHandle, fdatasync: bool) -> io::Result<u64> {
        let handle = self.handle(file)?;
        let (inode, is_directory) = (handle.inode, handle.mode == OpenMode::Directory);
        if fdatasync && is_directory {
            return Err(error(io::ErrorKind::InvalidInput, "fdatasync of a directory handle"));
        }
        if is_directory && let Some(left) = &mut self.directory_syncs_left {
            *left -= 1;
            if *left == 0 {
                self.directory_syncs_left = None;
                self.power_left = Some(0);
                return self.check_power().map(|()| 0);
            }
        }
        let injected_file = self.fail_next_file_syncs > 0 && !is_directory;
        let injected = self.fail_next_syncs > 0 || injected_file;
        if injected || self.rng.chance(self.faults.sync_error_per_million) {
            self.fail_next_syncs = self.fail_next_syncs.saturating_sub(1);
            if injected_file {
                self.fail_next_file_syncs -= 1;
            }
            self.stats.failed_syncs += 1;
            if !is_directory {
                // Linux: the dirty pages are dropped from the writeback set but stay cached.
                self.file_mut(inode)?.pending.clear();
            }
            return Err(eio("fsync"));
        }
        if is_directory {
            self.directory_mut(inode)?.sync();
            self.stats.directory_syncs += 1;
        } else {
            let node = self.file_mut(inode)?;
            for change in std::mem::take(&mut node.pending) {
                apply(&mut node.durable, &change);
            }
            self.stats.syncs += 1;
        }
        Ok(0)
    }

    fn execute(&mut self, operation: Operation) -> Completion {
        let name = operation.name();
        let (buffer, result) = match self.check_power() {
            Err(e) => (io_trait::operation_buffer(operation), Err(e)),
            Ok(()) => self.execute_powered(operation),
        };
        self.record(name.as_bytes());
        match &result {
            Ok(n) => self.record(&n.to_le_bytes()),
            Err(e) => self.record(format!("{:?}", e.kind()).as_bytes()),
        }
        Completion { buffer, result: result.map(|n| usize::try_from(n).expect("fits")) }
    }

    fn execute_powered(&mut self, operation: Operation) -> (Vec<u8>, io::Result<u64>) {
        match operation {
            Operation::Read { file, position, mut buffer } => {
                let result = self.read(file, position, &mut buffer);
                (buffer, result)
            }
            Operation::Write { file, position, buffer } => {
                let change = Pending::Write { position, bytes: buffer };
                let result = self.change(file, &change);
                let Pending::Write { bytes, .. } = change else { unreachable!("built above") };
                (bytes, result)
            }
            Operation::Fsync { file } => (Vec::new(), self.sync(file, false)),
            Operation::Fdatasync { file } => (Vec::new(), self.sync(file, true)),
            Operation::Truncate { file, length } => {
                (Vec::new(), self.change(file, &Pending::Resize { length }).map(|_| 0))
            }
            Operation::Allocate { file, position, length } => {
                let result = self.allocate(file, position.saturating_add(length));
                (Vec::new(), result)
            }
        }
    }

    fn allocate(&mut self, file: FileHandle, wanted: u64) -> io::Result<u64> {
        let inode = self.data_handle(file, true)?;
        if self.file_mut(inode)?.current.len() as u64 >= wanted {
            return Ok(0);
        }
        self.change(file, &Pending::Resize { length: wanted }).map(|_| 0)
    }
}

/// Namespace operations.
impl State {
    fn create_directory(&mut self, path: &Path) -> io::Result<u64> {
        let (parent, name) = self.parent(path)?;
        if self.directory(parent)?.current.contains_key(&name) {
            return Err(error(io::ErrorKind::AlreadyExists, format!("{}", path.display())));
        }
        let inode = self.allocate_inode(Inode::Directory(DirectoryNode::default()));
        self.directory_mut(parent)?.set(name, Some(inode));
        Ok(0)
    }

    fn list(&self, path: &Path) -> io::Result<Vec<DirectoryEntry>> {
        let directory = self.directory(self.resolve(path)?)?;
        let entries: Vec<DirectoryEntry> = directory
            .current
            .iter()
            .map(|(name, inode)| DirectoryEntry {
                name: name.clone(),
                is_directory: matches!(self.inodes[inode], Inode::Directory(_)),
            })
            .collect();
        // BTreeMap iteration is by name already: the order the trait promises.
        assert!(entries.windows(2).all(|pair| pair[0].name < pair[1].name));
        Ok(entries)
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<u64> {
        let (from_parent, from_name) = self.parent(from)?;
        let (to_parent, to_name) = self.parent(to)?;
        let inode = *self
            .directory(from_parent)?
            .current
            .get(&from_name)
            .ok_or_else(|| error(io::ErrorKind::NotFound, format!("{}", from.display())))?;
        let moving_directory = matches!(self.inodes[&inode], Inode::Directory(_));
        if moving_directory && to.starts_with(from) && to != from {
            return Err(error(io::ErrorKind::InvalidInput, "rename into its own subtree"));
        }
        if let Some(&target) = self.directory(to_parent)?.current.get(&to_name) {
            match (&self.inodes[&target], moving_directory) {
                (Inode::Directory(d), true) if !d.current.is_empty() => {
                    return Err(error(io::ErrorKind::DirectoryNotEmpty, "rename target"));
                }
                (Inode::Directory(_), false) => {
                    return Err(error(io::ErrorKind::IsADirectory, "rename target"));
                }
                (Inode::File(_), true) => {
                    return Err(error(io::ErrorKind::NotADirectory, "rename target"));
                }
                _ => {}
            }
        }
        if from_parent == to_parent {
            let changes = vec![(from_name, None), (to_name, Some(inode))];
            self.directory_mut(from_parent)?.change(changes);
        } else {
            self.directory_mut(from_parent)?.set(from_name, None);
            self.directory_mut(to_parent)?.set(to_name, Some(inode));
        }
        Ok(0)
    }

    fn remove_file(&mut self, path: &Path) -> io::Result<u64> {
        let (parent, name) = self.parent(path)?;
        let inode = self.resolve(path)?;
        self.file_mut(inode)?;
        self.directory_mut(parent)?.set(name, None);
        Ok(0)
    }

    fn remove_directory(&mut self, path: &Path) -> io::Result<u64> {
        let (parent, name) = self.parent(path)?;
        let inode = self.resolve(path)?;
        if !self.directory(inode)?.current.is_empty() {
            return Err(error(io::ErrorKind::DirectoryNotEmpty, format!("{}", path.display())));
        }
        self.directory_mut(parent)?.set(name, None);
        Ok(0)
    }
}

/// Crash and inspection.
impl State {
    fn crash(&mut self, rng: &mut Rng) {
        self.handles.clear();
        self.locks.clear();
        // A deferred batch still held (by an engine leaked across the crash) keeps its
        // operations: they run on handles the crash closed, so they fail; its writes no longer
        // count as in flight beside the next engine's.
        self.writes_in_flight.clear();
        self.power_left = None;
        self.entry_changes_left = None;
        self.directory_syncs_left = None;
        self.fail_next_syncs = 0;
        self.fail_next_file_syncs = 0;
        self.stats.crashes += 1;
        let faults = self.faults;
        // BTreeMap order makes the draws, and so the outcome, a function of the seed.
        for inode in self.inodes.values_mut() {
            match inode {
                Inode::Directory(directory) => crash_directory(directory, &faults, rng),
                Inode::File(file) => crash_file(file, &faults, rng),
            }
        }
        self.collect_garbage();
        self.record(b"crash");
    }

    /// Free the inodes a crash left unreachable from the root.
    fn collect_garbage(&mut self) {
        let mut reachable = BTreeSet::from([ROOT]);
        let mut stack = vec![ROOT];
        while let Some(inode) = stack.pop() {
            if let Inode::Directory(directory) = &self.inodes[&inode] {
                // A crash can reattach a directory in two places; `insert` keeps the walk finite.
                for &child in directory.current.values() {
                    if reachable.insert(child) {
                        stack.push(child);
                    }
                }
            }
        }
        self.inodes.retain(|inode, _| reachable.contains(inode));
        assert!(self.inodes.contains_key(&ROOT));
    }

    /// Every file reachable in the current namespace, by path, with its inode.
    fn files(&self) -> BTreeMap<PathBuf, InodeId> {
        let mut files = BTreeMap::new();
        let mut stack = vec![(PathBuf::from("/"), ROOT, 0_usize)];
        while let Some((path, inode, depth)) = stack.pop() {
            // Bounded: a crash may alias a directory, but never nests one in itself this deep.
            assert!(depth < 64, "directory tree deeper than 64 at {}", path.display());
            match &self.inodes[&inode] {
                Inode::File(_) => {
                    files.insert(path, inode);
                }
                Inode::Directory(directory) => {
                    for (name, &child) in &directory.current {
                        stack.push((path.join(name), child, depth + 1));
                    }
                }
            }
        }
        files
    }

    /// Flip one bit of synced data: a byte of some file's durable image, the file chosen with
    /// a weight of its durable length. The current bytes flip too unless a pending write has
    /// changed that byte since (then the rot surfaces only if a crash drops the write).
    fn flip_bit(&mut self, rng: &mut Rng, under: &Path) -> Option<BitFlip> {
        let candidates: Vec<(PathBuf, InodeId, u64)> = self
            .files()
            .into_iter()
            .filter(|(path, _)| path.starts_with(under))
            .filter_map(|(path, inode)| match &self.inodes[&inode] {
                Inode::File(file) if !file.durable.is_empty() => {
                    Some((path, inode, file.durable.len() as u64))
                }
                _ => None,
            })
            .collect();
        let total: u64 = candidates.iter().map(|c| c.2).sum();
        if total == 0 {
            return None;
        }
        let mut pick = rng.below(total);
        let (path, inode, length) = candidates.into_iter().find(|c| {
            pick < c.2 || {
                pick -= c.2;
                false
            }
        })?;
        assert!(pick < length);
        let bit = rng.below(8) as u8;
        let position = usize::try_from(pick).expect("a durable image fits in memory");
        let Inode::File(file) = self.inodes.get_mut(&inode).expect("a listed inode") else {
            unreachable!("only files are listed")
        };
        let old = file.durable[position];
        file.durable[position] ^= 1 << bit;
        if file.current.get(position) == Some(&old) {
            file.current[position] ^= 1 << bit;
        }
        self.record(b"flip");
        self.record(&pick.to_le_bytes());
        Some(BitFlip { path, position: pick, bit })
    }

    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        self.files()
            .into_iter()
            .filter_map(|(path, inode)| match &self.inodes[&inode] {
                Inode::File(file) => Some((path, file.current.clone())),
                Inode::Directory(_) => None,
            })
            .collect()
    }
}

/// Rebuild one file after a crash from its durable image and its pending changes.
/// A crash outcome for one directory's unsynced entry changes: all kept, a prefix kept (a
/// journaling file system commits them in order), any subset kept (the changes sit in
/// directory blocks written back independently), or none.
fn crash_directory(directory: &mut DirectoryNode, faults: &Faults, rng: &mut Rng) {
    let changes = directory.unsynced.len();
    let roll = rng.below(u64::from(crate::rng::PER_MILLION)) as u32;
    let prefix_end = faults.directory_kept_per_million + faults.directory_prefix_per_million;
    if roll < faults.directory_kept_per_million {
        directory.crash(|_| true);
    } else if roll < prefix_end {
        let kept = rng.index(changes + 1);
        directory.crash(|i| i < kept);
    } else if roll < prefix_end + faults.directory_subset_per_million {
        directory.crash(|_| rng.chance(crate::rng::PER_MILLION / 2));
    } else {
        directory.crash(|_| false);
    }
}

fn crash_file(file: &mut FileNode, faults: &Faults, rng: &mut Rng) {
    let mut survivors = Vec::new();
    for change in std::mem::take(&mut file.pending) {
        match change {
            Pending::Resize { .. } => {
                if rng.chance(faults.resize_kept_per_million) {
                    survivors.push(change);
                }
            }
            Pending::Write { position, bytes } => {
                survivors.extend(crash_write(position, &bytes, faults, rng));
            }
        }
    }
    rng.shuffle(&mut survivors);
    for change in &survivors {
        apply(&mut file.durable, change);
    }
    file.current = file.durable.clone();
    assert!(file.pending.is_empty());
}

/// The pieces of one pending write that survive a crash: each sector piece kept, torn or
/// dropped independently.
fn crash_write(position: u64, bytes: &[u8], faults: &Faults, rng: &mut Rng) -> Vec<Pending> {
    let mut pieces = Vec::new();
    let mut start = 0_usize;
    while start < bytes.len() {
        let absolute = position + start as u64;
        let sector_end = (absolute / SECTOR_BYTES + 1) * SECTOR_BYTES;
        let end = bytes.len().min(start + (sector_end - absolute) as usize);
        assert!(end > start && (end - start) as u64 <= SECTOR_BYTES);
        let roll = rng.below(u64::from(crate::rng::PER_MILLION)) as u32;
        let kept = if roll < faults.sector_kept_per_million {
            end - start
        } else if roll < faults.sector_kept_per_million + faults.sector_torn_per_million {
            rng.index(end - start)
        } else {
            0
        };
        if kept > 0 {
            let bytes = bytes[start..start + kept].to_vec();
            pieces.push(Pending::Write { position: absolute, bytes });
        }
        start = end;
    }
    pieces
}

impl SimDisk {
    /// An empty disk (only the root directory) whose faults draw from `rng`.
    pub fn new(rng: Rng) -> SimDisk {
        SimDisk { state: Arc::new(Mutex::new(State::new(rng))) }
    }

    /// Defer the batches of [`Io::start_linked`] from now on (see the module documentation),
    /// or run them at once again.
    pub fn set_deferred_completions(&self, deferred: bool) {
        self.state.lock().deferred = deferred;
    }

    /// Set the fault probabilities from now on.
    pub fn set_faults(&self, faults: Faults) {
        assert!(
            faults.sector_kept_per_million + faults.sector_torn_per_million
                <= crate::rng::PER_MILLION
        );
        self.state.lock().faults = faults;
    }

    pub fn faults(&self) -> Faults {
        self.state.lock().faults
    }

    /// Make the next `count` syncs (file or directory) fail, with Linux semantics.
    pub fn fail_next_syncs(&self, count: u32) {
        self.state.lock().fail_next_syncs = count;
    }

    /// Make the next `count` syncs of files (not directories) fail, with Linux semantics.
    pub fn fail_next_file_syncs(&self, count: u32) {
        self.state.lock().fail_next_file_syncs = count;
    }

    /// Let `operations` more calls through, then fail every call as if the machine lost power
    /// mid-run. Follow with [`SimDisk::crash`]: the cut ends at the crash.
    pub fn cut_power_after(&self, operations: u64) {
        self.state.lock().power_left = Some(operations);
    }

    /// Cut the power right after the next `changes` (at least one) directory entry changes
    /// (creates, renames, removes) have succeeded, whatever other calls come between them:
    /// every call after the last of them fails until [`SimDisk::crash`].
    pub fn cut_power_after_entry_changes(&self, changes: u64) {
        assert!(changes > 0, "cut_power_after(0) cuts it now");
        self.state.lock().entry_changes_left = Some(changes);
    }

    /// Cut the power at the `syncs`-th (at least the first) directory fsync from now: it
    /// fails, and so does every call after it until [`SimDisk::crash`].
    pub fn cut_power_at_directory_sync(&self, syncs: u64) {
        assert!(syncs > 0, "cut_power_after(0) cuts it now");
        self.state.lock().directory_syncs_left = Some(syncs);
    }

    /// Disarm a power cut that has not been reached.
    pub fn restore_power(&self) {
        let mut state = self.state.lock();
        assert!(state.power_left != Some(0), "the power is already cut: crash first");
        state.power_left = None;
        state.entry_changes_left = None;
        state.directory_syncs_left = None;
    }

    /// Whether a power cut is armed, reached or not.
    pub fn power_cut_armed(&self) -> bool {
        let state = self.state.lock();
        state.power_left.is_some()
            || state.entry_changes_left.is_some()
            || state.directory_syncs_left.is_some()
    }

    /// Whether an armed power cut has been reached.
    pub fn power_is_cut(&self) -> bool {
        self.state.lock().power_left == Some(0)
    }

    /// Rot one bit of synced data, chosen by `rng` (see `State::flip_bit`); `None` when no
    /// file holds synced bytes.
    pub fn flip_bit(&self, rng: &mut Rng) -> Option<BitFlip> {
        self.state.lock().flip_bit(rng, Path::new("/"))
    }

    /// As [`SimDisk::flip_bit`], in a file under `directory` only.
    pub fn flip_bit_under(&self, directory: &Path, rng: &mut Rng) -> Option<BitFlip> {
        self.state.lock().flip_bit(rng, directory)
    }

    /// Lose power: see the module documentation for exactly what survives.
    pub fn crash(&self, rng: &mut Rng) {
        self.state.lock().crash(rng);
    }

    /// Every file reachable in the current namespace, by path, with its current bytes.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        self.state.lock().snapshot()
    }

    /// A hash of every call made so far and its outcome: equal for two runs of one seed.
    pub fn trace_hash(&self) -> u64 {
        self.state.lock().trace
    }

    pub fn stats(&self) -> Stats {
        self.state.lock().stats
    }

    /// Handles currently open: zero after an engine closed cleanly.
    pub fn open_handles(&self) -> usize {
        self.state.lock().handles.len()
    }

    /// Count a directory entry change (`result` ok) against a cut armed by
    /// [`SimDisk::cut_power_after_entry_changes`].
    fn entry_changed<T>(&self, result: io::Result<T>) -> io::Result<T> {
        let mut state = self.state.lock();
        if result.is_ok()
            && let Some(left) = &mut state.entry_changes_left
        {
            *left = left.saturating_sub(1);
            if *left == 0 {
                state.entry_changes_left = None;
                state.power_left = Some(0);
            }
        }
        result
    }

    /// Run a namespace call: count it against a power cut and record it in the trace.
    fn call<T>(
        &self,
        name: &str,
        path: &Path,
        body: impl FnOnce(&mut State) -> io::Result<T>,
        trace_value: impl Fn(&T) -> u64,
    ) -> io::Result<T> {
        let mut state = self.state.lock();
        let result = state.check_power().and_then(|()| body(&mut state));
        let traced = result.as_ref().map(&trace_value).map_err(|e| error(e.kind(), ""));
        state.record_call(name, path, &traced);
        result
    }
}

impl Io for SimDisk {
    fn submit(&self, operations: Vec<Operation>) -> Vec<Completion> {
        // One lock for the batch. The trait lets the operations of a batch run concurrently,
        // so they run here in a seeded random order (as io_uring may complete them); the
        // completions still come back in the order of `operations`.
        let mut state = self.state.lock();
        let each = operations.iter().enumerate().map(|(i, op)| ((NOW, i), i, op));
        state.assert_no_overlapping_writes(each);
        let mut order: Vec<usize> = (0..operations.len()).collect();
        if order.len() > 1 {
            state.rng.shuffle(&mut order);
        }
        let mut slots: Vec<Option<Operation>> = operations.into_iter().map(Some).collect();
        let mut completions: Vec<Option<Completion>> = (0..slots.len()).map(|_| None).collect();
        for index in order {
            let operation = slots[index].take().expect("each operation runs once");
            completions[index] = Some(state.execute(operation));
        }
        completions.into_iter().map(|c| c.expect("every operation completed")).collect()
    }

    fn submit_linked(&self, operations: Vec<Linked>) -> Vec<Completion> {
        // Chains run concurrently: each step the seed picks a chain and runs its next
        // operation, so unlinked operations complete in any order while each chain keeps its
        // own. A failure cancels the rest of its chain; a power cut between any two steps is a
        // crash between two completions.
        let mut state = self.state.lock();
        let mut run = ChainRun::new(&state, NOW, operations);
        let mut completions: Vec<Option<Completion>> = (0..run.slots.len()).map(|_| None).collect();
        while let Some((index, completion)) = run.step(&mut state) {
            completions[index] = Some(completion);
        }
        completions.into_iter().map(|c| c.expect("every operation completed")).collect()
    }

    fn start_linked(&self, operations: Vec<Linked>) -> Box<dyn InFlight> {
        let mut state = self.state.lock();
        if !state.deferred {
            drop(state);
            return Box::new(Completed::new(self.submit_linked(operations)));
        }
        let batch = state.next_batch;
        state.next_batch += 1;
        let run = ChainRun::new(&state, batch, operations);
        for &(index, write) in &run.writes {
            state.writes_in_flight.insert((batch, index), write);
        }
        let pending = run.slots.len();
        state.deferred_batches.insert(batch, DeferredBatch { run, ran: Vec::new() });
        Box::new(Deferred { disk: self.clone(), batch, pending })
    }
}

/// The chains of one linked batch as the disk runs them: each step the seed picks a chain
/// and runs its next operation.
#[derive(Debug)]
struct ChainRun {
    chains: Vec<std::ops::Range<usize>>,
    slots: Vec<Option<Operation>>,
    next: Vec<usize>,
    failed: Vec<bool>,
    /// The batch's writes, by index (checked against the writes that may run beside them).
    writes: Vec<(usize, WriteRange)>,
}

impl ChainRun {
    fn new(state: &State, batch: u64, operations: Vec<Linked>) -> ChainRun {
        let chains = io_trait::chains(&operations);
        let operations_ref = &operations;
        let each = chains.iter().enumerate().flat_map(|(chain, range)| {
            range
                .clone()
                .map(move |index| ((batch, chain), index, &operations_ref[index].operation))
        });
        let writes = state.assert_no_overlapping_writes(each);
        let next = chains.iter().map(|chain| chain.start).collect();
        let failed = vec![false; chains.len()];
        let slots = operations.into_iter().map(|linked| Some(linked.operation)).collect();
        ChainRun { chains, slots, next, failed, writes }
    }

    /// The chain operation `index` is in.
    fn chain_of(&self, index: usize) -> usize {
        let chain = self.chains.partition_point(|chain| chain.end <= index);
        assert!(self.chains[chain].contains(&index), "every operation is in a chain");
        chain
    }

    /// Operations not run yet.
    fn left(&self) -> usize {
        self.chains.iter().zip(&self.next).map(|(chain, &next)| chain.end - next).sum()
    }

    /// Run the next operation of a seeded chain; `None` once every one ran. A failure cancels
    /// the rest of its chain.
    fn step(&mut self, state: &mut State) -> Option<(usize, Completion)> {
        let live: Vec<usize> =
            (0..self.chains.len()).filter(|&c| self.next[c] < self.chains[c].end).collect();
        if live.is_empty() {
            return None;
        }
        let chain = live[state.rng.index(live.len())];
        let index = self.next[chain];
        self.next[chain] += 1;
        let operation = self.slots[index].take().expect("each operation runs once");
        let completion = if self.failed[chain] {
            let buffer = io_trait::operation_buffer(operation);
            Completion { buffer, result: Err(io_trait::canceled()) }
        } else {
            state.execute(operation)
        };
        self.failed[chain] |= completion.result.is_err();
        Some((index, completion))
    }
}

/// A deferred batch of [`Io::start_linked`] (see the module documentation): its operations
/// are in the disk's state, under its number, so that a reap of any batch runs them.
struct Deferred {
    disk: SimDisk,
    batch: u64,
    /// Operations not handed back yet.
    pending: usize,
}

/// The operations of a deferred batch, in the disk's state.
#[derive(Debug)]
struct DeferredBatch {
    run: ChainRun,
    /// Operations that ran and were not handed back yet, in the order they ran.
    ran: Vec<(usize, Completion)>,
}

impl State {
    /// Run the next operation of a seeded chain of deferred batch `batch`.
    fn step_deferred(&mut self, batch: u64) {
        let mut deferred = self.deferred_batches.remove(&batch).expect("a batch in flight");
        let ran = deferred.run.step(self).expect("an operation is left");
        deferred.ran.push(ran);
        self.deferred_batches.insert(batch, deferred);
    }

    /// Run a seeded number of the operations of every deferred batch, as the kernel works
    /// on all of them whichever the caller reaps.
    fn run_deferred(&mut self) {
        let left: u64 = self.deferred_batches.values().map(|b| b.run.left() as u64).sum();
        for _ in 0..self.rng.below(left + 1) {
            let live: Vec<u64> = self
                .deferred_batches
                .iter()
                .filter(|(_, b)| b.run.left() > 0)
                .map(|(&batch, _)| batch)
                .collect();
            let batch = live[self.rng.index(live.len())];
            self.step_deferred(batch);
        }
    }
}

impl InFlight for Deferred {
    fn reap(&mut self, wait: bool) -> Vec<(usize, Completion)> {
        let mut state = self.disk.state.lock();
        state.run_deferred();
        // A seeded subset of what ran, in the order it ran; an operation held back holds back
        // the rest of its chain, which completes in order as on a ring.
        let mut deferred = state.deferred_batches.remove(&self.batch).expect("in flight");
        let mut reaped = Vec::new();
        let mut kept = Vec::new();
        let mut held_chains = BTreeSet::new();
        for (index, completion) in std::mem::take(&mut deferred.ran) {
            let chain = deferred.run.chain_of(index);
            if held_chains.contains(&chain) || state.rng.below(2) == 0 {
                held_chains.insert(chain);
                kept.push((index, completion));
            } else {
                reaped.push((index, completion));
            }
        }
        deferred.ran = kept;
        if wait && reaped.is_empty() && self.pending > 0 {
            if deferred.ran.is_empty() {
                let ran = deferred.run.step(&mut state).expect("an operation is left");
                deferred.ran.push(ran);
            }
            // The first that ran: every operation before it in its chain was handed back.
            reaped.push(deferred.ran.remove(0));
        }
        for (index, _) in &reaped {
            state.writes_in_flight.remove(&(self.batch, *index));
        }
        assert!(reaped.len() <= self.pending, "an operation is handed back once");
        self.pending -= reaped.len();
        assert!(deferred.ran.len() <= self.pending, "what ran and waits is pending");
        state.deferred_batches.insert(self.batch, deferred);
        reaped
    }

    fn pending(&self) -> usize {
        self.pending
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        // Dropped with operations left only on the way to a crash: they never run, and their
        // writes no longer count as in flight.
        let mut state = self.disk.state.lock();
        state.deferred_batches.remove(&self.batch);
        state.writes_in_flight.retain(|&(batch, _), _| batch != self.batch);
    }
}

impl Namespace for SimDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        let result = self.call("open", path, |state| state.open(path, mode), |handle| handle.0);
        if matches!(mode, OpenMode::CreateNew | OpenMode::CreateNewDirect) {
            return self.entry_changed(result);
        }
        result
    }

    fn close(&self, file: FileHandle) {
        // Closing never fails and flushes nothing, so a power cut does not stop it: the
        // handle table is gone at the crash anyway.
        let mut state = self.state.lock();
        state.close(file);
        state.record(b"close");
        state.record(&file.0.to_le_bytes());
    }

    fn file_size(&self, file: FileHandle) -> io::Result<u64> {
        self.call(
            "file_size",
            Path::new(""),
            |state| {
                let inode = state.data_handle(file, false)?;
                Ok(state.file_mut(inode)?.current.len() as u64)
            },
            |size| *size,
        )
    }

    fn create_directory(&self, path: &Path) -> io::Result<()> {
        let result = self.call("create_directory", path, |s| s.create_directory(path), |_| 0);
        self.entry_changed(result).map(|_| ())
    }

    fn list(&self, directory: &Path) -> io::Result<Vec<DirectoryEntry>> {
        self.call("list", directory, |state| state.list(directory), |e| e.len() as u64)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state.lock();
        state.record(to.as_os_str().as_encoded_bytes());
        drop(state);
        let result = self.call("rename", from, |state| state.rename(from, to), |_| 0);
        self.entry_changed(result).map(|_| ())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let result = self.call("remove_file", path, |state| state.remove_file(path), |_| 0);
        self.entry_changed(result).map(|_| ())
    }

    fn remove_directory(&self, path: &Path) -> io::Result<()> {
        let result = self.call("remove_directory", path, |s| s.remove_directory(path), |_| 0);
        self.entry_changed(result).map(|_| ())
    }

    fn lock(&self, path: &Path) -> io::Result<FileHandle> {
        self.call("lock", path, |state| state.lock(path), |handle| handle.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chronik_engine::io::{read_exact, run_plain, sync_directory, write_all};

    fn disk(seed: u64) -> SimDisk {
        SimDisk::new(Rng::new(seed))
    }

    fn create(disk: &SimDisk, path: &str, bytes: &[u8]) -> FileHandle {
        let file = disk.open(Path::new(path), OpenMode::CreateNew).unwrap();
        write_all(disk, file, 0, bytes.to_vec()).unwrap();
        file
    }

    fn linked(operation: Operation, link_next: bool) -> Linked {
        Linked { operation, link_next }
    }

    /// Two chains of two writes each, with the power cut after one operation: whichever ran
    /// first is a chain's first operation (a chain keeps its own order), either chain goes
    /// first over a few seeds (the seed picks the interleaving), and a failure cancels only
    /// the rest of its chain. (The chains write different bytes: two chains writing the same
    /// bytes break the contract, see the next test.)
    #[test]
    fn chains_keep_their_order_and_interleave_by_seed() {
        let mut first_ran = BTreeSet::new();
        for seed in 0..40 {
            let disk = disk(seed);
            let file = create(&disk, "/f", b"----");
            let write =
                |position: u64, byte: u8| Operation::Write { file, position, buffer: vec![byte] };
            disk.cut_power_after(1);
            let completions = disk.submit_linked(vec![
                linked(write(0, b'a'), true),
                linked(write(1, b'b'), false),
                linked(write(2, b'c'), true),
                linked(write(3, b'd'), false),
            ]);
            let ran: Vec<usize> =
                (0..completions.len()).filter(|&i| completions[i].result.is_ok()).collect();
            assert!(ran == [0] || ran == [2], "seed {seed}: a chain ran out of order: {ran:?}");
            first_ran.insert(ran[0]);
        }
        assert_eq!(first_ran.len(), 2, "over 40 seeds, each chain went first sometimes");

        let disk = disk(7);
        let file = create(&disk, "/g", b"");
        disk.fail_next_syncs(1);
        let completions = disk.submit_linked(vec![
            linked(Operation::Fdatasync { file }, true),
            linked(Operation::Write { file, position: 0, buffer: b"never".to_vec() }, false),
            linked(Operation::Write { file, position: 10, buffer: b"kept".to_vec() }, false),
        ]);
        assert!(completions[0].result.is_err());
        let cancelled = completions[1].result.as_ref().unwrap_err();
        assert!(io_trait::is_canceled(cancelled), "{cancelled}");
        assert_eq!(completions[1].buffer, b"never");
        assert_eq!(*completions[2].result.as_ref().unwrap(), 4);
    }

    /// Writes that may run concurrently (different chains) touching the same bytes are a bug
    /// of the caller: the disk refuses to pick a winner and panics. Linked, they are fine.
    #[test]
    fn overlapping_writes_in_different_chains_break_the_contract() {
        let disk = disk(1);
        let file = create(&disk, "/f", b"--");
        let write = |byte: u8| Operation::Write { file, position: 0, buffer: vec![byte; 2] };
        let linked_ok =
            disk.submit_linked(vec![linked(write(b'a'), true), linked(write(b'b'), false)]);
        assert!(linked_ok.iter().all(|c| c.result.is_ok()));
        assert_eq!(read_exact(&disk, file, 0, 2).unwrap(), b"bb", "a chain runs in order");
        let unlinked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            disk.submit_linked(vec![linked(write(b'c'), false), linked(write(b'd'), false)])
        }));
        let message = unlinked.expect_err("overlapping unlinked writes panic");
        let message = message.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("overlap"), "{message}");
    }

    /// Reap a deferred batch to its end, one call at a time; the indexes in the order they
    /// came back, and how many calls came back empty.
    fn reap_all(batch: &mut dyn InFlight) -> (Vec<usize>, u32) {
        let (mut order, mut empty) = (Vec::new(), 0);
        while batch.pending() > 0 {
            let reaped = batch.reap(false);
            empty += u32::from(reaped.is_empty());
            assert!(reaped.iter().all(|(_, c)| c.result.is_ok()));
            order.extend(reaped.into_iter().map(|(index, _)| index));
        }
        (order, empty)
    }

    /// A deferred batch comes back over several reaps, each operation once, each chain in its
    /// order, unlinked ones in any; a reap that waits brings one; without deferral the first
    /// reap brings all.
    #[test]
    fn deferred_batches_complete_over_later_reaps_each_chain_in_order() {
        let (mut empty_reaps, mut sync_first, mut sync_last) = (0, false, false);
        for seed in 0..40 {
            let disk = disk(seed);
            let file = create(&disk, "/f", b"----");
            let write =
                |position: u64, byte: u8| Operation::Write { file, position, buffer: vec![byte] };
            disk.set_deferred_completions(true);
            let mut batch = disk.start_linked(vec![
                linked(write(0, b'a'), true),
                linked(write(1, b'b'), false),
                linked(write(2, b'c'), true),
                linked(write(3, b'd'), false),
                linked(Operation::Fdatasync { file }, false),
            ]);
            assert_eq!(batch.pending(), 5);
            let waited = batch.reap(true);
            assert!(!waited.is_empty(), "seed {seed}: a reap that waits brings one");
            let (rest, empty) = reap_all(&mut *batch);
            let order: Vec<usize> = waited.iter().map(|(i, _)| *i).chain(rest).collect();
            let at = |index: usize| order.iter().position(|&i| i == index).expect("came back");
            assert_eq!(order.len(), 5, "seed {seed}: each once: {order:?}");
            assert!(at(0) < at(1) && at(2) < at(3), "seed {seed}: chains in order: {order:?}");
            empty_reaps += empty;
            sync_first |= at(4) == 0;
            sync_last |= at(4) == 4;
            assert_eq!(read_exact(&disk, file, 0, 4).unwrap(), b"abcd");
        }
        assert!(empty_reaps > 0, "some reap found nothing ready");
        assert!(sync_first && sync_last, "the unlinked fdatasync came back first and last");

        let disk = disk(1);
        let file = create(&disk, "/g", b"");
        let mut batch = disk.start_linked(vec![linked(Operation::Fdatasync { file }, false)]);
        assert_eq!(batch.reap(false).len(), 1, "not deferred: all at the first reap");
        assert_eq!(batch.pending(), 0);
    }

    /// The case only deferral reaches: an fdatasync in flight, a write submitted after it
    /// that completes first. Whether the fdatasync covers it depends on which took effect
    /// first, so a crash may lose a write that completed before the fdatasync did; it never
    /// loses one completed before the fdatasync was submitted.
    #[test]
    fn a_write_completed_while_an_fdatasync_is_in_flight_may_not_be_covered() {
        let (mut lost, mut kept) = (0, 0);
        for seed in 0..60 {
            let disk = disk(seed);
            let file = create(&disk, "/f", b"old");
            sync_directory(&disk, Path::new("/")).unwrap();
            disk.set_deferred_completions(true);
            let mut sync = disk.start_linked(vec![linked(Operation::Fdatasync { file }, false)]);
            let mut later = disk.start_linked(vec![linked(
                Operation::Write { file, position: 3, buffer: b"new".to_vec() },
                false,
            )]);
            // The write completes to the caller first, then the fdatasync.
            assert_eq!(later.reap(true).len(), 1);
            assert_eq!(sync.reap(true).len(), 1);
            disk.crash(&mut Rng::new(seed));
            let file = disk.open(Path::new("/f"), OpenMode::Read).unwrap();
            let size = disk.file_size(file).unwrap();
            let bytes = read_exact(&disk, file, 0, usize::try_from(size).unwrap()).unwrap();
            assert_eq!(&bytes[..3], b"old", "seed {seed}: what was written before survives");
            if bytes.len() == 3 { lost += 1 } else { kept += 1 }
        }
        assert!(lost > 0 && kept > 0, "over 60 seeds both orders: lost {lost}, kept {kept}");
    }

    /// Writes in two deferred batches, the first not reaped yet, may run concurrently: the
    /// disk refuses them if they overlap, and takes them once the first was reaped.
    #[test]
    fn writes_in_flight_in_two_batches_must_not_overlap() {
        let disk = disk(3);
        let file = create(&disk, "/f", b"--");
        disk.set_deferred_completions(true);
        let write = |byte: u8| Operation::Write { file, position: 0, buffer: vec![byte; 2] };
        let mut first = disk.start_linked(vec![linked(write(b'a'), false)]);
        let overlapping = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            disk.start_linked(vec![linked(write(b'b'), false)])
        }));
        let Err(message) = overlapping else { panic!("a write overlapping one in flight panics") };
        let message = message.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("overlap"), "{message}");
        assert_eq!(first.reap(true).len(), 1);
        let mut second = disk.start_linked(vec![linked(write(b'c'), false)]);
        assert_eq!(reap_all(&mut *second).0, [0]);
        assert_eq!(read_exact(&disk, file, 0, 2).unwrap(), b"cc");
    }

    #[test]
    fn synced_data_and_entries_survive_every_crash() {
        for seed in 0..50 {
            let disk = disk(seed);
            disk.create_directory(Path::new("/d")).unwrap();
            sync_directory(&disk, Path::new("/")).unwrap();
            let file = create(&disk, "/d/f", &vec![7; 3000]);
            run_plain(&disk, Operation::Fdatasync { file }).unwrap();
            sync_directory(&disk, Path::new("/d")).unwrap();
            disk.crash(&mut Rng::new(seed));
            assert_eq!(disk.snapshot()[Path::new("/d/f")], vec![7; 3000]);
            assert_eq!(disk.open_handles(), 0);
        }
    }

    #[test]
    fn unsynced_entries_vanish_and_removed_ones_come_back() {
        let disk = disk(1);
        let old = create(&disk, "/old", b"old");
        run_plain(&disk, Operation::Fsync { file: old }).unwrap();
        sync_directory(&disk, Path::new("/")).unwrap();
        create(&disk, "/new", b"new");
        disk.rename(Path::new("/old"), Path::new("/renamed")).unwrap();
        disk.create_directory(Path::new("/dir")).unwrap();
        assert_eq!(disk.list(Path::new("/")).unwrap().len(), 3);
        disk.crash(&mut Rng::new(1));
        let files: Vec<PathBuf> = disk.snapshot().into_keys().collect();
        assert_eq!(files, [PathBuf::from("/old")]);
        assert_eq!(disk.list(Path::new("/")).unwrap().len(), 1);
    }

    #[test]
    fn unsynced_writes_are_kept_torn_or_dropped_per_sector() {
        let mut outcomes = BTreeSet::new();
        for seed in 0..200 {
            let disk = disk(seed);
            let file = create(&disk, "/f", &[1; 1024]);
            run_plain(&disk, Operation::Fsync { file }).unwrap();
            sync_directory(&disk, Path::new("/")).unwrap();
            write_all(&disk, file, 256, vec![2; 512]).unwrap();
            disk.crash(&mut Rng::new(seed));
            let bytes = &disk.snapshot()[Path::new("/f")];
            assert_eq!(bytes.len(), 1024, "a write inside the file keeps the size");
            assert!(bytes[..256].iter().chain(&bytes[768..]).all(|&b| b == 1));
            // Each of the two sector pieces is a run of 2s followed by 1s (a torn prefix).
            for piece in [&bytes[256..512], &bytes[512..768]] {
                let twos = piece.iter().take_while(|&&b| b == 2).count();
                assert!(piece[twos..].iter().all(|&b| b == 1));
                outcomes.insert(twos);
            }
        }
        assert!(outcomes.contains(&0) && outcomes.contains(&256) && outcomes.len() > 3);
    }

    #[test]
    fn a_failed_fsync_drops_the_pending_writes_and_a_retry_lies() {
        for seed in 0..20 {
            let disk = disk(seed);
            let file = create(&disk, "/f", b"durable");
            run_plain(&disk, Operation::Fsync { file }).unwrap();
            sync_directory(&disk, Path::new("/")).unwrap();
            write_all(&disk, file, 7, b" lost".to_vec()).unwrap();
            disk.fail_next_syncs(1);
            assert!(run_plain(&disk, Operation::Fdatasync { file }).is_err());
            assert_eq!(read_exact(&disk, file, 0, 12).unwrap(), b"durable lost", "still cached");
            run_plain(&disk, Operation::Fdatasync { file }).unwrap();
            disk.crash(&mut Rng::new(seed));
            assert_eq!(disk.snapshot()[Path::new("/f")], b"durable");
            assert_eq!(disk.stats().failed_syncs, 1);
        }
    }

    #[test]
    fn truncates_survive_only_after_a_sync() {
        let mut sizes = BTreeSet::new();
        for seed in 0..40 {
            let disk = disk(seed);
            let file = create(&disk, "/f", &[3; 100]);
            run_plain(&disk, Operation::Fsync { file }).unwrap();
            sync_directory(&disk, Path::new("/")).unwrap();
            run_plain(&disk, Operation::Truncate { file, length: 10 }).unwrap();
            assert_eq!(disk.file_size(file).unwrap(), 10);
            disk.crash(&mut Rng::new(seed));
            sizes.insert(disk.snapshot()[Path::new("/f")].len());
        }
        assert_eq!(sizes, BTreeSet::from([10, 100]));
    }

    #[test]
    fn locks_are_exclusive_and_released_on_close_and_crash() {
        let disk = disk(2);
        let lock = disk.lock(Path::new("/lock")).unwrap();
        assert_eq!(disk.lock(Path::new("/lock")).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        disk.close(lock);
        let _lock = disk.lock(Path::new("/lock")).unwrap();
        disk.crash(&mut Rng::new(2));
        disk.lock(Path::new("/lock")).unwrap();
    }

    #[test]
    fn stale_handles_fail_after_a_crash_and_power_cuts_stop_everything() {
        let disk = disk(3);
        let file = create(&disk, "/f", b"x");
        disk.cut_power_after(1);
        assert!(disk.list(Path::new("/")).is_ok());
        assert!(disk.power_is_cut());
        assert!(disk.list(Path::new("/")).is_err());
        assert!(write_all(&disk, file, 0, b"y".to_vec()).is_err());
        disk.crash(&mut Rng::new(3));
        assert!(!disk.power_is_cut());
        assert!(write_all(&disk, file, 0, b"y".to_vec()).is_err(), "the handle died");
    }

    #[test]
    fn namespace_errors_match_posix() {
        let disk = disk(4);
        let kind = |r: io::Result<()>| r.unwrap_err().kind();
        disk.create_directory(Path::new("/a")).unwrap();
        create(&disk, "/a/f", b"");
        assert_eq!(kind(disk.create_directory(Path::new("/a"))), io::ErrorKind::AlreadyExists);
        assert_eq!(kind(disk.create_directory(Path::new("/b/c"))), io::ErrorKind::NotFound);
        let error = disk.remove_directory(Path::new("/a"));
        assert_eq!(kind(error), io::ErrorKind::DirectoryNotEmpty);
        let error = disk.open(Path::new("/a/f"), OpenMode::CreateNew).map(|_| ());
        assert_eq!(kind(error), io::ErrorKind::AlreadyExists);
        assert_eq!(kind(disk.remove_file(Path::new("/a"))), io::ErrorKind::IsADirectory);
        disk.remove_file(Path::new("/a/f")).unwrap();
        disk.remove_directory(Path::new("/a")).unwrap();
        assert!(disk.list(Path::new("/")).unwrap().is_empty());
    }

    #[test]
    fn injected_io_errors_transfer_nothing() {
        let disk = disk(6);
        let file = create(&disk, "/f", b"before");
        let always = crate::rng::PER_MILLION;
        disk.set_faults(Faults { read_error_per_million: always, ..Faults::NONE });
        assert!(read_exact(&disk, file, 0, 6).is_err());
        disk.set_faults(Faults { write_error_per_million: always, ..Faults::NONE });
        assert!(write_all(&disk, file, 0, b"after!".to_vec()).is_err());
        disk.set_faults(Faults::NONE);
        assert_eq!(read_exact(&disk, file, 0, 6).unwrap(), b"before");
    }

    #[test]
    fn a_full_disk_refuses_growth() {
        let disk = disk(5);
        disk.set_faults(Faults { capacity_bytes: Some(100), ..Faults::NONE });
        let file = create(&disk, "/f", &[0; 100]);
        let error = write_all(&disk, file, 100, vec![1]).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::StorageFull);
        write_all(&disk, file, 0, vec![1; 100]).unwrap();
    }

    #[test]
    fn the_same_seed_gives_the_same_disk() {
        let run = |seed| {
            let disk = disk(seed);
            disk.set_faults(Faults { write_error_per_million: 100_000, ..Faults::NONE });
            let file = disk.open(Path::new("/f"), OpenMode::CreateNew).unwrap();
            for i in 0..100_u64 {
                let _ = write_all(&disk, file, i * 300, vec![i as u8; 300]);
            }
            disk.crash(&mut Rng::new(seed));
            (disk.snapshot(), disk.trace_hash())
        };
        assert_eq!(run(9), run(9));
        assert_ne!(run(9), run(10));
    }
}
