//! A compaction pass that fails before a group's commit (here: the disk fills while a cleaned
//! copy is written) is abandoned: the engine is not poisoned, the partition serves its log
//! (groups swapped before the failure stay swapped, the failing one is as it was), other
//! partitions go on, the failure is reported, and a later pass succeeds.

use chronik_engine::{
    AppendError, Cleanup, Durability, Engine, Offset, Options, Record, TopicConfig,
};
use chronik_sim::clock::EPOCH_MS;
use chronik_sim::disk::Faults;
use chronik_sim::{Rng, SimClock, SimDisk};
use std::path::Path;

fn values(engine: &Engine<SimDisk>, partition: u32) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut from = Offset::ZERO;
    loop {
        let fetch = engine.read("t", partition, from, 1 << 20).expect("read");
        if fetch.is_empty() {
            return out;
        }
        for record in fetch.records().filter(|r| r.offset() >= from) {
            out.push((record.offset().get(), record.value().to_vec()));
        }
        from = fetch.next_offset();
    }
}

/// `after` is `before` with some records removed, the last five (one per key) kept: what a
/// pass, whole or abandoned after some of its groups, may leave.
fn consistent(before: &[(u64, Vec<u8>)], after: &[(u64, Vec<u8>)]) -> Result<(), String> {
    let mut rest = before.iter();
    for record in after {
        if !rest.any(|b| b == record) {
            return Err(format!("offset {} was not in the log, or not in order", record.0));
        }
    }
    let tail = |v: &[(u64, Vec<u8>)]| v.iter().rev().take(5).map(|r| r.0).collect::<Vec<_>>();
    if tail(after) != tail(before) {
        return Err(format!("latest offsets {:?}, expected {:?}", tail(after), tail(before)));
    }
    Ok(())
}

#[test]
fn a_pass_abandoned_on_a_full_disk_poisons_nothing_and_the_next_pass_succeeds() {
    let disk = SimDisk::new(Rng::new(7));
    let clock = SimClock::new(EPOCH_MS);
    let options = Options { durability: Durability::Sync, ..Options::default() };
    let (engine, _) =
        Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options).expect("open");
    let config = TopicConfig {
        partitions: 2,
        segment_bytes: 4096,
        cleanup: Cleanup::Compact,
        ..TopicConfig::default()
    };
    engine.create_topic("t", config).expect("create");
    for i in 0..200_u32 {
        let key = format!("key-{}", i % 5);
        let value = format!("{i}-{}", "x".repeat(200));
        for partition in 0..2 {
            let record = Record::new(Some(key.as_bytes()), value.as_bytes());
            engine.append("t", partition, &[record]).expect("append");
        }
    }
    let before = values(&engine, 0);
    let used: u64 = disk.snapshot().values().map(|bytes| bytes.len() as u64).sum();
    disk.set_faults(Faults { capacity_bytes: Some(used + 100), ..Faults::NONE });

    let error = engine.compact_partition("t", 0).expect_err("no room for the cleaned copy");
    assert!(matches!(&error, AppendError::Io(e) if e.is_disk_full()), "{error}");
    assert!(
        engine.poisoned().is_none(),
        "an abandoned pass poisons nothing: {:?}",
        engine.poisoned()
    );
    let failure = engine.compaction_error("t", 0).expect("partition").expect("kept");
    assert_eq!(failure.kind, std::io::ErrorKind::StorageFull);
    assert_eq!(consistent(&before, &values(&engine, 0)), Ok(()));
    let described = engine.describe_topic("t").expect("describe");
    assert_eq!(described.partitions[0].compaction_failures, 1);
    assert_eq!(described.partitions[0].compaction_passes, 0);
    // The tick goes on past it (and backs off from this partition).
    engine.tick().expect("tick");
    assert!(engine.poisoned().is_none());
    assert!(disk.snapshot().keys().all(|path| !path.to_string_lossy().ends_with(".cleaned")));

    disk.set_faults(Faults::NONE);
    let report = engine.compact_partition("t", 0).expect("room again").expect("a pass");
    assert!(report.records_kept < report.records_in);
    assert!(engine.compaction_error("t", 0).expect("partition").is_none());
    let after = values(&engine, 0);
    assert_eq!(consistent(&before, &after), Ok(()));
    assert!(after.len() < before.len());
    assert_eq!(values(&engine, 1).len(), 200, "the other partition is untouched");
}
