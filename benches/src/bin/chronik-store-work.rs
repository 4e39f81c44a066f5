//! The state-store benchmark's work, one process per step so that each step's peak RSS is its
//! own (`chronik-bench --only stores` runs it):
//!
//! - `produce DIR --records N --start S [--keys K] [--partitions P]`: append N clicks of
//!   100 B to topic `clicks` (P partitions, default 4, created if missing), each keyed by a
//!   distinct key `key-<S + i>` (or `key-<(S + i) mod K>`).
//! - `count DIR --application A --store KIND [--stores S] [--idle]`: a counting processor on
//!   2 threads (counts per key, 8-byte values, in S stores `counts`, `counts-1`, ... of kind
//!   `memory`, `disk` or `disk:<MiB>`, all disk stores in the process's default budget)
//!   until every partition of `clicks` is processed; `--idle` leaves the stores untouched
//!   (what the rest of the process takes); `--kill-after N` SIGKILLs the process after N
//!   records. `--full-restore` first removes the application's snapshots, so a memory store
//!   restores from its whole changelog.
//!
//! `count` prints one JSON line: records processed, seconds from the process's start to the
//! runner being ready (the restore) and to the first processed record, seconds processing,
//! peak RSS (`VmHWM`, KiB), and what the restore read.

use anyhow::{Context as _, bail};
use chronik::processor::{
    Context, ProcessError, Processor, ProcessorConfig, Runner, StoreKind, StoreMemory,
};
use chronik::{
    Chronik, Durability, HistogramSnapshot, Offset, Options, Record, RecordView, TopicConfig,
};
use clap::{Parser, Subcommand};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Partitions of `clicks` unless told otherwise.
const PARTITIONS: u32 = 4;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    work: Work,
}

#[derive(Subcommand)]
enum Work {
    Produce {
        dir: String,
        #[arg(long)]
        records: u64,
        #[arg(long, default_value_t = 0)]
        start: u64,
        /// Keys the records cycle over (default: every record its own key).
        #[arg(long)]
        keys: Option<u64>,
        #[arg(long, default_value_t = PARTITIONS)]
        partitions: u32,
    },
    Count {
        dir: String,
        #[arg(long)]
        application: String,
        #[arg(long)]
        store: StoreKind,
        #[arg(long)]
        kill_after: Option<u64>,
        #[arg(long)]
        full_restore: bool,
        /// Stores, each counting every record.
        #[arg(long, default_value_t = 1)]
        stores: usize,
        /// Leave the stores untouched: the process's memory without the stores' work.
        #[arg(long)]
        idle: bool,
    },
}

static STARTED: OnceLock<Instant> = OnceLock::new();
static FIRST_RECORD: OnceLock<Duration> = OnceLock::new();
static PROCESSED: AtomicU64 = AtomicU64::new(0);

/// Counts records per key, as 8-byte little-endian counts, in every store of `stores`.
struct Counter {
    kill_after: Option<u64>,
    stores: Vec<String>,
}

impl Processor for Counter {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        FIRST_RECORD.get_or_init(|| STARTED.get().map_or(Duration::ZERO, Instant::elapsed));
        let key = record.key().unwrap_or_default();
        for name in &self.stores {
            let counts = ctx.store(name)?;
            let count = counts.get(key)?.map_or(Ok(0), |v| {
                <[u8; 8]>::try_from(&*v)
                    .map(u64::from_le_bytes)
                    .map_err(|_| ProcessError::new("a count is not 8 bytes"))
            })? + 1;
            counts.put(key, &count.to_le_bytes());
        }
        let processed = PROCESSED.fetch_add(1, Ordering::Relaxed) + 1;
        if self.kill_after.is_some_and(|n| processed >= n) {
            // SAFETY: kill(2) with our own pid; no memory is touched.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        Ok(())
    }
}

fn open(dir: &str) -> anyhow::Result<Chronik> {
    Ok(Chronik::open(dir, Options { durability: Durability::Os, ..Options::default() })?)
}

fn produce(
    dir: &str,
    records: u64,
    start: u64,
    keys_max: Option<u64>,
    partitions: u32,
) -> anyhow::Result<()> {
    let chronik = open(dir)?;
    if chronik.partition_count("clicks").is_none() {
        chronik.create_topic("clicks", TopicConfig::default().with_partitions(partitions))?;
    }
    let partitions = chronik.partition_count("clicks").context("topic clicks")?;
    let value = [0x42_u8; 100];
    let mut keys: Vec<Vec<String>> = vec![Vec::new(); partitions as usize];
    for i in start..start + records {
        let key = format!("key-{:010}", keys_max.map_or(i, |k| i % k.max(1)));
        keys[chronik::partition_for_key(key.as_bytes(), partitions) as usize].push(key);
        if i % 8000 == 7999 || i + 1 == start + records {
            for (p, keys) in keys.iter_mut().enumerate() {
                let batch: Vec<Record<'_>> =
                    keys.iter().map(|k| Record::new(Some(k.as_bytes()), &value)).collect();
                if !batch.is_empty() {
                    chronik.engine().append("clicks", p as u32, &batch)?;
                }
                keys.clear();
            }
        }
    }
    chronik.flush()?;
    Ok(())
}

/// What `count` runs: the application, its stores, and when it stops.
struct Counting<'a> {
    application: &'a str,
    store: StoreKind,
    stores: usize,
    idle: bool,
    kill_after: Option<u64>,
    full_restore: bool,
}

fn count(dir: &str, work: &Counting<'_>) -> anyhow::Result<()> {
    let application = work.application;
    let chronik = open(dir)?;
    let opened = STARTED.get().map_or(Duration::ZERO, Instant::elapsed);
    let partitions = chronik.partition_count("clicks").context("topic clicks")?;
    let names: Vec<String> = (0..work.stores)
        .map(|i| if i == 0 { "counts".to_owned() } else { format!("counts-{i}") })
        .collect();
    let mut config = ProcessorConfig::new(application, "clicks").threads(2);
    for name in &names {
        config = config.store_with(name, work.store);
        for p in (0..partitions).filter(|_| work.full_restore) {
            let snapshot =
                std::path::Path::new(dir).join("state").join(config.snapshot_file(name, p));
            match std::fs::remove_file(&snapshot) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
    }
    let (kill_after, written) = (work.kill_after, if work.idle { Vec::new() } else { names });
    let mut runner =
        Runner::new(chronik.engine(), config, |_| Counter { kill_after, stores: written.clone() })?;
    let ready = STARTED.get().map_or(Duration::ZERO, Instant::elapsed);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let ends: Vec<u64> = (0..partitions)
        .map(|p| chronik.high_watermark("clicks", p).map(Offset::get))
        .collect::<Result<_, _>>()?;
    // The commit-latency histogram each time another million records were committed, so
    // the latency of commits can be told apart as the store grows.
    let mut marks: Vec<(u64, HistogramSnapshot)> = Vec::new();
    // The most the disk stores' shared budget (the process's default) accounted for.
    let mut budget_peak = 0;
    let stats = std::thread::scope(|scope| -> anyhow::Result<_> {
        let worker = scope.spawn(|| runner.run_until(&stop));
        loop {
            let committed: Vec<u64> = (0..partitions)
                .map(|p| chronik.committed_offset(application, "clicks", p).map_or(0, Offset::get))
                .collect();
            let done = committed.iter().zip(&ends).all(|(c, end)| c >= end);
            let total: u64 = committed.iter().sum();
            budget_peak = budget_peak.max(StoreMemory::process().resident_bytes());
            if total >= (marks.len() as u64 + 1) * MARK_RECORDS {
                marks.push((total, chronik.metrics().task_commit_latency));
            }
            if done || worker.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, Ordering::Relaxed);
        worker.join().map_err(|_| anyhow::anyhow!("the processor panicked"))?.map_err(Into::into)
    })?;
    let seconds = started.elapsed().as_secs_f64();
    // The peak while counting, before the check below reads every store through its cache.
    let peak_rss_kib = chronik_benches::proc_status_kib("VmHWM");
    let budget_kib = budget_peak / 1024;
    let mut entries = 0;
    for partition in 0..partitions {
        if let Some(store) = runner.store(partition, "counts").filter(|_| !work.idle) {
            entries += store.count()?;
        }
    }
    if let Some(store) = runner.stores().find(|s| s.check().is_err()) {
        bail!("a {} store failed a read", store.kind());
    }
    let metrics = chronik.metrics();
    let latency = commit_latency(&marks, &metrics.task_commit_latency);
    println!(
        "{{\"records\": {}, \"entries\": {entries}, \"open_seconds\": {}, \"ready_seconds\": {}, \
         \"first_record_seconds\": {}, \"process_seconds\": {seconds}, \"peak_rss_kib\": {}, \
         \"restored\": {}, \"stores_opened\": {}, \"stores_rebuilt\": {}, \"merges\": {}, \
         \"stalls\": {}, \"budget_peak_kib\": {budget_kib}, {latency}}}",
        stats.records,
        opened.as_secs_f64(),
        ready.as_secs_f64(),
        FIRST_RECORD.get().map_or(-1.0, Duration::as_secs_f64),
        peak_rss_kib,
        stats.restored,
        stats.stores_opened,
        stats.stores_rebuilt,
        metrics.store_merges,
        metrics.store_stalls,
    );
    Ok(())
}

/// Records committed between two marks of the commit-latency histogram.
const MARK_RECORDS: u64 = 1_000_000;

/// The commits' latency in the second million records committed (the store at 1-2 M keys,
/// or the first million if that is all) and in the last one or two, as JSON fields: the p50 and
/// p99 of each (upper bounds within a factor of two: the histogram's buckets are powers of
/// two), and the largest of all, exactly.
fn commit_latency(marks: &[(u64, HistogramSnapshot)], all: &HistogramSnapshot) -> String {
    let between = |from: Option<&HistogramSnapshot>, to: &HistogramSnapshot| {
        let mut part = *to;
        if let Some(from) = from {
            for (bucket, before) in part.buckets.iter_mut().zip(from.buckets) {
                *bucket -= before;
            }
            part.count -= from.count;
        }
        part
    };
    let early = match marks {
        [first, second, ..] => between(Some(&first.1), &second.1),
        [first] => between(None, &first.1),
        [] => *all,
    };
    let late = match marks {
        [.., before, _] => between(Some(&before.1), all),
        _ => *all,
    };
    let field = |h: &HistogramSnapshot, q| h.quantile_upper_us(q).unwrap_or(0);
    format!(
        "\"commit_early_p50_us\": {}, \"commit_early_p99_us\": {}, \"commit_late_p50_us\": {}, \
         \"commit_late_p99_us\": {}, \"commit_max_us\": {}, \"commits\": {}",
        field(&early, 0.5),
        field(&early, 0.99),
        field(&late, 0.5),
        field(&late, 0.99),
        all.max_us,
        all.count
    )
}

fn main() -> anyhow::Result<()> {
    STARTED.get_or_init(Instant::now);
    match Cli::parse().work {
        Work::Produce { dir, records, start, keys, partitions } => {
            produce(&dir, records, start, keys, partitions)
        }
        Work::Count { dir, application, store, kill_after, full_restore, stores, idle } => {
            let application = application.as_str();
            let work = Counting { application, store, stores, idle, kill_after, full_restore };
            count(&dir, &work)
        }
    }
}
