//! What a disk store's parts share, below all of them: its settings, its errors and the
//! directory its files live in (`Files`). Imports nothing else of `store/`.

use chronik_engine::canary::{self, Canary};
use chronik_engine::io::Io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A disk store's settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskOptions {
    /// The memory budget (a [`super::StoreMemory`]) the store's block cache, memtables, run
    /// indexes and Bloom filters live in. `None` (the default): the one every disk store of
    /// the application shares, `ProcessorConfig::store_memory` (by default the process's,
    /// [`super::StoreMemory::DEFAULT_BYTES`]). `Some(bytes)`: a budget of its own, shared
    /// by the store's partitions.
    pub budget_bytes: Option<usize>,
}

/// A damaged store file: which, and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub file: String,
    pub detail: &'static str,
}

impl Damage {
    pub fn new(file: &str, detail: &'static str) -> Damage {
        assert!(!file.is_empty(), "damage names its file");
        assert!(!detail.is_empty(), "damage says what was wrong");
        Damage { file: file.to_owned(), detail }
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.detail)
    }
}

/// A disk store's failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{operation} {}: {source}", path.display())]
    Io { operation: &'static str, path: PathBuf, source: std::io::Error },
    #[error("damaged store file {0}")]
    Damaged(Damage),
    #[error("disk stores need the embedded engine's data directory: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// The same failure again (an I/O error's kind and message; `std::io::Error` is not
    /// `Clone`): one for the caller, one remembered for the task.
    pub(crate) fn copy(&self) -> StoreError {
        match self {
            StoreError::Io { operation, path, source } => StoreError::Io {
                operation,
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            StoreError::Damaged(damage) => StoreError::Damaged(damage.clone()),
            StoreError::Unavailable(why) => StoreError::Unavailable(why.clone()),
        }
    }
}

impl From<chronik_engine::IoError> for StoreError {
    fn from(error: chronik_engine::IoError) -> StoreError {
        StoreError::Io { operation: error.operation, path: error.path, source: error.source }
    }
}

/// The canary that trusts damaged store bytes (checksums not compared).
pub(crate) fn canary_trusts_damage() -> bool {
    canary::active(Canary::StoreTrustsDamage)
}

/// Longest small store file (a manifest) that can be intact: far above any real one, so a
/// larger size is damage and is not read whole.
const SMALL_FILE_BYTES_MAX: u64 = 64 << 20;

/// One disk store's directory, and the I/O its files go through.
pub(crate) struct Files {
    pub io: Arc<dyn Io>,
    pub directory: PathBuf,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files").field("directory", &self.directory).finish_non_exhaustive()
    }
}

impl Files {
    pub fn path(&self, name: &str) -> PathBuf {
        // A store's files are plain names in its own directory, never a path out of it.
        assert!(
            !name.is_empty() && !name.contains('/') && name != "." && name != "..",
            "a store file is a plain name in its directory"
        );
        let path = self.directory.join(name);
        assert_eq!(path.parent(), Some(self.directory.as_path()), "a store's path is inside it");
        path
    }

    pub fn error(operation: &'static str, path: &Path, source: std::io::Error) -> StoreError {
        StoreError::Io { operation, path: path.to_owned(), source }
    }

    /// Create the directory if missing, durably.
    pub fn create_directory(&self) -> Result<(), StoreError> {
        // A store's directory is one of its own, never the root or a path that climbs out.
        assert!(self.directory.file_name().is_some(), "a store's directory has a name");
        match self.io.create_directory(&self.directory) {
            Ok(()) => {
                let parent = self.directory.parent().unwrap_or(Path::new("/"));
                chronik_engine::io::sync_directory(&*self.io, parent)
                    .map_err(|e| Files::error("fsync", parent, e))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(Files::error("create directory", &self.directory, e)),
        }
    }

    /// Make the directory's entries durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        assert!(self.directory.file_name().is_some(), "a store's directory has a name");
        chronik_engine::io::sync_directory(&*self.io, &self.directory)
            .map_err(|e| Files::error("fsync", &self.directory, e))
    }

    pub fn list(&self) -> Result<Vec<String>, StoreError> {
        let entries =
            self.io.list(&self.directory).map_err(|e| Files::error("list", &self.directory, e))?;
        assert!(entries.iter().all(|e| !e.name.contains('/')), "a listing gives plain names");
        // The `Io::list` contract: sorted by name, without the directory's `.` and `..`.
        assert!(
            entries.windows(2).all(|pair| pair[0].name < pair[1].name)
                && entries.iter().all(|e| e.name != "." && e.name != ".."),
            "a listing is sorted, without . and .."
        );
        Ok(entries.into_iter().filter(|e| !e.is_directory).map(|e| e.name).collect())
    }

    pub fn remove_if_present(&self, path: &Path) -> Result<(), StoreError> {
        assert_eq!(path.parent(), Some(self.directory.as_path()), "a store removes only its own");
        assert!(path.file_name().is_some(), "a store removes a file, never its directory");
        match self.io.remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Files::error("remove", path, e))
            }
            _ => Ok(()),
        }
    }

    /// The whole of a small file, if it exists.
    pub fn read_small(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let bytes = chronik_engine::io::read_file_bounded(
            &*self.io,
            &self.path(name),
            SMALL_FILE_BYTES_MAX,
        )
        .map_err(StoreError::from)?;
        // Pair with `write_durably`: a small file is read within the bound it was written in,
        // or (a longer one, damaged) only to a byte past it, which no decoder accepts.
        assert!(
            bytes.as_ref().is_none_or(|b| b.len() as u64 <= SMALL_FILE_BYTES_MAX + 1),
            "a small file read is within its bound"
        );
        Ok(bytes)
    }

    /// Replace `name` with `bytes` atomically and durably: a temporary file, fdatasync,
    /// rename (the engine's state-file protocol), then the directory fsync.
    pub fn write_durably(&self, name: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        assert!(bytes.len() > 8, "a file written whole holds more than its checksum");
        // Pair with `read_small`, which would refuse a larger file as damage.
        assert!(bytes.len() as u64 <= SMALL_FILE_BYTES_MAX, "a file written whole reads back");
        chronik_engine::io::replace_file(&*self.io, &self.path(name), bytes)?;
        self.sync()
    }
}

/// Whether `low` is at most `high` where both bound a key: what a range that is not
/// [`is_empty_range`] has (`BTreeMap::range` and a disk range's cursors take them so).
pub(crate) fn bounds_ordered(low: Bound<&[u8]>, high: Bound<&[u8]>) -> bool {
    match (low, high) {
        (Bound::Included(l) | Bound::Excluded(l), Bound::Included(h) | Bound::Excluded(h)) => {
            l <= h
        }
        _ => true,
    }
}

/// Whether no key can lie between `low` and `high`.
pub(crate) fn is_empty_range(low: Bound<&[u8]>, high: Bound<&[u8]>) -> bool {
    match (low, high) {
        (Bound::Included(l), Bound::Included(h)) => l > h,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(h))
        | (Bound::Excluded(l), Bound::Included(h)) => l >= h,
        _ => false,
    }
}
