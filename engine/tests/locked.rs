//! One engine per data directory: a second open fails with `Locked` while the first is open,
//! and succeeds once it is dropped.

mod common;

use chronik_engine::{Durability, Engine, OpenError, Options, TopicConfig};

#[test]
fn a_second_open_of_the_same_directory_is_refused_while_the_first_is_open() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    engine.create_topic("locked", TopicConfig::default()).unwrap();
    common::append_value(&engine, "locked", 0, b"held");

    let clock = common::ManualClock::new(common::EPOCH_MS);
    for _ in 0..2 {
        let error =
            Engine::open(common::test_io(), clock.clone(), directory.path(), Options::default())
                .unwrap_err();
        match error {
            OpenError::Locked { path } => assert_eq!(path, directory.path()),
            other => panic!("expected Locked, got {other:?}"),
        }
    }
    // The refused opens changed nothing: the first engine works on.
    assert_eq!(common::append_value(&engine, "locked", 0, b"still held"), 1);

    // A clone keeps the directory locked; only the last one releases it.
    let clone = engine.clone();
    drop(engine);
    assert!(matches!(
        Engine::open(common::test_io(), clock.clone(), directory.path(), Options::default()),
        Err(OpenError::Locked { .. })
    ));
    drop(clone);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean());
    assert_eq!(common::read_all(&engine, "locked", 0, 0, 1 << 20).len(), 2);
}

#[test]
fn other_directories_are_independent() {
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    let (_a, _) = common::open(first.path(), Durability::Sync);
    let (_b, _) = common::open(second.path(), Durability::Sync);
}
