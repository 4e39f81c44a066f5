//! A writable open fsyncs every directory of the data directory, whether or not it changed
//! anything: an earlier process killed between creating an entry and fsyncing its directory
//! leaves an entry that a power loss could still take, and appends are about to land in it.
//!
//! Checked by path, directory by directory: a count of fsyncs would let the fsyncs of files
//! (after truncates at recovery) stand in for a missing directory's.
//!
//! After a clean close (the clean-shutdown mark in place) no such entry can be left, and the
//! open fsyncs no partition directory: that is what the mark saves on many partitions.

mod common;

use chronik_engine::{Durability, TopicConfig};
use std::path::PathBuf;

#[test]
fn every_directory_is_fsynced_at_a_writable_open() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    {
        let (engine, _) = common::open(root, Durability::Sync);
        engine.create_topic("a", TopicConfig::default().with_partitions(2)).unwrap();
        engine.create_topic("b", TopicConfig::default().with_partitions(3)).unwrap();
    }
    {
        let (_engine, report, faults) = common::open_faulty(root, Durability::Sync);
        assert!(report.clean_shutdown && report.is_clean(), "{report:?}");
        let synced = faults.synced_directories();
        let partitions = common::partition_directory(root, "a", 0);
        assert!(!synced.contains(&partitions), "after a clean close: {synced:?}");
    }
    common::forget_clean_close(root);
    let (_engine, report, faults) = common::open_faulty(root, Durability::Sync);
    assert!(report.is_clean(), "{report:?}");
    let topics = root.join("topics");
    let mut expected: Vec<PathBuf> = vec![root.to_path_buf(), topics.clone()];
    for (topic, partitions) in [("a", 2), ("b", 3)] {
        expected.push(topics.join(topic));
        expected.extend((0..partitions).map(|p| common::partition_directory(root, topic, p)));
    }
    let synced = faults.synced_directories();
    let missing: Vec<&PathBuf> = expected.iter().filter(|path| !synced.contains(*path)).collect();
    assert!(missing.is_empty(), "not fsynced at open: {missing:?}; fsynced: {synced:?}");
}
