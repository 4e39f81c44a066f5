//! Where things live in a data directory (docs/format.md): the names of its directories and
//! files, and the directory operations every module shares. A leaf module: it uses nothing of
//! the engine but `io` and `Offset`.
//!
//! ```text
//! DIR/LOCK                      advisory lock held while open
//! DIR/chronik.meta              data directory format version
//! DIR/state/                    files applications keep beside their topics
//! DIR/topics/NAME/topic.meta    topic config
//! DIR/topics/NAME/P/            partition P: 00000000000000000000.log, .index, .timeindex, ...
//!                               and synced.checkpoint
//! DIR/topics/.NAME.creating     a topic being created (removed at open if a crash left it)
//! DIR/topics/.NAME.deleting     a topic being deleted (removed at open if a crash left it)
//! ```

use crate::Offset;
use crate::error::IoError;
use crate::io::{self, Io};
use std::path::{Path, PathBuf};

pub const LOCK_FILE: &str = "LOCK";
/// The clean-shutdown mark in the data directory (`clean_shutdown.rs`).
pub const CLEAN_SHUTDOWN_FILE: &str = "clean.shutdown";
pub const META_FILE: &str = "chronik.meta";
/// Files applications keep beside their topics
/// ([`Engine::write_state_file`](crate::Engine::write_state_file)).
pub const STATE_DIRECTORY: &str = "state";
pub const TOPICS_DIRECTORY: &str = "topics";
pub const CREATING_SUFFIX: &str = ".creating";
pub const DELETING_SUFFIX: &str = ".deleting";

pub const LOG_SUFFIX: &str = ".log";
pub const INDEX_SUFFIX: &str = ".index";
pub const TIME_INDEX_SUFFIX: &str = ".timeindex";
pub use crate::io::TEMPORARY_SUFFIX;

/// `00000000000000001234.log`: the base offset, zero-padded to 20 digits so names sort.
pub fn file_name(base_offset: Offset, suffix: &str) -> String {
    format!("{:020}{suffix}", base_offset.get())
}

/// The base offset of a segment log file name, or `None` for any other name.
pub fn parse_log_file_name(name: &str) -> Option<Offset> {
    let digits = name.strip_suffix(LOG_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Offsets this large cannot come from appends; such a name is not one of ours, and taking it
    // would let the next append overflow.
    digits.parse().ok().filter(|&base: &u64| base <= u64::MAX / 2).map(Offset::new)
}

/// The path of a partition's directory from the data directory's root (for tests and tools).
pub fn partition_directory(root: &Path, topic: &str, partition: u32) -> PathBuf {
    root.join(TOPICS_DIRECTORY).join(topic).join(partition.to_string())
}

/// fsync a directory, so the entries created, renamed or removed in it are durable.
pub fn fsync_directory<I: Io + ?Sized>(io: &I, directory: &Path) -> Result<(), IoError> {
    io::sync_directory(io, directory).map_err(|e| IoError::new("fsync", directory, e))
}

/// Create `path` (its parent must exist); returns whether the directory was created.
pub fn create_directory_if_missing<I: Io + ?Sized>(io: &I, path: &Path) -> Result<bool, IoError> {
    match io.create_directory(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(error) => Err(IoError::new("mkdir", path, error)),
    }
}

/// The directory holding `path`'s entry (`.` for a bare relative name, `/` for the root).
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if parent.as_os_str().is_empty() => Path::new("."),
        Some(parent) => parent,
        None => path,
    }
}

/// Create `path` and any missing parent, fsyncing each parent whose entries changed.
pub fn create_directories<I: Io + ?Sized>(io: &I, path: &Path) -> Result<(), IoError> {
    let parent = parent_of(path);
    match io.create_directory(path) {
        Ok(()) => fsync_directory(io, parent),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && path.parent().is_some() => {
            create_directories(io, parent)?;
            io.create_directory(path).map_err(|e| IoError::new("mkdir", path, e))?;
            fsync_directory(io, parent)
        }
        Err(error) => Err(IoError::new("mkdir", path, error)),
    }
}

/// Remove a directory and everything under it. Bounded by the tree's depth (three levels in a
/// data directory).
pub fn remove_tree<I: Io + ?Sized>(io: &I, path: &Path) -> Result<(), IoError> {
    let entries = io.list(path).map_err(|e| IoError::new("list", path, e))?;
    for entry in entries {
        let child = path.join(&entry.name);
        if entry.is_directory {
            remove_tree(io, &child)?;
        } else {
            io.remove_file(&child).map_err(|e| IoError::new("remove", &child, e))?;
        }
    }
    io.remove_directory(path).map_err(|e| IoError::new("rmdir", path, e))
}
