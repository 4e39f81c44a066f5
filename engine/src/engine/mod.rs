//! The engine: a data directory of topics (`crate::layout` has its map), each a set of
//! partitions. This file holds the engine's state, open and the lookups; the rest is split by
//! responsibility:
//!
//! - `data.rs`: appends and reads, handed to the partition;
//! - `offsets.rs`: consumer offsets and transactions;
//! - `topics.rs`: admin of topics;
//! - `maintenance.rs`: interval flushes, retention, compaction, refresh.
//!
//! Locks: `topics` (the map of open topics, read-mostly) is never held while waiting for the
//! write path; the partitions' locks are described in `crate::partition`.

mod data;
mod maintenance;
mod offsets;
mod topics;

pub use offsets::{GroupCommit, TransactionWrite};
pub use topics::TopicDescription;

use crate::clean_shutdown;
use crate::context::{PartitionContext, Poison};
use crate::error::{CloseError, CorruptionKind, IoError, OpenError, Poisoned, TopicError};
use crate::format::meta::{DATA_DIRECTORY_VERSION, DataDirectoryMeta, MetaFile};
use crate::groups::{Committed, OFFSETS_TOPIC};
use crate::io::{FileHandle, Io};
use crate::layout::{
    LOCK_FILE, META_FILE, STATE_DIRECTORY, TOPICS_DIRECTORY, create_directories,
    create_directory_if_missing, fsync_directory, parent_of, remove_tree,
};
use crate::log::Durability;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::partition::Partition;
use crate::reactor::Reactor;
use crate::recovery::{DamagedTopic, PartitionRecovery, RecoveryReport};
use crate::segment;
use crate::state_dir::StateDir;
use crate::sync::{Mutex, RwLock};
use crate::topic::{TOPIC_META_FILE, TopicConfig};
use crate::write_path::WritePath;
use crate::{Clock, Corruption};
use std::collections::BTreeMap;
use std::io::ErrorKind::NotFound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// Options of [`Engine::open`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub durability: Durability,
    /// Open without the lock and without changing any file, beside a process that writes:
    /// no recovery is written (an unparsable tail is left unread), appends and topic changes
    /// fail with `ReadOnly`, and [`Engine::refresh`] picks up what the writer appended.
    /// Readers then see what the writer has written, synced or not.
    pub read_only: bool,
    /// The backend [`SystemIo`](crate::io::SystemIo) sets up for callers that open real files
    /// through it (the `chronik` crate and CLI): io_uring where available by default.
    /// `Engine::open` itself runs on whatever backend it is given.
    pub io_backend: crate::io::Backend,
    /// Write segment data with direct I/O (`O_DIRECT` on Linux), bypassing the page cache:
    /// appends write whole 4 KiB blocks (the partial last block rewritten from memory) and
    /// their data does not evict other files from the page cache. Reads still go through it.
    /// Off by default: without batching, each append waits for the device. Fails at open on a
    /// file system without direct I/O (tmpfs).
    pub direct_io: bool,
    /// Shards of partitions, each with its own write path: a reactor, one driver at a time,
    /// and on io_uring its own rings, so partitions of different shards are turned by
    /// different threads at once. 0 means one (`Engine::open`); the `chronik` crate sets one
    /// per core. At most [`WRITE_SHARDS_MAX`](crate::limits::WRITE_SHARDS_MAX).
    pub write_shards: usize,
    /// A partition's recovery point (below which an open after a crash reads nothing) moves
    /// once this many bytes past it are durable. 0 means
    /// [`RECOVERY_POINT_BYTES_DEFAULT`](crate::limits::RECOVERY_POINT_BYTES_DEFAULT).
    /// Each move writes the active segment's index files (about 5 bytes per 1 KiB of log).
    pub recovery_point_bytes: u64,
    /// ... or once this many milliseconds passed since the last move. 0 means
    /// [`RECOVERY_POINT_MS_DEFAULT`](crate::limits::RECOVERY_POINT_MS_DEFAULT).
    pub recovery_point_ms: u64,
    /// Threads that recover a topic's partitions at open, in parallel (the opening thread
    /// among them). 0 means one (`Engine::open`, and the simulator, which must stay
    /// deterministic); the `chronik` crate sets one per core.
    pub open_threads: usize,
}

#[derive(Debug)]
struct Topic<I: Io> {
    /// Changed only under `admin`, after `topic.meta` was rewritten.
    config: Mutex<TopicConfig>,
    partitions: Vec<Arc<Partition<I>>>,
}

type Topics<I> = BTreeMap<String, Arc<Topic<I>>>;

/// A topic's settings and its opened partitions.
type OpenedTopic<I> = (TopicConfig, Vec<Arc<Partition<I>>>);

/// Why a lookup found no partition.
enum Missing {
    Topic,
    Partition,
    /// The topic is kept closed by this damage.
    Damaged(Corruption),
}

/// What `open_locked` found.
struct Opened<I: Io> {
    topics: Topics<I>,
    damaged: BTreeMap<String, Corruption>,
    report: RecoveryReport,
    committed: Committed,
}

/// Why a topic did not open: damage keeps it closed (the open goes on), anything else fails
/// the open.
enum TopicOpenError {
    Damaged(Corruption),
    Failed(OpenError),
}

impl From<OpenError> for TopicOpenError {
    fn from(error: OpenError) -> Self {
        match error {
            OpenError::Corruption(damage) => TopicOpenError::Damaged(damage),
            other => TopicOpenError::Failed(other),
        }
    }
}

impl From<Corruption> for TopicOpenError {
    fn from(damage: Corruption) -> Self {
        TopicOpenError::Damaged(damage)
    }
}

impl From<IoError> for TopicOpenError {
    fn from(error: IoError) -> Self {
        TopicOpenError::Failed(error.into())
    }
}

#[derive(Debug)]
struct Inner<I: Io> {
    context: PartitionContext<I>,
    options: Options,
    root: PathBuf,
    topics: RwLock<Topics<I>>,
    /// Topics found damaged at open and not opened (never also in `topics`), with the
    /// evidence every operation on them reports. Changed only under `admin`.
    damaged: RwLock<BTreeMap<String, Corruption>>,
    /// Serialises topic creation and deletion (rare, and they touch the topics directory).
    admin: Mutex<()>,
    /// `None` when opened read-only.
    lock: Option<FileHandle>,
    /// The latest committed consumer offsets; held across a commit's append, so commits
    /// reach the offsets topic and this map in the same order.
    committed: Mutex<Committed>,
    /// [`Engine::close`] ran (or the drop did).
    closed: std::sync::atomic::AtomicBool,
}

impl<I: Io> Inner<I> {
    /// Close every partition, then write the clean-shutdown mark if all of them closed; the
    /// first failure is returned. Once only: later calls do nothing.
    fn close(&self) -> Result<(), CloseError> {
        if self.closed.swap(true, std::sync::atomic::Ordering::AcqRel) || self.lock.is_none() {
            return Ok(());
        }
        let io = &*self.context.io;
        let early = crate::canary::active(crate::canary::Canary::CleanMarkBeforeLastSync);
        if early {
            clean_shutdown::write(io, &self.root).map_err(CloseError::Mark)?;
        }
        let partitions: Vec<Arc<Partition<I>>> = {
            let topics = self.topics.read();
            topics.values().flat_map(|t| t.partitions.iter().cloned()).collect()
        };
        // Every partition, whatever the others did (a failure poisons, and the next open
        // recovers that one as after a crash), on as many threads as the open used: each
        // close waits for its last fsyncs.
        let closed =
            crate::parallel::map_parallel(self.context.open_threads, &partitions, |p| p.close());
        if let Some(error) = closed.into_iter().find_map(Result::err) {
            return Err(CloseError::Partition(error));
        }
        if let Err(poisoned) = self.context.poison.check() {
            return Err(CloseError::Poisoned(poisoned));
        }
        if !early {
            clean_shutdown::write(io, &self.root).map_err(CloseError::Mark)?;
        }
        Ok(())
    }
}

impl<I: Io> Drop for Inner<I> {
    fn drop(&mut self) {
        // Best effort: whatever failed, the next open recovers.
        let _ = self.close();
        if let Some(lock) = self.lock
            && !crate::canary::active(crate::canary::Canary::CloseLeaksLockHandle)
        {
            self.context.io.close(lock);
        }
    }
}

/// An open data directory. Cheap to clone; all clones share the same state. Closed (with a
/// final flush) when the last clone is dropped.
#[derive(Debug)]
pub struct Engine<I: Io> {
    inner: Arc<Inner<I>>,
}

impl<I: Io> Clone for Engine<I> {
    fn clone(&self) -> Self {
        Engine { inner: Arc::clone(&self.inner) }
    }
}

impl<I: Io> Engine<I> {
    /// Open (creating if needed) the data directory at `root`, recovering every partition.
    pub fn open(
        io: I,
        clock: Arc<dyn Clock>,
        root: &Path,
        options: Options,
    ) -> Result<(Self, RecoveryReport), OpenError> {
        let io = Arc::new(io);
        let lock = if options.read_only {
            None
        } else {
            create_directories(&*io, root)?;
            let lock = io.lock(&root.join(LOCK_FILE)).map_err(|e| {
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    OpenError::Locked { path: root.to_path_buf() }
                } else {
                    IoError::new("lock", &root.join(LOCK_FILE), e).into()
                }
            })?;
            Some(lock)
        };
        let poison: Arc<Poison> = Arc::default();
        let metrics: Arc<Metrics> = Arc::default();
        let shards = if options.read_only {
            0
        } else {
            options.write_shards.clamp(1, crate::limits::WRITE_SHARDS_MAX)
        };
        let submitted: Arc<AtomicU64> = Arc::default();
        let write_paths = (0..shards)
            .map(|_| {
                let mut reactor = Reactor::new(Arc::clone(&io));
                reactor.set_metrics(Arc::clone(&metrics), Arc::clone(&clock));
                let poisoned = Arc::clone(&poison);
                WritePath::with_poison(
                    reactor,
                    Arc::clone(&clock),
                    Box::new(move || poisoned.check().is_err()),
                    Arc::clone(&submitted),
                )
            })
            .collect();
        let context = PartitionContext {
            io,
            clock,
            poison,
            metrics,
            durability: options.durability,
            read_only: options.read_only,
            direct: options.direct_io && !options.read_only,
            clean_shutdown: false,
            open_threads: options.open_threads.max(1),
            recovery_point_bytes: match options.recovery_point_bytes {
                0 => crate::limits::RECOVERY_POINT_BYTES_DEFAULT,
                bytes => bytes,
            },
            recovery_point_ms: i64::try_from(match options.recovery_point_ms {
                0 => crate::limits::RECOVERY_POINT_MS_DEFAULT,
                ms => ms,
            })
            .unwrap_or(i64::MAX),
            write_paths,
        };
        let result = Self::open_locked(&context, root);
        let Opened { topics, damaged, report, committed } = match result {
            Ok(opened) => opened,
            Err(error) => {
                if let Some(lock) = lock {
                    context.io.close(lock);
                }
                return Err(error);
            }
        };
        let inner = Inner {
            context,
            options,
            root: root.to_path_buf(),
            topics: RwLock::new(topics),
            damaged: RwLock::new(damaged),
            admin: Mutex::new(()),
            lock,
            committed: Mutex::new(committed),
            closed: std::sync::atomic::AtomicBool::new(false),
        };
        Ok((Engine { inner: Arc::new(inner) }, report))
    }

    fn open_locked(context: &PartitionContext<I>, root: &Path) -> Result<Opened<I>, OpenError> {
        let io = &*context.io;
        let read_only = context.read_only;
        check_data_directory_meta(io, root, read_only)?;
        let topics_directory = root.join(TOPICS_DIRECTORY);
        if !read_only {
            create_directory_if_missing(io, &topics_directory)?;
            // Unconditionally: entries an earlier process created but was killed before
            // fsyncing (a topic renamed into place, say) must be durable before new appends.
            // The parent too: an earlier open may have created the data directory itself and
            // failed before that fsync (found by the simulator's faulty opens).
            fsync_directory(io, parent_of(root))?;
            fsync_directory(io, root)?;
            fsync_directory(io, &topics_directory)?;
        }
        let mut report = RecoveryReport::default();
        // Before anything else is written: from here on the mark would lie.
        let found = clean_shutdown::take(io, root, read_only)?;
        report.clean_shutdown = found == clean_shutdown::Found::Valid;
        report.clean_shutdown_unreadable = found == clean_shutdown::Found::Unreadable;
        let mut context = context.clone();
        context.clean_shutdown = report.clean_shutdown;
        let context = &context;
        let mut topics = BTreeMap::new();
        let entries = match io.list(&topics_directory) {
            Err(error) if read_only && error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            listed => listed.map_err(|e| IoError::new("list", &topics_directory, e))?,
        };
        // The offsets topic first: its transaction commit records say which transactional
        // batch at the end of another partition was committed.
        let mut entries = entries;
        entries.sort_by_key(|e| e.name != OFFSETS_TOPIC);
        let mut committed = Committed::default();
        let mut damaged = BTreeMap::new();
        for entry in entries.into_iter().filter(|e| e.is_directory) {
            let path = topics_directory.join(&entry.name);
            if entry.name.starts_with('.') && read_only {
                continue;
            }
            if entry.name.starts_with('.') {
                remove_tree(io, &path)?;
                fsync_directory(io, &topics_directory)?;
                report.removed_incomplete_topics.push(entry.name);
                continue;
            }
            let recoveries = &mut report.partitions;
            let opened = Self::open_topic(context, &path, &entry.name, &committed, recoveries);
            let (config, partitions) = match opened {
                Ok(Some(opened)) => opened,
                // A read-only open racing the writer's `delete_topic`.
                Ok(None) => continue,
                // One topic's damage never closes the others: this one is kept closed,
                // its files as they are, and every operation on it reports the damage.
                Err(TopicOpenError::Damaged(damage)) => {
                    tracing::error!(topic = %entry.name, %damage, "damaged topic not opened");
                    if entry.name == OFFSETS_TOPIC {
                        committed.damage = Some(damage.clone());
                    }
                    damaged.insert(entry.name.clone(), damage.clone());
                    report.damaged_topics.push(DamagedTopic { name: entry.name, damage });
                    continue;
                }
                Err(TopicOpenError::Failed(error)) => return Err(error),
            };
            if entry.name == OFFSETS_TOPIC
                && let Some(partition) = partitions.first()
            {
                committed = Self::load_committed(partition, &path)?;
            }
            topics.insert(entry.name, Arc::new(Topic { config: Mutex::new(config), partitions }));
        }
        report.committed_offsets_damage.clone_from(&committed.damage);
        Ok(Opened { topics, damaged, report, committed })
    }

    /// Open one topic's partitions, recovering each (what recovery did goes to `recoveries`,
    /// also for a topic then found damaged). `Ok(None)`: a read-only open found the topic
    /// gone (the writer deleted it meanwhile).
    fn open_topic(
        context: &PartitionContext<I>,
        path: &Path,
        name: &str,
        committed: &Committed,
        recoveries: &mut Vec<PartitionRecovery>,
    ) -> Result<Option<OpenedTopic<I>>, TopicOpenError> {
        let io = &*context.io;
        let read_only = context.read_only;
        let meta_path = path.join(TOPIC_META_FILE);
        let bytes = segment::read_small_file(io, &meta_path).map_err(OpenError::from)?;
        let Some(bytes) = bytes else {
            // A writer's delete renames the whole directory away first.
            if read_only && io.list(path).is_err_and(|e| e.kind() == NotFound) {
                return Ok(None);
            }
            // Creation writes `topic.meta` before the topic directory is renamed into place.
            let kind = CorruptionKind::Malformed { reason: "the file is missing" };
            return Err(TopicOpenError::Damaged(Corruption { file: meta_path, position: 0, kind }));
        };
        let config = TopicConfig::decode(&bytes).map_err(|kind| Corruption {
            file: meta_path.clone(),
            position: 0,
            kind,
        })?;
        if !read_only {
            fsync_directory(io, path)?;
        }
        let mut partitions: Vec<Arc<Partition<I>>> = Vec::with_capacity(config.partitions as usize);
        // Each partition's recovery is independent of the others': in parallel, each doing
        // work in proportion to its own unsynced tail.
        let ids: Vec<u32> = (0..config.partitions).collect();
        let opened = crate::parallel::map_parallel(context.open_threads, &ids, |&id| {
            let directory = path.join(id.to_string());
            let transaction_end = committed.transaction_end(name, id);
            Partition::open(context, directory, name, id, config, transaction_end)
        });
        let mut failure = None;
        for opened in opened {
            match opened {
                Ok((partition, recovery)) => {
                    recoveries.push(recovery);
                    partitions.push(partition);
                }
                Err(error) => {
                    failure = failure.or(Some(error));
                }
            }
        }
        if let Some(error) = failure {
            // The partitions opened so far leave the write path: the topic stays closed.
            for partition in &partitions {
                partition.mark_deleted();
            }
            return match error {
                OpenError::Io(e) if read_only && e.source.kind() == NotFound => Ok(None),
                OpenError::Corruption(damage) => Err(TopicOpenError::Damaged(damage)),
                other => Err(TopicOpenError::Failed(other)),
            };
        }
        assert_eq!(partitions.len(), config.partitions as usize, "every partition opened");
        Ok(Some((config, partitions)))
    }

    /// The directory where layers above the engine keep files of their own (stream
    /// processors' snapshots and disk stores), through this engine's I/O.
    pub fn state_dir(&self) -> StateDir {
        let io: Arc<dyn Io> = Arc::clone(&self.inner.context.io) as Arc<dyn Io>;
        StateDir::new(
            io,
            &self.inner.root,
            self.inner.root.join(STATE_DIRECTORY),
            self.inner.options.read_only,
            Arc::clone(&self.inner.context.poison),
        )
    }

    /// The engine clock's time, in milliseconds since the Unix epoch (simulated time under
    /// the simulator).
    pub fn now_ms(&self) -> i64 {
        self.inner.context.clock.now_ms()
    }

    /// Microseconds on the engine's clock that never goes back ([`crate::Clock::monotonic_us`]).
    pub fn monotonic_us(&self) -> u64 {
        self.inner.context.clock.monotonic_us()
    }

    pub fn options(&self) -> Options {
        self.inner.options
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    fn io(&self) -> &I {
        &self.inner.context.io
    }

    fn topics_directory(&self) -> PathBuf {
        self.inner.root.join(TOPICS_DIRECTORY)
    }

    fn topic(&self, name: &str) -> Option<Arc<Topic<I>>> {
        self.inner.topics.read().get(name).cloned()
    }

    /// A topic that is open: `NotFound`, or `Corruption` for a topic kept closed by damage.
    fn existing_topic(&self, name: &str) -> Result<Arc<Topic<I>>, TopicError> {
        if let Some(topic) = self.topic(name) {
            return Ok(topic);
        }
        // Looked up after `topics`: a repair adds the topic there before it leaves `damaged`.
        match self.damage_of(name) {
            Some(damage) => Err(TopicError::Corruption(damage)),
            None => Err(TopicError::NotFound { name: name.to_owned() }),
        }
    }

    /// The damage that keeps topic `name` closed, if it is.
    fn damage_of(&self, name: &str) -> Option<Corruption> {
        self.inner.damaged.read().get(name).cloned()
    }

    /// A partition, or why there is none.
    fn partition(&self, topic: &str, partition: u32) -> Result<Arc<Partition<I>>, Missing> {
        let found = self.existing_topic(topic).map_err(|error| match error {
            TopicError::Corruption(damage) => Missing::Damaged(damage),
            _ => Missing::Topic,
        })?;
        found.partitions.get(partition as usize).cloned().ok_or(Missing::Partition)
    }

    /// The topics found damaged at open and kept closed (see [`DamagedTopic`]), by name:
    /// every operation on them fails with the damage as `Corruption`.
    pub fn damaged_topics(&self) -> Vec<DamagedTopic> {
        let damaged = self.inner.damaged.read();
        let entries = damaged.iter();
        entries
            .map(|(name, damage)| DamagedTopic { name: name.clone(), damage: damage.clone() })
            .collect()
    }

    fn check_writable(&self) -> Result<(), TopicError> {
        if self.inner.options.read_only {
            return Err(TopicError::ReadOnly);
        }
        Ok(())
    }

    /// Every counter and latency histogram of this open engine (since it opened);
    /// [`MetricsSnapshot::prometheus`] gives them in the Prometheus text format.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.context.metrics.snapshot()
    }

    /// The live counters, for layers above the engine to add theirs (the SDK's restores).
    pub fn metrics_registry(&self) -> &Metrics {
        &self.inner.context.metrics
    }

    /// Close the engine: every partition's appends made durable, its recovery point moved to
    /// its end, then the clean-shutdown mark written, so that the next open reads and fsyncs
    /// nothing of a partition. Dropping the last clone does the same, without the result.
    /// Other clones see every partition closed: their appends are refused.
    ///
    /// # Errors
    /// The first failure; the next open then recovers as after a crash ([`CloseError`]).
    pub fn close(self) -> Result<(), CloseError> {
        self.inner.close()
    }

    /// Whether a failure has poisoned the engine, and why.
    pub fn poisoned(&self) -> Option<Poisoned> {
        self.inner.context.poison.check().err()
    }

    /// Poison the engine from outside, e.g. when a background worker panicked.
    pub(crate) fn poison(&self, reason: String) {
        self.inner.context.poison.set(reason);
    }

    fn all_partitions(&self) -> Vec<Arc<Partition<I>>> {
        let topics = self.inner.topics.read();
        topics.values().flat_map(|t| t.partitions.iter().cloned()).collect()
    }
}

/// Check `chronik.meta`, writing it on a new data directory (unless read-only).
fn check_data_directory_meta<I: Io + ?Sized>(
    io: &I,
    root: &Path,
    read_only: bool,
) -> Result<(), OpenError> {
    let path = root.join(META_FILE);
    let bytes = segment::read_small_file(io, &path)?;
    let Some(bytes) = bytes else {
        if read_only {
            let missing = std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not a Chronik data directory (no chronik.meta)",
            );
            return Err(IoError::new("open", &path, missing).into());
        }
        // A new directory gets `chronik.meta` before `topics/` exists, so topics without it
        // mean the file was lost: writing a fresh one would hide that.
        let topics = root.join(TOPICS_DIRECTORY);
        let holds_topics = match io.list(&topics) {
            Ok(entries) => entries.iter().any(|e| !e.name.starts_with('.')),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(IoError::new("list", &topics, e).into()),
        };
        if holds_topics {
            let kind = CorruptionKind::Malformed { reason: "missing, but topics/ holds topics" };
            return Err(Corruption { file: path, position: 0, kind }.into());
        }
        segment::write_file_durably(io, &path, DataDirectoryMeta::current().encode())?;
        fsync_directory(io, root)?;
        return Ok(());
    };
    let meta = DataDirectoryMeta::decode(&bytes).map_err(|kind| Corruption {
        file: path.clone(),
        position: 0,
        kind,
    })?;
    if meta.version() != DATA_DIRECTORY_VERSION {
        return Err(OpenError::UnsupportedVersion {
            path,
            found: meta.version(),
            supported: DATA_DIRECTORY_VERSION,
        });
    }
    Ok(())
}
