//! `Engine::commit_transaction` is all or nothing across a power loss at every disk call of
//! the commit, in every durability mode: after the crash either every write of the
//! transaction (three partitions of two topics) and its consumer offset are there, or none of
//! them is; earlier transactions are all there; and appends go on right after what is there.
//! A topic deleted and created again does not inherit the old one's commit records. Two
//! canaries of the commit's order make the same scenarios fail.

use chronik_engine::canary::Canary;
use chronik_engine::{
    Cleanup, Durability, Engine, GroupCommit, Offset, Options, Record, TopicConfig,
    TransactionWrite,
};
use chronik_sim::canaries::arm;
use chronik_sim::clock::EPOCH_MS;
use chronik_sim::disk::Faults;
use chronik_sim::{Rng, SimClock, SimDisk};
use std::path::Path;

const CUTS: u64 = 40;
const CRASH_SEEDS: u64 = 3;
const ROUNDS: u64 = 3;

type Disk = SimDisk;

fn values(engine: &Engine<Disk>, topic: &str, partition: u32) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut from = Offset::ZERO;
    loop {
        let fetch = engine.read(topic, partition, from, 1 << 20).map_err(|e| e.to_string())?;
        if fetch.is_empty() {
            return Ok(out);
        }
        out.extend(fetch.records().filter(|r| r.offset() >= from).map(|r| r.value().to_vec()));
        from = fetch.next_offset();
    }
}

/// The writes of round `round`: (topic, partition, values).
fn round_writes(round: u64) -> Vec<(&'static str, u32, Vec<Vec<u8>>)> {
    let value = |what: &str, i: u64| format!("{what}-{round}-{i}").into_bytes();
    vec![
        ("out", 0, (0..3).map(|i| value("a", i)).collect()),
        ("out", 1, (0..2).map(|i| value("b", i)).collect()),
        ("changelog", 0, (0..4).map(|i| value("c", i)).collect()),
    ]
}

fn commit(engine: &Engine<Disk>, round: u64) -> Result<(), String> {
    let writes = round_writes(round);
    let records: Vec<Vec<Record<'_>>> = writes
        .iter()
        .map(|(_, _, values)| values.iter().map(|v| Record::new(Some(b"k"), v)).collect())
        .collect();
    let batches: Vec<TransactionWrite<'_>> = writes
        .iter()
        .zip(&records)
        .map(|((topic, partition, _), records)| TransactionWrite {
            topic,
            partition: *partition,
            records,
        })
        .collect();
    let offsets = [("in", 0, Offset::new(10 * (round + 1)))];
    let group = GroupCommit { group: "app", offsets: &offsets };
    engine.commit_transaction(&batches, Some(group)).map(|_| ()).map_err(|e| e.to_string())
}

/// How many rounds the engine holds, checking that each is whole.
fn rounds_present(engine: &Engine<Disk>) -> Result<u64, String> {
    let mut found = Vec::new();
    for (topic, partition, _) in round_writes(0) {
        found.push(values(engine, topic, partition)?);
    }
    let committed = engine.committed_offset("app", "in", 0).map_or(0, |o| o.get() / 10);
    for round in 0..=ROUNDS {
        let writes = round_writes(round);
        let present: Vec<bool> = writes
            .iter()
            .zip(&found)
            .map(|((_, _, values), found)| values.iter().all(|v| found.contains(v)))
            .collect();
        let offsets_there = committed > round;
        if present.iter().all(|&p| p) && offsets_there {
            continue;
        }
        if present.iter().all(|&p| !p) && !offsets_there {
            let total: usize = found.iter().map(Vec::len).sum();
            let expected: usize =
                (0..round).map(|r| round_writes(r).iter().map(|w| w.2.len()).sum::<usize>()).sum();
            if total != expected {
                return Err(format!("{total} records after {round} rounds, expected {expected}"));
            }
            return Ok(round);
        }
        return Err(format!(
            "round {round} is partial: writes present {present:?}, offsets committed {offsets_there}"
        ));
    }
    Ok(ROUNDS + 1)
}

fn scenario(durability: Durability, crash_seed: u64, cut: u64) -> Result<(), String> {
    let disk = SimDisk::new(Rng::new(crash_seed));
    let clock = SimClock::new(EPOCH_MS);
    let open = || {
        let options = Options { durability, ..Options::default() };
        Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options)
            .map(|(engine, _)| engine)
            .map_err(|e| format!("open: {e}"))
    };
    let engine = open()?;
    let small = TopicConfig { partitions: 2, segment_bytes: 4096, ..TopicConfig::default() };
    engine.create_topic("out", small).map_err(|e| e.to_string())?;
    engine.create_topic("in", small).map_err(|e| e.to_string())?;
    let compacted = TopicConfig { partitions: 1, cleanup: Cleanup::Compact, ..small };
    engine.create_topic("changelog", compacted).map_err(|e| e.to_string())?;
    for round in 0..ROUNDS {
        commit(&engine, round)?;
    }
    let faults = Faults { directory_subset_per_million: 500_000, ..Faults::NONE };
    disk.set_faults(faults);
    disk.cut_power_after(cut);
    let outcome = commit(&engine, ROUNDS);
    if outcome.is_ok() && !disk.power_is_cut() {
        disk.restore_power();
    }
    drop(engine);
    disk.crash(&mut Rng::new(crash_seed));
    let engine = open()?;
    let rounds = rounds_present(&engine)?;
    if rounds < ROUNDS {
        return Err(format!("only {rounds} of {ROUNDS} earlier transactions survived"));
    }
    if outcome.is_ok() && rounds != ROUNDS + 1 {
        return Err("a transaction that returned Ok was lost".to_owned());
    }
    // Appends continue right after what is there, and a transaction commits again.
    commit(&engine, ROUNDS + 1).map_err(|e| format!("after recovery: {e}"))?;
    let after = values(&engine, "out", 0)?;
    if after.last() != round_writes(ROUNDS + 1)[0].2.last() {
        return Err("a transaction after recovery is not at the end".to_owned());
    }
    Ok(())
}

/// A topic deleted after a transaction and created again: its old commit records must not
/// make the new topic's uncommitted transaction look committed after a crash.
fn recreated(crash_seed: u64, cut: u64) -> Result<(), String> {
    let disk = SimDisk::new(Rng::new(crash_seed));
    let clock = SimClock::new(EPOCH_MS);
    let open = || {
        let options = Options { durability: Durability::Sync, ..Options::default() };
        Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options)
            .map(|(engine, _)| engine)
            .map_err(|e| format!("open: {e}"))
    };
    let engine = open()?;
    let config = TopicConfig { partitions: 1, ..TopicConfig::default() };
    engine.create_topic("t", config).map_err(|e| e.to_string())?;
    engine.create_topic("in", config).map_err(|e| e.to_string())?;
    let records: Vec<Record<'_>> = (0..5).map(|_| Record::new(None, b"old")).collect();
    let write = [TransactionWrite { topic: "t", partition: 0, records: &records }];
    engine.commit_transaction(&write, None).map_err(|e| e.to_string())?;
    engine.delete_topic("t").map_err(|e| e.to_string())?;
    engine.create_topic("t", config).map_err(|e| e.to_string())?;
    let records = [Record::new(None, b"new")];
    let write = [TransactionWrite { topic: "t", partition: 0, records: &records }];
    let offsets = [("in", 0, Offset::new(1))];
    disk.cut_power_after(cut);
    let outcome =
        engine.commit_transaction(&write, Some(GroupCommit { group: "g", offsets: &offsets }));
    if outcome.is_ok() && !disk.power_is_cut() {
        disk.restore_power();
    }
    drop(engine);
    disk.crash(&mut Rng::new(crash_seed));
    let engine = open()?;
    let present = values(&engine, "t", 0)?.len();
    let committed = engine.committed_offset("g", "in", 0).is_some();
    if present != usize::from(committed) {
        return Err(format!("{present} records of the transaction, offsets committed {committed}"));
    }
    Ok(())
}

fn failures() -> Vec<String> {
    let mut failures = Vec::new();
    for seed in 0..CRASH_SEEDS {
        for cut in 0..CUTS {
            if let Err(failure) = recreated(seed, cut) {
                failures.push(format!("recreated topic, seed {seed} cut {cut}: {failure}"));
            }
        }
    }
    for durability in [Durability::Sync, Durability::Os, Durability::Interval { ms: 50 }] {
        for seed in 0..CRASH_SEEDS {
            for cut in 0..CUTS {
                if let Err(failure) = scenario(durability, seed, cut) {
                    failures.push(format!("{durability:?} seed {seed} cut {cut}: {failure}"));
                }
            }
        }
    }
    failures
}

#[test]
fn a_transaction_cut_at_any_call_is_all_or_nothing_and_canaries_break_it() {
    let found = failures();
    assert!(found.is_empty(), "{}", found.join("\n"));
    for canary in
        [Canary::RecoveryKeepsUncommittedTransaction, Canary::TransactionCommittedBeforeDataSynced]
    {
        let _armed = arm(Some(canary));
        let caught = failures().len();
        eprintln!("{canary:?} broke {caught} scenarios");
        assert!(caught > 0, "{canary:?} went unnoticed");
    }
}
