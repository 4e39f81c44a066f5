//! The portable backend: positional reads and writes (`pread`/`pwrite`) on `std::fs` files.
//!
//! Operations of a batch run one after another on the calling thread, so a batch of a write
//! followed by an fdatasync is ordered. Many threads may submit at once.

use super::{Completion, DirectoryEntry, FileHandle, Io, OpenMode, Operation};
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
    files: RwLock<HashMap<u64, Arc<File>>>,
    next_handle: AtomicU64,
}

impl PreadIo {
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn file(&self, handle: FileHandle) -> io::Result<Arc<File>> {
        self.files.read().get(&handle.0).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("unknown file handle {}", handle.0))
        })
    }

    fn insert(&self, file: File) -> FileHandle {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let previous = self.files.write().insert(handle, Arc::new(file));
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
                    .file(file)
                    .and_then(|f| f.write_all_at(&buffer, position))
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

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        let file = match mode {
            OpenMode::Read | OpenMode::Directory => File::open(path)?,
            OpenMode::ReadWrite => OpenOptions::new().read(true).write(true).open(path)?,
            OpenMode::CreateNew => {
                OpenOptions::new().read(true).write(true).create_new(true).open(path)?
            }
        };
        Ok(self.insert(file))
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
            Ok(()) => Ok(self.insert(file)),
            Err(TryLockError::WouldBlock) => {
                Err(io::Error::new(io::ErrorKind::WouldBlock, "locked by another process"))
            }
            Err(TryLockError::Error(error)) => Err(error),
        }
    }
}
