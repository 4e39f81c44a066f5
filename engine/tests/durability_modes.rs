//! What each durability mode makes visible, and when: `os` at once, `interval` after the tick
//! that fsyncs, `sync` on acknowledgement; `wait_for` wakes a tailing consumer.

mod common;

use chronik_engine::{Durability, Offset, Record, TopicConfig};
use common::ManualClock;
use std::time::{Duration, Instant};

const TOPIC: &str = "modes";

#[test]
fn os_mode_makes_records_visible_at_once() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Os);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let syncs = faults.fdatasyncs();
    for i in 0..10 {
        assert_eq!(common::append_value(&engine, TOPIC, 0, b"os"), i);
        assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(i + 1));
        let fetch = engine.read(TOPIC, 0, Offset::new(i), 1 << 20).unwrap();
        assert_eq!(fetch.records().next().unwrap().offset(), Offset::new(i));
    }
    assert_eq!(faults.fdatasyncs(), syncs, "os mode does not fsync on append");
    engine.tick().unwrap();
    assert_eq!(faults.fdatasyncs(), syncs, "nor on tick");
    engine.flush().unwrap();
    assert_eq!(faults.fdatasyncs(), syncs + 1, "flush does");
    drop(engine);
    let (engine, report) = common::open(directory.path(), Durability::Os);
    assert!(report.is_clean());
    assert_eq!(common::read_all(&engine, TOPIC, 0, 0, 1 << 20).len(), 10);
}

#[test]
fn interval_mode_makes_records_visible_after_the_tick_that_fsyncs_them() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (io, faults) = common::FaultyIo::new();
    let options = chronik_engine::Options {
        durability: Durability::Interval { ms: 100 },
        ..chronik_engine::Options::default()
    };
    let (engine, _) =
        chronik_engine::Engine::open(io, clock.clone(), directory.path(), options).unwrap();
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let syncs = faults.fdatasyncs();

    for i in 0..5 {
        assert_eq!(common::append_value(&engine, TOPIC, 0, b"interval"), i);
    }
    // Acknowledged but not yet durable, hence not visible.
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::ZERO);
    assert!(engine.read(TOPIC, 0, Offset::ZERO, 1 << 20).unwrap().is_empty());
    assert!(engine.read(TOPIC, 0, Offset::new(1), 1 << 20).is_err(), "beyond the watermark");
    engine.tick().unwrap();
    assert_eq!(
        engine.high_watermark(TOPIC, 0).unwrap(),
        Offset::ZERO,
        "the interval has not passed"
    );
    clock.advance(99);
    engine.tick().unwrap();
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::ZERO);
    assert_eq!(faults.fdatasyncs(), syncs);

    clock.advance(1);
    engine.tick().unwrap();
    assert_eq!(faults.fdatasyncs(), syncs + 1);
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(5));
    assert_eq!(common::read_all(&engine, TOPIC, 0, 0, 1 << 20).len(), 5);

    // The interval counts from the last fsync; a tick with nothing new does not fsync.
    clock.advance(1000);
    engine.tick().unwrap();
    assert_eq!(faults.fdatasyncs(), syncs + 1);
    common::append_value(&engine, TOPIC, 0, b"late");
    engine.tick().unwrap();
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(6), "already due");
    common::append_value(&engine, TOPIC, 0, b"later");
    clock.advance(50);
    engine.tick().unwrap();
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(6));
    // An explicit flush makes everything visible at once.
    engine.flush().unwrap();
    assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(7));
}

#[test]
fn sync_mode_makes_records_visible_on_acknowledgement() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _, faults) = common::open_faulty(directory.path(), Durability::Sync);
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let syncs = faults.fdatasyncs();
    for i in 0..5 {
        let offset = common::append_value(&engine, TOPIC, 0, b"sync");
        assert_eq!(engine.high_watermark(TOPIC, 0).unwrap(), Offset::new(offset + 1));
        assert_eq!(faults.fdatasyncs(), syncs + i + 1, "one fdatasync per lone append");
    }
}

#[test]
fn wait_for_wakes_when_another_thread_appends() {
    for durability in [Durability::Sync, Durability::Os] {
        let directory = tempfile::tempdir().unwrap();
        let (engine, _) = common::open(directory.path(), durability);
        engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
        // Nothing arrives: the wait times out.
        let start = Instant::now();
        let waited = engine.wait_for(TOPIC, 0, Offset::ZERO, Duration::from_millis(50)).unwrap();
        assert!(!waited);
        assert!(start.elapsed() >= Duration::from_millis(50));

        // One record at a time arrives from another thread; the waiter wants the tenth, and
        // must not give up when the first ones wake it.
        let producer = {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    std::thread::sleep(Duration::from_millis(5));
                    engine
                        .append(TOPIC, 0, &[Record::new(None, format!("{i}").as_bytes())])
                        .unwrap();
                }
            })
        };
        let waited = engine.wait_for(TOPIC, 0, Offset::new(9), Duration::from_secs(20)).unwrap();
        assert!(waited, "{durability:?}: the tenth record arrived");
        assert!(engine.high_watermark(TOPIC, 0).unwrap() >= Offset::new(10));
        producer.join().unwrap();
        // Already visible: returns at once.
        assert!(engine.wait_for(TOPIC, 0, Offset::new(9), Duration::ZERO).unwrap());
        assert!(!engine.wait_for(TOPIC, 0, Offset::new(10), Duration::ZERO).unwrap());
    }
}

#[test]
fn wait_for_in_interval_mode_wakes_on_the_tick() {
    let directory = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) =
        common::open_with_clock(directory.path(), Durability::Interval { ms: 10 }, clock.clone());
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.wait_for(TOPIC, 0, Offset::ZERO, Duration::from_secs(20)))
    };
    common::append_value(&engine, TOPIC, 0, b"tick me");
    clock.advance(10);
    engine.tick().unwrap();
    assert!(waiter.join().unwrap().unwrap());
}
