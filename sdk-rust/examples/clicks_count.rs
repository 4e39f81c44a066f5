//! Clicks counted per user, exactly once, by a stateful processor whose store is backed by a
//! compacted changelog. Kill it at any moment (Ctrl-C, `kill -9`) and start it again: it
//! restores its counts from the changelog (and a snapshot), goes on from its last commit, and
//! ends with every count exact and one output record per click.
//!
//!     cargo run --release -p chronik --example clicks_count -- [TARGET] [CLICKS] [STEP]
//!
//! TARGET is a data directory (default `./clicks-data`) or, built with `--features kafka`, a
//! Kafka-protocol cluster: `kafka://127.0.0.1:9092`. The same code runs on both. STEP is `all`
//! (the default: produce, count, verify), or one of `produce`, `count`, `verify`: start
//! `count` several times on a cluster and the processes share the partitions in one consumer
//! group; kill one and another takes its partitions over, restoring their counts from the
//! changelog. `CHRONIK_GUARANTEE=at-least-once` runs on a cluster without Kafka transactions
//! (outputs may then repeat after a kill; the counts stay exact). `CLICKS_PACE=N` counts at most
//! N clicks per second per process, to watch partitions move.
//!
//! `CLICKS_STORE=disk` keeps the counts in a disk store (bounded memory; a restart reads only
//! the changelog the store had not taken); `CLICKS_USERS=N` spreads the clicks over N users.
//!
//! Defaults: 1,000,000 clicks over 1,000 users in 4 partitions. The last line names the final
//! state (`final state: ... digest ...`), the same on every target for the same clicks.

use chronik::Log;
use chronik::processor::{
    Context, Guarantee, ProcessError, Processor, ProcessorConfig, RestoreProgress, StoreKind, Until,
};
use chronik::{Connection, Durability, Options, OwnedRecord, Record, RecordView, TransactionWrite};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

const USERS: u64 = 1_000;

/// Users the clicks are spread over (`CLICKS_USERS`, default [`USERS`]).
fn users() -> u64 {
    std::env::var("CLICKS_USERS")
        .ok()
        .and_then(|u| u.parse().ok())
        .filter(|&u| u > 0)
        .unwrap_or(USERS)
}

/// The counts' store kind (`CLICKS_STORE`: memory, the default, or disk).
fn store_kind() -> Result<StoreKind, String> {
    std::env::var("CLICKS_STORE").map_or(Ok(StoreKind::Memory), |kind| kind.parse())
}

/// The counter application.
fn config() -> Result<ProcessorConfig, String> {
    let listener: chronik::processor::RestoreListener = Arc::new(|p: RestoreProgress<'_>| {
        if p.done {
            let from = p.from_snapshot.map_or("the changelog".to_owned(), |o| {
                format!("a store or snapshot at {o} + changelog")
            });
            println!(
                "  restored store {} partition {}: {} records from {from}",
                p.store, p.partition, p.restored
            );
        }
    });
    Ok(ProcessorConfig {
        commit_every_records: Some(20_000),
        snapshot_every_commits: Some(10),
        on_restore: Some(listener),
        ..ProcessorConfig::new("click-counter", "clicks")
            .store_with("counts", store_kind()?)
            .commit_interval_ms(100)
    })
}
const PARTITIONS: u32 = 4;
const PRODUCE_BATCH: u64 = 1_000;

/// Counts clicks per user in the store "counts" and emits each new count to "click-counts".
struct ClickCounter {
    /// At most this many clicks per second (`CLICKS_PACE`), to watch partitions move between
    /// processes; unpaced without it.
    pace: Option<u64>,
    seen: u64,
}

impl Processor for ClickCounter {
    fn process_batch(
        &mut self,
        records: &[RecordView<'_>],
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        for record in records {
            self.process(record, ctx)?;
            self.seen += 1;
            if let Some(pace) = self.pace.filter(|_| self.seen.is_multiple_of(100)) {
                std::thread::sleep(std::time::Duration::from_micros(100_000_000 / pace.max(1)));
            }
        }
        Ok(())
    }

    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let user = record.key().ok_or_else(|| ProcessError::new("a click without a user"))?;
        let counts = ctx.store("counts")?;
        let count = counts.get(user)?.map_or(Ok(0), |v| decode(&v))? + 1;
        counts.put(user, &count.to_le_bytes());
        ctx.emit("click-counts", Some(user), &count.to_le_bytes());
        Ok(())
    }
}

fn decode(bytes: &[u8]) -> Result<u64, ProcessError> {
    bytes
        .try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| ProcessError::new("a count is not 8 bytes"))
}

fn user(i: u64) -> String {
    format!("user-{:04}", (i * 7919) % users())
}

/// Produce the clicks not produced yet (a kill may have stopped an earlier run midway).
fn produce(log: &Connection, clicks: u64) -> Result<(), Box<dyn std::error::Error>> {
    let mut produced: u64 =
        (0..PARTITIONS).map(|p| log.record_count("clicks", p)).sum::<Result<u64, _>>()?;
    let started = Instant::now();
    let from = produced;
    let mut pending: Vec<Vec<(String, String)>> = vec![Vec::new(); PARTITIONS as usize];
    // Clicks are produced in order; each partition's share keeps that order.
    while produced < clicks {
        let end = (produced + PRODUCE_BATCH).min(clicks);
        for i in produced..end {
            let key = user(i);
            let partition = chronik::partition_for_key(key.as_bytes(), PARTITIONS) as usize;
            pending[partition].push((key, format!("/page/{}", i % 50)));
        }
        // Embedded: one transaction for the batch's clicks in every partition, so a kill
        // leaves all of them or none, and what is there is always the first `produced` clicks.
        let records: Vec<Vec<Record<'_>>> = pending
            .iter()
            .map(|batch| {
                batch.iter().map(|(k, v)| Record::new(Some(k.as_bytes()), v.as_bytes())).collect()
            })
            .collect();
        let writes: Vec<TransactionWrite<'_>> = records
            .iter()
            .enumerate()
            .map(|(partition, records)| TransactionWrite {
                topic: "clicks",
                partition: partition as u32,
                records,
            })
            .collect();
        log.send_all(&writes)?;
        drop(writes);
        drop(records);
        pending.iter_mut().for_each(Vec::clear);
        produced = end;
    }
    if produced > from {
        println!("produced clicks {from}..{produced} in {:.2?}", started.elapsed());
    }
    Ok(())
}

fn count(log: &Connection, guarantee: Guarantee) -> Result<(), Box<dyn std::error::Error>> {
    let config = config()?;
    let counting = Instant::now();
    let pace = std::env::var("CLICKS_PACE").ok().map(|p| p.parse::<u64>()).transpose()?;
    let counter = |_| ClickCounter { pace, seen: 0 };
    let stats = log.run(config, guarantee, counter, Until::CaughtUp)?;
    let elapsed = counting.elapsed();
    println!(
        "counted {} clicks in {elapsed:.2?} ({:.0} clicks/s), {} commits",
        stats.records,
        stats.records as f64 / elapsed.as_secs_f64().max(1e-9),
        stats.commits
    );
    Ok(())
}

/// Check: every user's count is exact in the store (read back from its changelog), and the
/// outputs hold one record per click (at least one, at least once), the last of each user
/// its count.
fn verify(
    log: &Connection,
    clicks: u64,
    guarantee: Guarantee,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut expected = BTreeMap::new();
    for i in 0..clicks {
        *expected.entry(user(i)).or_insert(0_u64) += 1;
    }
    let mut state: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_output: BTreeMap<String, u64> = BTreeMap::new();
    let mut outputs = 0_u64;
    for partition in 0..PARTITIONS {
        let changelog = log.records("click-counter-counts-changelog", partition)?;
        for (key, value) in chronik::processor::committed_state(&changelog) {
            state.insert(String::from_utf8_lossy(&key).into_owned(), decode(&value)?);
        }
        for record in log.records("click-counts", partition)? {
            outputs += 1;
            let OwnedRecord { key, value, .. } = record;
            let key = String::from_utf8_lossy(&key.unwrap_or_default()).into_owned();
            last_output.insert(key, decode(&value)?);
        }
    }
    let mut wrong = expected.iter().filter(|(user, count)| state.get(*user) != Some(count)).count();
    if let Connection::Embedded(chronik) = log {
        // The store itself, restored as a restart restores it (a disk store: opened, and the
        // changelog after its offset read), must hold the same counts.
        let runner = chronik::processor::Runner::new(chronik.engine(), config()?, |_| {
            ClickCounter { pace: None, seen: 0 }
        })?;
        let mut stored = BTreeMap::new();
        for partition in 0..PARTITIONS {
            for entry in runner.store(partition, "counts").ok_or("no store")? {
                let (key, value) = entry?;
                stored.insert(String::from_utf8_lossy(&key).into_owned(), decode(&value)?);
            }
        }
        for store in runner.stores() {
            store.check()?;
        }
        if stored != state {
            wrong += 1;
            println!("MISMATCH: the restored store differs from the changelog's state");
        }
    }
    let outputs_ok = match guarantee {
        Guarantee::ExactlyOnce => outputs == clicks,
        Guarantee::AtLeastOnce => outputs >= clicks,
    };
    let sample = user(7);
    println!("{sample}: {} clicks", expected[&sample]);
    let mut digest = String::new();
    for (user, count) in &state {
        use std::fmt::Write as _;
        let _ = write!(digest, "{user}={count};");
    }
    println!("final state: {} users, digest {:016x}", state.len(), digest_of(&digest));
    if wrong == 0 && state.len() == expected.len() && outputs_ok && last_output == state {
        println!(
            "exact: {} users, every count right, {outputs} output records for {clicks} clicks",
            expected.len()
        );
        Ok(())
    } else {
        Err(format!(
            "MISMATCH: {wrong} wrong counts of {} users, {outputs} output records for {clicks} \
             clicks, last outputs agree: {}",
            state.len(),
            last_output == state
        )
        .into())
    }
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("clicks_count: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_else(|| "./clicks-data".to_owned());
    let clicks: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let step = args.next().unwrap_or_else(|| "all".to_owned());
    let guarantee = Guarantee::from_env()?;
    let log = chronik::connect_with(
        &target,
        Options { durability: Durability::Sync, ..Options::default() },
    )?;
    println!("clicks_count: {target}");
    if let Connection::Embedded(chronik) = &log {
        for line in chronik.recovery().lines() {
            println!("  recovery: {line}");
        }
    }
    for topic in ["clicks", "click-counts"] {
        log.ensure_topic(topic, PARTITIONS)?;
    }
    if matches!(step.as_str(), "all" | "produce") {
        produce(&log, clicks)?;
    }
    if matches!(step.as_str(), "all" | "count") {
        count(&log, guarantee)?;
    }
    if matches!(step.as_str(), "all" | "verify") {
        verify(&log, clicks, guarantee)?;
    }
    if !matches!(step.as_str(), "all" | "produce" | "count" | "verify") {
        return Err(format!("unknown step {step:?}: all, produce, count or verify").into());
    }
    Ok(())
}

/// A stable digest of the final state, to compare runs (the same build's runs: `DefaultHasher`
/// is SipHash with fixed keys).
fn digest_of(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}
