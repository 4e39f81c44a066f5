//! The second design's front door (`WritePath`) over a reactor on real files: pipelined
//! requests share turns (a hundred appends to one partition take one fdatasync, four
//! partitions one submission), answers follow submission order, threads that wait take turns
//! driving, a `Pending` can be awaited with a driver thread, a fence holds later appends until
//! its transaction ends, and a failed fdatasync answers every waiter with the failure. What
//! the reactor wrote, the engine's own recovery reads back.

mod common;

use chronik_engine::internals::checkpoint::CheckpointWriter;
use chronik_engine::internals::format;
use chronik_engine::internals::layout::LOG_SUFFIX;
use chronik_engine::internals::layout::{self, partition_directory};
use chronik_engine::internals::log::{Acked, Batch, Config, PartitionLog, Recovered, Refusal};
use chronik_engine::internals::reactor::{IndexHost, PartitionId, Reactor};
use chronik_engine::internals::segment::SegmentFile;
use chronik_engine::internals::write_path::{Pending, Request, WritePath};
use chronik_engine::io::{Io, OpenMode};
use chronik_engine::runtime::SystemClock;
use chronik_engine::{Durability, Offset, Record, TopicConfig};
use common::FaultyIo;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const TOPIC: &str = "t";

/// A topic of `partitions` made by the engine, then a write path over a fresh `FaultyIo`.
type Opened = (Arc<WritePath<FaultyIo>>, Vec<PartitionId>, Arc<common::Faults>);

fn write_path(root: &Path, partitions: u32) -> Opened {
    let (engine, _) = common::open(root, Durability::Sync);
    let config = TopicConfig { partitions, ..TopicConfig::default() };
    engine.create_topic(TOPIC, config).unwrap();
    drop(engine);
    // The write path below writes as an engine would, and an engine's open takes the mark of
    // the last close away first.
    std::fs::remove_file(root.join(layout::CLEAN_SHUTDOWN_FILE)).unwrap();
    let (io, faults) = FaultyIo::new();
    let io = Arc::new(io);
    let mut reactor = Reactor::new(Arc::clone(&io));
    let mut ids = Vec::new();
    for partition in 0..partitions {
        let directory = partition_directory(root, TOPIC, partition);
        let path = directory.join(layout::file_name(Offset::ZERO, LOG_SUFFIX));
        let active = SegmentFile::open(&io, path, OpenMode::ReadWrite).unwrap();
        let checkpoint = CheckpointWriter::open(&io, &directory, None).unwrap();
        let config = Config {
            durability: Durability::Sync,
            segment_bytes: 1 << 20,
            segment_ms: i64::MAX,
            direct: false,
            write_bytes_max: chronik_engine::internals::log::WRITE_BYTES_MAX,
            recovery_point_bytes: chronik_engine::limits::RECOVERY_POINT_BYTES_DEFAULT,
            recovery_point_ms: 5_000,
        };
        let recovered = Recovered {
            base_offset: Offset::ZERO,
            size: 0,
            next_offset: Offset::ZERO,
            created_ms: 0,
            tail: Vec::new(),
            max_timestamp: i64::MIN,
            recovery_point: 0,
        };
        let log = PartitionLog::new(config, recovered, 0);
        let host = IndexHost::new(Offset::ZERO, 4096);
        ids.push(reactor.add(directory, log, Arc::new(active), checkpoint, host));
    }
    (WritePath::new(reactor, Arc::new(SystemClock)), ids, faults)
}

fn batch(values: &[&[u8]]) -> Batch {
    let records: Vec<Record<'_>> = values.iter().map(|v| Record::new(None, v)).collect();
    let mut bytes = Vec::new();
    let info = format::encode_batch(&mut bytes, Offset::ZERO, &records, 0, Offset::ZERO).unwrap();
    Batch { bytes, info }
}

fn append<I: Io>(path: &Arc<WritePath<I>>, partition: PartitionId, value: &[u8]) -> Pending<I> {
    path.submit(partition, Request::Append(batch(&[value])))
}

fn offset(answer: Result<Acked, Refusal>) -> u64 {
    match answer.unwrap() {
        Acked::Appended { base_offset, .. } => base_offset.get(),
        other => panic!("not an append: {other:?}"),
    }
}

fn values_read_back(root: &Path, partition: u32) -> Vec<Vec<u8>> {
    let (engine, report) = common::open(root, Durability::Sync);
    assert!(report.is_clean(), "{report:?}");
    let records = common::read_all(&engine, TOPIC, partition, 0, 1 << 20);
    records.into_iter().map(|r| r.value).collect()
}

#[test]
fn pipelined_appends_share_one_turn_and_keep_their_order() {
    let directory = tempfile::tempdir().unwrap();
    let (path, ids, faults) = write_path(directory.path(), 4);
    let syncs_before = faults.fdatasyncs();
    let pending: Vec<(usize, Pending<FaultyIo>)> = (0..400)
        .map(|i| (i % 4, append(&path, ids[i % 4], format!("value {i}").as_bytes())))
        .collect();
    let mut next = [0u64; 4];
    for (partition, pending) in pending {
        let got = offset(pending.wait());
        assert_eq!(got, next[partition], "answers follow submission order");
        next[partition] += 1;
    }
    // One turn took all 400: per partition one coalesced write linked to one fdatasync.
    assert_eq!(faults.fdatasyncs() - syncs_before, 4);
    drop(path);
    for partition in 0..4u32 {
        let values = values_read_back(directory.path(), partition);
        let expected: Vec<Vec<u8>> =
            (0..100).map(|j| format!("value {}", j * 4 + partition).into_bytes()).collect();
        assert_eq!(values, expected, "partition {partition}");
    }
}

#[test]
fn threads_that_wait_take_turns_driving() {
    let directory = tempfile::tempdir().unwrap();
    let (path, ids, _) = write_path(directory.path(), 2);
    let threads: Vec<_> = (0..8u32)
        .map(|thread| {
            let path = Arc::clone(&path);
            let ids = ids.clone();
            std::thread::spawn(move || {
                let mut last = [None::<u64>; 2];
                for i in 0..150u32 {
                    let partition = (i % 2) as usize;
                    let value = format!("thread {thread} append {i}");
                    let got = offset(append(&path, ids[partition], value.as_bytes()).wait());
                    assert!(last[partition].is_none_or(|l| l < got), "a thread's offsets grow");
                    last[partition] = Some(got);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    drop(path);
    for partition in 0..2 {
        let values = values_read_back(directory.path(), partition);
        assert_eq!(values.len(), 8 * 75, "every acknowledged append, once");
    }
}

#[test]
fn a_pending_answer_is_awaited_while_a_driver_thread_turns() {
    let directory = tempfile::tempdir().unwrap();
    let (path, ids, _) = write_path(directory.path(), 1);
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let (path, stop) = (Arc::clone(&path), Arc::clone(&stop));
        std::thread::spawn(move || path.drive_until_idle(&|| stop.load(Ordering::SeqCst)))
    };
    let futures: Vec<_> =
        (0..50).map(|i| append(&path, ids[0], format!("{i}").as_bytes())).collect();
    let offsets: Vec<u64> = futures.into_iter().map(|f| offset(common::block_on(f))).collect();
    assert_eq!(offsets, (0..50).collect::<Vec<_>>());
    stop.store(true, Ordering::SeqCst);
    path.notify();
    driver.join().unwrap();
}

#[test]
fn a_fence_holds_later_appends_until_its_transaction_ends() {
    let directory = tempfile::tempdir().unwrap();
    let (path, ids, _) = write_path(directory.path(), 1);
    assert_eq!(offset(append(&path, ids[0], b"before").wait()), 0);
    let begun = path.submit(ids[0], Request::BeginTransaction(batch(&[b"in", b"tx"])));
    assert!(matches!(begun.wait().unwrap(), Acked::TransactionWritten { .. }));
    // Queued before the transaction syncs, waited for on a thread of its own.
    let after = append(&path, ids[0], b"after");
    let later = std::thread::spawn(move || offset(after.wait()));
    let synced = path.submit(ids[0], Request::SyncTransaction).wait().unwrap();
    assert_eq!(synced, Acked::TransactionSynced);
    assert!(!later.is_finished(), "the append waits behind the fence");
    let ended = path.submit(ids[0], Request::EndTransaction { committed: true }).wait();
    assert_eq!(ended.unwrap(), Acked::TransactionEnded);
    assert_eq!(later.join().unwrap(), 3, "it follows the transaction's two records");
    drop(path);
    assert_eq!(values_read_back(directory.path(), 0).len(), 4);
}

#[test]
fn a_failed_fdatasync_answers_every_waiter_with_the_failure() {
    let directory = tempfile::tempdir().unwrap();
    let (path, ids, faults) = write_path(directory.path(), 1);
    assert_eq!(offset(append(&path, ids[0], b"durable").wait()), 0);
    faults.fail_next_syncs(1);
    let pending: Vec<_> =
        (0..10).map(|i| append(&path, ids[0], format!("{i}").as_bytes())).collect();
    for answer in pending.into_iter().map(Pending::wait) {
        assert!(matches!(answer, Err(Refusal::Poisoned(_))), "{answer:?}");
    }
    let refused = append(&path, ids[0], b"later").wait();
    assert!(matches!(refused, Err(Refusal::Poisoned(_))), "fail-stop: {refused:?}");
    drop(path);
    assert_eq!(values_read_back(directory.path(), 0)[0], b"durable");
}
