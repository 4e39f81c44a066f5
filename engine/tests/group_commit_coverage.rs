//! Which offsets one group-commit fdatasync covers (ARCHITECTURE.md, "The write path, one
//! fsync at a time"): only what was written before it started, or linked before it. An I/O
//! wrapper keeps a shadow of what the crash contract makes durable: at the moment an
//! fdatasync of a segment is called it notes the end of the writes completed so far, and once
//! the fdatasync returns, that much of the file is durable. Eight appenders check, at every
//! acknowledgement, that their batch lies inside that durable size (no ack precedes the
//! fdatasync that covers it), and that the high watermark never passes the last offset the
//! durable size holds. The write path coalesces the batches of several appenders into one
//! write before one fdatasync; the run must show that it did (an fdatasync covering batches of
//! several appenders is the case under test).

mod common;

use chronik_engine::io::{Completion, FileHandle, Io, Namespace, OpenMode, Operation, SystemIo};
use chronik_engine::{Durability, Offset, Options, Record, TopicConfig};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const TOPIC: &str = "covered";
const SEEDS: u64 = 6;
const THREADS: usize = 8;
const APPENDS: u64 = 120;
/// Most records in one append.
const RECORDS_MAX: u64 = 4;

/// A seeded schedule, the same for a seed on every run: splitmix64's outputs.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        chronik_simdisk::rng::splitmix64(&mut self.0) % bound
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

#[derive(Debug, Default)]
struct Shared {
    opened: HashMap<FileHandle, PathBuf>,
    files: HashMap<PathBuf, FileShadow>,
    /// Where each batch ends, by the offset after it: (file, end position).
    ends: HashMap<u64, (PathBuf, u64)>,
    log_writes: u64,
    /// Segment writes that carried batches of more than one append.
    coalesced_writes: u64,
    fdatasyncs: u64,
}

#[derive(Debug)]
struct CoverageIo {
    inner: SystemIo,
    shared: Arc<Mutex<Shared>>,
}

fn is_log(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension == "log")
}

/// The length and the offset after each batch of a buffer of whole batches, read from their
/// headers independently of the engine (length at 8..12, base offset at 24..32, last offset
/// delta at 32..36, little-endian).
fn batches(buffer: &[u8]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = 0;
    while buffer.len() >= at + 64 {
        let header = &buffer[at..];
        let length = u32::from_le_bytes(header[8..12].try_into().unwrap()) as usize;
        let base = u64::from_le_bytes(header[24..32].try_into().unwrap());
        let delta = u32::from_le_bytes(header[32..36].try_into().unwrap());
        assert!(length >= 64 && at + length <= buffer.len(), "a segment write holds whole batches");
        out.push((length as u64, base + u64::from(delta) + 1));
        at += length;
    }
    assert_eq!(at, buffer.len(), "a segment write holds whole batches");
    out
}

impl CoverageIo {
    fn write(&self, file: FileHandle, position: u64, buffer: Vec<u8>) -> Completion {
        let to_log = self.shared.lock().opened.get(&file).is_some_and(|p| is_log(p));
        let parsed = if to_log { batches(&buffer) } else { Vec::new() };
        let completion = self.delegate(Operation::Write { file, position, buffer });
        if completion.result.is_err() {
            return completion;
        }
        let mut shared = self.shared.lock();
        let path = shared.opened.get(&file).cloned();
        if let Some(path) = path.filter(|p| is_log(p)) {
            let mut end = position;
            for &(length, next) in &parsed {
                end += length;
                let shadow = shared.files.entry(path.clone()).or_default();
                shadow.batch_ends.insert(end, next);
                shared.ends.insert(next, (path.clone(), end));
            }
            let shadow = shared.files.entry(path).or_default();
            shadow.written_end = shadow.written_end.max(end);
            shared.log_writes += 1;
            shared.coalesced_writes += u64::from(parsed.len() > 1);
        }
        completion
    }

    fn fdatasync(&self, file: FileHandle) -> Completion {
        let shared = self.shared.lock();
        let Some(path) = shared.opened.get(&file).cloned().filter(|p| is_log(p)) else {
            drop(shared);
            return self.delegate(Operation::Fdatasync { file });
        };
        // The crash contract: what completed before the call is what this makes durable.
        let snapshot = shared.files.get(&path).map_or(0, |s| s.written_end);
        drop(shared);
        let completion = self.delegate(Operation::Fdatasync { file });
        let mut shared = self.shared.lock();
        if completion.result.is_ok() {
            shared.fdatasyncs += 1;
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
}

impl Namespace for CoverageIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        let file = self.inner.open(path, mode)?;
        self.shared.lock().opened.insert(file, path.to_path_buf());
        Ok(file)
    }

    fn close(&self, file: FileHandle) {
        self.shared.lock().opened.remove(&file);
        self.inner.close(file);
    }

    crate::forward_io_namespace!();
}

/// One appender: `APPENDS` appends of 1..=`RECORDS_MAX` records, each acknowledgement checked
/// against the shadow.
fn appender(
    engine: &chronik_engine::Engine<CoverageIo>,
    shared: &Mutex<Shared>,
    index: usize,
    seed: u64,
) -> u64 {
    let mut rng = Rng(seed ^ (index as u64 + 1) << 32);
    let mut records_appended = 0;
    for sequence in 0..APPENDS {
        let count = 1 + rng.below(RECORDS_MAX);
        let values: Vec<Vec<u8>> =
            (0..count).map(|r| format!("{index}-{sequence}-{r}").into_bytes()).collect();
        let records: Vec<Record<'_>> = values.iter().map(|v| Record::new(None, v)).collect();
        let appended = engine.append(TOPIC, 0, &records).unwrap();
        let high_watermark = engine.high_watermark(TOPIC, 0).unwrap().get();
        let state = shared.lock();
        let next = appended.last_offset.get() + 1;
        let (path, end) =
            state.ends.get(&next).cloned().expect("the batch acknowledged was written");
        let shadow = &state.files[&path];
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
        drop(state);
        records_appended += count;
    }
    records_appended
}

/// One seed: returns (fdatasyncs, segment writes, coalesced writes).
fn run(seed: u64) -> (u64, u64, u64) {
    let directory = tempfile::tempdir().unwrap();
    let shared = Arc::new(Mutex::new(Shared::default()));
    let io = CoverageIo { inner: common::test_io(), shared: Arc::clone(&shared) };
    // Buffered writes: each segment write is whole batches, which the shadow reads.
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
    let state = shared.lock();
    let logs: Vec<&FileShadow> = state.files.values().collect();
    assert_eq!(logs.len(), 1, "one segment: no roll in this test");
    assert_eq!(logs[0].durable_offset(), total, "every record durable at the end");
    (state.fdatasyncs, state.log_writes, state.coalesced_writes)
}

#[test]
fn an_fdatasync_covers_only_what_was_written_before_it_started() {
    let mut coalesced = 0;
    for seed in 0..SEEDS {
        let (fdatasyncs, writes, coalesced_writes) = run(seed);
        println!(
            "seed {seed}: {fdatasyncs} fdatasyncs, {writes} segment writes, {coalesced_writes} \
             of them carrying several appends"
        );
        coalesced += coalesced_writes;
    }
    // Eight appenders waiting at once: some turn of some seed takes several of them in one
    // write and one fdatasync, the sharing whose coverage is under test.
    assert!(coalesced > 0, "no write carried the batches of several appenders");
}
