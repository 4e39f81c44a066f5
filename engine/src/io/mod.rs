//! The one I/O trait through which every file operation of the engine goes.
//!
//! The trait is shaped for io_uring: data operations ([`Operation`]) own their buffers, are
//! submitted in batches, and complete with their buffer handed back in a [`Completion`]. `fsync`,
//! `fdatasync` and the fsync of a directory are ordinary operations. Namespace operations (open,
//! rename, remove, list) are plain methods.
//!
//! # Crash contract
//!
//! What a crash (power loss or kernel panic, not only a killed process) may do, per method.
//! Backends must behave this way; the simulated disk injects exactly these outcomes.
//!
//! - [`Operation::Write`]: after completion the bytes are in the page cache. A crash before a
//!   later `Fdatasync`/`Fsync` of the same file completes may keep each sector of the write,
//!   drop it, or tear it, in any order.
//! - [`Operation::Fdatasync`]: on success, every write to this file that completed before it
//!   was submitted, and the file size, survive a crash. Metadata that is not needed to read the
//!   data back (timestamps) may not.
//! - [`Operation::Fsync`]: as `Fdatasync`, plus all file metadata. On a handle opened with
//!   [`OpenMode::Directory`] it makes the directory's entries (files created, renamed or removed
//!   in it) survive a crash.
//! - A failed `Fsync`/`Fdatasync` means the dirty data may be gone (Linux drops the pages and
//!   a retried fsync reports success). The engine never retries: it poisons itself.
//! - [`Operation::Truncate`] and [`Operation::Allocate`] change the size; the change survives a
//!   crash only after an `Fsync` of the file.
//! - [`Namespace::open`] with [`OpenMode::CreateNew`], [`Namespace::rename`],
//!   [`Namespace::remove_file`], [`Namespace::create_directory`] and
//!   [`Namespace::remove_directory`] survive a crash only after an `Fsync` of the parent
//!   directory; until then the entry may be lost on a crash.
//! - [`Namespace::lock`] holds an advisory exclusive lock while the handle is open; it does not
//!   survive the process.

mod aligned;
mod pread;
mod system;
#[cfg(target_os = "linux")]
mod uring;

pub use pread::PreadIo;
pub use system::{Backend, SystemIo};
#[cfg(target_os = "linux")]
pub use uring::UringIo;

use std::io;
use std::path::{Path, PathBuf};

/// An open file or directory. Opaque; valid until passed to [`Namespace::close`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileHandle(pub u64);

/// How [`Namespace::open`] opens a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// An existing file, read only.
    Read,
    /// An existing file, read and write.
    ReadWrite,
    /// A new file, read and write; fails with `AlreadyExists` if the path exists.
    CreateNew,
    /// As [`OpenMode::ReadWrite`], with writes that bypass the page cache where the backend
    /// can (`O_DIRECT` on Linux). Every [`Operation::Write`] on the handle must start at a
    /// multiple of [`DIRECT_ALIGNMENT`] and have a length that is one, or it fails with
    /// `InvalidInput`. Reads, syncs and truncates are not restricted. The crash contract is
    /// the same: a direct write may sit in the device's cache until an fdatasync.
    ReadWriteDirect,
    /// As [`OpenMode::CreateNew`], with direct writes as in [`OpenMode::ReadWriteDirect`].
    CreateNewDirect,
    /// An existing directory, only to be passed to [`Operation::Fsync`].
    Directory,
}

impl OpenMode {
    /// Whether writes through the handle must be aligned (see [`OpenMode::ReadWriteDirect`]).
    pub fn is_direct(self) -> bool {
        matches!(self, OpenMode::ReadWriteDirect | OpenMode::CreateNewDirect)
    }

    /// Whether the mode creates the file (and fails if it exists).
    pub fn creates(self) -> bool {
        matches!(self, OpenMode::CreateNew | OpenMode::CreateNewDirect)
    }

    /// `mode`, with direct writes if `direct` (only for the writable modes).
    #[must_use]
    pub fn with_direct(self, direct: bool) -> OpenMode {
        match (self, direct) {
            (OpenMode::ReadWrite, true) => OpenMode::ReadWriteDirect,
            (OpenMode::CreateNew, true) => OpenMode::CreateNewDirect,
            (mode, _) => mode,
        }
    }
}

/// Alignment of the position and length of every write on a handle opened with
/// [`OpenMode::ReadWriteDirect`] or [`OpenMode::CreateNewDirect`]: the logical block size of
/// every disk we know and the page size, so it suits `O_DIRECT` everywhere.
pub const DIRECT_ALIGNMENT: usize = 4096;

/// Whether a write at `position` of `length` bytes may go to a direct handle.
pub fn is_direct_aligned(position: u64, length: usize) -> bool {
    position.is_multiple_of(DIRECT_ALIGNMENT as u64) && length.is_multiple_of(DIRECT_ALIGNMENT)
}

/// The error of a write to a direct handle that is not aligned.
pub fn misaligned_direct_write(position: u64, length: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "direct write of {length} bytes at {position} is not aligned to {DIRECT_ALIGNMENT}"
        ),
    )
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirectoryEntry {
    pub name: String,
    pub is_directory: bool,
}

/// A data operation. Buffers are owned by the operation and handed back on completion, so a
/// backend may keep them alive while the kernel works on them (io_uring).
#[derive(Debug)]
pub enum Operation {
    /// Read `buffer.len()` bytes at `position`. Completes with the buffer truncated to the bytes
    /// read, which is fewer only at the end of the file.
    Read { file: FileHandle, position: u64, buffer: Vec<u8> },
    /// Write all of `buffer` at `position`.
    Write { file: FileHandle, position: u64, buffer: Vec<u8> },
    /// Flush data and all metadata of a file or directory to stable storage.
    Fsync { file: FileHandle },
    /// Flush data and the metadata needed to read it back (the size) to stable storage.
    Fdatasync { file: FileHandle },
    /// Set the file's size to `length`.
    Truncate { file: FileHandle, length: u64 },
    /// Make the file at least `position + length` bytes long, reserving space where the
    /// backend can.
    Allocate { file: FileHandle, position: u64, length: u64 },
}

impl Operation {
    /// A short name for error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Read { .. } => "read",
            Operation::Write { .. } => "write",
            Operation::Fsync { .. } => "fsync",
            Operation::Fdatasync { .. } => "fdatasync",
            Operation::Truncate { .. } => "truncate",
            Operation::Allocate { .. } => "allocate",
        }
    }
}

/// The result of one [`Operation`], with its buffer handed back (empty for operations without
/// one).
#[derive(Debug)]
pub struct Completion {
    pub buffer: Vec<u8>,
    /// Bytes transferred for reads and writes, zero otherwise.
    pub result: io::Result<usize>,
}

/// One operation of [`Io::submit_linked`].
#[derive(Debug)]
pub struct Linked {
    pub operation: Operation,
    /// The next operation of the batch starts only after this one completed in full (io_uring's
    /// `IOSQE_IO_LINK`). If this one fails, every later operation of its chain fails with
    /// [`canceled`] without running.
    pub link_next: bool,
}

/// The error of an operation that did not run because an earlier one of its chain failed.
pub fn canceled() -> io::Error {
    io::Error::from_raw_os_error(ECANCELED)
}

/// `ECANCELED` on Linux; the same number wherever the error is only ours.
const ECANCELED: i32 = 125;

/// Whether `error` is [`canceled`].
pub fn is_canceled(error: &io::Error) -> bool {
    error.raw_os_error() == Some(ECANCELED)
}

/// Run `operations` as [`Io::submit_linked`] promises, one operation at a time through
/// `io.submit`: the portable way, for backends without a ring.
pub fn submit_linked_in_order<I: Io + ?Sized>(io: &I, operations: Vec<Linked>) -> Vec<Completion> {
    let mut completions = Vec::with_capacity(operations.len());
    let mut chain_failed = false;
    for Linked { operation, link_next } in operations {
        let completion = if chain_failed {
            Completion { buffer: operation_buffer(operation), result: Err(canceled()) }
        } else {
            run(io, operation)
        };
        // A short read is not a failure; a short write completes as an error already.
        chain_failed = link_next && (chain_failed || completion.result.is_err());
        completions.push(completion);
    }
    completions
}

/// The chains of a linked batch, as index ranges.
pub fn chains(operations: &[Linked]) -> Vec<std::ops::Range<usize>> {
    let mut chains = Vec::new();
    let mut start = 0;
    for (index, linked) in operations.iter().enumerate() {
        if !linked.link_next {
            chains.push(start..index + 1);
            start = index + 1;
        }
    }
    if start < operations.len() {
        // The last operation asked for a link to nothing: its chain ends with the batch.
        chains.push(start..operations.len());
    }
    chains
}

/// The buffer an operation carries (empty for those without one).
pub fn operation_buffer(operation: Operation) -> Vec<u8> {
    match operation {
        Operation::Read { buffer, .. } | Operation::Write { buffer, .. } => buffer,
        _ => Vec::new(),
    }
}

/// Every file operation of the engine: the data operations (reads, writes, fsyncs), submitted
/// in batches and completed asynchronously by the backend, in the [`Namespace`] they work in.
/// See the module documentation for the crash contract.
pub trait Io: Namespace {
    /// Submit a batch of operations in chains and wait for all of them. A chain is a run of
    /// operations each with [`Linked::link_next`] set, and the one after the last of them: its
    /// operations run one after another, each only once the one before it succeeded (a failure
    /// cancels the rest of the chain, see [`canceled`]). Operations of different chains may run
    /// concurrently and complete in any order. For the crash contract, a linked operation is
    /// submitted when the one before it completed: an fdatasync linked behind a write covers it.
    /// Completions come back in the order of `operations`.
    ///
    /// The default runs the operations one at a time, in order, through [`Io::submit`].
    fn submit_linked(&self, operations: Vec<Linked>) -> Vec<Completion> {
        submit_linked_in_order(self, operations)
    }

    /// Submit a batch as [`Io::submit_linked`] does, without waiting for it: its operations
    /// complete through [`InFlight::reap`], possibly over many calls, in any order (each chain
    /// in its own). An operation started and not reaped may have run or not: a crash may keep
    /// or drop its effect as the crash contract says. The caller reaps every operation before
    /// it drops the batch, except on the way to a crash.
    ///
    /// The default runs the batch through [`Io::submit_linked`] at once and hands every
    /// completion back on the first reap.
    fn start_linked(&self, operations: Vec<Linked>) -> Box<dyn InFlight> {
        Box::new(Completed::new(self.submit_linked(operations)))
    }

    /// Submit a batch of operations and wait for all of them. Completions come back in the order
    /// of `operations`. Operations in one batch may run concurrently: a caller that needs an
    /// order between two operations (write, then fdatasync) submits them in separate batches,
    /// or relies on a backend that documents linking them.
    fn submit(&self, operations: Vec<Operation>) -> Vec<Completion>;
}

/// A batch started by [`Io::start_linked`]: its operations still to be handed back.
pub trait InFlight: Send {
    /// The completions ready now, each with its operation's index in the batch. With `wait`,
    /// at least one if any operation is left (blocking until one completes).
    fn reap(&mut self, wait: bool) -> Vec<(usize, Completion)>;

    /// How many operations of the batch were not handed back yet.
    fn pending(&self) -> usize;
}

/// A batch whose operations all completed already: the default [`Io::start_linked`].
#[derive(Debug)]
pub struct Completed {
    completions: Vec<Completion>,
}

impl Completed {
    pub fn new(completions: Vec<Completion>) -> Completed {
        Completed { completions }
    }
}

impl InFlight for Completed {
    fn reap(&mut self, _wait: bool) -> Vec<(usize, Completion)> {
        std::mem::take(&mut self.completions).into_iter().enumerate().collect()
    }

    fn pending(&self) -> usize {
        self.completions.len()
    }
}

/// The file system's namespace: opening and closing files, their sizes, directories, renames,
/// removals and the data directory's lock. Synchronous calls: they are rare, off the write
/// path's hot loop (a roll's create runs inline in the reactor's turn), and never batched.
/// Their durability is a directory fsync ([`sync_directory`]), a data operation.
pub trait Namespace: Send + Sync + 'static {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle>;

    /// Close a handle. Closing does not flush anything.
    fn close(&self, file: FileHandle);

    fn file_size(&self, file: FileHandle) -> io::Result<u64>;

    /// Create one directory; its parent must exist. `AlreadyExists` if it does.
    fn create_directory(&self, path: &Path) -> io::Result<()>;

    /// The entries of a directory, sorted by name, without `.` and `..`.
    fn list(&self, directory: &Path) -> io::Result<Vec<DirectoryEntry>>;

    /// Atomically replace `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Remove an empty directory.
    fn remove_directory(&self, path: &Path) -> io::Result<()>;

    /// Open (creating if needed) `path` and take an exclusive advisory lock on it, failing with
    /// `WouldBlock` if another holder has it. The lock is released when the handle is closed.
    fn lock(&self, path: &Path) -> io::Result<FileHandle>;
}

/// An I/O error with the operation and path it happened on.
#[derive(Debug, thiserror::Error)]
#[error("{operation} {}: {source}", path.display())]
pub struct IoError {
    pub operation: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl IoError {
    pub fn new(operation: &'static str, path: &Path, source: io::Error) -> Self {
        IoError { operation, path: path.to_path_buf(), source }
    }

    /// Whether the error means the disk is full.
    pub fn is_disk_full(&self) -> bool {
        self.source.kind() == io::ErrorKind::StorageFull
    }
}

/// Submit one operation and wait for it.
pub fn run<I: Io + ?Sized>(io: &I, operation: Operation) -> Completion {
    let mut completions = io.submit(vec![operation]);
    assert_eq!(completions.len(), 1, "backend returned a wrong number of completions");
    completions.pop().expect("one completion")
}

/// Read exactly `length` bytes at `position`, or fail with `UnexpectedEof`.
pub fn read_exact<I: Io + ?Sized>(
    io: &I,
    file: FileHandle,
    position: u64,
    length: usize,
) -> io::Result<Vec<u8>> {
    let completion = run(io, Operation::Read { file, position, buffer: vec![0; length] });
    completion.result?;
    if completion.buffer.len() < length {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shorter than expected"));
    }
    Ok(completion.buffer)
}

/// Write all of `buffer` at `position`.
pub fn write_all<I: Io + ?Sized>(
    io: &I,
    file: FileHandle,
    position: u64,
    buffer: Vec<u8>,
) -> io::Result<()> {
    run(io, Operation::Write { file, position, buffer }).result.map(|_| ())
}

/// Run an operation that carries no buffer (fsync, fdatasync, truncate, allocate).
pub fn run_plain<I: Io + ?Sized>(io: &I, operation: Operation) -> io::Result<()> {
    run(io, operation).result.map(|_| ())
}

/// Fsync the directory at `path`, making its entries durable.
pub fn sync_directory<I: Io + ?Sized>(io: &I, path: &Path) -> io::Result<()> {
    let directory = io.open(path, OpenMode::Directory)?;
    let result = run_plain(io, Operation::Fsync { file: directory });
    io.close(directory);
    result
}

/// Remove the file at `path` if it is there (a missing file is no error). The caller fsyncs
/// the directory to make the removal durable.
pub fn remove_if_present<I: Io + ?Sized>(io: &I, path: &Path) -> Result<(), IoError> {
    match io.remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(IoError::new("remove", path, error)),
    }
}

/// Replace the file at `path` with `bytes`, atomically: write `path` + [`TEMPORARY_SUFFIX`]
/// (removed first if a crash left one), fdatasync it, rename it over `path`. The caller
/// fsyncs the directory to make the rename durable.
pub fn replace_file<I: Io + ?Sized>(io: &I, path: &Path, bytes: Vec<u8>) -> Result<(), IoError> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(TEMPORARY_SUFFIX);
    let temporary = PathBuf::from(temporary);
    assert_ne!(temporary, path, "the temporary file is another file");
    match io.remove_file(&temporary) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            return Err(IoError::new("remove", &temporary, error));
        }
        _ => {}
    }
    let file = io
        .open(&temporary, OpenMode::CreateNew)
        .map_err(|e| IoError::new("create", &temporary, e))?;
    let length = bytes.len();
    let result = write_all(io, file, 0, bytes)
        .map_err(|e| IoError::new("write", &temporary, e))
        .and_then(|()| {
            run_plain(io, Operation::Fdatasync { file })
                .map_err(|e| IoError::new("fdatasync", &temporary, e))
        });
    if result.is_ok() {
        let written = io.file_size(file).map_err(|e| IoError::new("stat", &temporary, e));
        if let Ok(written) = written {
            assert_eq!(written, length as u64, "the temporary file holds the bytes written");
        }
    }
    io.close(file);
    result?;
    io.rename(&temporary, path).map_err(|e| IoError::new("rename", path, e))
}

/// The suffix of the temporary file [`replace_file`] writes before its rename.
pub const TEMPORARY_SUFFIX: &str = ".tmp";

/// Read a whole file, or `None` if it does not exist. Of a file longer than `bytes_max`
/// (damaged: a size set wrong by a broken file system, a sparse file) only the first
/// `bytes_max + 1` bytes are read: the caller's decoder then sees a length no intact file has
/// and treats it as any damage, without reading (or allocating) the whole file.
pub fn read_file_bounded<I: Io + ?Sized>(
    io: &I,
    path: &Path,
    bytes_max: u64,
) -> Result<Option<Vec<u8>>, IoError> {
    let file = match io.open(path, OpenMode::Read) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(IoError::new("open", path, error)),
    };
    let result = io.file_size(file).and_then(|size| {
        let length = size.min(bytes_max.saturating_add(1));
        read_exact(io, file, 0, usize::try_from(length).unwrap_or(usize::MAX))
    });
    io.close(file);
    let bytes = result.map_err(|e| IoError::new("read", path, e))?;
    assert!(bytes.len() as u64 <= bytes_max.saturating_add(1), "the read is bounded");
    Ok(Some(bytes))
}
