//! A writable open fsyncs every directory of the data directory, whether or not it changed
//! anything: an earlier process killed between creating an entry and fsyncing its directory
//! leaves an entry that a power loss could still take, and appends are about to land in it.

mod common;

use chronik_engine::{Durability, TopicConfig};

#[test]
fn every_directory_is_fsynced_at_a_writable_open() {
    let directory = tempfile::tempdir().unwrap();
    {
        let (engine, _) = common::open(directory.path(), Durability::Sync);
        engine.create_topic("a", TopicConfig::default().with_partitions(2)).unwrap();
        engine.create_topic("b", TopicConfig::default().with_partitions(3)).unwrap();
    }
    let (_engine, report, faults) = common::open_faulty(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{report:?}");
    // Root, topics/, two topic directories and five partition directories, at least.
    let directories = 1 + 1 + 2 + 5;
    assert!(
        faults.fsyncs() >= directories,
        "{} fsyncs at open for {directories} directories",
        faults.fsyncs()
    );
}
