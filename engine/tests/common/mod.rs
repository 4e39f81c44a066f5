//! Shared helpers of the engine's integration tests: a manual clock, an I/O backend that fails
//! on command, and shortcuts to open an engine on a temporary directory.
//!
//! Every test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use chronik_engine::io::{
    Backend, Completion, FileHandle, Io, Namespace, OpenMode, Operation, SystemIo,
};
use chronik_engine::{
    Clock, Durability, Fetch, Offset, Options, Record, RecoveryReport, TopicConfig,
};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A fixed, arbitrary point in time (2024-01-01T00:00:00Z) that tests start their clocks at.
pub const EPOCH_MS: i64 = 1_704_067_200_000;

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicI64,
}

impl ManualClock {
    pub fn new(now_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock { now_ms: AtomicI64::new(now_ms) })
    }

    pub fn set(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    pub fn advance(&self, ms: i64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// A condition an fdatasync waits for.
type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

/// What a [`FaultyIo`] is told to do and what it counted. Shared between the test and the
/// backend the engine owns.
#[derive(Default)]
pub struct Faults {
    /// Fail this many of the next fsync/fdatasync operations (files and directories).
    fail_syncs: AtomicU32,
    /// Fail this many of the next writes.
    fail_writes: AtomicU32,
    /// Completed (successful) operations.
    fdatasyncs: AtomicU64,
    fsyncs: AtomicU64,
    writes: AtomicU64,
    /// Hold the next fdatasync until `writes` reaches this value (0: no hold).
    hold_sync_until_writes: AtomicU64,
    /// Successful writes to segment files (`*.log`) so far.
    log_writes: AtomicU64,
    /// Hold every fdatasync until this says so.
    hold_syncs_until: Mutex<Option<Gate>>,
    gate: Mutex<()>,
    gate_changed: Condvar,
    /// The path of every directory a successful fsync made durable, as the engine named it.
    synced_directories: Mutex<BTreeSet<PathBuf>>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults").field("writes", &self.writes()).finish_non_exhaustive()
    }
}

impl Faults {
    pub fn fail_next_syncs(&self, count: u32) {
        self.fail_syncs.store(count, Ordering::SeqCst);
    }

    pub fn fail_next_writes(&self, count: u32) {
        self.fail_writes.store(count, Ordering::SeqCst);
    }

    /// Successful fdatasyncs so far (files only: directories are fsynced, not fdatasynced).
    pub fn fdatasyncs(&self) -> u64 {
        self.fdatasyncs.load(Ordering::SeqCst)
    }

    /// Successful fsyncs so far (directories, and files after a truncate).
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::SeqCst)
    }

    /// The directories successfully fsynced so far, by the path the engine opened them with.
    pub fn synced_directories(&self) -> BTreeSet<PathBuf> {
        self.synced_directories.lock().clone()
    }

    /// Successful writes so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Make the next fdatasync wait (up to a safety timeout) until `writes()` reaches `writes`.
    /// Lets a test line up concurrent appenders behind one in-flight fsync deterministically.
    pub fn hold_next_fdatasync_until_writes(&self, writes: u64) {
        self.hold_sync_until_writes.store(writes, Ordering::SeqCst);
    }

    /// Make every fdatasync from now on wait (up to a safety timeout each) until `gate`
    /// holds; `None` lets them all go.
    pub fn hold_fdatasyncs_until(&self, gate: Option<Gate>) {
        *self.hold_syncs_until.lock() = gate;
        let _guard = self.gate.lock();
        self.gate_changed.notify_all();
    }

    fn take(counter: &AtomicU32) -> bool {
        counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }

    fn wait_for_writes(&self) {
        let wanted = self.hold_sync_until_writes.swap(0, Ordering::SeqCst);
        let released = || {
            let gate = self.hold_syncs_until.lock().clone();
            self.writes() >= wanted && gate.is_none_or(|gate| gate())
        };
        // A safety net only: a test whose gate never opens fails on its bound, not by hanging.
        // The gate may look at what no write changes: look again every millisecond.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut guard = self.gate.lock();
        while !released() {
            if Instant::now() >= deadline {
                return;
            }
            self.gate_changed.wait_for(&mut guard, Duration::from_millis(1));
        }
    }

    fn on_write(&self, to_log: bool) {
        let _guard = self.gate.lock();
        self.writes.fetch_add(1, Ordering::SeqCst);
        if to_log {
            self.log_writes.fetch_add(1, Ordering::SeqCst);
        }
        self.gate_changed.notify_all();
    }
}

/// The backend the tests run on: `CHRONIK_TEST_IO=pread` or `io_uring` (the test script runs
/// the engine's tests once with each), `auto` by default.
pub fn test_io() -> SystemIo {
    let backend = std::env::var("CHRONIK_TEST_IO").map_or(Backend::Auto, |name| {
        name.parse().unwrap_or_else(|error| panic!("CHRONIK_TEST_IO: {error}"))
    });
    SystemIo::new(backend).expect("the test backend can be set up")
}

/// [`test_io`] with fault injection: fails writes and fsyncs on command, counts them, and can
/// hold an fdatasync back. Every other call is delegated unchanged.
#[derive(Debug)]
pub struct FaultyIo {
    inner: SystemIo,
    faults: Arc<Faults>,
    /// Every open handle's path and mode, to name the directory an fsync makes durable and to
    /// tell segment writes apart (operations carry only the handle). Entries leave on close:
    /// handles are reused.
    opened: Mutex<HashMap<FileHandle, (PathBuf, OpenMode)>>,
}

impl FaultyIo {
    pub fn new() -> (FaultyIo, Arc<Faults>) {
        let faults = Arc::new(Faults::default());
        let opened = Mutex::new(HashMap::new());
        (FaultyIo { inner: test_io(), faults: Arc::clone(&faults), opened }, faults)
    }

    fn injected(what: &str) -> io::Error {
        io::Error::other(format!("injected {what} failure"))
    }

    fn execute(&self, operation: Operation) -> Completion {
        let faults = &self.faults;
        match operation {
            Operation::Fsync { .. } | Operation::Fdatasync { .. } => {
                let is_fdatasync = matches!(operation, Operation::Fdatasync { .. });
                let fsynced = match operation {
                    Operation::Fsync { file } => Some(file),
                    _ => None,
                };
                if is_fdatasync {
                    faults.wait_for_writes();
                }
                if Faults::take(&faults.fail_syncs) {
                    return Completion { buffer: Vec::new(), result: Err(Self::injected("fsync")) };
                }
                let completion = self.delegate(operation);
                if completion.result.is_ok() {
                    let counter = if is_fdatasync { &faults.fdatasyncs } else { &faults.fsyncs };
                    counter.fetch_add(1, Ordering::SeqCst);
                    if let Some(file) = fsynced
                        && let Some((path, OpenMode::Directory)) = self.opened.lock().get(&file)
                    {
                        faults.synced_directories.lock().insert(path.clone());
                    }
                }
                completion
            }
            Operation::Write { buffer, .. } if Faults::take(&faults.fail_writes) => {
                Completion { buffer, result: Err(Self::injected("write")) }
            }
            Operation::Write { file, .. } => {
                let to_log = self.opened.lock().get(&file).is_some_and(|(path, _)| {
                    path.extension().is_some_and(|extension| extension == "log")
                });
                let completion = self.delegate(operation);
                if completion.result.is_ok() {
                    faults.on_write(to_log);
                }
                completion
            }
            other => self.delegate(other),
        }
    }

    fn delegate(&self, operation: Operation) -> Completion {
        let mut completions = self.inner.submit(vec![operation]);
        assert_eq!(completions.len(), 1);
        completions.pop().unwrap()
    }
}

impl Io for FaultyIo {
    fn submit(&self, operations: Vec<Operation>) -> Vec<Completion> {
        operations.into_iter().map(|operation| self.execute(operation)).collect()
    }
}

impl Namespace for FaultyIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        let file = self.inner.open(path, mode)?;
        self.opened.lock().insert(file, (path.to_path_buf(), mode));
        Ok(file)
    }

    fn close(&self, file: FileHandle) {
        self.opened.lock().remove(&file);
        self.inner.close(file);
    }

    crate::forward_io_namespace!();
}

/// Open an engine with the pread backend and a manual clock starting at [`EPOCH_MS`].
pub fn open(root: &Path, durability: Durability) -> (Engine, RecoveryReport) {
    open_with_clock(root, durability, ManualClock::new(EPOCH_MS))
}

/// Open an engine on the test backend with the given clock.
pub fn open_with_clock(
    root: &Path,
    durability: Durability,
    clock: Arc<ManualClock>,
) -> (Engine, RecoveryReport) {
    chronik_engine::Engine::open(
        test_io(),
        clock,
        root,
        Options { durability, direct_io: test_direct_io(), ..Options::default() },
    )
    .unwrap()
}

/// Whether the tests write segments with direct I/O: `CHRONIK_TEST_DIRECT=1` (the test script
/// runs the engine's tests once that way too).
pub fn test_direct_io() -> bool {
    std::env::var("CHRONIK_TEST_DIRECT").is_ok_and(|v| v == "1")
}

/// Open an engine over a [`FaultyIo`]; returns the handle to its faults too.
pub fn open_faulty(
    root: &Path,
    durability: Durability,
) -> (chronik_engine::Engine<FaultyIo>, RecoveryReport, Arc<Faults>) {
    let (io, faults) = FaultyIo::new();
    let clock = ManualClock::new(EPOCH_MS);
    let (engine, report) = chronik_engine::Engine::open(
        io,
        clock,
        root,
        Options { durability, direct_io: test_direct_io(), ..Options::default() },
    )
    .unwrap();
    (engine, report, faults)
}

/// A topic config with small segments, so tests roll many of them.
pub fn small_segments(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: 4096,
        index_interval_bytes: 512,
        ..TopicConfig::default()
    }
}

/// A record as the tests remember it, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owned {
    pub offset: u64,
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Owned {
    pub fn of_fetch(fetch: &Fetch) -> Vec<Owned> {
        fetch
            .records()
            .map(|r| Owned {
                offset: r.offset().get(),
                timestamp: r.timestamp(),
                key: r.key().map(<[u8]>::to_vec),
                value: r.value().to_vec(),
                headers: r.headers().map(|h| (h.key.to_vec(), h.value.to_vec())).collect(),
            })
            .collect()
    }
}

/// Read every visible record of a partition from `from`, following `next_offset`, with reads of
/// at most `max_bytes`. Panics on any error.
pub fn read_all<I: Io>(
    engine: &chronik_engine::Engine<I>,
    topic: &str,
    partition: u32,
    from: u64,
    max_bytes: usize,
) -> Vec<Owned> {
    let mut records = Vec::new();
    let mut next = Offset::new(from);
    // Bounded: every non-empty fetch moves `next` forward.
    loop {
        let fetch = engine.read(topic, partition, next, max_bytes).unwrap();
        if fetch.is_empty() {
            assert_eq!(next, engine.high_watermark(topic, partition).unwrap());
            return records;
        }
        assert!(fetch.next_offset() > next, "a non-empty fetch moves forward");
        records.extend(Owned::of_fetch(&fetch));
        next = fetch.next_offset();
    }
}

/// Append one record with a value and return its offset.
pub fn append_value<I: Io>(
    engine: &chronik_engine::Engine<I>,
    topic: &str,
    partition: u32,
    value: &[u8],
) -> u64 {
    let appended = engine.append(topic, partition, &[Record::new(None, value)]).unwrap();
    appended.base_offset.get()
}

/// Every file under `root` (recursively), relative to it, sorted.
pub fn files_under(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, directory: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(directory).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// The segment log files of a partition directory, sorted by base offset.
pub fn log_files(partition_directory: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(partition_directory)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

/// `DIR/topics/TOPIC/PARTITION`.
pub fn partition_directory(root: &Path, topic: &str, partition: u32) -> PathBuf {
    root.join("topics").join(topic).join(partition.to_string())
}

/// Flip the bits of one byte of a file in place.
pub fn flip_byte(path: &Path, position: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[usize::try_from(position).unwrap()] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

/// The position and base offset of every batch in a segment file, parsed independently of the
/// engine's reader: the length is at byte 8 and the base offset at byte 24 of each header.
pub fn batch_positions(path: &Path) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let positions = batch_positions_of(&bytes);
    assert!(!positions.is_empty() || bytes.is_empty(), "{} holds batches", path.display());
    positions
}

/// As [`batch_positions`], over the bytes of a segment file.
pub fn batch_positions_of(bytes: &[u8]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut position = 0usize;
    while position + 64 <= bytes.len() {
        let length = u32::from_le_bytes(bytes[position + 8..position + 12].try_into().unwrap());
        let base = u64::from_le_bytes(bytes[position + 24..position + 32].try_into().unwrap());
        out.push((position as u64, base));
        position += length as usize;
    }
    assert_eq!(position, bytes.len(), "a segment holds whole batches");
    out
}

/// The engine over the test backend, as most tests open it.
pub type Engine = chronik_engine::Engine<SystemIo>;

/// The bytes of every file under `root` except the lock file, by relative path.
pub fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    files_under(root)
        .into_iter()
        .filter(|path| path != Path::new("LOCK"))
        .map(|path| {
            let bytes = std::fs::read(root.join(&path)).unwrap();
            (path, bytes)
        })
        .collect()
}

/// The base offset in a segment file's name.
pub fn base_offset_of(log: &Path) -> u64 {
    log.file_stem().unwrap().to_str().unwrap().parse().unwrap()
}

/// A closed data directory with topic `t` (one partition, small segments) holding `count`
/// records `value-0000`, `value-0001`, ...; returns the partition's directory.
pub fn filled_small_segments(root: &Path, count: usize) -> PathBuf {
    let (engine, _) = open(root, Durability::Sync);
    engine.create_topic("t", small_segments(1)).unwrap();
    for i in 0..count {
        append_value(&engine, "t", 0, format!("value-{i:04}").as_bytes());
    }
    partition_directory(root, "t", 0)
}

/// The `Io` methods a test wrapper passes on unchanged to the backend in its field `inner`:
/// `file_size` and the namespace calls but `open` and `close` (which wrappers track).
#[macro_export]
macro_rules! forward_io_namespace {
    () => {
        fn file_size(&self, file: chronik_engine::io::FileHandle) -> std::io::Result<u64> {
            self.inner.file_size(file)
        }

        fn create_directory(&self, path: &std::path::Path) -> std::io::Result<()> {
            self.inner.create_directory(path)
        }

        fn list(
            &self,
            directory: &std::path::Path,
        ) -> std::io::Result<Vec<chronik_engine::io::DirectoryEntry>> {
            self.inner.list(directory)
        }

        fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
            self.inner.rename(from, to)
        }

        fn remove_file(&self, path: &std::path::Path) -> std::io::Result<()> {
            self.inner.remove_file(path)
        }

        fn remove_directory(&self, path: &std::path::Path) -> std::io::Result<()> {
            self.inner.remove_directory(path)
        }

        fn lock(&self, path: &std::path::Path) -> std::io::Result<chronik_engine::io::FileHandle> {
            self.inner.lock(path)
        }
    };
}

/// Wakes the thread that polls.
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Poll `future` to completion on this thread, parking between polls: the least executor
/// there is, for awaiting the engine's futures in tests.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = std::task::Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = std::task::Context::from_waker(&waker);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

/// Make a cleanly closed data directory look like one whose writer was killed before it made
/// any recovery point: the clean-shutdown mark and every active segment's index files go, so
/// the next open scans every active segment from its start (the evidence rules apply to all
/// of it).
pub fn forget_clean_close(root: &Path) {
    let _ = std::fs::remove_file(root.join("clean.shutdown"));
    for file in files_under(root) {
        let file = root.join(file);
        if file.extension().is_none_or(|extension| extension != "log") {
            continue;
        }
        let partition = file.parent().unwrap();
        if log_files(partition).last() != Some(&file) {
            continue;
        }
        for suffix in ["index", "timeindex"] {
            let _ = std::fs::remove_file(file.with_extension(suffix));
        }
    }
}
