//! Clicks enriched by joining a users table, exactly once. The processor reads two
//! co-partitioned inputs, `clicks` and `users`, merged in timestamp order; users go into a
//! store backed by a compacted changelog, and each click is emitted to `enriched` with the
//! user's name as it was at the click's time. Kill it at any moment and start it again: it
//! restores the table, goes on from its last commit, and ends with every click enriched once,
//! with the right version of its user.
//!
//!     cargo run --release -p chronik --example clicks_join -- [DATA_DIR] [CLICKS]
//!     cargo run --release -p chronik --features kafka --example clicks_join -- \
//!         kafka://HOST:PORT [CLICKS]
//!
//! The same code runs on a Kafka-protocol cluster (`chronik::connect`); there
//! `CHRONIK_GUARANTEE=at-least-once` runs it without Kafka transactions (an enriched click may
//! then be written twice after a crash; the table in the store stays exact).
//!
//! The users (1,000) are written at time 0 (version 1) and again halfway through the clicks
//! (version 2); clicks before that moment must carry version 1, the others version 2.

use chronik::Log;
use chronik::processor::{Context, Guarantee, ProcessError, Processor, ProcessorConfig, Until};
use chronik::{Connection, Durability, Options, Record, RecordView, TransactionWrite};
use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
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
        let name =
            ctx.store("users")?.get(user)?.map_or_else(|| b"(unknown)".to_vec(), |v| v.to_vec());
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
    log: &Connection,
    topic: &str,
    records: &[(String, String, i64)],
) -> Result<(), chronik::ConnectionError> {
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
    log.send_all(&writes)
}

fn total(log: &Connection, topic: &str) -> Result<u64, chronik::ConnectionError> {
    (0..PARTITIONS).map(|p| log.record_count(topic, p)).sum()
}

fn users_at(version: u64, timestamp: i64) -> Vec<(String, String, i64)> {
    (0..USERS)
        .map(|u| (format!("user-{u:04}"), format!("name-{u}-v{version}"), timestamp))
        .collect()
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "./join-data".to_owned());
    let clicks: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let half = clicks / 2;
    let guarantee = Guarantee::from_env()?;
    let log = chronik::connect_with(
        &dir,
        Options { durability: Durability::Sync, ..Options::default() },
    )?;
    println!("clicks_join: {dir}");
    if let Connection::Embedded(chronik) = &log {
        for line in chronik.recovery().lines() {
            println!("  recovery: {line}");
        }
    }
    for topic in ["clicks", "users", "enriched"] {
        log.ensure_topic(topic, PARTITIONS)?;
    }

    // Produce what is missing, each step one transaction, so what is there is always a prefix
    // of: users v1, clicks [0, half), users v2, clicks [half, clicks).
    let started = Instant::now();
    if total(&log, "users")? == 0 {
        write_all(&log, "users", &users_at(1, EPOCH))?;
    }
    let mut produced = total(&log, "clicks")?;
    while produced < clicks {
        if produced == half && total(&log, "users")? == USERS {
            write_all(&log, "users", &users_at(2, EPOCH + 2 * half.cast_signed()))?;
        }
        let end = (produced + BATCH).min(if produced < half { half } else { clicks });
        let batch: Vec<(String, String, i64)> = (produced..end)
            .map(|i| (user(i), format!("/page/{i}"), EPOCH + 2 * i.cast_signed() + 1))
            .collect();
        write_all(&log, "clicks", &batch)?;
        produced = end;
    }
    if produced == half && total(&log, "users")? == USERS {
        write_all(&log, "users", &users_at(2, EPOCH + 2 * half.cast_signed()))?;
    }
    println!("input ready in {:.2?}", started.elapsed());

    let config = ProcessorConfig {
        commit_every_records: Some(20_000),
        snapshot_every_commits: Some(10),
        ..ProcessorConfig::new("enricher", "clicks").input("users").store("users")
    };
    let joining = Instant::now();
    let stats = log.run(config, guarantee, |_| Enricher, Until::CaughtUp)?;
    println!("restored and joined {} records in {:.2?}", stats.records, joining.elapsed());
    check(&log, clicks, guarantee)
}

fn check(log: &Connection, clicks: u64, guarantee: Guarantee) -> Result<(), Box<dyn Error>> {
    let half = clicks / 2;
    // Check: one enriched record per click (at least one, at least once), each with its user's
    // version at the click's time; the users table in the store at version 2.
    let mut seen = 0_u64;
    let mut wrong = 0_u64;
    let mut enriched: BTreeMap<u64, String> = BTreeMap::new();
    let mut table: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for p in 0..PARTITIONS {
        for record in log.records("enriched", p)? {
            let value = String::from_utf8_lossy(&record.value).into_owned();
            let index: u64 =
                value.rsplit('/').next().and_then(|i| i.parse().ok()).ok_or("bad value")?;
            let version = if index < half { 1 } else { 2 };
            let number = (index * 7919) % USERS;
            wrong += u64::from(value != format!("name-{number}-v{version} /page/{index}"));
            seen += 1;
            enriched.insert(index, value);
        }
        table.extend(chronik::processor::committed_state(
            &log.records("enricher-users-changelog", p)?,
        ));
    }
    let expected_table: BTreeMap<Vec<u8>, Vec<u8>> = users_at(2, 0)
        .into_iter()
        .map(|(user, name, _)| (user.into_bytes(), name.into_bytes()))
        .collect();
    let table_ok = table == expected_table;
    let mut digest = String::new();
    for value in enriched.values() {
        digest.push_str(value);
        digest.push(';');
    }
    for (user, name) in &table {
        let (user, name) = (String::from_utf8_lossy(user), String::from_utf8_lossy(name));
        let _ = write!(digest, "{user}={name};");
    }
    println!("{seen} enriched clicks; sample: {} joined as of its time", user(half));
    println!(
        "final state: {} clicks enriched, {} users, digest {:016x}",
        enriched.len(),
        table.len(),
        digest_of(&digest)
    );
    let once = match guarantee {
        Guarantee::ExactlyOnce => seen == clicks,
        Guarantee::AtLeastOnce => seen >= clicks,
    };
    if once && enriched.len() as u64 == clicks && wrong == 0 && table_ok {
        println!(
            "exact: {clicks} clicks enriched ({seen} records), every one with the right user \
             version; the users table at version 2"
        );
        Ok(())
    } else {
        Err(format!(
            "MISMATCH: {seen} enriched records ({} clicks) for {clicks} clicks, {wrong} wrong, \
             users table right: {table_ok}",
            enriched.len()
        )
        .into())
    }
}

/// A stable digest of the final state, to compare runs (the same build's runs: `DefaultHasher`
/// is SipHash with fixed keys).
fn digest_of(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}
