//! The state-store benchmark's counting work on fjall (an LSM-tree key-value store), the peer
//! our disk store is measured against:
//!
//! - `count DIR --records N [--keys K] [--cache-bytes B] [--partitions P] [--threads T]`:
//!   opens a fresh fjall database in DIR (removed first), one keyspace `counts-<p>` per
//!   partition. Record `i` (`0..N`) has key `key-<i mod K>` (K defaults to N: every key its
//!   own) and partition `(i mod K) mod P`, a stand-in for our hash partitioning. T threads
//!   each own the partitions `p` with `p mod T` equal to their number and go through their
//!   records in order of `i`: get the key's count (8 bytes, little-endian; absent is 0), add
//!   one, insert it.
//!
//! It prints one JSON line: records, entries counted after the work (a full scan of every
//! keyspace, which must find `min(N, K)` keys whose counts add up to N), seconds of the work
//! (from the first record to the final persist, the open excluded), and the peak RSS (`VmHWM`,
//! KiB) right after the work, before the scan reads everything through the cache.

use anyhow::{Context as _, bail, ensure};
use clap::{Parser, Subcommand};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// The memory our disk stores get by default is 256 MiB, an eighth of it for memtables: the
/// rest is the block cache.
const CACHE_BYTES_DEFAULT: u64 = (256 << 20) - WRITE_BUFFER_BYTES;

/// The memtables' share of that budget, split evenly between the keyspaces.
const WRITE_BUFFER_BYTES: u64 = 32 << 20;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    work: Work,
}

#[derive(Subcommand)]
enum Work {
    Count {
        dir: String,
        #[arg(long)]
        records: u64,
        /// Keys the records cycle over (default: every record its own key).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        keys: Option<u64>,
        /// The block cache's capacity.
        #[arg(long, default_value_t = CACHE_BYTES_DEFAULT)]
        cache_bytes: u64,
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
        partitions: u64,
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
        threads: u64,
    },
}

/// The shape of one run of the work.
#[derive(Clone, Copy)]
struct Shape {
    records: u64,
    keys: u64,
    partitions: u64,
    threads: u64,
}

impl Shape {
    /// The partition of the key `key-<key_index>`: a function of the key, as our hash
    /// partitioning is, so that each key is counted in one keyspace. It is `i mod P` for record
    /// `i` when every record has its own key, or when P divides K.
    fn partition(self, key_index: u64) -> u64 {
        key_index % self.partitions
    }
}

fn open(dir: &str, cache_bytes: u64, partitions: u64) -> anyhow::Result<(Database, Vec<Keyspace>)> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {dir}"));
        }
        _ => {}
    }
    // fjall 3.1's database-wide memtable limit (`max_write_buffer_size`) is deprecated and
    // read nowhere, so the write buffers are bounded per keyspace: each memtable is sealed at
    // 32 MiB / P, 32 MiB in all, as our disk store's are. Sealed memtables stay in memory until
    // a background worker has flushed them, so this bounds the active ones only. The journal
    // is persisted by hand (`manual_journal_persist`): written to the OS when its buffer fills
    // and once at the end, as our changelog is written at commits under `Durability::Os`
    // (fjall's default writes to the OS at every insert, a syscall each). Everything else is
    // fjall's default: the journal is capped at 512 MiB, min(cores, 4) background workers.
    let database = Database::builder(Path::new(dir))
        .cache_size(cache_bytes)
        .manual_journal_persist(true)
        .open()?;
    let memtable_bytes = WRITE_BUFFER_BYTES / partitions;
    let keyspaces = (0..partitions)
        .map(|p| {
            database.keyspace(&format!("counts-{p}"), || {
                KeyspaceCreateOptions::default()
                    .max_memtable_size(memtable_bytes)
                    .manual_journal_persist(true)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    assert_eq!(keyspaces.len() as u64, partitions);
    Ok((database, keyspaces))
}

/// One thread's share of the work: the records of the partitions it owns, in order.
fn count_thread(thread: u64, shape: Shape, keyspaces: &[Keyspace]) -> anyhow::Result<()> {
    let mut key = String::with_capacity(16);
    for i in 0..shape.records {
        let key_index = i % shape.keys;
        let p = shape.partition(key_index);
        if p % shape.threads != thread {
            continue;
        }
        key.clear();
        write!(key, "key-{key_index:010}")?;
        let counts = &keyspaces[p as usize];
        let count = match counts.get(&key)? {
            None => 0,
            Some(value) => u64::from_le_bytes(
                <[u8; 8]>::try_from(&*value)
                    .map_err(|_| anyhow::anyhow!("{key}: a count of {} bytes", value.len()))?,
            ),
        } + 1;
        counts.insert(key.as_str(), count.to_le_bytes())?;
    }
    Ok(())
}

/// Every keyspace's entries, and the sum of their counts, by a full scan.
fn scan(keyspaces: &[Keyspace]) -> anyhow::Result<(u64, u64)> {
    let (mut entries, mut total) = (0_u64, 0_u64);
    for counts in keyspaces {
        for guard in counts.iter() {
            let (key, value) = guard.into_inner()?;
            let count = <[u8; 8]>::try_from(&*value).map_err(|_| {
                anyhow::anyhow!(
                    "{}: a count of {} bytes",
                    String::from_utf8_lossy(&key),
                    value.len()
                )
            })?;
            entries += 1;
            total += u64::from_le_bytes(count);
        }
    }
    Ok((entries, total))
}

fn count(dir: &str, shape: Shape, cache_bytes: u64) -> anyhow::Result<()> {
    let (database, keyspaces) = open(dir, cache_bytes, shape.partitions)?;
    let started = Instant::now();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..shape.threads)
            .map(|thread| {
                let keyspaces = &keyspaces;
                scope.spawn(move || count_thread(thread, shape, keyspaces))
            })
            .collect();
        workers.into_iter().try_for_each(|worker| {
            worker.join().map_err(|_| anyhow::anyhow!("a counting thread panicked"))?
        })
    })?;
    // Once, at the end and inside the timing: the journal's buffer to the OS, no fsync, as
    // our side's `Durability::Os` acknowledges. Every insert has already done as much (fjall's
    // default), so this costs next to nothing; it states what the figure includes.
    database.persist(PersistMode::Buffer)?;
    let seconds = started.elapsed().as_secs_f64();
    let peak_rss_kib = chronik_benches::proc_status_kib("VmHWM");
    let (entries, total) = scan(&keyspaces)?;
    let entries_expected = shape.records.min(shape.keys);
    if entries != entries_expected || total != shape.records {
        bail!(
            "counted {entries} keys (expected {entries_expected}) whose counts add up to {total} \
             (expected {})",
            shape.records
        );
    }
    println!(
        "{{\"records\": {}, \"entries\": {entries}, \"process_seconds\": {seconds}, \
         \"peak_rss_kib\": {peak_rss_kib}}}",
        shape.records
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().work {
        Work::Count { dir, records, keys, cache_bytes, partitions, threads } => {
            ensure!(threads <= partitions, "{threads} threads for {partitions} partitions");
            let keys = keys.unwrap_or(records).max(1);
            count(&dir, Shape { records, keys, partitions, threads }, cache_bytes)
        }
    }
}
