//! `Engine::append_nowait`: one caller keeps many appends in flight in `sync` mode. They are
//! given offsets in the order queued, share the write path's turns (a thousand appends to one
//! partition, queued before any is waited for, take one fdatasync), can be awaited as futures
//! while the runtime's driver thread turns the engine, still happen when their answer is
//! dropped, and are refused at once where `append` refuses at once.

mod common;

use chronik_engine::runtime::Runtime;
use chronik_engine::{AppendError, Durability, Options, Record, TopicConfig};

const TOPIC: &str = "pipelined";

#[test]
fn a_thousand_appends_in_flight_take_one_fdatasync_in_order() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let syncs_before = faults.fdatasyncs();
    let pending: Vec<_> = (0..1000u32)
        .map(|i| engine.append_nowait(TOPIC, 0, &[Record::new(None, &i.to_le_bytes())]).unwrap())
        .collect();
    for (i, pending) in pending.into_iter().enumerate() {
        let appended = pending.wait().unwrap();
        assert_eq!(appended.base_offset.get(), i as u64, "offsets in the order queued");
        assert!(engine.high_watermark(TOPIC, 0).unwrap() > appended.base_offset, "visible");
    }
    // All were queued before the first wait: one turn, one coalesced write, one fdatasync.
    assert_eq!(faults.fdatasyncs() - syncs_before, 1);
    let records = common::read_all(&engine, TOPIC, 0, 0, 1 << 20);
    let values: Vec<u32> =
        records.iter().map(|r| u32::from_le_bytes(r.value[..4].try_into().unwrap())).collect();
    assert_eq!(values, (0..1000).collect::<Vec<_>>());
}

#[test]
fn futures_complete_while_the_runtime_drives() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let runtime = Runtime::start(&engine).unwrap();
    let futures: Vec<_> = (0..200u32)
        .map(|i| engine.append_nowait(TOPIC, 0, &[Record::new(None, &i.to_le_bytes())]).unwrap())
        .collect();
    let offsets: Vec<u64> =
        futures.into_iter().map(|f| common::block_on(f).unwrap().base_offset.get()).collect();
    assert_eq!(offsets, (0..200).collect::<Vec<_>>());
    drop(runtime);
}

#[test]
fn a_dropped_answer_leaves_the_append_done() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    drop(engine.append_nowait(TOPIC, 0, &[Record::new(None, b"forgotten")]).unwrap());
    let after = engine.append(TOPIC, 0, &[Record::new(None, b"waited")]).unwrap();
    assert_eq!(after.base_offset.get(), 1, "the dropped one went first");
    let values: Vec<Vec<u8>> =
        common::read_all(&engine, TOPIC, 0, 0, 1 << 20).into_iter().map(|r| r.value).collect();
    assert_eq!(values, [b"forgotten".to_vec(), b"waited".to_vec()]);
}

#[test]
fn refusals_come_at_once() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let missing = engine.append_nowait("missing", 0, &[Record::new(None, b"x")]).unwrap_err();
    assert!(matches!(missing, AppendError::TopicNotFound { .. }), "{missing}");
    let empty = engine.append_nowait(TOPIC, 0, &[]).unwrap_err();
    assert!(matches!(empty, AppendError::Empty), "{empty}");
    drop(engine);
    let options = Options { read_only: true, ..Options::default() };
    let clock = common::ManualClock::new(common::EPOCH_MS);
    let (reader, _) = chronik_engine::Engine::open(
        chronik_engine::io::PreadIo::new(),
        clock,
        directory.path(),
        options,
    )
    .unwrap();
    let refused = reader.append_nowait(TOPIC, 0, &[Record::new(None, b"x")]).unwrap_err();
    assert!(matches!(refused, AppendError::ReadOnly), "{refused}");
}
