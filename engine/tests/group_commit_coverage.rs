//! Which offsets one group-commit fdatasync covers while appenders keep writing during it
//! (ARCHITECTURE.md, "The write path, one fsync at a time", steps 7-9): only what was written
//! before it started. An I/O wrapper keeps a shadow of what the crash contract makes durable:
//! at the moment an fdatasync of a segment is called it notes the end of the writes completed
//! so far, and once the fdatasync returns, that much of the file is durable. Appenders check,
//! at every acknowledgement, that their batch lies inside that durable size (no ack precedes
//! the fdatasync that covers it), and that the high watermark never passes the last offset
//! the durable size holds.
//!
//! A seeded schedule holds fdatasyncs after they are called until more batches are written
//! (by appenders that are free to write, so it never waits for nothing), so that in every run
//! records land during an fdatasync: the case a leader that took the end of the log after its
//! fdatasync, instead of before it, would call durable.

mod common;

use chronik_engine::io::{Completion, FileHandle, Io, OpenMode, Operation, SystemIo};
use chronik_engine::{Durability, Offset, Options, Record, TopicConfig};
use parking_lot::{Condvar, Mutex};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOPIC: &str = "covered";
const SEEDS: u64 = 6;
const THREADS: usize = 8;
const APPENDS: u64 = 120;
/// Most records in one append.
const RECORDS_MAX: u64 = 4;
/// Most further batches a held fdatasync waits for.
const HOLD_WRITES_MAX: u64 = THREADS as u64;
/// A safety net: a hold that cannot be met (nobody free to write) ends at once anyway; this
/// only bounds a wait on a thread that was free and then was not.
const HOLD_TIMEOUT: Duration = Duration::from_secs(2);

thread_local! {
    /// The appender this thread is, and its last segment write: (path, end position,
    /// next offset).
    static APPENDER: Cell<Option<usize>> = const { Cell::new(None) };
    static LAST_WRITE: std::cell::RefCell<Option<(PathBuf, u64, u64)>> =
        const { std::cell::RefCell::new(None) };
}

/// splitmix64: a seeded schedule, the same for a seed on every run.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

/// What the crash contract makes durable of one segment file.
#[derive(Debug, Default)]
struct FileShadow {
    /// The end of the completed writes.
    written_end: u64,
    /// The largest `written_end` noted at the call of an fdatasync that then succeeded.
    durable_size: u64,
    /// The next offset after each batch written, by the batch's end position.
    batch_ends: BTreeMap<u64, u64>,
}

impl FileShadow {
    /// Every offset below this one is in the durable size.
    fn durable_offset(&self) -> u64 {
        self.batch_ends.range(..=self.durable_size).next_back().map_or(0, |(_, next)| *next)
    }
}

/// Where an appender is, for the gate: a thread outside `append`, or inside it and not yet
/// written, is free to write soon; one that wrote and waits is not.
#[derive(Clone, Copy, Debug, Default)]
struct Appender {
    started: u64,
    written: u64,
    inside: bool,
    done: bool,
}

impl Appender {
    fn free_to_write(self) -> bool {
        !self.done && (!self.inside || self.written < self.started)
    }
}

#[derive(Debug, Default)]
struct Shared {
    opened: HashMap<FileHandle, PathBuf>,
    files: HashMap<PathBuf, FileShadow>,
    appenders: Vec<Appender>,
    log_writes: u64,
    fdatasyncs: u64,
    /// Fdatasyncs of a segment during which at least one batch was written.
    fdatasyncs_overlapped: u64,
    holds_timed_out: u64,
}

#[derive(Debug)]
struct CoverageIo {
    inner: SystemIo,
    shared: Arc<(Mutex<Shared>, Condvar)>,
    schedule: Mutex<Rng>,
}

fn is_log(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension == "log")
}

/// The base offset and the last offset delta of a batch, read from its header independently
/// of the engine (bytes 24..32 and 32..36, little-endian).
fn batch_next_offset(buffer: &[u8]) -> u64 {
    let base = u64::from_le_bytes(buffer[24..32].try_into().unwrap());
    let delta = u32::from_le_bytes(buffer[32..36].try_into().unwrap());
    base + u64::from(delta) + 1
}

impl CoverageIo {
    fn write(&self, file: FileHandle, position: u64, buffer: Vec<u8>) -> Completion {
        let length = buffer.len() as u64;
        let next_offset = (buffer.len() >= 64).then(|| batch_next_offset(&buffer));
        let completion = self.delegate(Operation::Write { file, position, buffer });
        if completion.result.is_err() {
            return completion;
        }
        let (lock, changed) = &*self.shared;
        let mut shared = lock.lock();
        let path = shared.opened.get(&file).cloned();
        if let Some(path) = path.filter(|p| is_log(p)) {
            let end = position + length;
            let next = next_offset.expect("a segment write holds a batch");
            let shadow = shared.files.entry(path.clone()).or_default();
            shadow.written_end = shadow.written_end.max(end);
            shadow.batch_ends.insert(end, next);
            shared.log_writes += 1;
            if let Some(appender) = APPENDER.get() {
                shared.appenders[appender].written += 1;
                LAST_WRITE.with_borrow_mut(|last| *last = Some((path, end, next)));
            }
            changed.notify_all();
        }
        completion
    }

    fn fdatasync(&self, file: FileHandle) -> Completion {
        let (lock, changed) = &*self.shared;
        let mut shared = lock.lock();
        let Some(path) = shared.opened.get(&file).cloned().filter(|p| is_log(p)) else {
            drop(shared);
            return self.delegate(Operation::Fdatasync { file });
        };
        // The crash contract: what completed before the call is what this makes durable.
        let snapshot = shared.files.get(&path).map_or(0, |s| s.written_end);
        let writes_at_call = shared.log_writes;
        let hold = self.schedule.lock().below(HOLD_WRITES_MAX + 1);
        let me = APPENDER.get();
        let deadline = Instant::now() + HOLD_TIMEOUT;
        while shared.log_writes < writes_at_call + hold {
            let free = shared
                .appenders
                .iter()
                .enumerate()
                .any(|(index, appender)| Some(index) != me && appender.free_to_write());
            if !free {
                break;
            }
            if changed.wait_until(&mut shared, deadline).timed_out() {
                shared.holds_timed_out += 1;
                break;
            }
        }
        drop(shared);
        let completion = self.delegate(Operation::Fdatasync { file });
        let mut shared = lock.lock();
        if completion.result.is_ok() {
            let overlapped = shared.log_writes > writes_at_call;
            shared.fdatasyncs += 1;
            shared.fdatasyncs_overlapped += u64::from(overlapped);
            let shadow = shared.files.entry(path).or_default();
            shadow.durable_size = shadow.durable_size.max(snapshot);
        }
        completion
    }

    fn delegate(&self, operation: Operation) -> Completion {
        let mut completions = self.inner.submit(vec![operation]);
        assert_eq!(completions.len(), 1);
        completions.pop().unwrap()
    }
}

impl Io for CoverageIo {
    fn submit(&self, operations: Vec<Operation>) -> Vec<Completion> {
        operations
            .into_iter()
            .map(|operation| match operation {
                Operation::Write { file, position, buffer } => self.write(file, position, buffer),
                Operation::Fdatasync { file } => self.fdatasync(file),
                other => self.delegate(other),
            })
            .collect()
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        let file = self.inner.open(path, mode)?;
        self.shared.0.lock().opened.insert(file, path.to_path_buf());
        Ok(file)
    }

    fn close(&self, file: FileHandle) {
        self.shared.0.lock().opened.remove(&file);
        self.inner.close(file);
    }

    crate::forward_io_namespace!();
}

/// Set this appender's phase for the gate, and wake a held fdatasync to look again.
fn set_phase(shared: &(Mutex<Shared>, Condvar), appender: usize, inside: bool, done: bool) {
    let mut state = shared.0.lock();
    let phase = &mut state.appenders[appender];
    if inside && !phase.inside {
        phase.started += 1;
    }
    phase.inside = inside;
    phase.done = done;
    shared.1.notify_all();
}

/// One appender: `APPENDS` appends of 1..=`RECORDS_MAX` records, each acknowledgement checked
/// against the shadow.
fn appender(
    engine: &chronik_engine::Engine<CoverageIo>,
    shared: &(Mutex<Shared>, Condvar),
    index: usize,
    seed: u64,
) -> u64 {
    APPENDER.set(Some(index));
    let mut rng = Rng(seed ^ (index as u64 + 1) << 32);
    let mut records_appended = 0;
    for sequence in 0..APPENDS {
        let count = 1 + rng.below(RECORDS_MAX);
        let values: Vec<Vec<u8>> =
            (0..count).map(|r| format!("{index}-{sequence}-{r}").into_bytes()).collect();
        let records: Vec<Record<'_>> = values.iter().map(|v| Record::new(None, v)).collect();
        set_phase(shared, index, true, false);
        let appended = engine.append(TOPIC, 0, &records).unwrap();
        let (path, end, next) = LAST_WRITE.with_borrow(Clone::clone).expect("the append wrote");
        let high_watermark = engine.high_watermark(TOPIC, 0).unwrap().get();
        {
            let state = shared.0.lock();
            let shadow = &state.files[&path];
            assert_eq!(next, appended.last_offset.get() + 1, "the batch written is the one acked");
            assert!(
                end <= shadow.durable_size,
                "seed {seed}: offsets {}..={} acknowledged with their batch ending at byte {end} \
                 of {}, but fdatasyncs have made only {} bytes durable",
                appended.base_offset.get(),
                appended.last_offset.get(),
                path.display(),
                shadow.durable_size
            );
            assert!(
                high_watermark <= shadow.durable_offset(),
                "seed {seed}: high watermark {high_watermark} above the durable offset {}",
                shadow.durable_offset()
            );
            assert!(high_watermark >= next, "acknowledged records are visible");
        }
        set_phase(shared, index, false, sequence + 1 == APPENDS);
        records_appended += count;
    }
    records_appended
}

/// One seed: returns (fdatasyncs, fdatasyncs with writes during them, holds timed out).
fn run(seed: u64) -> (u64, u64, u64) {
    let directory = tempfile::tempdir().unwrap();
    let shared = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
    shared.0.lock().appenders = vec![Appender::default(); THREADS];
    let io = CoverageIo {
        inner: common::test_io(),
        shared: Arc::clone(&shared),
        schedule: Mutex::new(Rng(seed)),
    };
    // Buffered writes: each segment write is one whole batch, which the shadow reads.
    let options = Options { durability: Durability::Sync, direct_io: false, ..Options::default() };
    let clock = common::ManualClock::new(common::EPOCH_MS);
    let (engine, _) = chronik_engine::Engine::open(io, clock, directory.path(), options).unwrap();
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let barrier = Arc::new(std::sync::Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|index| {
            let (engine, shared, barrier) =
                (engine.clone(), Arc::clone(&shared), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                appender(&engine, &shared, index, seed)
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(total));
    let state = shared.0.lock();
    let logs: Vec<&FileShadow> = state.files.values().collect();
    assert_eq!(logs.len(), 1, "one segment: no roll in this test");
    assert_eq!(logs[0].durable_offset(), total, "every record durable at the end");
    (state.fdatasyncs, state.fdatasyncs_overlapped, state.holds_timed_out)
}

#[test]
fn an_fdatasync_covers_only_what_was_written_before_it_started() {
    for seed in 0..SEEDS {
        let (fdatasyncs, overlapped, timed_out) = run(seed);
        println!(
            "seed {seed}: {fdatasyncs} fdatasyncs, {overlapped} with batches written during \
             them, {timed_out} holds timed out"
        );
        // The schedule holds most fdatasyncs until a free appender writes: the case under test
        // happens in every run, not by luck.
        assert!(overlapped > 0, "seed {seed}: no batch was written during an fdatasync");
    }
}
