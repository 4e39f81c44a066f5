//! Clicks counted per user, exactly once, by a stateful processor whose store is backed by a
//! compacted changelog. Kill it at any moment (Ctrl-C, `kill -9`) and start it again: it
//! restores its counts from the changelog (and a snapshot), goes on from its last commit, and
//! ends with every count exact and one output record per click.
//!
//!     cargo run --release -p chronik --example clicks_count -- [DATA_DIR] [CLICKS]
//!
//! Defaults: `./clicks-data`, 1,000,000 clicks over 1,000 users in 4 partitions.

use chronik::processor::{
    Context, ProcessError, Processor, ProcessorConfig, RestoreProgress, Runner,
};
use chronik::{Chronik, Durability, Options, Record, RecordView, TopicConfig, TransactionWrite};
use std::sync::Arc;
use std::time::Instant;

const USERS: u64 = 1_000;
const PARTITIONS: u32 = 4;
const PRODUCE_BATCH: u64 = 1_000;

/// Counts clicks per user in the store "counts" and emits each new count to "click-counts".
struct ClickCounter;

impl Processor for ClickCounter {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let user = record.key().ok_or_else(|| ProcessError::new("a click without a user"))?;
        let counts = ctx.store("counts")?;
        let count = counts.get(user).map_or(Ok(0), decode)? + 1;
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
    format!("user-{:04}", (i * 7919) % USERS)
}

/// Produce the clicks not produced yet (a kill may have stopped an earlier run midway).
fn produce(chronik: &Chronik, clicks: u64) -> Result<(), Box<dyn std::error::Error>> {
    let mut produced: u64 = (0..PARTITIONS)
        .map(|p| chronik.high_watermark("clicks", p).map(chronik::Offset::get))
        .sum::<Result<u64, _>>()?;
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
        // One transaction for the batch's clicks in every partition: a kill leaves all of
        // them or none, so what is there is always the first `produced` clicks.
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
        chronik.commit_transaction(&writes, None)?;
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "./clicks-data".to_owned());
    let clicks: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let chronik =
        Chronik::open(&dir, Options { durability: Durability::Sync, ..Options::default() })?;
    println!("clicks_count: data directory {dir}");
    for line in chronik.recovery().lines() {
        println!("  recovery: {line}");
    }
    for topic in ["clicks", "click-counts"] {
        if chronik.partition_count(topic).is_none() {
            chronik.create_topic(topic, TopicConfig::default().with_partitions(PARTITIONS))?;
        }
    }

    produce(&chronik, clicks)?;

    // Restore, then count what is not counted yet.
    let restore_started = Instant::now();
    let listener: chronik::processor::RestoreListener = Arc::new(|p: RestoreProgress<'_>| {
        if p.done {
            let from = p
                .from_snapshot
                .map_or("the changelog".to_owned(), |o| format!("a snapshot at {o} + changelog"));
            println!(
                "  restored store {} partition {}: {} records from {from}",
                p.store, p.partition, p.restored
            );
        }
    });
    let config = ProcessorConfig {
        commit_every_records: Some(20_000),
        snapshot_every_commits: Some(10),
        on_restore: Some(listener),
        ..ProcessorConfig::new("click-counter", "clicks").store("counts").commit_interval_ms(100)
    };
    let mut runner = Runner::new(chronik.engine(), config, |_| ClickCounter)?;
    println!(
        "restored in {:.2?}; counting from offsets {:?}",
        restore_started.elapsed(),
        runner.positions()
    );
    let counting = Instant::now();
    let stats = runner.run_until_caught_up()?;
    let elapsed = counting.elapsed();
    println!(
        "counted {} clicks in {elapsed:.2?} ({:.0} clicks/s), {} commits",
        stats.records,
        stats.records as f64 / elapsed.as_secs_f64().max(1e-9),
        stats.commits
    );

    // Check: every user's count is exact, and there is exactly one output record per click.
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..clicks {
        *expected.entry(user(i)).or_insert(0_u64) += 1;
    }
    let mut wrong = 0;
    let mut users = 0;
    for partition in 0..PARTITIONS {
        let store = runner.store(partition, "counts").ok_or("no store")?;
        users += store.len();
        for (key, value) in store.iter() {
            let key = String::from_utf8_lossy(key).into_owned();
            if expected.get(&key).copied() != Some(decode(value)?) {
                wrong += 1;
            }
        }
    }
    let outputs: u64 = (0..PARTITIONS)
        .map(|p| chronik.high_watermark("click-counts", p).map(chronik::Offset::get))
        .sum::<Result<u64, _>>()?;
    let sample = user(7);
    println!("{sample}: {} clicks", expected[&sample]);
    if wrong == 0 && users == expected.len() && outputs == clicks {
        println!(
            "exact: {} users, every count right, {outputs} output records for {clicks} clicks",
            expected.len()
        );
        Ok(())
    } else {
        Err(format!("MISMATCH: {wrong} wrong counts, {outputs} output records for {clicks} clicks")
            .into())
    }
}
