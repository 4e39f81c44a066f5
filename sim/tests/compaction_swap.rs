//! A compaction swap cut by a power loss at each of its directory fsyncs, on a disk whose
//! crashes keep any subset of a directory's unsynced entry changes (the case no ordering
//! saves). The swarm meets this rarely, because it needs a group of several segments (a
//! second pass over small cleaned segments); here it is built on purpose for every crash
//! seed and every fsync of the pass. Run with the canary that drops the fsync between the
//! sources' removal and the rename, the same scenario must fail: the test can fail.
//!
//! The premise is checked too: the pass merges (fewer segments out than in) in the scenario
//! left uncut and in every scenario whose cut comes after the pass ended, so a compaction that
//! stopped merging fails here instead of leaving the swaps of single segments tested only.

use chronik_engine::canary::Canary;
use chronik_engine::{Cleanup, Durability, Engine, Offset, Options, Record, TopicConfig};
use chronik_sim::canaries::arm;
use chronik_sim::clock::EPOCH_MS;
use chronik_sim::disk::Faults;
use chronik_sim::{Rng, SimClock, SimDisk};
use std::collections::BTreeMap;
use std::path::Path;

const KEYS: u64 = 6;
const CRASH_SEEDS: u64 = 24;
const DIRECTORY_SYNCS: u64 = 6;

/// What went wrong in one scenario, if anything; else whether the pass merged, if it ended
/// before the power cut (`None` if the cut came during it). No cut if `cut_at_sync` is 0.
fn scenario(crash_seed: u64, cut_at_sync: u64) -> Result<Option<bool>, String> {
    let disk = SimDisk::new(Rng::new(crash_seed));
    let clock = SimClock::new(EPOCH_MS);
    let open = || {
        let options = Options { durability: Durability::Sync, ..Options::default() };
        Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options)
    };
    let (engine, _) = open().map_err(|e| e.to_string())?;
    let config = TopicConfig {
        segment_bytes: 4096,
        index_interval_bytes: 512,
        cleanup: Cleanup::Compact,
        delete_retention_ms: 0,
        ..TopicConfig::default()
    };
    engine.create_topic("t", config).map_err(|e| e.to_string())?;
    let mut latest = BTreeMap::new();
    let mut append = |engine: &Engine<SimDisk>, round: u64| -> Result<(), String> {
        for i in 0..40 {
            let key = format!("key-{}", i % KEYS);
            let value = format!("{round}-{i}-{}", "v".repeat(300));
            engine
                .append("t", 0, &[Record::new(Some(key.as_bytes()), value.as_bytes())])
                .map_err(|e| e.to_string())?;
            latest.insert(key, value);
        }
        Ok(())
    };
    // Two rounds of updates, each compacted into small cleaned segments: the next pass
    // merges them into groups of several sources.
    for round in 0..2 {
        append(&engine, round)?;
        engine.compact_partition("t", 0).map_err(|e| e.to_string())?;
    }
    append(&engine, 2)?;
    disk.set_faults(Faults { directory_subset_per_million: 1_000_000, ..Faults::NONE });
    if cut_at_sync > 0 {
        disk.cut_power_at_directory_sync(cut_at_sync);
    }
    let report = engine.compact_partition("t", 0);
    let merged = report.as_ref().ok().and_then(|r| *r).map(|r| r.segments_in > r.segments_out);
    drop(engine);
    if !disk.power_is_cut() {
        disk.restore_power();
    }
    disk.crash(&mut Rng::new(crash_seed));
    let (engine, recovery) = open().map_err(|e| format!("reopen: {e}"))?;
    if let Some(damage) = recovery.partitions.iter().find(|p| !p.damage.is_empty()) {
        return Err(format!("damage after the crash: {:?}", damage.damage));
    }
    let mut found = BTreeMap::new();
    let mut from = Offset::ZERO;
    loop {
        let fetch = engine.read("t", 0, from, 1 << 20).map_err(|e| format!("read: {e}"))?;
        if fetch.is_empty() {
            break;
        }
        for record in fetch.records().filter(|r| r.offset() >= from) {
            let key = String::from_utf8_lossy(record.key().unwrap_or_default()).into_owned();
            found.insert(key, String::from_utf8_lossy(record.value()).into_owned());
        }
        from = fetch.next_offset();
    }
    if found != latest {
        return Err(format!("latest values differ after the crash (merged: {merged:?})"));
    }
    Ok(merged)
}

#[test]
fn a_swap_cut_at_any_directory_fsync_keeps_the_latest_values_and_the_canary_breaks_it() {
    let mut passes_ended = 0;
    for crash_seed in 0..CRASH_SEEDS {
        for sync in 0..=DIRECTORY_SYNCS {
            match scenario(crash_seed, sync) {
                Err(failure) => {
                    panic!("crash seed {crash_seed}, cut at directory fsync {sync}: {failure}")
                }
                Ok(Some(merged)) => {
                    passes_ended += 1;
                    assert!(merged, "crash seed {crash_seed}, cut at {sync}: the pass merged none");
                }
                Ok(None) => assert!(sync > 0, "crash seed {crash_seed}: the uncut pass failed"),
            }
        }
    }
    // At least the uncut scenario of each seed ended its pass, so the premise was checked.
    eprintln!(
        "{passes_ended} of {} scenarios ended the pass before a cut",
        CRASH_SEEDS * (DIRECTORY_SYNCS + 1)
    );
    assert!(passes_ended >= CRASH_SEEDS, "{passes_ended} passes ended");
    let _armed = arm(Some(Canary::SwapRenameBeforeRemovalsSynced));
    let caught = (0..CRASH_SEEDS)
        .flat_map(|seed| (1..=DIRECTORY_SYNCS).map(move |sync| (seed, sync)))
        .filter(|&(seed, sync)| scenario(seed, sync).is_err())
        .count();
    eprintln!("the canary broke {caught} of {} scenarios", CRASH_SEEDS * DIRECTORY_SYNCS);
    assert!(caught > 0, "the canary went unnoticed in every scenario");
}
