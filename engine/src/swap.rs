//! The swap protocol of compaction, shared by the cleaner (which commits and finishes swaps)
//! and recovery (which finishes a committed swap a crash interrupted and removes uncommitted
//! output). docs/format.md, "Compaction":
//!
//! 1. the cleaned group is written to `<base>.log.cleaned` and fdatasynced;
//! 2. [`commit_swap`]: renamed to `<base>.log.swap`, the directory fsynced (the commit point);
//! 3. [`finish_swap`]: the sources' files removed, the directory fsynced, `<base>.log.swap`
//!    renamed to `<base>.log`, the directory fsynced.
//!
//! A leaf module: it uses nothing of the engine but file names, `io` and the canaries.

use crate::Offset;
use crate::canary::{self, Canary};
use crate::error::IoError;
use crate::io::Io;
use crate::layout::{INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, file_name, fsync_directory};
use std::path::{Path, PathBuf};

/// Suffix of a cleaned segment being written.
pub const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of a cleaned segment whose swap is committed.
pub const SWAP_SUFFIX: &str = ".swap";

/// `<directory>/<base><suffix>`, the suffix after `.log` for cleaner files.
pub fn path_with(directory: &Path, base: Offset, suffix: &str) -> PathBuf {
    directory.join(format!("{}{suffix}", file_name(base, LOG_SUFFIX)))
}

/// Commit a cleaned group: rename `.cleaned` to `.swap` and fsync the directory. From here a
/// crash ends with the swap finished by recovery.
pub fn commit_swap<I: Io + ?Sized>(io: &I, directory: &Path, base: Offset) -> Result<(), IoError> {
    let cleaned = path_with(directory, base, CLEANED_SUFFIX);
    let swap = path_with(directory, base, SWAP_SUFFIX);
    io.rename(&cleaned, &swap).map_err(|e| IoError::new("rename", &cleaned, e))?;
    if canary::active(Canary::SwapWithoutDirectoryFsync) {
        return Ok(());
    }
    fsync_directory(io, directory)
}

/// Finish a committed swap: remove the sources' files (every segment with a base in
/// `sources`, and whatever is left of the segment at `base`), fsync the directory, rename
/// `.swap` to `.log`, fsync the directory.
///
/// The fsync between the removals and the rename is what keeps a crash from making the
/// rename durable without every removal: nothing orders a directory's unsynced changes, and
/// a cleaned `<base>.log` beside a surviving source would overlap it.
pub fn finish_swap<I: Io + ?Sized>(
    io: &I,
    directory: &Path,
    base: Offset,
    sources: &[Offset],
) -> Result<(), IoError> {
    // The base's own files go too even when its log is already gone: index files left
    // beside the new log would describe the old one.
    let others = sources.iter().copied().filter(|&source| source != base);
    for source in std::iter::once(base).chain(others) {
        remove_segment_files(io, directory, source)?;
    }
    if !canary::active(Canary::SwapRenameBeforeRemovalsSynced) {
        fsync_directory(io, directory)?;
    }
    let swap = path_with(directory, base, SWAP_SUFFIX);
    let log = directory.join(file_name(base, LOG_SUFFIX));
    io.rename(&swap, &log).map_err(|e| IoError::new("rename", &swap, e))?;
    fsync_directory(io, directory)
}

/// Remove a segment's log and index files (whichever exist).
pub fn remove_segment_files<I: Io + ?Sized>(
    io: &I,
    directory: &Path,
    base: Offset,
) -> Result<(), IoError> {
    for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX] {
        crate::io::remove_if_present(io, &directory.join(file_name(base, suffix)))?;
    }
    Ok(())
}
