//! The engine: a data directory of topics, each a set of partitions.
//!
//! Layout of a data directory (see docs/format.md):
//!
//! ```text
//! DIR/LOCK                      advisory lock held while open
//! DIR/chronik.meta              data directory format version
//! DIR/topics/NAME/topic.meta    topic config
//! DIR/topics/NAME/P/            partition P: 00000000000000000000.log, .index, .timeindex, ...
//!                               and synced.checkpoint
//! DIR/topics/.NAME.creating     a topic being created (removed at open if a crash left it)
//! DIR/topics/.NAME.deleting     a topic being deleted (removed at open if a crash left it)
//! ```

use crate::error::{
    AppendError, CommitError, CorruptionKind, IoError, OpenError, Poisoned, ReadError, TopicError,
};
use crate::fetch::Fetch;
use crate::format::meta::{DATA_DIRECTORY_VERSION, DataDirectoryMeta, MetaFile};
use crate::groups::{self, CommitKey, Committed, OFFSETS_TOPIC};
use crate::io::{self, FileHandle, Io};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::partition::{
    Appended, CompactionFailure, CompactionReport, Partition, PartitionContext,
    PartitionDescription, PendingAppend,
};
use crate::reactor::Reactor;
use crate::recovery::RecoveryReport;
use crate::segment;
use crate::sync::{Mutex, RwLock};
use crate::topic::{self, TOPIC_META_FILE, TopicConfig};
use crate::write_path::WritePath;
use crate::{Clock, Corruption, Offset, Record};
use std::collections::BTreeMap;
use std::io::ErrorKind::NotFound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const LOCK_FILE: &str = "LOCK";
pub(crate) const META_FILE: &str = "chronik.meta";
/// Files applications keep beside their topics ([`Engine::write_state_file`]).
const STATE_DIRECTORY: &str = "state";
pub(crate) const TOPICS_DIRECTORY: &str = "topics";
const CREATING_SUFFIX: &str = ".creating";
const DELETING_SUFFIX: &str = ".deleting";

/// When an append is acknowledged, and what a crash may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// Acknowledged after the records and the metadata needed to read them are fsynced.
    /// Concurrent appenders to a partition share fsyncs (group commit). Readers see records
    /// only once they are durable.
    #[default]
    Sync,
    /// Acknowledged when written to the OS; fsynced by [`Engine::tick`] at most `ms` later.
    /// A crash loses at most the last `ms` of acknowledged records. Readers see records once
    /// they are durable.
    Interval { ms: u64 },
    /// Acknowledged when written to the OS; fsynced only when a segment rolls and on close.
    /// Readers see records at once.
    Os,
}

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
}

/// The fail-stop flag: set by the first failed write or fsync, checked by every operation.
#[derive(Debug, Default)]
pub struct Poison {
    poisoned: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Poison {
    pub fn set(&self, reason: String) {
        let mut slot = self.reason.lock();
        if slot.is_none() {
            *slot = Some(reason);
        }
        self.poisoned.store(true, Ordering::Release);
    }

    pub fn check(&self) -> Result<(), Poisoned> {
        if !self.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        let reason = self.reason.lock().clone().unwrap_or_default();
        Err(Poisoned { reason })
    }
}

/// A partition a transaction holds, the partition's name, and what its batch got.
type Held<'a, I> = (Arc<Partition<I>>, (&'a str, u32), Appended);

/// The consumer offsets a transaction commits ([`Engine::commit_transaction`]): for `group`,
/// each `(topic, partition, offset to read next)`.
#[derive(Clone, Copy, Debug)]
pub struct GroupCommit<'a> {
    pub group: &'a str,
    pub offsets: &'a [(&'a str, u32, Offset)],
}

/// One write of a transaction ([`Engine::commit_transaction`]).
#[derive(Clone, Copy, Debug)]
pub struct TransactionWrite<'a> {
    pub topic: &'a str,
    pub partition: u32,
    pub records: &'a [Record<'a>],
}

/// A topic as [`Engine::describe_topic`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub config: TopicConfig,
    pub partitions: Vec<PartitionDescription>,
}

#[derive(Debug)]
struct Topic<I: Io> {
    /// Changed only under `admin`, after `topic.meta` was rewritten.
    config: Mutex<TopicConfig>,
    partitions: Vec<Arc<Partition<I>>>,
}

type Topics<I> = BTreeMap<String, Arc<Topic<I>>>;

#[derive(Debug)]
struct Inner<I: Io> {
    context: PartitionContext<I>,
    options: Options,
    root: PathBuf,
    topics: RwLock<Topics<I>>,
    /// Serialises topic creation and deletion (rare, and they touch the topics directory).
    admin: Mutex<()>,
    /// `None` when opened read-only.
    lock: Option<FileHandle>,
    /// The latest committed consumer offsets; held across a commit's append, so commits
    /// reach the offsets topic and this map in the same order.
    committed: Mutex<Committed>,
}

impl<I: Io> Drop for Inner<I> {
    fn drop(&mut self) {
        for topic in self.topics.get_mut().values() {
            for partition in &topic.partitions {
                // Best effort: a failure poisons, and the next open recovers.
                let _ = partition.close();
            }
        }
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
        let write_path = (!options.read_only).then(|| {
            let mut reactor = Reactor::new(Arc::clone(&io));
            reactor.set_metrics(Arc::clone(&metrics), Arc::clone(&clock));
            let poisoned = Arc::clone(&poison);
            WritePath::with_poison(
                reactor,
                Arc::clone(&clock),
                Box::new(move || poisoned.check().is_err()),
            )
        });
        let context = PartitionContext {
            io,
            clock,
            poison,
            metrics,
            durability: options.durability,
            read_only: options.read_only,
            direct: options.direct_io && !options.read_only,
            write_path,
        };
        let result = Self::open_locked(&context, root);
        let (topics, report, committed) = match result {
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
            admin: Mutex::new(()),
            lock,
            committed: Mutex::new(committed),
        };
        Ok((Engine { inner: Arc::new(inner) }, report))
    }

    fn open_locked(
        context: &PartitionContext<I>,
        root: &Path,
    ) -> Result<(Topics<I>, RecoveryReport, Committed), OpenError> {
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
            sync(io, parent_of(root))?;
            sync(io, root)?;
            sync(io, &topics_directory)?;
        }
        let mut report = RecoveryReport::default();
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
        'topics: for entry in entries.into_iter().filter(|e| e.is_directory) {
            let path = topics_directory.join(&entry.name);
            if entry.name.starts_with('.') && read_only {
                continue;
            }
            if entry.name.starts_with('.') {
                remove_tree(io, &path)?;
                sync(io, &topics_directory)?;
                report.removed_incomplete_topics.push(entry.name);
                continue;
            }
            let meta_path = path.join(TOPIC_META_FILE);
            let bytes = segment::read_small_file(io, &meta_path)?;
            if read_only && bytes.is_none() {
                // The writer deleted the topic while this reader was listing.
                continue;
            }
            let Some(bytes) = bytes else {
                let kind = CorruptionKind::Malformed { reason: "the file is missing" };
                return Err(Corruption { file: meta_path, position: 0, kind }.into());
            };
            let config = TopicConfig::decode(&bytes).map_err(|kind| Corruption {
                file: meta_path.clone(),
                position: 0,
                kind,
            })?;
            if !read_only {
                sync(io, &path)?;
            }
            let mut partitions = Vec::with_capacity(config.partitions as usize);
            for id in 0..config.partitions {
                let directory = path.join(id.to_string());
                let transaction_end = committed.transaction_end(&entry.name, id);
                let opened =
                    Partition::open(context, directory, &entry.name, id, config, transaction_end);
                let (partition, recovery) = match opened {
                    // A read-only open racing the writer's `delete_topic`.
                    Err(OpenError::Io(e)) if read_only && e.source.kind() == NotFound => {
                        continue 'topics;
                    }
                    other => other?,
                };
                report.partitions.push(recovery);
                partitions.push(partition);
            }
            if entry.name == OFFSETS_TOPIC
                && let Some(partition) = partitions.first()
            {
                committed = Self::load_committed(partition, &path)?;
            }
            topics.insert(entry.name, Arc::new(Topic { config: Mutex::new(config), partitions }));
        }
        Ok((topics, report, committed))
    }

    /// Write a small file the application keeps beside its topics (stream processors keep
    /// their store snapshots so), under `<root>/state/`, durably: temporary file, fdatasync,
    /// rename, directory fsync. `name` is one path component (1 to 200 bytes of ASCII letters,
    /// digits, `.`, `_`, `-`, not starting with `.`).
    pub fn write_state_file(&self, name: &str, bytes: Vec<u8>) -> Result<(), TopicError> {
        self.check_writable()?;
        self.inner.context.poison.check()?;
        topic::validate_name(name)?;
        let io = self.io();
        let directory = self.inner.root.join(STATE_DIRECTORY);
        if create_directory_if_missing(io, &directory)? {
            sync(io, &self.inner.root)?;
        }
        segment::write_file_durably(io, &directory.join(name), bytes)?;
        sync(io, &directory)?;
        Ok(())
    }

    /// A file [`Engine::write_state_file`] wrote, if it exists.
    pub fn read_state_file(&self, name: &str) -> Result<Option<Vec<u8>>, TopicError> {
        topic::validate_name(name)?;
        let path = self.inner.root.join(STATE_DIRECTORY).join(name);
        Ok(segment::read_small_file(self.io(), &path)?)
    }

    /// The engine clock's time, in milliseconds since the Unix epoch (simulated time under
    /// the simulator).
    pub fn now_ms(&self) -> i64 {
        self.inner.context.clock.now_ms()
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

    /// Create a topic. Crash-safe: the topic is built in a hidden directory, fsynced, and
    /// renamed into place; a crash before the rename leaves nothing behind after the next open.
    /// Names starting with `__` are reserved for internal topics.
    pub fn create_topic(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        if groups::is_internal(name) {
            let reason = "names starting with \"__\" are reserved for internal topics";
            return Err(TopicError::InvalidName { name: name.to_owned(), reason });
        }
        if self.topic(name).is_none() {
            // A topic of this name deleted before (and a crash before its records were
            // forgotten): its transactions' ends must not speak for the new one.
            self.forget_commits(name).map_err(|e| self.as_topic_error(e, name))?;
        }
        self.create_any_topic(name, config)
    }

    /// Tombstone every commit record of `topic` in `__consumer_offsets` (transactions' and
    /// groups' offsets), durably, so a topic created again under the name inherits none.
    fn forget_commits(&self, topic: &str) -> Result<(), CommitError> {
        let mut committed = self.inner.committed.lock();
        let keys = committed.keys_of_topic(topic);
        if keys.is_empty() {
            return Ok(());
        }
        let encoded: Vec<Vec<u8>> = keys.iter().map(CommitKey::encode).collect();
        let records: Vec<Record<'_>> = encoded.iter().map(|k| Record::new(Some(k), b"")).collect();
        self.append(OFFSETS_TOPIC, 0, &records)?;
        if self.inner.options.durability != Durability::Sync {
            self.partition_for_append(OFFSETS_TOPIC, 0)?.flush()?;
        }
        for key in &keys {
            committed.remove(key);
        }
        Ok(())
    }

    fn create_any_topic(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        self.check_writable()?;
        topic::validate_name(name)?;
        config.validate()?;
        self.inner.context.poison.check()?;
        let _admin = self.inner.admin.lock();
        if self.inner.topics.read().contains_key(name) {
            return Err(TopicError::AlreadyExists { name: name.to_owned() });
        }
        let io = self.io();
        let topics_directory = self.topics_directory();
        let staging = topics_directory.join(format!(".{name}{CREATING_SUFFIX}"));
        let final_path = topics_directory.join(name);
        let result = (|| {
            if io.list(&staging).is_ok() {
                remove_tree(io, &staging)?;
            }
            io.create_directory(&staging).map_err(|e| IoError::new("mkdir", &staging, e))?;
            segment::write_file_durably(io, &staging.join(TOPIC_META_FILE), config.encode())?;
            for id in 0..config.partitions {
                Partition::<I>::create_files(io, &staging.join(id.to_string()))?;
            }
            sync(io, &staging)?;
            io.rename(&staging, &final_path).map_err(|e| IoError::new("rename", &staging, e))?;
            if crate::canary::active(crate::canary::Canary::TopicCreateNotDurable) {
                return Ok(());
            }
            sync(io, &topics_directory)
        })();
        result
            .inspect_err(|e| self.inner.context.poison.set(format!("create topic {name}: {e}")))?;
        let mut partitions = Vec::with_capacity(config.partitions as usize);
        for id in 0..config.partitions {
            let directory = final_path.join(id.to_string());
            // The topic is in place on disk but not yet in memory: a failure here poisons
            // too (found by the simulator), and the next open finds the topic whole.
            let context = &self.inner.context;
            let (partition, _) =
                Partition::open(context, directory, name, id, config, Offset::ZERO)
                    .inspect_err(|e| {
                        self.inner.context.poison.set(format!("create topic {name}: {e}"));
                    })
                    .map_err(|e| match e {
                        OpenError::Io(e) => TopicError::Io(e),
                        OpenError::Corruption(c) => TopicError::Corruption(c),
                        other => TopicError::Io(IoError::new(
                            "open new partition",
                            &self.inner.root,
                            std::io::Error::other(other.to_string()),
                        )),
                    })?;
            partitions.push(partition);
        }
        let topic = Topic { config: Mutex::new(config), partitions };
        self.inner.topics.write().insert(name.to_owned(), Arc::new(topic));
        Ok(())
    }

    /// Change an existing topic's settings; every one but `partitions` may change. Durable
    /// when it returns: `topic.meta` is replaced through a temporary file and a rename, and
    /// the topic directory fsynced. A crash leaves the old settings or the new ones. New
    /// settings apply from the next append (segment size and age), the next roll (index
    /// interval) and the next [`Engine::tick`] (retention).
    pub fn alter_topic_config(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        self.check_writable()?;
        config.validate()?;
        self.inner.context.poison.check()?;
        let _admin = self.inner.admin.lock();
        let topic =
            self.topic(name).ok_or_else(|| TopicError::NotFound { name: name.to_owned() })?;
        let current = *topic.config.lock();
        if config.partitions != current.partitions {
            return Err(TopicError::InvalidConfig {
                reason: format!(
                    "the partition count of an existing topic cannot change (it has {})",
                    current.partitions
                ),
            });
        }
        let io = self.io();
        let directory = self.topics_directory().join(name);
        let result =
            segment::write_file_durably(io, &directory.join(TOPIC_META_FILE), config.encode())
                .and_then(|()| sync(io, &directory));
        result.inspect_err(|e| {
            self.inner.context.poison.set(format!("alter topic {name}: {e}"));
        })?;
        *topic.config.lock() = config;
        for partition in &topic.partitions {
            partition.set_config(config);
        }
        Ok(())
    }

    /// Delete a topic and all its data. Crash-safe: the directory is first renamed to a hidden
    /// name (durably), then removed; a crash in between is finished at the next open.
    pub fn delete_topic(&self, name: &str) -> Result<(), TopicError> {
        if groups::is_internal(name) {
            let reason = "internal topics cannot be deleted";
            return Err(TopicError::InvalidName { name: name.to_owned(), reason });
        }
        self.check_writable()?;
        self.inner.context.poison.check()?;
        let _admin = self.inner.admin.lock();
        let Some(removed) = self.inner.topics.write().remove(name) else {
            return Err(TopicError::NotFound { name: name.to_owned() });
        };
        // No append may roll a segment into the directory about to be renamed.
        for partition in &removed.partitions {
            partition.mark_deleted();
        }
        let io = self.io();
        let topics_directory = self.topics_directory();
        let doomed = topics_directory.join(format!(".{name}{DELETING_SUFFIX}"));
        let result = (|| {
            io.rename(&topics_directory.join(name), &doomed)
                .map_err(|e| IoError::new("rename", &doomed, e))?;
            sync(io, &topics_directory)?;
            remove_tree(io, &doomed)?;
            sync(io, &topics_directory)
        })();
        result
            .inspect_err(|e| self.inner.context.poison.set(format!("delete topic {name}: {e}")))?;
        // Housekeeping (a create of the same name does it too, should this one not happen).
        self.forget_commits(name).map_err(|e| self.as_topic_error(e, name))
    }

    /// A commit error met while managing topic `name`.
    fn as_topic_error(&self, error: CommitError, name: &str) -> TopicError {
        match error {
            CommitError::Topic(e) => e,
            CommitError::Append(AppendError::Io(e)) => TopicError::Io(e),
            CommitError::Append(AppendError::Poisoned(p)) => TopicError::Poisoned(p),
            other => TopicError::Io(IoError::new(
                "forget transactions",
                &self.topics_directory().join(name),
                std::io::Error::other(other.to_string()),
            )),
        }
    }

    /// Names of all topics but the internal ones (`__consumer_offsets`), sorted.
    pub fn list_topics(&self) -> Vec<String> {
        self.inner.topics.read().keys().filter(|t| !groups::is_internal(t)).cloned().collect()
    }

    /// Commit consumer positions for `group`: for each `(topic, partition, offset)`, the
    /// offset the group reads next. All of them are one batch of the internal topic
    /// `__consumer_offsets` (created at the first commit): they commit together or not at
    /// all, and are durable when this returns, in every durability mode.
    pub fn commit_offsets(
        &self,
        group: &str,
        offsets: &[(&str, u32, Offset)],
    ) -> Result<(), CommitError> {
        let keys = self.commit_keys_of(group, offsets)?;
        if keys.is_empty() {
            return Ok(());
        }
        self.commit_keys(keys)
    }

    /// The commit records of `group`'s `offsets`, checked: a valid group name, and existing
    /// partitions of user topics.
    fn commit_keys_of(
        &self,
        group: &str,
        offsets: &[(&str, u32, Offset)],
    ) -> Result<Vec<(CommitKey, Offset)>, CommitError> {
        groups::validate_group(group)?;
        let mut keys = Vec::with_capacity(offsets.len());
        for &(topic, partition, offset) in offsets {
            if self.partition(topic, partition).is_err() || groups::is_internal(topic) {
                let topic = topic.to_owned();
                return Err(CommitError::PartitionNotFound { topic, partition });
            }
            let key = CommitKey { group: group.to_owned(), topic: topic.to_owned(), partition };
            keys.push((key, offset));
        }
        Ok(keys)
    }

    /// Append to several partitions and commit consumer offsets, all or nothing: after a crash
    /// at any moment, either every write and every offset is there, or none is. Readers see
    /// a transaction's records only once it has committed, and then all of them (each
    /// partition's at once). Each `(topic, partition)` gets one batch, the records of all its
    /// writes in order; offsets are committed for `group` as [`Engine::commit_offsets`] does.
    ///
    /// How: each partition's batch is written flagged transactional and fdatasynced while the
    /// partition is held (appends and other transactions on it wait; partitions are taken in
    /// name order, so transactions never wait in a cycle); then one batch in
    /// `__consumer_offsets` holding the group's offsets and, per partition, where the
    /// transaction's batch ends, is made durable: the commit point. The partitions are then
    /// released and their records shown. Recovery removes a transactional batch at the end of
    /// a partition that no commit record covers. Any I/O failure poisons the engine; the next
    /// open decides by the commit record. Returns the offsets each write got, in the order of
    /// `writes`.
    pub fn commit_transaction(
        &self,
        writes: &[TransactionWrite<'_>],
        offsets: Option<GroupCommit<'_>>,
    ) -> Result<Vec<Appended>, CommitError> {
        let context = &self.inner.context;
        let started = context.clock.monotonic_us();
        let result = self.commit_transaction_unmeasured(writes, offsets);
        let m = &context.metrics;
        match &result {
            Ok(appended) => {
                Metrics::add(&m.appends, appended.len() as u64);
                let records = appended
                    .iter()
                    .map(|a| (a.last_offset.get() + 1).saturating_sub(a.base_offset.get()));
                Metrics::add(&m.records_appended, records.sum());
                m.append_latency.record(context.clock.monotonic_us().saturating_sub(started));
            }
            Err(_) => Metrics::add(&m.append_errors, 1),
        }
        result
    }

    fn commit_transaction_unmeasured(
        &self,
        writes: &[TransactionWrite<'_>],
        offsets: Option<GroupCommit<'_>>,
    ) -> Result<Vec<Appended>, CommitError> {
        self.check_writable()?;
        self.inner.context.poison.check().map_err(AppendError::from)?;
        let mut keys = match offsets {
            Some(GroupCommit { group, offsets }) => self.commit_keys_of(group, offsets)?,
            None => Vec::new(),
        };
        // One batch per partition, the partitions in name order.
        let mut merged: BTreeMap<(&str, u32), Vec<Record<'_>>> = BTreeMap::new();
        for write in writes {
            if groups::is_internal(write.topic)
                || self.partition(write.topic, write.partition).is_err()
            {
                let (topic, partition) = (write.topic.to_owned(), write.partition);
                return Err(CommitError::PartitionNotFound { topic, partition });
            }
            merged
                .entry((write.topic, write.partition))
                .or_default()
                .extend_from_slice(write.records);
        }
        merged.retain(|_, records| !records.is_empty());
        if merged.is_empty() {
            return if keys.is_empty() {
                Ok(Vec::new())
            } else {
                self.commit_keys(keys).map(|()| Vec::new())
            };
        }
        let mut held: Vec<Held<'_, I>> = Vec::new();
        // Every partition's end queued before any is waited for: one turn.
        let release = |held: &[Held<'_, I>], committed: bool| {
            let ends: Vec<_> = held
                .iter()
                .filter_map(|(partition, _, _)| partition.submit_end_transaction(committed))
                .collect();
            for end in ends {
                let _ = end.wait();
            }
        };
        #[cfg_attr(not(loom), allow(unused_mut))]
        let mut order: Vec<(&(&str, u32), &Vec<Record<'_>>)> = merged.iter().collect();
        #[cfg(loom)]
        if crate::sync::bugs::active(crate::sync::bugs::Bug::UnorderedTransaction) {
            let first =
                |key: &(&str, u32)| writes.iter().position(|w| (w.topic, w.partition) == *key);
            order.sort_by_key(|(key, _)| first(key));
        }
        for (&(topic, id), records) in order {
            let partition = self.partition_for_append(topic, id)?;
            match partition.begin_transaction(records) {
                Ok(appended) => held.push((partition, (topic, id), appended)),
                Err(error) => {
                    release(&held, false);
                    return Err(error.into());
                }
            }
        }
        let early =
            crate::canary::active(crate::canary::Canary::TransactionCommittedBeforeDataSynced);
        // Every partition's sync queued before any is waited for: their fdatasyncs share a turn.
        let sync_all = || -> Result<(), AppendError> {
            let syncs: Vec<_> = held
                .iter()
                .map(|(partition, _, _)| {
                    partition.submit(crate::partition::Request::SyncTransaction)
                })
                .collect::<Result<_, _>>()?;
            syncs.into_iter().try_for_each(|sync| sync.wait().map(|_| ()))
        };
        if let Err(error) = if early { Ok(()) } else { sync_all() } {
            release(&held, false);
            return Err(error.into());
        }
        for (_, (topic, id), appended) in &held {
            keys.push((CommitKey::transaction(topic, *id), appended.last_offset.plus(1)));
        }
        let committed = self
            .commit_keys(keys)
            .and_then(|()| if early { sync_all().map_err(CommitError::from) } else { Ok(()) });
        release(&held, committed.is_ok());
        committed?;
        let by_partition: BTreeMap<(&str, u32), Appended> =
            held.iter().map(|(_, key, appended)| (*key, *appended)).collect();
        // A partition written twice got one batch: each write reports the batch's range.
        Ok(writes
            .iter()
            .filter_map(|w| by_partition.get(&(w.topic, w.partition)).copied())
            .collect())
    }

    /// Append commit records to `__consumer_offsets` (creating it first) and make them
    /// durable; then take them into the committed map.
    fn commit_keys(&self, keys: Vec<(CommitKey, Offset)>) -> Result<(), CommitError> {
        let mut committed = self.inner.committed.lock();
        if self.topic(OFFSETS_TOPIC).is_none() {
            match self.create_any_topic(OFFSETS_TOPIC, groups::offsets_topic_config()) {
                Ok(()) | Err(TopicError::AlreadyExists { .. }) => {}
                Err(error) => return Err(error.into()),
            }
        }
        let encoded = groups::encode_commit(&keys);
        self.append(OFFSETS_TOPIC, 0, &groups::records(&encoded))?;
        if self.inner.options.durability != Durability::Sync
            && !crate::canary::active(crate::canary::Canary::CommitNotDurable)
        {
            let partition = self.partition_for_append(OFFSETS_TOPIC, 0)?;
            partition.flush()?;
        }
        for (key, offset) in keys {
            committed.insert(key, offset);
        }
        Ok(())
    }

    /// The offset `group` committed last for a partition, if any.
    pub fn committed_offset(&self, group: &str, topic: &str, partition: u32) -> Option<Offset> {
        let key = CommitKey { group: group.to_owned(), topic: topic.to_owned(), partition };
        self.inner.committed.lock().get(&key)
    }

    /// The damage in the consumer offsets topic that hid commit records at open, if any: then
    /// a group's committed offset may be an older one than its last commit, and a consumer
    /// that resumes from it would read records again.
    pub fn committed_offsets_damage(&self) -> Option<Corruption> {
        self.inner.committed.lock().damage.clone()
    }

    /// Every offset `group` committed, as `(topic, partition, offset)`, sorted.
    pub fn committed_offsets(&self, group: &str) -> Vec<(String, u32, Offset)> {
        self.inner.committed.lock().of_group(group)
    }

    /// Rebuild the committed offsets from the offsets topic, every record in order.
    fn load_committed(partition: &Partition<I>, path: &Path) -> Result<Committed, OpenError> {
        let mut committed = Committed::default();
        let end = partition.high_watermark();
        let mut next = partition.describe().log_start_offset;
        while next < end {
            let fetch = partition.read(next, 1 << 20).map_err(|error| match error {
                ReadError::Corruption(corruption) => OpenError::Corruption(corruption),
                ReadError::Io(error) => OpenError::Io(error),
                other => OpenError::Io(IoError::new(
                    "read consumer offsets",
                    path,
                    std::io::Error::other(other.to_string()),
                )),
            })?;
            if fetch.is_empty() {
                break;
            }
            for record in fetch.records().filter(|r| r.offset() >= next) {
                committed.apply(&record, path)?;
            }
            next = fetch.next_offset();
        }
        if let Err(ReadError::Corruption(corruption)) = partition.read(next, 1) {
            // Damage (reported by the open) hides the records after it: which transaction
            // committed is unknown, so none is rolled back, and no group's position is known.
            committed.damage = Some(corruption);
        }
        Ok(committed)
    }

    pub fn describe_topic(&self, name: &str) -> Result<TopicDescription, TopicError> {
        let topic =
            self.topic(name).ok_or_else(|| TopicError::NotFound { name: name.to_owned() })?;
        let partitions = topic.partitions.iter().map(|p| p.describe()).collect();
        let config = *topic.config.lock();
        Ok(TopicDescription { name: name.to_owned(), config, partitions })
    }

    fn topic(&self, name: &str) -> Option<Arc<Topic<I>>> {
        self.inner.topics.read().get(name).cloned()
    }

    /// A partition, or which of the two names was not found: `Err(true)` for the topic,
    /// `Err(false)` for the partition.
    fn partition(&self, topic: &str, partition: u32) -> Result<Arc<Partition<I>>, bool> {
        let found = self.topic(topic).ok_or(true)?;
        found.partitions.get(partition as usize).cloned().ok_or(false)
    }

    fn partition_for_append(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Arc<Partition<I>>, AppendError> {
        self.partition(topic, partition).map_err(|topic_missing| {
            let topic = topic.to_owned();
            if topic_missing {
                AppendError::TopicNotFound { topic }
            } else {
                AppendError::PartitionNotFound { topic, partition }
            }
        })
    }

    fn partition_for_read(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Arc<Partition<I>>, ReadError> {
        self.partition(topic, partition).map_err(|topic_missing| {
            let topic = topic.to_owned();
            if topic_missing {
                ReadError::TopicNotFound { topic }
            } else {
                ReadError::PartitionNotFound { topic, partition }
            }
        })
    }

    /// The number of partitions of a topic.
    pub fn partition_count(&self, topic: &str) -> Option<u32> {
        self.topic(topic).map(|t| t.config.lock().partitions)
    }

    /// Append `records` as one batch to a partition and return their offsets. Returns once the
    /// records are acknowledged under the engine's [`Durability`].
    pub fn append(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record<'_>],
    ) -> Result<Appended, AppendError> {
        self.partition_for_append(topic, partition)?.append(records)
    }

    /// Queue an append and return at once, without waiting for it: many appends in flight
    /// from one caller share the write path's turns (and, in `sync` mode, their fdatasyncs).
    /// The records are encoded (and checked) here; the [`PendingAppend`] gives the offsets,
    /// assigned in the order appends to the partition were queued, once the append is done
    /// as the durability mode promises. Refused at once for what `append` refuses at once.
    ///
    /// ```
    /// use chronik_engine::{io::PreadIo, runtime::SystemClock, Engine, Options, Record};
    /// # let directory = tempfile::tempdir().unwrap();
    /// let (engine, _) = Engine::open(
    ///     PreadIo::new(), std::sync::Arc::new(SystemClock), directory.path(), Options::default(),
    /// ).unwrap();
    /// engine.create_topic("t", Default::default()).unwrap();
    /// let pending: Vec<_> = (0..100u32)
    ///     .map(|i| engine.append_nowait("t", 0, &[Record::new(None, &i.to_le_bytes())]).unwrap())
    ///     .collect();
    /// for (i, pending) in pending.into_iter().enumerate() {
    ///     assert_eq!(pending.wait().unwrap().base_offset.get(), i as u64);
    /// }
    /// ```
    pub fn append_nowait(
        &self,
        topic: &str,
        partition: u32,
        records: &[Record<'_>],
    ) -> Result<PendingAppend<I>, AppendError> {
        self.partition_for_append(topic, partition)?.append_nowait(records)
    }

    /// For the runtime's driver thread: turn the write path whenever requests are queued,
    /// until `stop()` holds (then [`Engine::wake_write_path`]).
    #[doc(hidden)]
    pub fn drive_write_path(&self, stop: &dyn Fn() -> bool) {
        if let Some(path) = &self.inner.context.write_path {
            path.drive_until_idle(stop);
        }
    }

    /// Wake the driver thread (to see its stop flag).
    #[doc(hidden)]
    pub fn wake_write_path(&self) {
        if let Some(path) = &self.inner.context.write_path {
            path.notify();
        }
    }

    /// Read whole batches from `from` on, about `max_bytes` of them (at least one batch).
    /// Empty when `from` is the high watermark.
    pub fn read(
        &self,
        topic: &str,
        partition: u32,
        from: Offset,
        max_bytes: usize,
    ) -> Result<Fetch, ReadError> {
        self.partition_for_read(topic, partition)?.read(from, max_bytes)
    }

    /// The first offset whose timestamp is at or after `timestamp`, if any is visible.
    pub fn offset_for_timestamp(
        &self,
        topic: &str,
        partition: u32,
        timestamp: i64,
    ) -> Result<Option<Offset>, ReadError> {
        self.partition_for_read(topic, partition)?.offset_for_timestamp(timestamp)
    }

    /// The end of what readers may see in a partition.
    pub fn high_watermark(&self, topic: &str, partition: u32) -> Result<Offset, ReadError> {
        Ok(self.partition_for_read(topic, partition)?.high_watermark())
    }

    /// Block until `offset` is visible in a partition or `timeout` passes; returns whether it
    /// is. Lets consumers tail a partition without polling.
    pub fn wait_for(
        &self,
        topic: &str,
        partition: u32,
        offset: Offset,
        timeout: Duration,
    ) -> Result<bool, ReadError> {
        self.partition_for_read(topic, partition)?.wait_for(offset, timeout)
    }

    /// The count of requests handed to the write path so far (zero forever when read-only),
    /// for tests that line appenders up behind a turn.
    #[doc(hidden)]
    pub fn write_requests_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.inner.context.write_path.as_ref().map_or_else(Arc::default, |path| path.submitted())
    }

    /// Fsync every partition now.
    pub fn flush(&self) -> Result<(), AppendError> {
        // Fail-stop: a poisoned engine reports no success, even when nothing is left to sync.
        if crate::canary::active(crate::canary::Canary::FlushIgnoresPoison)
            && self.inner.context.poison.check().is_err()
        {
            return Ok(());
        }
        self.inner.context.poison.check()?;
        if self.inner.options.read_only {
            return Ok(());
        }
        // Every partition's flush queued before any is waited for: one turn, every
        // partition's fdatasync in one submission.
        let partitions = self.all_partitions();
        let flushes: Vec<_> = partitions
            .iter()
            .map(|partition| partition.submit(crate::partition::Request::Flush))
            .collect::<Result<_, _>>()?;
        for flush in flushes {
            flush.wait()?;
        }
        Ok(())
    }

    /// One step of all background work: [`Engine::flush_due`], then [`Engine::maintain`].
    /// The simulator calls it between workload steps; the runtime calls the two halves from
    /// threads of their own, so a long compaction pass never delays an interval flush.
    pub fn tick(&self) -> Result<(), AppendError> {
        self.flush_due()?;
        self.maintain()
    }

    /// In `interval` mode, fsync every partition whose last fsync is older than the interval
    /// (a no-op in the other modes and for a read-only engine). Bounded by one fdatasync per
    /// partition. It takes no lock that retention or compaction holds for long (they hold
    /// `maintenance`, which it never takes), so it runs on time beside a pass in progress:
    /// this is what keeps `interval:MS`'s loss window at MS plus one flusher period.
    pub fn flush_due(&self) -> Result<(), AppendError> {
        self.inner.context.poison.check()?;
        if self.inner.options.read_only {
            return Ok(());
        }
        if let (Durability::Interval { .. }, Some(path)) =
            (self.inner.options.durability, &self.inner.context.write_path)
        {
            // The partition logs know their deadlines: a turn syncs those that are due.
            path.turn_once();
            self.inner.context.poison.check()?;
        }
        Ok(())
    }

    /// Retention and compaction of every partition: sealed segments older than
    /// `retention_ms` or beyond `retention_bytes` removed, a durable log start first (see
    /// `Partition::apply_retention`); then a compaction pass where one is due. A pass may
    /// take long (it reads and rewrites segments); it never holds a lock that appends,
    /// flushes or reads wait for, except for the moment of a segment swap.
    pub fn maintain(&self) -> Result<(), AppendError> {
        self.inner.context.poison.check()?;
        if self.inner.options.read_only {
            return Ok(());
        }
        let now = self.inner.context.clock.now_ms();
        for partition in self.all_partitions() {
            partition.apply_retention(now)?;
            // An abandoned pass leaves its log as it was and is kept for `compaction_error`;
            // the other partitions go on. Only a poisoned engine stops the tick.
            if let Err(error) = partition.compact(now, false) {
                self.inner.context.poison.check()?;
                debug_assert!(matches!(error, AppendError::Io(_)), "{error}");
            }
        }
        Ok(())
    }

    /// The last compaction pass of a partition that was abandoned on an I/O error (reading
    /// its segments, writing the cleaned copy, disk full), while no pass has succeeded since.
    /// The group that failed is as it was (groups swapped before it stay swapped), and the
    /// partition is served as usual; the tick tries again after a back-off of 1 s doubling
    /// per failure in a row, up to a minute.
    pub fn compaction_error(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Option<CompactionFailure>, AppendError> {
        Ok(self.partition_for_append(topic, partition)?.compaction_failure())
    }

    /// Compact one partition now, as [`Engine::compact_topic`] does each.
    pub fn compact_partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Option<CompactionReport>, AppendError> {
        let partition = self.partition_for_append(topic, partition)?;
        partition.compact(self.inner.context.clock.now_ms(), true)
    }

    /// Compact every partition of a compacted topic now, whatever its dirty ratio (the lag
    /// bounds still hold). Returns one report per partition, `None` where nothing was
    /// cleanable.
    pub fn compact_topic(&self, name: &str) -> Result<Vec<Option<CompactionReport>>, AppendError> {
        let topic = self
            .topic(name)
            .ok_or_else(|| AppendError::TopicNotFound { topic: name.to_owned() })?;
        let now = self.inner.context.clock.now_ms();
        topic.partitions.iter().map(|partition| partition.compact(now, true)).collect()
    }

    /// Read-only engines: pick up what the writing process appended to every partition since
    /// the last look. A no-op for an engine that writes itself.
    pub fn refresh(&self) -> Result<(), ReadError> {
        for partition in self.all_partitions() {
            partition.refresh()?;
        }
        Ok(())
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

    /// Whether a failure has poisoned the engine, and why.
    pub fn poisoned(&self) -> Option<Poisoned> {
        self.inner.context.poison.check().err()
    }

    /// Poison the engine from outside, e.g. when a background worker panicked.
    pub fn poison(&self, reason: String) {
        self.inner.context.poison.set(reason);
    }

    fn all_partitions(&self) -> Vec<Arc<Partition<I>>> {
        let topics = self.inner.topics.read();
        topics.values().flat_map(|t| t.partitions.iter().cloned()).collect()
    }
}

fn sync<I: Io + ?Sized>(io: &I, directory: &Path) -> Result<(), IoError> {
    io::sync_directory(io, directory).map_err(|e| IoError::new("fsync", directory, e))
}

/// Returns whether the directory was created.
fn create_directory_if_missing<I: Io + ?Sized>(io: &I, path: &Path) -> Result<bool, IoError> {
    match io.create_directory(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(error) => Err(IoError::new("mkdir", path, error)),
    }
}

/// The directory holding `path`'s entry (`.` for a bare relative name, `/` for the root).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if parent.as_os_str().is_empty() => Path::new("."),
        Some(parent) => parent,
        None => path,
    }
}

/// Create `path` and any missing parent, fsyncing each parent whose entries changed.
fn create_directories<I: Io + ?Sized>(io: &I, path: &Path) -> Result<(), IoError> {
    let parent = parent_of(path);
    match io.create_directory(path) {
        Ok(()) => sync(io, parent),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && path.parent().is_some() => {
            create_directories(io, parent)?;
            io.create_directory(path).map_err(|e| IoError::new("mkdir", path, e))?;
            sync(io, parent)
        }
        Err(error) => Err(IoError::new("mkdir", path, error)),
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
        sync(io, root)?;
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

/// Remove a directory and everything under it. Bounded by the tree's depth (three levels in a
/// data directory).
fn remove_tree<I: Io + ?Sized>(io: &I, path: &Path) -> Result<(), IoError> {
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
