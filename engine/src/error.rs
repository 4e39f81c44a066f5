//! Typed errors, one enum per operation, each convertible into [`Error`].
//!
//! Conditions the world can cause (damaged bytes, a full disk, EIO, a second process) are
//! errors; violated invariants panic.

pub use crate::io::IoError;
use std::fmt;
use std::path::PathBuf;

/// Damaged bytes found in a file, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corruption {
    pub file: PathBuf,
    /// Byte position in `file` where the damaged structure starts.
    pub position: u64,
    pub kind: CorruptionKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CorruptionKind {
    ChecksumMismatch {
        expected: u64,
        actual: u64,
    },
    BadMagic {
        found: u32,
    },
    UnsupportedVersion {
        found: u16,
    },
    BadLength {
        length: u64,
    },
    /// A batch whose checksum is valid but whose base offset is not the expected one.
    OffsetMismatch {
        expected: u64,
        found: u64,
    },
    /// The structure ends before its declared length, inside data that was already synced.
    Truncated {
        needed: u64,
        available: u64,
    },
    Malformed {
        reason: &'static str,
    },
}

impl fmt::Display for CorruptionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorruptionKind::ChecksumMismatch { expected, actual } => {
                write!(f, "checksum mismatch (expected {expected:#018x}, actual {actual:#018x})")
            }
            CorruptionKind::BadMagic { found } => write!(f, "bad magic {found:#010x}"),
            CorruptionKind::UnsupportedVersion { found } => {
                write!(f, "unsupported format version {found}")
            }
            CorruptionKind::BadLength { length } => write!(f, "impossible length {length}"),
            CorruptionKind::OffsetMismatch { expected, found } => {
                write!(f, "batch offset {found} where {expected} was expected")
            }
            CorruptionKind::Truncated { needed, available } => {
                write!(f, "truncated: {needed} bytes needed, {available} present")
            }
            CorruptionKind::Malformed { reason } => write!(f, "malformed: {reason}"),
        }
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corruption in {} at byte {}: {}", self.file.display(), self.position, self.kind)
    }
}

impl std::error::Error for Corruption {}

/// Errors of [`crate::Engine::open`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("data directory {} is locked by another process", path.display())]
    Locked { path: PathBuf },
    #[error("data directory {} has format version {found}; this build reads {supported}",
        path.display())]
    UnsupportedVersion { path: PathBuf, found: u16, supported: u16 },
    #[error(transparent)]
    Corruption(#[from] Corruption),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Errors of [`crate::Engine::close`]. The next open recovers as after a crash, except after
/// [`CloseError::Mark`]: every partition closed and only the mark is missing, so that open
/// reads each partition's bytes past its recovery point (none) and fsyncs it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloseError {
    /// A partition's last flush, sync or recovery point failed.
    #[error("close: {0}")]
    Partition(#[source] AppendError),
    /// The engine was poisoned before the close.
    #[error("close: {0}")]
    Poisoned(#[source] Poisoned),
    /// Every partition closed, but the clean-shutdown mark was not written.
    #[error("close: the clean-shutdown mark: {0}")]
    Mark(#[source] IoError),
}

/// Errors of topic management: create, delete, describe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    #[error("topic {name:?} does not exist")]
    NotFound { name: String },
    #[error("topic {name:?} already exists")]
    AlreadyExists { name: String },
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("invalid topic config: {reason}")]
    InvalidConfig { reason: String },
    /// Damaged files: the topic is kept closed by damage found at open
    /// ([`crate::Engine::damaged_topics`]), or a new partition did not open.
    #[error(transparent)]
    Corruption(#[from] Corruption),
    #[error("the data directory was opened read-only")]
    ReadOnly,
    #[error(transparent)]
    Poisoned(#[from] Poisoned),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Errors of [`crate::Engine::append`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    #[error("topic {topic:?} does not exist")]
    TopicNotFound { topic: String },
    #[error("topic {topic:?} has no partition {partition}")]
    PartitionNotFound { topic: String, partition: u32 },
    #[error("a batch must hold at least one record")]
    Empty,
    /// [`crate::Fetch::from_records`] got offsets that do not increase, or pass its end.
    #[error("records given with offsets out of order")]
    OffsetsOutOfOrder,
    #[error("the data directory was opened read-only")]
    ReadOnly,
    #[error("batch of {bytes} bytes exceeds the maximum of {max} bytes")]
    BatchTooLarge { bytes: u64, max: u64 },
    #[error("batch of {records} records exceeds the maximum of {max} records")]
    TooManyRecords { records: usize, max: u32 },
    /// The partition holds damaged synced data at its end (appending after it would hide
    /// it), or its topic is kept closed by damage ([`crate::Engine::damaged_topics`]).
    #[error("damaged, appends refused: {0}")]
    Corruption(Corruption),
    #[error(transparent)]
    Poisoned(#[from] Poisoned),
    #[error(transparent)]
    Io(#[from] IoError),
    /// More requests than the partition queues wait for it (behind a transaction that holds
    /// it, say); try again once some are answered.
    #[error("partition overloaded: {queued} requests wait already")]
    Overloaded { queued: usize },
}

/// Errors of reads: [`crate::Engine::read`] and timestamp lookups.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("topic {topic:?} does not exist")]
    TopicNotFound { topic: String },
    #[error("topic {topic:?} has no partition {partition}")]
    PartitionNotFound { topic: String, partition: u32 },
    #[error("offset {requested} is out of range [{start}, {end}]")]
    OffsetOutOfRange { requested: u64, start: u64, end: u64 },
    /// The read reached damaged data, or the topic is kept closed by damage
    /// ([`crate::Engine::damaged_topics`]).
    #[error(transparent)]
    Corruption(#[from] Corruption),
    /// A read-only open found that the writing process recovered and rewrote data this reader
    /// had already seen (it was never synced). Reopen to read the log as it is now.
    #[error("{} changed under a read-only open (the writer recovered); reopen it", path.display())]
    Changed { path: PathBuf },
    #[error(transparent)]
    Poisoned(#[from] Poisoned),
    #[error(transparent)]
    Io(#[from] IoError),
}

/// Errors of committing consumer offsets ([`crate::Engine::commit_offsets`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    #[error("invalid group name {name:?}: {reason}")]
    InvalidGroup { name: String, reason: &'static str },
    #[error("topic {topic:?} has no partition {partition}")]
    PartitionNotFound { topic: String, partition: u32 },
    /// Creating the internal offsets topic failed, or (`TopicError::Corruption`) a topic
    /// named, or `__consumer_offsets` itself, is kept closed by damage.
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error(transparent)]
    Append(#[from] AppendError),
}

/// The engine stopped accepting work after a failed write or fsync. Reopen it to recover.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("engine is poisoned by an earlier failure ({reason}); reopen it to recover")]
pub struct Poisoned {
    pub reason: String,
}

/// Any engine error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error(transparent)]
    Close(#[from] CloseError),
}

impl Error {
    /// The corruption evidence, if this error reports damaged data.
    pub fn corruption(&self) -> Option<&Corruption> {
        match self {
            Error::Open(OpenError::Corruption(c))
            | Error::Topic(TopicError::Corruption(c))
            | Error::Append(AppendError::Corruption(c))
            | Error::Read(ReadError::Corruption(c))
            | Error::Commit(
                CommitError::Append(AppendError::Corruption(c))
                | CommitError::Topic(TopicError::Corruption(c)),
            ) => Some(c),
            _ => None,
        }
    }
}
