//! Clicks enriched by joining a users table, exactly once. The processor reads two
//! co-partitioned inputs, `clicks` and `users`, merged in timestamp order; users go into a
//! store backed by a compacted changelog, and each click is emitted to `enriched` with the
//! user's name as it was at the click's time. Kill it at any moment and start it again: it
//! restores the table, goes on from its last commit, and ends with every click enriched once,
//! with the right version of its user.
//!
//!     cargo run --release -p chronik --example clicks_join -- [DATA_DIR] [CLICKS]
//!
//! The users (1,000) are written at time 0 (version 1) and again halfway through the clicks
//! (version 2); clicks before that moment must carry version 1, the others version 2.

use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig, Runner};
use chronik::{
    Chronik, Durability, Offset, Options, Record, RecordView, TopicConfig, TransactionWrite,
};
use std::time::Instant;

const USERS: u64 = 1_000;
const PARTITIONS: u32 = 4;
const BATCH: u64 = 1_000;
/// Event times: click `i` happens at `EPOCH + 2 i + 1`; version 2 of the users at
/// `EPOCH + 2 (clicks / 2)`, between click `clicks/2 - 1` and click `clicks/2`.
const EPOCH: i64 = 1_700_000_000_000;

struct Enricher;

impl Processor for Enricher {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let user = record.key().ok_or_else(|| ProcessError::new("a record without a user"))?;
        if ctx.input() == "users" {
            ctx.store("users")?.put(user, record.value());
            return Ok(());
        }
        let name = ctx.store("users")?.get(user).unwrap_or(b"(unknown)").to_vec();
        let mut enriched = name;
        enriched.push(b' ');
        enriched.extend_from_slice(record.value());
        ctx.emit("enriched", Some(user), &enriched);
        Ok(())
    }
}

fn user(i: u64) -> String {
    format!("user-{:04}", (i * 7919) % USERS)
}

fn partition(key: &str) -> u32 {
    chronik::partition_for_key(key.as_bytes(), PARTITIONS)
}

/// Write `records` (topic, key, value, timestamp) in one transaction: all or none.
fn write_all(
    chronik: &Chronik,
    topic: &str,
    records: &[(String, String, i64)],
) -> Result<(), chronik::CommitError> {
    let mut by_partition: Vec<Vec<Record<'_>>> = vec![Vec::new(); PARTITIONS as usize];
    for (key, value, timestamp) in records {
        by_partition[partition(key) as usize]
            .push(Record::new(Some(key.as_bytes()), value.as_bytes()).with_timestamp(*timestamp));
    }
    let writes: Vec<TransactionWrite<'_>> = by_partition
        .iter()
        .enumerate()
        .map(|(p, records)| TransactionWrite { topic, partition: p as u32, records })
        .collect();
    chronik.commit_transaction(&writes, None).map(|_| ())
}

fn total(chronik: &Chronik, topic: &str) -> Result<u64, chronik::ReadError> {
    (0..PARTITIONS).map(|p| chronik.high_watermark(topic, p).map(Offset::get)).sum()
}

fn users_at(version: u64, timestamp: i64) -> Vec<(String, String, i64)> {
    (0..USERS)
        .map(|u| (format!("user-{u:04}"), format!("name-{u}-v{version}"), timestamp))
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "./join-data".to_owned());
    let clicks: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let half = clicks / 2;
    let chronik =
        Chronik::open(&dir, Options { durability: Durability::Sync, ..Options::default() })?;
    println!("clicks_join: data directory {dir}");
    for line in chronik.recovery().lines() {
        println!("  recovery: {line}");
    }
    for topic in ["clicks", "users", "enriched"] {
        if chronik.partition_count(topic).is_none() {
            chronik.create_topic(topic, TopicConfig::default().with_partitions(PARTITIONS))?;
        }
    }

    // Produce what is missing, each step one transaction, so what is there is always a prefix
    // of: users v1, clicks [0, half), users v2, clicks [half, clicks).
    let started = Instant::now();
    if total(&chronik, "users")? == 0 {
        write_all(&chronik, "users", &users_at(1, EPOCH))?;
    }
    let mut produced = total(&chronik, "clicks")?;
    while produced < clicks {
        if produced == half && total(&chronik, "users")? == USERS {
            write_all(&chronik, "users", &users_at(2, EPOCH + 2 * half.cast_signed()))?;
        }
        let end = (produced + BATCH).min(if produced < half { half } else { clicks });
        let batch: Vec<(String, String, i64)> = (produced..end)
            .map(|i| (user(i), format!("/page/{i}"), EPOCH + 2 * i.cast_signed() + 1))
            .collect();
        write_all(&chronik, "clicks", &batch)?;
        produced = end;
    }
    if produced == half && total(&chronik, "users")? == USERS {
        write_all(&chronik, "users", &users_at(2, EPOCH + 2 * half.cast_signed()))?;
    }
    println!("input ready in {:.2?}", started.elapsed());

    let config = ProcessorConfig {
        commit_every_records: Some(20_000),
        snapshot_every_commits: Some(10),
        ..ProcessorConfig::new("enricher", "clicks").input("users").store("users")
    };
    let restoring = Instant::now();
    let mut runner = Runner::new(chronik.engine(), config, |_| Enricher)?;
    println!("restored the users table in {:.2?}", restoring.elapsed());
    let joining = Instant::now();
    let stats = runner.run_until_caught_up()?;
    println!("joined {} records in {:.2?}", stats.records, joining.elapsed());

    // Check: one enriched record per click, each with its user's version at the click's time.
    let mut seen = 0_u64;
    let mut wrong = 0_u64;
    for p in 0..PARTITIONS {
        let mut consumer = chronik.consumer("enriched", p);
        for record in consumer.by_ref() {
            let record = record?;
            let value = String::from_utf8_lossy(&record.value).into_owned();
            let index: u64 =
                value.rsplit('/').next().and_then(|i| i.parse().ok()).ok_or("bad value")?;
            let version = if index < half { 1 } else { 2 };
            let number = (index * 7919) % USERS;
            let expected = format!("name-{number}-v{version} /page/{index}");
            wrong += u64::from(value != expected);
            seen += 1;
        }
    }
    println!("{seen} enriched clicks; sample: {} joined as of its time", user(half));
    if seen == clicks && wrong == 0 {
        println!(
            "exact: {clicks} clicks enriched once each, every one with the right user version"
        );
        Ok(())
    } else {
        Err(format!("MISMATCH: {seen} enriched records for {clicks} clicks, {wrong} wrong").into())
    }
}
