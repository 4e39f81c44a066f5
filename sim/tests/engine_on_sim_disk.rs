//! The real engine on the simulated disk, over many seeds, through the library's [`run`]:
//! seeded workloads in every durability mode, crashes of three kinds, swarm faults, and the
//! oracles after every restart. Plus two fixed scenarios: determinism of a seed, and an
//! fsync failure that poisons the engine.

use chronik_engine::io::Namespace;
use chronik_engine::{AppendError, Durability, Engine, Options, Record, TopicConfig};
use chronik_sim::clock::EPOCH_MS;
use chronik_sim::model::{Model, ModelBatch, ModelRecord, TopicState};
use chronik_sim::oracle::{self, Context};
use chronik_sim::run::{Counters, RunOptions, run};
use chronik_sim::workload::TOPIC;
use chronik_sim::{Rng, SimClock, SimDisk};
use std::path::Path;

const SEEDS: u64 = 40;

/// The seeds to run: `SEEDS` from 0, or `CHRONIK_SIM_SEEDS=first..end` to explore more.
fn seeds() -> std::ops::Range<u64> {
    let Ok(range) = std::env::var("CHRONIK_SIM_SEEDS") else {
        return 0..SEEDS;
    };
    let (first, end) = range.split_once("..").expect("CHRONIK_SIM_SEEDS=first..end");
    first.parse().expect("a first seed")..end.parse().expect("an end seed")
}

#[test]
fn every_oracle_holds_on_every_seed() {
    let mut total = Counters::default();
    let mut crashes = 0;
    let seeds = seeds();
    for seed in seeds.clone() {
        let outcome = run(seed, &RunOptions::default());
        if let Some(violation) = &outcome.violation {
            panic!(
                "{violation}\nlast events:\n  {}\nreplay: {}",
                outcome.trace.join("\n  "),
                outcome.replay_command()
            );
        }
        total.add(&outcome.counters);
        crashes += outcome.crashes;
    }
    eprintln!("seeds {seeds:?}: crashes {crashes}, {total:?}");
    // The run must have exercised the interesting paths, or it proves nothing.
    assert!(total.acknowledged_batches > 0 && crashes > 0 && total.reads > 0);
    assert!(total.failed_appends > 0 && total.truncated_bytes > 0);
    assert!(total.poison_probes > 0 && total.double_opens > 0 && total.power_cuts_reached > 0);
    assert!(total.clean_closes > 0 && total.restarts_without_crash > 0);
    // The SDK's group consumers read and committed, and compaction removed offsets that the
    // SDK's readers had to read past (`sdk_readers`).
    assert!(total.group_consumer_records > 0 && total.group_consumer_commits > 0);
    assert!(total.compacted_away > 0);
}

#[test]
fn the_same_seed_gives_the_same_trace_and_disk() {
    let options = RunOptions { keep_snapshot: true, ..RunOptions::default() };
    for seed in [0, 7, 31] {
        let (a, b) = (run(seed, &options), run(seed, &options));
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}");
        assert_eq!(a.snapshot, b.snapshot, "seed {seed}");
        assert_eq!(a.sim_time_us, b.sim_time_us, "seed {seed}");
        assert!(a.snapshot.is_some_and(|files| !files.is_empty()));
    }
    assert_ne!(run(1, &options).trace_hash, run(2, &options).trace_hash);
}

#[test]
fn a_failed_fsync_poisons_the_engine_and_recovery_keeps_the_acknowledged() {
    let config = TopicConfig {
        partitions: 2,
        segment_bytes: 4096,
        index_interval_bytes: 512,
        ..TopicConfig::default()
    };
    for seed in 0..20 {
        let mut rng = Rng::new(seed);
        let disk = SimDisk::new(rng.fork());
        let clock = SimClock::new(EPOCH_MS);
        let open = || {
            let options = Options { durability: Durability::Sync, ..Options::default() };
            Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options).unwrap().0
        };
        let mut model = Model::new(2);
        let engine = open();
        engine.create_topic(TOPIC, config).unwrap();
        model.topic = TopicState::Present;
        for _ in 0..rng.between(1, 20) {
            let length = rng.below(700) as usize;
            let value = rng.bytes(length);
            engine.append(TOPIC, 0, &[Record::new(None, &value)]).unwrap();
            let record = ModelRecord { key: None, value, timestamp: EPOCH_MS };
            model.acknowledge(0, ModelBatch { records: vec![record], appended_ms: EPOCH_MS });
        }
        disk.fail_next_syncs(1);
        let error = engine.append(TOPIC, 0, &[Record::new(None, b"doomed")]).unwrap_err();
        assert!(matches!(error, AppendError::Io(_)), "seed {seed}: {error}");
        assert!(engine.poisoned().is_some());
        let error = engine.append(TOPIC, 1, &[Record::new(None, b"later")]).unwrap_err();
        assert!(matches!(error, AppendError::Poisoned(_)), "seed {seed}: {error}");
        let syncs = disk.stats().syncs;
        drop(engine);
        assert_eq!(disk.stats().syncs, syncs, "seed {seed}: a poisoned engine synced");
        disk.crash(&mut Rng::new(seed));
        // Linux dropped the doomed batch's pages at the failed fsync: it cannot come back,
        // and the model does not allow it (it was never acknowledged nor marked uncertain).
        let engine = open();
        assert!(engine.poisoned().is_none(), "seed {seed}: reopening clears the poison");
        let scan = oracle::scan(&engine, &model, &mut rng).unwrap();
        let context = Context {
            model: &model,
            engine: &engine,
            scan: &scan,
            topic_exists: true,
            now_ms: EPOCH_MS,
        };
        oracle::check_all(&oracle::standard(), &context, &mut rng).unwrap();
        assert!(scan.partitions[1].is_empty());
    }
}

/// Found by the simulator's faulty opens (seed 61 of the first swarm with them): the first
/// open created the data directory and failed on the fsync of its parent; the next open found
/// the directory there and never fsynced the parent, so a power loss later took the data
/// directory, with every acknowledged record in it. A writable open now fsyncs the data
/// directory's parent every time.
#[test]
fn a_first_open_that_failed_before_its_parent_fsync_loses_nothing_later() {
    let disk = SimDisk::new(Rng::new(61));
    let clock = SimClock::new(EPOCH_MS);
    let open = || {
        let options = Options { durability: Durability::Sync, ..Options::default() };
        Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options)
    };
    disk.fail_next_syncs(1);
    assert!(open().is_err(), "the fsync of / after creating /data fails");
    assert_eq!(disk.open_handles(), 0, "a failed open releases every handle");
    let engine = open().unwrap().0;
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    engine.append(TOPIC, 0, &[Record::new(None, b"acknowledged")]).unwrap();
    drop(engine);
    disk.crash(&mut Rng::new(61));
    let engine = open().unwrap().0;
    let fetch = engine.read(TOPIC, 0, chronik_engine::Offset::ZERO, 1 << 16).unwrap();
    let values: Vec<Vec<u8>> = fetch.records().map(|r| r.value().to_vec()).collect();
    assert_eq!(values, [b"acknowledged".to_vec()]);
}

/// Runs in the situation the swarm once failed on: an fsync failed (Linux drops the dirty pages
/// but keeps them readable, and the engine poisons itself), the process reopened without a
/// machine crash, recovery accepted the never-durable tail from the page cache, and a later
/// power loss left a hole before acknowledged records. Recovery now writes the tail past the
/// sync checkpoint again before its fdatasync.
///
/// The eight seeds first kept for it (90, 247, 329, 359, 400, 613, 749, 929) stopped drawing
/// that situation as the workload grew (all eight pass with the fix taken out), so the test
/// searches for runs that draw it instead, and checks them with every oracle; it fails if the
/// search finds too few. `a_tail_read_back_after_a_failed_fsync_is_written_again` pins the
/// same fix without a seed.
#[test]
fn seeds_that_reopen_after_a_failed_fsync_and_crash_later_pass() {
    /// Runs wanted in the situation; the first ones from seed 0 are 4, 10, 24, 25, 33, 44, 57
    /// and 85 (at 200 operations), and seed 10 fails without the fix.
    const FOUND_WANTED: usize = 8;
    /// Seeds the search may run: at 200 operations about one in sixteen draws the situation.
    const SEARCH_SEEDS_MAX: u64 = 400;
    /// Trace events kept per run: all of them at 200 operations.
    const TRACE_KEPT: usize = 1 << 16;
    let options = RunOptions { trace_events_max: TRACE_KEPT, ..RunOptions::default() };
    let mut found = Vec::new();
    for seed in 0..SEARCH_SEEDS_MAX {
        let outcome = run(seed, &options);
        if let Some(violation) = &outcome.violation {
            panic!("{violation}\nreplay: {}", outcome.replay_command());
        }
        assert!(outcome.trace[0].starts_with("#1 "), "seed {seed}: the trace lost its start");
        if reopened_after_a_failed_fsync_then_crashed(&outcome.trace) {
            found.push(seed);
            if found.len() == FOUND_WANTED {
                break;
            }
        }
    }
    assert_eq!(
        found.len(),
        FOUND_WANTED,
        "only seeds {found:?} of 0..{SEARCH_SEEDS_MAX} reopened without a crash after a failed \
         fsync and crashed later: the workload no longer draws the situation this test is for"
    );
}

/// Whether a run's trace shows an fsync failing, then (with no crash between) a round ending
/// in a restart without a crash, then a crash.
fn reopened_after_a_failed_fsync_then_crashed(trace: &[String]) -> bool {
    let (mut failed, mut reopened) = (false, false);
    for event in trace {
        if event.contains("simulated EIO on fsync") {
            failed = true;
        } else if event.contains("end round") && event.ends_with(": Restart") {
            reopened |= failed;
        } else if event.ends_with(" crash") {
            if reopened {
                return true;
            }
            failed = false;
        }
    }
    false
}

#[test]
fn the_situation_finder_reads_the_trace_in_order() {
    let trace = |events: &[&str]| events.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>();
    let eio = "#3 flush -> error: fsync /data/topics/events/0: simulated EIO on fsync";
    let restart = "#5 end round 1: Restart";
    let crash = "#9 crash";
    assert!(reopened_after_a_failed_fsync_then_crashed(&trace(&[eio, restart, crash])));
    assert!(!reopened_after_a_failed_fsync_then_crashed(&trace(&[eio, restart])));
    assert!(!reopened_after_a_failed_fsync_then_crashed(&trace(&[eio, crash, restart, crash])));
    assert!(!reopened_after_a_failed_fsync_then_crashed(&trace(&[restart, eio, crash])));
}

/// The fsync-failure reopen bug, pinned without a seed: records written in `os` mode, a flush
/// whose fdatasync fails (Linux drops the dirty pages from write-back but keeps them readable),
/// a reopen without a crash that accepts them from the page cache, one `sync` append after
/// them, and a power loss. Every record must come back, with no hole before the last.
#[test]
fn a_tail_read_back_after_a_failed_fsync_is_written_again() {
    for seed in 0..20 {
        let disk = SimDisk::new(Rng::new(seed));
        let clock = SimClock::new(EPOCH_MS);
        let open = |durability| {
            let options = Options { durability, ..Options::default() };
            Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options).unwrap().0
        };
        let engine = open(Durability::Os);
        engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
        let values: Vec<Vec<u8>> = (0..5).map(|i| vec![i; 300]).collect();
        for value in &values {
            engine.append(TOPIC, 0, &[Record::new(None, value)]).unwrap();
        }
        disk.fail_next_syncs(1);
        assert!(engine.flush().is_err(), "seed {seed}: the flush's fdatasync fails");
        drop(engine);
        let engine = open(Durability::Sync);
        engine.append(TOPIC, 0, &[Record::new(None, b"after")]).unwrap();
        drop(engine);
        disk.crash(&mut Rng::new(seed));
        let engine = open(Durability::Sync);
        let mut read = Vec::new();
        let mut next = chronik_engine::Offset::ZERO;
        loop {
            let fetch = engine.read(TOPIC, 0, next, 1 << 16).unwrap();
            if fetch.is_empty() {
                break;
            }
            read.extend(fetch.records().map(|r| r.value().to_vec()));
            next = fetch.next_offset();
        }
        let mut expected = values.clone();
        expected.push(b"after".to_vec());
        assert_eq!(read, expected, "seed {seed}");
    }
}

/// Found by the simulator's faulty opens (seed 102663 at 1000 operations): recovery cut a torn
/// tail and the fsync after the cut failed, which drops the truncate from write-back while the
/// page cache shows the file short. The next open found nothing to cut, the disk kept the old
/// tail past the new end, and after the next crash its leftovers read as evidence of synced
/// data. Recovery now sets the active segment's length again on every writable open.
#[test]
fn a_cut_tail_stays_cut_after_the_fsync_of_the_cut_failed() {
    use chronik_engine::io::{OpenMode, Operation, run_plain, write_all};
    for seed in 0..20 {
        let disk = SimDisk::new(Rng::new(seed));
        let clock = SimClock::new(EPOCH_MS);
        let open = || {
            let options = Options { durability: Durability::Sync, ..Options::default() };
            Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options)
        };
        let engine = open().unwrap().0;
        let config = TopicConfig { partitions: 1, ..TopicConfig::default() };
        engine.create_topic(TOPIC, config).unwrap();
        let values: Vec<Vec<u8>> = (0..3).map(|i| vec![i; 100]).collect();
        for value in &values {
            engine.append(TOPIC, 0, &[Record::new(None, value)]).unwrap();
        }
        drop(engine);
        // A durable torn tail: garbage past the last batch.
        let path = Path::new("/data/topics/events/0/00000000000000000000.log");
        let file = disk.open(path, OpenMode::ReadWrite).unwrap();
        let size = disk.file_size(file).unwrap();
        write_all(&disk, file, size, Rng::new(seed).bytes(700)).unwrap();
        run_plain(&disk, Operation::Fdatasync { file }).unwrap();
        disk.close(file);
        disk.fail_next_file_syncs(1);
        assert!(open().is_err(), "seed {seed}: the fsync after the cut fails");
        let engine = open().unwrap().0;
        engine.append(TOPIC, 0, &[Record::new(None, b"after")]).unwrap();
        drop(engine);
        disk.crash(&mut Rng::new(seed));
        let (engine, report) = open().unwrap();
        assert!(report.is_clean(), "seed {seed}: {:?}", report.lines());
        let fetch = engine.read(TOPIC, 0, chronik_engine::Offset::ZERO, 1 << 16).unwrap();
        let read: Vec<Vec<u8>> = fetch.records().map(|r| r.value().to_vec()).collect();
        let mut expected = values.clone();
        expected.push(b"after".to_vec());
        assert_eq!(read, expected, "seed {seed}");
    }
}

/// Found by review of deferred completions: an `interval` append is acknowledged on its write
/// while the fdatasync linked behind it may still be in flight. If that fdatasync fails and
/// comes back only while its partition is removed (a topic deletion, a close), the failure
/// must still poison the engine: no later close may succeed or leave the clean-shutdown mark.
/// Over seeds, the disk defers completions and fails the first file fdatasync, linked behind
/// the second append's write.
#[test]
fn a_failed_fdatasync_completed_during_a_removal_poisons_the_engine() {
    let mut failed_during_removal = 0;
    for seed in 0..60 {
        let disk = SimDisk::new(Rng::new(seed));
        let clock = SimClock::new(EPOCH_MS);
        let options = Options { durability: Durability::Interval { ms: 1 }, ..Options::default() };
        let open = || Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options);
        let engine = open().unwrap().0;
        engine
            .create_topic(TOPIC, TopicConfig { partitions: 1, ..TopicConfig::default() })
            .unwrap();
        disk.set_deferred_completions(true);
        // Written, not yet synced: the next append's turn links an fdatasync behind its write.
        engine.append(TOPIC, 0, &[Record::new(None, b"written")]).unwrap();
        clock.advance(10);
        disk.fail_next_file_syncs(1);
        let appended = engine.append(TOPIC, 0, &[Record::new(None, b"maybe")]);
        let poisoned_before = engine.poisoned().is_some();
        let removed = engine.delete_topic(TOPIC);
        let failed = disk.stats().failed_syncs > 0;
        if failed && appended.is_ok() && !poisoned_before {
            failed_during_removal += 1;
        }
        let closed = engine.close();
        if failed {
            assert!(
                closed.is_err(),
                "seed {seed}: a failed fdatasync, a clean close ({removed:?})"
            );
        }
        disk.set_deferred_completions(false);
        let (engine, report) = open().unwrap();
        assert!(!failed || !report.clean_shutdown, "seed {seed}: a mark after a failed fdatasync");
        drop(engine);
    }
    assert!(failed_during_removal > 0, "no seed failed the fdatasync during the removal");
}
