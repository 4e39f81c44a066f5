//! Sixteen threads append to one partition in `sync` mode: offsets are distinct and contiguous,
//! every acknowledged record reads back, and appenders share fdatasyncs (group commit): at most
//! two fdatasyncs per sixteen appends, forced by a gate rather than left to the scheduler.

mod common;

use chronik_engine::internals::EngineInternals;
use chronik_engine::{Durability, Offset, Record, TopicConfig};
use std::collections::BTreeMap;
use std::sync::Arc;

const TOPIC: &str = "shared";
const THREADS: u64 = 16;
const APPENDS: u64 = 200;

fn value(thread: u64, sequence: u64) -> Vec<u8> {
    format!("thread {thread:02} append {sequence:03}").into_bytes()
}

#[test]
fn concurrent_sync_appenders_share_fsyncs() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let syncs_before = faults.fdatasyncs();
    // Deterministic sharing. The threads append in lockstep steps (a barrier before each
    // append), and every fdatasync is held until the engine's write path has been handed all
    // sixteen appends of the step. The thread that drives the first turn of a step applied
    // those queued when the turn began; its fdatasync ends only once the rest are queued, so
    // the next turn applies all of them, and its fdatasync covers them. Then nobody writes
    // until the next step. So each step takes one or two fdatasyncs, whatever the scheduler
    // does; a write path that synced once per append would take sixteen.
    let submitted = engine.write_requests_counter();
    let before = submitted.load(std::sync::atomic::Ordering::SeqCst);
    faults.hold_fdatasyncs_until(Some(Arc::new(move || {
        (submitted.load(std::sync::atomic::Ordering::SeqCst) - before).is_multiple_of(THREADS)
    })));

    let barrier = Arc::new(std::sync::Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let engine = engine.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut offsets = Vec::with_capacity(APPENDS as usize);
                for sequence in 0..APPENDS {
                    barrier.wait();
                    let value = value(thread, sequence);
                    let appended = engine.append(TOPIC, 0, &[Record::new(None, &value)]).unwrap();
                    assert_eq!(appended.base_offset, appended.last_offset);
                    // Acknowledged in sync mode means visible to readers.
                    let high_watermark = engine.high_watermark(TOPIC, 0).unwrap();
                    assert!(high_watermark > appended.base_offset);
                    let fetch = engine.read(TOPIC, 0, appended.base_offset, 1).unwrap();
                    assert_eq!(fetch.records().next().unwrap().value(), value);
                    offsets.push(appended.base_offset.get());
                }
                offsets
            })
        })
        .collect();
    let mut owner: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for (thread, handle) in handles.into_iter().enumerate() {
        let offsets = handle.join().unwrap();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "a thread's offsets increase");
        for (sequence, offset) in offsets.into_iter().enumerate() {
            let previous = owner.insert(offset, (thread as u64, sequence as u64));
            assert!(previous.is_none(), "offset {offset} given twice");
        }
    }
    let total = THREADS * APPENDS;
    assert_eq!(owner.keys().copied().collect::<Vec<_>>(), (0..total).collect::<Vec<_>>());
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(total));

    let records = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    assert_eq!(records.len() as u64, total);
    for record in &records {
        let (thread, sequence) = owner[&record.offset];
        assert_eq!(record.value, value(thread, sequence), "offset {}", record.offset);
    }

    // The close below hands the write path one request more: let its fdatasync go.
    faults.hold_fdatasyncs_until(None);
    let syncs = faults.fdatasyncs() - syncs_before;
    println!(
        "group commit: {total} appends, {syncs} fdatasyncs, {:.2} appends per fdatasync",
        total as f64 / syncs as f64
    );
    // One or two per step (see the gate above): at least eight appends per fdatasync.
    assert!(
        syncs <= 2 * APPENDS,
        "{syncs} fdatasyncs for {total} appends in {APPENDS} steps of {THREADS}: at most {} \
         expected",
        2 * APPENDS
    );
    drop(engine);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean());
    assert_eq!(common::read_all(&engine, TOPIC, 0, 0, 1 << 20), records);
}

/// An fdatasync fails while sixteen appenders wait, some of them behind a leader that runs
/// several fdatasyncs in a row: every appender returns (none is left asleep), every one then
/// sees the engine poisoned, and every acknowledged record is there after reopening.
#[test]
fn a_failed_fdatasync_wakes_every_waiter() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let syncs_before = faults.fdatasyncs();
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                for sequence in 0.. {
                    let value = value(thread, sequence % 1000);
                    match engine.append(TOPIC, 0, &[Record::new(None, &value)]) {
                        Ok(appended) => acknowledged.push((appended.base_offset.get(), value)),
                        Err(error) => return (acknowledged, error.to_string()),
                    }
                }
                unreachable!("appends end with the failure")
            })
        })
        .collect();
    while faults.fdatasyncs() < syncs_before + 50 {
        std::thread::yield_now();
    }
    faults.fail_next_syncs(1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !handles.iter().all(std::thread::JoinHandle::is_finished) {
        assert!(std::time::Instant::now() < deadline, "appenders still waiting after a failure");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut acknowledged = BTreeMap::new();
    for handle in handles {
        let (records, error) = handle.join().unwrap();
        assert!(error.contains("poisoned") || error.contains("fdatasync"), "{error}");
        acknowledged.extend(records);
    }
    assert!(engine.poisoned().is_some());
    drop(engine);

    let (engine, _) = common::open(directory.path(), Durability::Sync);
    let records: BTreeMap<u64, Vec<u8>> = common::read_all(&engine, TOPIC, 0, 0, 1 << 20)
        .into_iter()
        .map(|r| (r.offset, r.value))
        .collect();
    for (offset, value) in &acknowledged {
        assert_eq!(records.get(offset), Some(value), "acknowledged offset {offset} lost");
    }
}
