//! The state directory: `<root>/state/`, where layers above the engine keep files of their own
//! (stream processors' store snapshots and disk stores, the mirror's progress) through the
//! engine's I/O, so that under the simulator they live on the simulated disk too.
//!
//! Invariants: nothing is written here by a read-only open; every write is durable when it
//! returns (temporary file, fdatasync, rename, directory fsync); no path outside the directory
//! is read or written.

use crate::context::Poison;
use crate::error::{IoError, TopicError};
use crate::io::Io;
use crate::layout::{create_directory_if_missing, fsync_directory, parent_of};
use crate::segment;
use crate::topic;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A handle on an engine's state directory, from [`Engine::state_dir`](crate::Engine::state_dir).
#[derive(Clone)]
pub struct StateDir {
    io: Arc<dyn Io>,
    root: PathBuf,
    path: PathBuf,
    read_only: bool,
    poison: Arc<Poison>,
}

impl std::fmt::Debug for StateDir {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("StateDir")
            .field("path", &self.path)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

impl StateDir {
    pub(crate) fn new(
        io: Arc<dyn Io>,
        root: &Path,
        path: PathBuf,
        read_only: bool,
        poison: Arc<Poison>,
    ) -> StateDir {
        assert_eq!(parent_of(&path), root, "the state directory is a child of the root");
        StateDir { io, root: root.to_path_buf(), path, read_only, poison }
    }

    /// The directory's path (it may not exist yet: [`StateDir::create`] makes it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The engine's I/O, for files kept here that are larger than a snapshot (disk stores).
    pub fn io(&self) -> &Arc<dyn Io> {
        &self.io
    }

    /// Create the directory, durably, if it is missing.
    pub fn create(&self) -> Result<(), TopicError> {
        self.check_writable()?;
        if create_directory_if_missing(&*self.io, &self.path)? {
            fsync_directory(&*self.io, &self.root)?;
        }
        Ok(())
    }

    /// The file `name` (one path component: 1 to 200 bytes of ASCII letters, digits, `.`, `_`,
    /// `-`, not starting with `.`), if it exists.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, TopicError> {
        topic::validate_name(name)?;
        Ok(self.read_file(&self.path.join(name))?)
    }

    /// Replace the file `name` with `bytes`, durably (see [`StateDir::read`] for names).
    pub fn write(&self, name: &str, bytes: Vec<u8>) -> Result<(), TopicError> {
        topic::validate_name(name)?;
        self.create()?;
        self.write_file(&self.path.join(name), bytes)?;
        fsync_directory(&*self.io, &self.path)?;
        Ok(())
    }

    /// The whole of a small file at `path`, below this directory, if it exists. Of a file
    /// longer than any small file can be, only a prefix is read: its decoder then sees a
    /// length no intact file has.
    pub fn read_file(&self, path: &Path) -> Result<Option<Vec<u8>>, IoError> {
        assert!(path.starts_with(&self.path), "{} lies in the state directory", path.display());
        let bytes = segment::read_small_file(&*self.io, path)?;
        assert!(
            bytes.as_ref().is_none_or(|b| b.len() as u64 <= segment::SMALL_FILE_BYTES_MAX + 1),
            "a small file's read is bounded",
        );
        Ok(bytes)
    }

    /// Replace the file at `path`, below this directory, with `bytes` through a temporary
    /// file, fdatasync and rename. The caller fsyncs the file's directory to make the rename
    /// durable. Refused (`PermissionDenied`) when the engine was opened read-only.
    pub fn write_file(&self, path: &Path, bytes: Vec<u8>) -> Result<(), IoError> {
        assert!(path.starts_with(&self.path), "{} lies in the state directory", path.display());
        if self.read_only {
            let refused = std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the data directory was opened read-only",
            );
            return Err(IoError::new("write", path, refused));
        }
        segment::write_file_durably(&*self.io, path, bytes)
    }

    fn check_writable(&self) -> Result<(), TopicError> {
        if self.read_only {
            return Err(TopicError::ReadOnly);
        }
        self.poison.check()?;
        Ok(())
    }
}
