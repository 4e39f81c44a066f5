//! `interval:MS` keeps its loss window while maintenance is slow: with a compaction pass held
//! in the middle of writing its cleaned segment (as slow as a compaction can be), the
//! production runtime still fsyncs a fresh append once the interval has passed, and the
//! record becomes visible. When retention and compaction ran inline after the flushes in one
//! tick, the flusher waited for the whole pass, and the window stretched to the pass's length.

mod common;

use chronik_engine::io::{Completion, FileHandle, Io, Namespace, OpenMode, Operation};
use chronik_engine::runtime::Runtime;
use chronik_engine::{Cleanup, Durability, Engine, Offset, Options, Record, TopicConfig};
use common::ManualClock;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const INTERVAL_MS: u64 = 20;
/// How long the test waits for the flush before it calls the flusher stuck. The flusher is
/// due at once (the clock is moved past the interval) and runs every 20 ms; 20 s is only
/// there so that a stuck flusher fails the test instead of hanging it.
const FLUSH_WAIT_MAX: Duration = Duration::from_secs(20);

/// Holds every write to a compaction's cleaned segment until released.
#[derive(Debug, Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    released: bool,
    /// Writes to a cleaned segment waiting at the gate.
    held: u32,
}

impl Gate {
    fn pass(&self) {
        let mut state = self.state.lock();
        state.held += 1;
        self.changed.notify_all();
        while !state.released {
            self.changed.wait(&mut state);
        }
        state.held -= 1;
    }

    fn wait_until_held(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock();
        while state.held == 0 {
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                return state.held > 0;
            }
        }
        true
    }

    fn release(&self) {
        self.state.lock().released = true;
        self.changed.notify_all();
    }
}

/// The test backend, with writes to `*.cleaned` files held at a [`Gate`].
#[derive(Debug)]
struct GatedIo {
    inner: chronik_engine::io::SystemIo,
    paths: Mutex<HashMap<FileHandle, PathBuf>>,
    gate: Arc<Gate>,
}

impl GatedIo {
    fn is_cleaned(&self, file: FileHandle) -> bool {
        let paths = self.paths.lock();
        paths.get(&file).is_some_and(|path| path.extension().is_some_and(|e| e == "cleaned"))
    }
}

impl Io for GatedIo {
    fn submit(&self, operations: Vec<Operation>) -> Vec<Completion> {
        for operation in &operations {
            if let Operation::Write { file, .. } = operation
                && self.is_cleaned(*file)
            {
                self.gate.pass();
            }
        }
        self.inner.submit(operations)
    }
}

impl Namespace for GatedIo {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<FileHandle> {
        let handle = self.inner.open(path, mode)?;
        self.paths.lock().insert(handle, path.to_path_buf());
        Ok(handle)
    }

    fn close(&self, file: FileHandle) {
        self.paths.lock().remove(&file);
        self.inner.close(file);
    }

    crate::forward_io_namespace!();
}

#[test]
fn an_interval_flush_is_not_held_up_by_a_compaction_pass() {
    let directory = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let io = GatedIo { inner: common::test_io(), paths: Mutex::default(), gate: gate.clone() };
    let clock = ManualClock::new(common::EPOCH_MS);
    let options =
        Options { durability: Durability::Interval { ms: INTERVAL_MS }, ..Options::default() };
    let (engine, _) = Engine::open(io, clock.clone(), directory.path(), options).unwrap();
    let config = TopicConfig {
        segment_bytes: 4096,
        index_interval_bytes: 512,
        cleanup: Cleanup::Compact,
        ..TopicConfig::default()
    };
    engine.create_topic("keyed", config).unwrap();
    // Several sealed segments of updates to eight keys: all dirty, so a pass is due.
    for i in 0..120_u32 {
        let key = format!("key-{}", i % 8);
        let value = format!("{i}-{}", "v".repeat(200));
        engine.append("keyed", 0, &[Record::new(Some(key.as_bytes()), value.as_bytes())]).unwrap();
    }
    engine.flush().unwrap();
    let before = engine.describe_topic("keyed").unwrap();
    assert!(before.partitions[0].segment_count >= 4, "{before:?}");

    let runtime = Runtime::start(&engine).unwrap();
    assert!(
        gate.wait_until_held(Duration::from_secs(60)),
        "the maintainer never started a compaction pass"
    );
    // The pass is now stuck writing its cleaned segment. Append, and let the interval pass.
    let appended = engine.append("keyed", 0, &[Record::new(Some(b"fresh"), b"value")]).unwrap();
    assert!(engine.high_watermark("keyed", 0).unwrap() <= appended.last_offset);
    clock.advance(i64::try_from(INTERVAL_MS).unwrap() * 10);
    let deadline = Instant::now() + FLUSH_WAIT_MAX;
    let flushed = loop {
        if engine.high_watermark("keyed", 0).unwrap() > appended.last_offset {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let still_compacting = gate.wait_until_held(Duration::ZERO);
    gate.release();
    drop(runtime);
    assert!(still_compacting, "the check ran while the pass was held");
    assert!(flushed, "no interval flush within {FLUSH_WAIT_MAX:?} while compaction ran");

    // The pass went on once released, and nothing was lost on the way.
    let fetch = engine.read("keyed", 0, appended.last_offset, 1 << 20).unwrap();
    let record = fetch.records().next().unwrap();
    assert_eq!((record.offset(), record.value()), (appended.last_offset, &b"value"[..]));
    assert!(engine.high_watermark("keyed", 0).unwrap() > Offset::new(120));
}
