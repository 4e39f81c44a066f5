//! The portable backend: positional reads and writes (`pread`/`pwrite`) on `std::fs` files.
//!
//! Operations of a batch run one after another on the calling thread, so a batch of a write
//! followed by an fdatasync is ordered. Many threads may submit at once.
//!
//! A file opened for direct writes has two descriptors: one with `O_DIRECT` (Linux) that the
//! writes go through, from a copy of the operation's buffer in an aligned allocation, and an
//! ordinary one for reads, syncs and truncates. Linux keeps the two coherent (a direct write
//! drops the cached pages it overwrites), and fsync and fdatasync act on the file, whichever
//! descriptor they are called on.

use super::aligned::AlignedBuffer;
use super::{Completion, DirectoryEntry, FileHandle, Io, Namespace, OpenMode, Operation};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The pread/pwrite backend of [`Io`].
#[derive(Debug, Default)]
pub struct PreadIo {
    files: RwLock<HashMap<u64, OpenFile>>,
    next_handle: AtomicU64,
}

/// The descriptors behind a handle.
#[derive(Debug)]
struct OpenFile {
    file: Arc<File>,
    /// Opened with `O_DIRECT`, for the writes of a direct handle.
    direct: Option<Arc<File>>,
}

impl PreadIo {
    pub fn new() -> Self {
        Self::default()
    }

    /// The ordinary descriptor of a handle: for reads, syncs and truncates.
    pub(super) fn file(&self, handle: FileHandle) -> io::Result<Arc<File>> {
        self.with_file(handle, |open| Arc::clone(&open.file))
    }

    /// The descriptor writes go through, and whether it is a direct one.
    pub(super) fn writer(&self, handle: FileHandle) -> io::Result<(Arc<File>, bool)> {
        self.with_file(handle, |open| match &open.direct {
            Some(direct) => (Arc::clone(direct), true),
            None => (Arc::clone(&open.file), false),
        })
    }

    fn with_file<T>(&self, handle: FileHandle, f: impl FnOnce(&OpenFile) -> T) -> io::Result<T> {
        self.files.read().get(&handle.0).map(f).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("unknown file handle {}", handle.0))
        })
    }

    fn insert(&self, file: File, direct: Option<File>) -> FileHandle {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let open = OpenFile { file: Arc::new(file), direct: direct.map(Arc::new) };
        let previous = self.files.write().insert(handle, open);
        assert!(previous.is_none(), "file handle reused");
        FileHandle(handle)
    }

    pub(super) fn execute(&self, operation: Operation) -> Completion {
        match operation {
            Operation::Read { file, position, mut buffer } => {
                let result = self.file(file).and_then(|f| read_at_most(&f, position, &mut buffer));
                if let Ok(length) = result {
                    buffer.truncate(length);
                }
                Completion { buffer, result }
            }
            Operation::Write { file, position, buffer } => {
                let result = self
                    .writer(file)
                    .and_then(|(f, direct)| write_all_at(&f, direct, &buffer, position))
                    .map(|()| buffer.len());
                Completion { buffer, result }
            }
            Operation::Fsync { file } => plain(self.file(file).and_then(|f| f.sync_all())),
            Operation::Fdatasync { file } => plain(self.file(file).and_then(|f| f.sync_data())),
            Operation::Truncate { file, length } => {
                plain(self.file(file).and_then(|f| f.set_len(length)))
            }
            Operation::Allocate { file, position, length } => {
                plain(self.file(file).and_then(|f| {
                    // Portable stand-in for fallocate: extend the size (sparsely) if needed.
                    let wanted = position.saturating_add(length);
                    if f.metadata()?.len() < wanted { f.set_len(wanted) } else { Ok(()) }
                }))
            }
        }
    }
}

/// Write all of `buffer`; through a direct descriptor from an aligned copy, after checking the
/// alignment the kernel would refuse with a less helpful error.
fn write_all_at(file: &File, direct: bool, buffer: &[u8], position: u64) -> io::Result<()> {
    if !direct {
        return file.write_all_at(buffer, position);
    }
    if !super::is_direct_aligned(position, buffer.len()) {
        return Err(super::misaligned_direct_write(position, buffer.len()));
    }
    if buffer.is_empty() {
        return Ok(());
    }
    file.write_all_at(AlignedBuffer::copy_of(buffer).as_slice(), position)
}

/// Open `path` a second time for direct writes.
fn open_direct(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path).map_err(|error| {
        io::Error::new(error.kind(), format!("opening for direct (O_DIRECT) writes: {error}"))
    })
}

fn plain(result: io::Result<()>) -> Completion {
    Completion { buffer: Vec::new(), result: result.map(|()| 0) }
}

fn read_at_most(file: &File, position: u64, buffer: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buffer.len() {
        match file.read_at(&mut buffer[done..], position + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(done)
}

impl Io for PreadIo {
    fn submit(&self, operations: Vec<Operation>) -> Vec<Completion> {
        operations.into_iter().map(|operation| self.execute(operation)).collect()
    }
}

impl Namespace for PreadIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        let file = match mode {
            OpenMode::Read | OpenMode::Directory => File::open(path)?,
            OpenMode::ReadWrite | OpenMode::ReadWriteDirect => {
                OpenOptions::new().read(true).write(true).open(path)?
            }
            OpenMode::CreateNew | OpenMode::CreateNewDirect => {
                OpenOptions::new().read(true).write(true).create_new(true).open(path)?
            }
        };
        let direct = if mode.is_direct() { Some(open_direct(path)?) } else { None };
        Ok(self.insert(file, direct))
    }

    fn close(&self, file: FileHandle) {
        self.files.write().remove(&file.0);
    }

    fn file_size(&self, file: FileHandle) -> io::Result<u64> {
        Ok(self.file(file)?.metadata()?.len())
    }

    fn create_directory(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    fn list(&self, directory: &Path) -> io::Result<Vec<DirectoryEntry>> {
        let mut entries = Vec::new();
        for entry in fs::read_dir(directory)? {
            let entry = entry?;
            let name = entry.file_name().into_string().map_err(|name| {
                io::Error::new(io::ErrorKind::InvalidData, format!("file name {}", name.display()))
            })?;
            entries.push(DirectoryEntry { name, is_directory: entry.file_type()?.is_dir() });
        }
        entries.sort();
        Ok(entries)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_directory(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir(path)
    }

    fn lock(&self, path: &Path) -> io::Result<FileHandle> {
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(self.insert(file, None)),
            Err(TryLockError::WouldBlock) => {
                Err(io::Error::new(io::ErrorKind::WouldBlock, "locked by another process"))
            }
            Err(TryLockError::Error(error)) => Err(error),
        }
    }
}
