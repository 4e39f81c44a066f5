//! `chronik-bench`: end-to-end throughput of Chronik beside its peers, in one run on one machine,
//! reported as ratios. In the style of Kafka's producer-perf-test.
//!
//! ```text
//! scripts/bench [--quick]        # installs fio, redis-server, nats-server if missing, then this
//! chronik-bench [--quick] [--out target/bench] [--repeat N] [--only fio,redis,nats,commitlog,small,large,sync,compaction,processor,stores,open]
//! ```
//!
//! Chronik scenarios, each on io_uring and on pread/pwrite: append (100 B and 1 KiB records,
//! several batch sizes, durability `os` and `sync`, 1 and 16 writers), consume from the start
//! of a large partition (borrowed views, no copy), the recovery scan of an unclean data
//! directory, and (on the default backend) the open of a directory after a clean close and
//! after SIGKILL. Peers: fio (sequential write bandwidth and the rate of write+fdatasync: the
//! disk's limits), Redis Streams (pipelined `XADD`, `appendfsync everysec` and `always`), NATS
//! JetStream (file storage, async publish with acks in flight) and the `commitlog` crate. A
//! peer that is not installed or fails to start is reported as skipped, never faked.
//!
//! Output: a table on standard output, and `results.json`, `results.md` and `throughput.svg`
//! under `--out`.

use anyhow::{Context as _, bail};
use chronik::{Backend, Chronik, Durability, Offset, Options, Record, TopicConfig};
use chronik_benches::proc_status_kib;
use clap::Parser;
use serde_json::json;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(name = "chronik-bench", about = "Chronik throughput beside fio, Redis, NATS, commitlog")]
struct Cli {
    /// Smaller sizes and shorter runs: under three minutes, for a smoke test.
    #[arg(long)]
    quick: bool,
    /// Where results.json, results.md and throughput.svg go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Where the data directories go (a temporary directory inside it).
    #[arg(long, env = "CHRONIK_BENCH_DIR")]
    dir: Option<PathBuf>,
    /// Runs of the whole suite; each figure is the median over them (3 by default, 1 with
    /// --quick).
    #[arg(long)]
    repeat: Option<u32>,
    /// Run only these groups of scenarios (all by default). Ratios whose inputs were not run
    /// are reported as not measured.
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Group>,
}

/// A group of scenarios `--only` can pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Group {
    /// fio: sequential write bandwidth and the write+fdatasync rate.
    Fio,
    /// Redis Streams XADD.
    Redis,
    /// NATS JetStream.
    Nats,
    /// The commitlog crate.
    Commitlog,
    /// Chronik: 100 B appends in batches of 10, 100 and 1000 (`os`), and consume.
    Small,
    /// Chronik: 1 KiB appends (`os`) and the recovery scan.
    Large,
    /// Chronik: `sync` appends from 1 and 16 writers, and pipelined from one producer (into
    /// one partition, and round robin into 16 and 64).
    Sync,
    /// Chronik: compaction of a keyed topic (every key updated ten times).
    Compaction,
    /// Chronik: a counting stream processor, and restoring its store (changelog only, and
    /// snapshot plus changelog tail) beside a zero-copy scan of the changelog.
    Processor,
    /// Chronik: a counting processor over many distinct keys with a memory store and a disk
    /// store (throughput, peak RSS), each killed and restarted. Only in the first run.
    Stores,
    /// Chronik: the engine's open after a clean close and after SIGKILL, over large active
    /// segments and over many small partitions.
    Open,
}

impl Cli {
    fn runs(&self, group: Group) -> bool {
        self.only.is_empty() || self.only.contains(&group)
    }
}

/// Sizes of one run.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    small_records: u64,
    large_bytes: u64,
    /// Distinct keys of the compaction scenario (each updated ten times).
    compaction_keys: u64,
    /// Input records of the processor scenario.
    processor_records: u64,
    /// Distinct keys of the stores scenario.
    store_keys: u64,
    sync_seconds: f64,
    peer_records: u64,
    fio_bytes: u64,
    /// Bytes of the open scenarios' smaller and larger active segments (4 partitions).
    open_small_bytes: u64,
    open_large_bytes: u64,
    /// Partitions of the many-partitions open scenario (64 KiB each).
    open_partitions: u32,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                small_records: 1_000_000,
                large_bytes: 256 << 20,
                compaction_keys: 100_000,
                processor_records: 1_000_000,
                store_keys: 1_000_000,
                sync_seconds: 1.5,
                peer_records: 200_000,
                fio_bytes: 256 << 20,
                open_small_bytes: 25_000_000,
                open_large_bytes: 400_000_000,
                open_partitions: 256,
            }
        } else {
            Sizes {
                small_records: 5_000_000,
                large_bytes: 1 << 30,
                compaction_keys: 1_000_000,
                processor_records: 4_000_000,
                store_keys: 20_000_000,
                sync_seconds: 5.0,
                peer_records: 1_000_000,
                fio_bytes: 1 << 30,
                open_small_bytes: 100_000_000,
                open_large_bytes: 1_600_000_000,
                open_partitions: 1024,
            }
        }
    }
}

/// One measured line of the report.
#[derive(Clone, Debug)]
struct Measure {
    /// What was measured, such as `append 100 B, batch 1000, os`.
    scenario: String,
    /// `chronik io_uring`, `chronik pread`, `redis`, `fio`, ...
    system: String,
    records_per_second: Option<f64>,
    bytes_per_second: Option<f64>,
    /// Why there is no figure.
    skipped: Option<String>,
    /// More about the run (acknowledgement latencies, say).
    note: Option<String>,
    /// A scenario measured in time (a restart): its seconds, and those of its restore alone.
    seconds: Option<f64>,
    restore_seconds: Option<f64>,
    /// A disk-store count: commit p99 early over late, and the largest commit over the p50.
    commit_p99_flat: Option<f64>,
    commit_max_over_p50: Option<f64>,
}

impl Measure {
    fn new(scenario: &str, system: &str, records: u64, bytes: u64, elapsed: Duration) -> Measure {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Measure {
            scenario: scenario.to_owned(),
            system: system.to_owned(),
            records_per_second: (records > 0).then(|| records as f64 / seconds),
            bytes_per_second: (bytes > 0).then(|| bytes as f64 / seconds),
            skipped: None,
            note: None,
            seconds: None,
            restore_seconds: None,
            commit_p99_flat: None,
            commit_max_over_p50: None,
        }
    }

    fn skipped(scenario: &str, system: &str, why: impl Into<String>) -> Measure {
        Measure {
            scenario: scenario.to_owned(),
            system: system.to_owned(),
            records_per_second: None,
            bytes_per_second: None,
            skipped: Some(why.into()),
            note: None,
            seconds: None,
            restore_seconds: None,
            commit_p99_flat: None,
            commit_max_over_p50: None,
        }
    }
}

const TOPIC: &str = "bench";
const BACKENDS: [Backend; 2] = [Backend::IoUring, Backend::Pread];

/// The I/O a Chronik scenario runs on: a backend, and whether segments are written with
/// direct I/O.
#[derive(Clone, Copy, Debug)]
struct ChronikIo {
    backend: Backend,
    direct: bool,
}

impl From<Backend> for ChronikIo {
    fn from(backend: Backend) -> ChronikIo {
        ChronikIo { backend, direct: false }
    }
}

fn system_name(io: impl Into<ChronikIo>) -> String {
    let io = io.into();
    format!("chronik {}{}", io.backend.name(), if io.direct { " direct" } else { "" })
}

fn open(dir: &Path, io: impl Into<ChronikIo>, durability: Durability) -> anyhow::Result<Chronik> {
    let io = io.into();
    let options =
        Options { durability, io_backend: io.backend, direct_io: io.direct, ..Options::default() };
    Ok(Chronik::open(dir, options)?)
}

fn topic_config() -> TopicConfig {
    TopicConfig { partitions: 1, segment_bytes: 256 << 20, ..TopicConfig::default() }
}

/// Append `records` records of `value_bytes` in batches of `batch` and flush; returns the
/// measure. The flush's fsync is part of the time, as fio's `end_fsync`.
/// Appends one producer keeps in flight in the pipelined 1 KiB scenario.
const LARGE_IN_FLIGHT: usize = 16;

fn append_os(
    dir: &Path,
    backend: impl Into<ChronikIo> + Copy,
    value_bytes: usize,
    batch: usize,
    records: u64,
) -> anyhow::Result<Measure> {
    let chronik = open(dir, backend, Durability::Os)?;
    chronik.create_topic(TOPIC, topic_config())?;
    let value = vec![0x5a_u8; value_bytes];
    let views: Vec<Record<'_>> = (0..batch).map(|_| Record::new(None, &value)).collect();
    let batches = records.div_ceil(batch as u64);
    let start = Instant::now();
    for _ in 0..batches {
        chronik.engine().append(TOPIC, 0, &views)?;
    }
    chronik.flush()?;
    let elapsed = start.elapsed();
    let total = batches * batch as u64;
    let scenario = format!("append {}, batch {batch}, os", size_name(value_bytes));
    Ok(Measure::new(&scenario, &system_name(backend), total, total * value_bytes as u64, elapsed))
}

fn size_name(bytes: usize) -> String {
    if bytes >= 1024 { format!("{} KiB", bytes / 1024) } else { format!("{bytes} B") }
}

/// `writers` threads appending one 100 B record per batch with `sync` durability for a while:
/// acknowledged (fdatasynced) appends per second, group commit sharing the fsyncs.
fn append_sync(
    dir: &Path,
    backend: impl Into<ChronikIo> + Copy,
    writers: u32,
    seconds: f64,
) -> anyhow::Result<Measure> {
    let chronik = Arc::new(open(dir, backend, Durability::Sync)?);
    chronik.create_topic(TOPIC, topic_config())?;
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|_| {
            let (chronik, stop, acknowledged) =
                (Arc::clone(&chronik), Arc::clone(&stop), Arc::clone(&acknowledged));
            std::thread::spawn(move || -> anyhow::Result<()> {
                let value = [0x5a_u8; 100];
                while !stop.load(Ordering::Relaxed) {
                    chronik.engine().append(TOPIC, 0, &[Record::new(None, &value)])?;
                    acknowledged.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??;
    }
    let elapsed = start.elapsed();
    let count = acknowledged.load(Ordering::Relaxed);
    let scenario =
        format!("append 100 B, sync, {writers} writer{}", if writers > 1 { "s" } else { "" });
    let mut measure = Measure::new(&scenario, &system_name(backend), count, count * 100, elapsed);
    // How well group commit shares the fdatasyncs: what limits the figure.
    let metrics = chronik.engine().metrics();
    let per_sync = metrics.appends as f64 / metrics.fsyncs.max(1) as f64;
    measure.note = Some(format!("{per_sync:.1} appends per fdatasync"));
    Ok(measure)
}

/// Read the partition from offset zero to its end three times (the page cache warm after the
/// first); the best pass. With `copy`, each record's key and value are copied into owned
/// buffers, as a consumer API handing out owned records would; without, records are iterated
/// as borrowed views and nothing is copied (each value's first byte is read, so the bytes are
/// touched either way).
fn consume(dir: &Path, backend: Backend, copy: bool) -> anyhow::Result<Measure> {
    let chronik = open(dir, backend, Durability::Os)?;
    let end = chronik.high_watermark(TOPIC, 0)?;
    let mut best = Duration::MAX;
    let mut counted = (0, 0);
    let mut touched = 0_u64;
    for _ in 0..3 {
        let start = Instant::now();
        let (mut records, mut bytes) = (0_u64, 0_u64);
        let mut next = Offset::ZERO;
        while next < end {
            let fetch = chronik.engine().read(TOPIC, 0, next, 4 << 20)?;
            for record in fetch.records() {
                records += 1;
                if copy {
                    let key = record.key().map(<[u8]>::to_vec);
                    let value = record.value().to_vec();
                    bytes += value.len() as u64;
                    touched += u64::from(value.first().copied().unwrap_or(0));
                    touched += key.map_or(0, |k| k.len() as u64);
                    std::hint::black_box(value);
                } else {
                    let value = record.value();
                    bytes += value.len() as u64;
                    touched += u64::from(value.first().copied().unwrap_or(0));
                    touched += record.key().map_or(0, |k| k.len() as u64);
                }
            }
            next = fetch.next_offset();
        }
        best = best.min(start.elapsed());
        counted = (records, bytes);
    }
    std::hint::black_box(touched);
    if counted.0 != end.get() {
        bail!("consume read {} records of {end}", counted.0);
    }
    let scenario = if copy { CONSUME_COPYING } else { CONSUME };
    Ok(Measure::new(scenario, &system_name(backend), counted.0, counted.1, best))
}

const CONSUME: &str = "consume 100 B, from the start";
const CONSUME_COPYING: &str = "consume 100 B, copying each record";

/// Open a data directory whose index files and sync checkpoint are gone (as after a crash that
/// lost them): recovery scans every segment and checks every checksum.
fn recovery(dir: &Path, backend: Backend) -> anyhow::Result<Measure> {
    let partition = dir.join("topics").join(TOPIC).join("0");
    let mut log_bytes = 0;
    for entry in std::fs::read_dir(&partition)? {
        let path = entry?.path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("index" | "timeindex" | "checkpoint") => std::fs::remove_file(&path)?,
            Some("log") => log_bytes += std::fs::metadata(&path)?.len(),
            _ => {}
        }
    }
    let start = Instant::now();
    let chronik = open(dir, backend, Durability::Os)?;
    let elapsed = start.elapsed();
    let records = chronik.high_watermark(TOPIC, 0)?.get();
    drop(chronik);
    Ok(Measure::new(
        "recovery scan, 1 KiB records",
        &system_name(backend),
        records,
        log_bytes,
        elapsed,
    ))
}

/// Run `run` (from 1) of the Chronik scenarios. Odd runs take io_uring first, even ones
/// pread/pwrite first, so neither backend always meets the disk right after the other.
fn chronik_scenarios(
    cli: &Cli,
    run: u32,
    base: &Path,
    sizes: Sizes,
    out: &mut Vec<Measure>,
) -> anyhow::Result<()> {
    let mut backends = Vec::new();
    for backend in BACKENDS {
        if chronik::SystemIo::new(backend).is_ok() {
            backends.push(backend);
        } else {
            out.push(report(Measure::skipped(
                "all scenarios",
                &system_name(backend),
                "io_uring unavailable here",
            )));
        }
    }
    let default_backend =
        if backends.contains(&Backend::IoUring) { Backend::IoUring } else { Backend::Pread };
    if run.is_multiple_of(2) {
        backends.reverse();
    }
    // Scenario by scenario, the backends one after the other, each from a settled disk: the
    // two backends see the same conditions, and no scenario pays for another's write-back.
    let small: &[usize] = if cli.runs(Group::Small) { &[10, 100, 1000] } else { &[] };
    for &batch in small {
        let records = if batch == 10 { sizes.small_records / 5 } else { sizes.small_records };
        for &backend in &backends {
            let dir = fresh(base, &format!("{}-small-{batch}", backend.name()))?;
            out.push(report(append_os(&dir, backend, 100, batch, records)?));
            if batch == 1000 {
                settle();
                out.push(report(consume(&dir, backend, false)?));
                out.push(report(consume(&dir, backend, true)?));
            }
            std::fs::remove_dir_all(&dir)?;
        }
    }
    let large_records = sizes.large_bytes / 1024;
    let large: &[Backend] = if cli.runs(Group::Large) { &backends } else { &[] };
    for &backend in large {
        let dir = fresh(base, &format!("{}-large", backend.name()))?;
        out.push(report(append_os(&dir, backend, 1024, 64, large_records)?));
        settle();
        out.push(report(recovery(&dir, backend)?));
        std::fs::remove_dir_all(&dir)?;
        // Direct I/O beside it, and both with a pipelining producer.
        let direct = ChronikIo { backend, direct: true };
        for io in [ChronikIo::from(backend), direct] {
            if io.direct {
                let dir = fresh(base, &format!("{}-direct-large", backend.name()))?;
                out.push(report(append_os(&dir, io, 1024, 64, large_records)?));
                std::fs::remove_dir_all(&dir)?;
            }
            let dir = fresh(base, &format!("{}-pipelined-large", backend.name()))?;
            let depth = LARGE_IN_FLIGHT;
            let measure = pipelined::append_os_pipelined(&dir, io, 1024, 64, depth, large_records)?;
            out.push(report(measure));
            std::fs::remove_dir_all(&dir)?;
        }
    }
    // Direct I/O on the default backend, beside the buffered figures below.
    let direct = ChronikIo { backend: default_backend, direct: true };
    if cli.runs(Group::Compaction) && !backends.is_empty() {
        let dir = fresh(base, "compaction")?;
        out.extend(compaction(&dir, default_backend, sizes.compaction_keys)?.map(report));
        std::fs::remove_dir_all(&dir)?;
    }
    if cli.runs(Group::Stores) && run == 1 {
        let dir = fresh(base, "stores")?;
        out.extend(stores::stores(&dir, sizes.store_keys)?.into_iter().map(report));
        std::fs::remove_dir_all(&dir)?;
    }
    if cli.runs(Group::Processor) && !backends.is_empty() {
        let dir = fresh(base, "processor")?;
        out.extend(
            processor(&dir, default_backend, sizes.processor_records)?.into_iter().map(report),
        );
        std::fs::remove_dir_all(&dir)?;
    }
    if cli.runs(Group::Open) && !backends.is_empty() {
        out.extend(open::open_scenarios(base, default_backend, sizes)?.into_iter().map(report));
    }
    let writers: &[u32] = if cli.runs(Group::Sync) { &[1, 16] } else { &[] };
    for &writers in writers {
        for &backend in &backends {
            let dir = fresh(base, &format!("{}-sync-{writers}", backend.name()))?;
            out.push(report(append_sync(&dir, backend, writers, sizes.sync_seconds)?));
            std::fs::remove_dir_all(&dir)?;
        }
        if writers > 1 && !backends.is_empty() {
            let dir = fresh(base, &format!("direct-sync-{writers}"))?;
            out.push(report(append_sync(&dir, direct, writers, sizes.sync_seconds)?));
            std::fs::remove_dir_all(&dir)?;
        }
    }
    if cli.runs(Group::Sync) {
        pipelined_sync(base, &backends, sizes, out)?;
    }
    Ok(())
}

/// The `sync` scenarios of one producer keeping many appends in flight (`send_async_to`),
/// on each backend.
fn pipelined_sync(
    base: &Path,
    backends: &[Backend],
    sizes: Sizes,
    out: &mut Vec<Measure>,
) -> anyhow::Result<()> {
    for (batch, depth) in [(1, 256), (100, 16)] {
        for &backend in backends {
            let dir = fresh(base, &format!("{}-pipelined-{batch}", backend.name()))?;
            let io = ChronikIo::from(backend);
            let seconds = sizes.sync_seconds;
            let (mut measure, p50, p99) =
                pipelined::append_sync_pipelined(&dir, io, batch, depth, seconds)?;
            measure.note = Some(format!("ack latency p50 {p50} us, p99 {p99} us"));
            out.push(report(measure));
            std::fs::remove_dir_all(&dir)?;
        }
    }
    // Round robin over many partitions, a few one-record appends in flight in each: many
    // small fdatasyncs at once, where io_uring should earn its place.
    for partitions in PIPELINED_PARTITIONS {
        for &backend in backends {
            let dir = fresh(base, &format!("{}-partitions-{partitions}", backend.name()))?;
            let io = ChronikIo::from(backend);
            let (depth, seconds) = (PARTITION_IN_FLIGHT, sizes.sync_seconds);
            let (mut measure, p50, p99) =
                pipelined::append_sync_partitions(&dir, io, partitions, depth, seconds)?;
            measure.note = Some(format!("ack latency p50 {p50} us, p99 {p99} us"));
            out.push(report(measure));
            std::fs::remove_dir_all(&dir)?;
        }
    }
    Ok(())
}

/// Partition counts of the many-partitions `sync` scenario, and the appends each keeps in
/// flight.
const PIPELINED_PARTITIONS: [u32; 2] = [16, 64];
const PARTITION_IN_FLIGHT: usize = 4;

/// Compaction: `keys` keys, each updated ten times (round after round, 100 B values, batches
/// of 1000, `os`), on a compacted topic of 64 MiB segments; then one forced pass over the
/// partition, timed. Input bandwidth (what the pass read, the sealed segments) and its peak
/// memory (the rise of the process's peak resident set during the pass, `VmHWM` reset first).
/// The engine is opened without the background ticker, so nothing compacts early.
fn compaction(dir: &Path, backend: Backend, keys: u64) -> anyhow::Result<[Measure; 2]> {
    use chronik_engine::{Engine, runtime::SystemClock};
    let options = Options { durability: Durability::Os, io_backend: backend, ..Options::default() };
    let io = chronik::SystemIo::new(backend)?;
    let (engine, _) = Engine::open(io, Arc::new(SystemClock), dir, options)?;
    let config = TopicConfig {
        segment_bytes: 64 << 20,
        cleanup: chronik::Cleanup::Compact,
        ..topic_config()
    };
    engine.create_topic(TOPIC, config)?;
    let value = [0x5a_u8; 100];
    let names: Vec<String> = (0..keys).map(|k| format!("key-{k:09}")).collect();
    for _round in 0..10 {
        for chunk in names.chunks(1000) {
            let records: Vec<Record<'_>> =
                chunk.iter().map(|k| Record::new(Some(k.as_bytes()), &value)).collect();
            engine.append(TOPIC, 0, &records)?;
        }
    }
    engine.flush()?;
    settle();
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before = proc_status_kib("VmRSS");
    let start = Instant::now();
    let report = engine
        .compact_partition(TOPIC, 0)?
        .ok_or_else(|| anyhow::anyhow!("the compaction pass found nothing to clean"))?;
    let elapsed = start.elapsed();
    let peak = proc_status_kib("VmHWM").saturating_sub(rss_before);
    let system = format!("chronik {} (peak +{} MiB)", backend.name(), peak / 1024);
    let scenario = format!("compact {} keys x 10 updates", human(keys as f64));
    let input = Measure::new(&scenario, &system, report.records_in, report.bytes_in, elapsed);
    let kept = Measure::new(
        "compaction output",
        &system_name(backend),
        report.records_kept,
        report.bytes_out,
        elapsed,
    );
    Ok([input, kept])
}

/// Scenario names of the processor group.
const PROCESS: &str = "process: count 100 B clicks, 2 threads, commit 100 ms";
const RESTORE_CHANGELOG: &str = "restore store from changelog only";
const RESTORE_SNAPSHOT: &str = "restore store from snapshot + changelog tail";
const SCAN_CHANGELOG: &str = "scan the changelog, zero copy";

/// Counts clicks per user in the store "counts".
struct BenchCounter;

impl chronik::processor::Processor for BenchCounter {
    fn process(
        &mut self,
        record: &chronik::RecordView<'_>,
        ctx: &mut chronik::processor::Context<'_>,
    ) -> Result<(), chronik::processor::ProcessError> {
        let key = record.key().unwrap_or_default();
        let counts = ctx.store("counts")?;
        let count = counts.get(key)?.map_or(0, |v| v.first().copied().unwrap_or(0)).wrapping_add(1);
        counts.put(key, &[count]);
        Ok(())
    }
}

/// `records` clicks of 100 B over `users` keys, spread over the partitions by key.
fn produce_clicks(
    chronik: &Chronik,
    records: u64,
    users: u64,
    partitions: u32,
) -> anyhow::Result<()> {
    let value = [0x42_u8; 100];
    let mut batches: Vec<Vec<String>> = vec![Vec::new(); partitions as usize];
    for i in 0..records {
        let key = format!("user-{:08}", (i * 7919) % users);
        batches[chronik::partition_for_key(key.as_bytes(), partitions) as usize].push(key);
        if i % 4000 == 3999 || i + 1 == records {
            for (p, keys) in batches.iter_mut().enumerate() {
                let batch: Vec<Record<'_>> =
                    keys.iter().map(|k| Record::new(Some(k.as_bytes()), &value)).collect();
                if !batch.is_empty() {
                    chronik.engine().append("clicks", p as u32, &batch)?;
                }
                keys.clear();
            }
        }
    }
    Ok(())
}

/// Processors: `records` 100 B clicks over `records / 4` users in 4 partitions, counted by a
/// processor on 2 threads committing every 100 ms (each commit one transaction, durable); then
/// the store restored from a snapshot plus the changelog after it, and from the changelog
/// alone; beside them, a zero-copy scan of the changelog: what a restore cannot beat.
fn processor(dir: &Path, backend: Backend, records: u64) -> anyhow::Result<Vec<Measure>> {
    use chronik::processor::{ProcessorConfig, Runner};
    let chronik = open(dir, backend, Durability::Os)?;
    let partitions = 4;
    chronik.create_topic("clicks", TopicConfig::default().with_partitions(partitions))?;
    let users = (records / 4).max(1);
    produce_clicks(&chronik, records, users, partitions)?;
    chronik.flush()?;
    settle();
    let system = system_name(backend);
    let config = ProcessorConfig::new("bench", "clicks").store("counts").threads(2);
    let mut runner = Runner::new(chronik.engine(), config.clone(), |_| BenchCounter)?;
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let stats = std::thread::scope(|scope| -> anyhow::Result<_> {
        let worker = scope.spawn(|| runner.run_until(&stop));
        while (0..partitions)
            .map(|p| chronik.committed_offset("bench", "clicks", p).map_or(0, Offset::get))
            .sum::<u64>()
            < records
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        worker.join().map_err(|_| anyhow::anyhow!("the processor panicked"))?.map_err(Into::into)
    })?;
    let processed = started.elapsed();
    if stats.records != records {
        bail!("the processor counted {} records of {records}", stats.records);
    }
    let mut out = vec![Measure::new(PROCESS, &system, records, records * 100, processed)];
    drop(runner);

    // A clean stop wrote snapshots: restore from them (and the changelog after them), then
    // remove them and restore from the changelog alone.
    let mut restore = |scenario: &str| -> anyhow::Result<()> {
        let started = Instant::now();
        let mut runner = Runner::new(chronik.engine(), config.clone(), |_| BenchCounter)?;
        let elapsed = started.elapsed();
        let stats = runner.run_until_caught_up()?;
        let mut entries = 0;
        for partition in 0..partitions {
            if let Some(store) = runner.store(partition, "counts") {
                entries += store.count()?;
            }
        }
        if entries != users {
            bail!("{scenario}: {entries} users restored, {users} expected");
        }
        let restored =
            if stats.snapshots_loaded > 0 { entries + stats.restored } else { stats.restored };
        out.push(Measure::new(scenario, &system, restored, 0, elapsed));
        Ok(())
    };
    settle();
    restore(RESTORE_SNAPSHOT)?;
    for entry in std::fs::read_dir(dir.join("state"))? {
        std::fs::remove_file(entry?.path())?;
    }
    settle();
    restore(RESTORE_CHANGELOG)?;

    let changelog = config.changelog("counts");
    let started = Instant::now();
    let mut scanned = 0_u64;
    let mut touched = 0_u64;
    for p in 0..partitions {
        let end = chronik.high_watermark(&changelog, p)?;
        let mut next = Offset::ZERO;
        while next < end {
            let fetch = chronik.engine().read(&changelog, p, next, 4 << 20)?;
            for record in fetch.records() {
                scanned += 1;
                touched += record.key().map_or(0, |k| k.len() as u64);
                touched += u64::from(record.value().first().copied().unwrap_or(0));
            }
            next = fetch.next_offset();
        }
    }
    std::hint::black_box(touched);
    out.push(Measure::new(SCAN_CHANGELOG, &system, scanned, 0, started.elapsed()));
    Ok(out)
}

/// Let the disk settle before a measurement: write back everything dirty (`sync`), so a
/// scenario does not pay for an earlier one's write-back.
pub fn settle() {
    let _ = Command::new("sync").status();
    std::thread::sleep(Duration::from_millis(200));
}

/// A new, empty directory for a scenario, on a settled disk.
fn fresh(base: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let dir = empty_directory(&base.join(name))?;
    settle();
    Ok(dir)
}

/// `path`, created empty (whatever an earlier run left there removed).
fn empty_directory(path: &Path) -> anyhow::Result<PathBuf> {
    if path.exists() {
        std::fs::remove_dir_all(path)?;
    }
    std::fs::create_dir_all(path)?;
    Ok(path.to_path_buf())
}

/// Print a measure as it is taken, so a long run shows progress.
fn report(measure: Measure) -> Measure {
    eprintln!("  {:<42} {:<18} {}", measure.scenario, measure.system, figures(&measure));
    if let Some(note) = &measure.note {
        eprintln!("    {note}");
    }
    measure
}

fn figures(m: &Measure) -> String {
    if let Some(why) = &m.skipped {
        return format!("skipped: {why}");
    }
    let mut parts = Vec::new();
    if let Some(r) = m.records_per_second {
        parts.push(format!("{} rec/s", human(r)));
    }
    if let Some(b) = m.bytes_per_second {
        parts.push(format!("{:.1} MiB/s", b / f64::from(1 << 20)));
    }
    if let Some(seconds) = m.seconds {
        parts.push(format!("{seconds:.3} s"));
    }
    parts.join(", ")
}

fn human(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2} M", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1} k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

mod open;
mod peers;
mod pipelined;
mod stores;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let sizes = Sizes::new(cli.quick);
    let root = match &cli.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            tempfile::tempdir_in(dir)?
        }
        None => tempfile::tempdir()?,
    };
    let began = Instant::now();
    eprintln!("chronik-bench: data under {} ({})", root.path().display(), machine());
    let repeat = cli.repeat.unwrap_or(if cli.quick { 1 } else { 3 }).max(1);
    let mut runs = Vec::new();
    for run in 1..=repeat {
        let mut measures = Vec::new();
        eprintln!("run {run} of {repeat}, peers:");
        if cli.runs(Group::Fio) {
            peers::fio(root.path(), sizes, &mut measures);
        }
        if cli.runs(Group::Redis) {
            peers::redis(root.path(), sizes, &mut measures);
        }
        if cli.runs(Group::Nats) {
            peers::nats(root.path(), sizes, &mut measures);
        }
        if cli.runs(Group::Commitlog) {
            peers::commitlog(root.path(), sizes, &mut measures);
        }
        eprintln!("run {run} of {repeat}, chronik:");
        chronik_scenarios(&cli, run, root.path(), sizes, &mut measures)
            .context("a Chronik scenario failed")?;
        runs.push(measures);
    }
    let measures = medians(&runs);
    let ratios = ratios(&measures, sizes);
    print_table(&measures, &ratios);
    write_outputs(&cli.out, &measures, &ratios, cli.quick, began.elapsed())?;
    println!("took {:.0} s; results in {}", began.elapsed().as_secs_f64(), cli.out.display());
    Ok(())
}

/// Per scenario and system, the measure with the median records/s (or bytes/s) over the runs;
/// a measure skipped in any run stays skipped.
fn medians(runs: &[Vec<Measure>]) -> Vec<Measure> {
    let Some(first) = runs.first() else { return Vec::new() };
    first
        .iter()
        .map(|m| {
            let mut same: Vec<&Measure> = runs
                .iter()
                .filter_map(|run| {
                    run.iter().find(|o| o.scenario == m.scenario && o.system == m.system)
                })
                .collect();
            if let Some(skipped) = same.iter().find(|o| o.skipped.is_some()) {
                return (*skipped).clone();
            }
            // A measure in time (an open) by its time: its bytes/s, where it has any, is of
            // what it happened to scan.
            let key = |o: &&Measure| {
                o.seconds.or(o.records_per_second).or(o.bytes_per_second).unwrap_or(0.0)
            };
            same.sort_by(|a, b| key(a).total_cmp(&key(b)));
            same[same.len() / 2].clone()
        })
        .collect()
}

/// A short description of the machine, for the report.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or_else(String::new, |m| m.trim().to_owned());
    format!("{cpus} cores, {model}, Linux {}", kernel.trim())
}

/// A ratio the issue's targets are stated in.
#[derive(Clone, Debug)]
struct Ratio {
    what: String,
    value: Option<f64>,
    /// `None` where no target is set: the ratio is reported for what it shows.
    target: Option<f64>,
    unit: &'static str,
}

fn find<'a>(measures: &'a [Measure], scenario: &str, system: &str) -> Option<&'a Measure> {
    measures.iter().find(|m| m.scenario == scenario && m.system == system && m.skipped.is_none())
}

fn best_records(measures: &[Measure], prefix: &str, system: &str) -> Option<f64> {
    measures
        .iter()
        .filter(|m| m.scenario.starts_with(prefix) && m.system == system)
        .filter_map(|m| m.records_per_second)
        .reduce(f64::max)
}

/// `a / b`, where both were measured and `b` is positive.
fn divide(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The processor group's figures: restore rates against their target and the scan.
fn processor_ratios(measures: &[Measure], uring: &str) -> Vec<Ratio> {
    let rate = |scenario: &str| find(measures, scenario, uring).and_then(|m| m.records_per_second);
    vec![
        Ratio {
            what: "restore from changelog only, M rec/s".into(),
            value: rate(RESTORE_CHANGELOG).map(|r| r / 1e6),
            target: Some(2.0),
            unit: "M",
        },
        Ratio {
            what: "restore from snapshot + tail, M rec/s".into(),
            value: rate(RESTORE_SNAPSHOT).map(|r| r / 1e6),
            target: Some(2.0),
            unit: "M",
        },
        Ratio {
            what: "restore from changelog over scanning it".into(),
            value: divide(rate(RESTORE_CHANGELOG), rate(SCAN_CHANGELOG)),
            target: None,
            unit: "x",
        },
        Ratio {
            what: "counting processor, M rec/s (commits every 100 ms)".into(),
            value: rate(PROCESS).map(|r| r / 1e6),
            target: None,
            unit: "M",
        },
    ]
}

/// Pipelined `sync` appends beside Redis Streams with `appendfsync always`.
fn pipelined_ratios(measures: &[Measure], uring: &str) -> Vec<Ratio> {
    let rate = |batch, depth| {
        find(measures, &pipelined::scenario(batch, depth), uring).and_then(|m| m.records_per_second)
    };
    let redis_always =
        find(measures, "append 100 B, pipelined, appendfsync always", "redis streams")
            .and_then(|m| m.records_per_second);
    vec![
        Ratio {
            what: "one producer, pipelined sync appends (batches of 100), M rec/s".into(),
            value: rate(100, 16).map(|r| r / 1e6),
            target: Some(1.0),
            unit: "M",
        },
        Ratio {
            what: "pipelined sync appends (batches of 100) over Redis XADD, appendfsync always"
                .into(),
            value: divide(rate(100, 16), redis_always),
            target: Some(4.0),
            unit: "x",
        },
        Ratio {
            what: "pipelined sync appends of one record over Redis XADD, appendfsync always".into(),
            value: divide(rate(1, 256), redis_always),
            target: None,
            unit: "x",
        },
    ]
}

fn ratios(measures: &[Measure], sizes: Sizes) -> Vec<Ratio> {
    let uring = system_name(Backend::IoUring);
    let pread = system_name(Backend::Pread);
    let append_small = best_records(measures, "append 100 B, batch", &uring);
    let redis = find(measures, "append 100 B, pipelined, appendfsync everysec", "redis streams")
        .and_then(|m| m.records_per_second);
    let large =
        find(measures, "append 1 KiB, batch 64, os", &uring).and_then(|m| m.bytes_per_second);
    let large_pipelined = pipelined::os_scenario(1024, 64, LARGE_IN_FLIGHT);
    let large_pipelined_bytes =
        find(measures, &large_pipelined, &uring).and_then(|m| m.bytes_per_second);
    let fio_write = find(measures, "sequential write, 64 KiB blocks, fdatasync per 256 MiB", "fio")
        .and_then(|m| m.bytes_per_second);
    let sync16 =
        find(measures, "append 100 B, sync, 16 writers", &uring).and_then(|m| m.records_per_second);
    let fio_sync =
        find(measures, "write 4 KiB + fdatasync", "fio").and_then(|m| m.records_per_second);
    let consume = find(measures, CONSUME, &uring).and_then(|m| m.records_per_second);
    let consume_copying =
        find(measures, CONSUME_COPYING, &uring).and_then(|m| m.records_per_second);
    let mut out = vec![
        Ratio {
            what: "append 100 B rec/s over Redis Streams XADD (everysec)".into(),
            value: divide(append_small, redis),
            target: Some(10.0),
            unit: "x",
        },
        Ratio {
            what: "append 1 KiB bandwidth over fio sequential write".into(),
            value: divide(large, fio_write),
            target: None,
            unit: "x",
        },
        Ratio {
            what: format!("{large_pipelined} bandwidth over fio sequential write"),
            value: divide(large_pipelined_bytes, fio_write),
            target: Some(0.8),
            unit: "x",
        },
        Ratio {
            what: "16-writer sync appends/s over fio fdatasync rate".into(),
            value: divide(sync16, fio_sync),
            target: Some(10.0),
            unit: "x",
        },
        Ratio {
            what: "consume 100 B, M rec/s".into(),
            value: consume.map(|c| c / 1e6),
            target: Some(10.0),
            unit: "M",
        },
        Ratio {
            what: "zero-copy consume over copying each record".into(),
            value: divide(consume, consume_copying),
            target: Some(1.0),
            unit: "x",
        },
    ];
    let compaction = measures
        .iter()
        .find(|m| m.scenario.starts_with("compact ") && m.skipped.is_none())
        .and_then(|m| m.bytes_per_second);
    out.push(Ratio {
        what: "compaction input bandwidth over fio sequential write".into(),
        value: divide(compaction, fio_write),
        target: Some(0.5),
        unit: "x",
    });
    out.extend(processor_ratios(measures, &uring));
    out.extend(stores::store_ratios(measures));
    out.extend(pipelined_ratios(measures, &uring));
    out.extend(direct_ratios(measures, &uring));
    out.extend(open::open_ratios(measures, sizes));
    // Every scenario run on both backends (those run on the default one only, such as the
    // processor's and the open's, have nothing to compare).
    let scenarios: Vec<String> = measures
        .iter()
        .filter(|m| m.system == uring)
        .filter(|m| measures.iter().any(|o| o.system == pread && o.scenario == m.scenario))
        .map(|m| m.scenario.clone())
        .collect();
    let many_partitions = pipelined::partitions_scenario(64, PARTITION_IN_FLIGHT);
    for scenario in scenarios {
        let a = find(measures, &scenario, &uring);
        let b = find(measures, &scenario, &pread);
        let value =
            |m: Option<&Measure>| m.and_then(|m| m.records_per_second.or(m.bytes_per_second));
        let target = match scenario.as_str() {
            "append 100 B, sync, 16 writers" => 1.3,
            // Measured outside the bench: 69.9k rec/s on io_uring, 22.1k on pread.
            s if s == many_partitions => 1.5,
            _ => 1.0,
        };
        out.push(Ratio {
            what: format!("io_uring over pread: {scenario}"),
            value: divide(value(a), value(b)),
            target: Some(target),
            unit: "x",
        });
    }
    out
}

/// Direct I/O over buffered, and io_uring over pread with direct I/O (where the ring has the
/// device's latency to hide).
fn direct_ratios(measures: &[Measure], uring: &str) -> Vec<Ratio> {
    let mut out = Vec::new();
    let direct = system_name(ChronikIo { backend: Backend::IoUring, direct: true });
    let large_pipelined = pipelined::os_scenario(1024, 64, LARGE_IN_FLIGHT);
    let direct_scenarios =
        ["append 1 KiB, batch 64, os", &large_pipelined, "append 100 B, sync, 16 writers"];
    for scenario in direct_scenarios {
        let value =
            |system: &str| find(measures, scenario, system).and_then(|m| m.records_per_second);
        out.push(Ratio {
            what: format!("direct over buffered I/O: {scenario}"),
            value: divide(value(&direct), value(uring)),
            target: (scenario == large_pipelined).then_some(0.9),
            unit: "x",
        });
    }
    let pread_direct = system_name(ChronikIo { backend: Backend::Pread, direct: true });
    for scenario in ["append 1 KiB, batch 64, os", &large_pipelined] {
        let value =
            |system: &str| find(measures, scenario, system).and_then(|m| m.records_per_second);
        out.push(Ratio {
            what: format!("io_uring over pread, direct: {scenario}"),
            value: divide(value(&direct), value(&pread_direct)),
            target: Some(1.3),
            unit: "x",
        });
    }
    out
}

fn target_text(ratio: &Ratio) -> String {
    ratio.target.map_or_else(|| "-".to_owned(), |t| format!("{t}{}", ratio.unit))
}

fn print_table(measures: &[Measure], ratios: &[Ratio]) {
    println!();
    println!("{:<46} | {:<18} | {:>14} | {:>12}", "scenario", "system", "records/s", "MiB/s");
    println!("{:-<46}-|-{:-<18}-|-{:->14}-|-{:->12}", "", "", "", "");
    for m in measures {
        if let Some(why) = &m.skipped {
            println!("{:<46} | {:<18} | skipped: {why}", m.scenario, m.system);
            continue;
        }
        let records = m.records_per_second.map_or_else(|| "-".to_owned(), human);
        let bytes = m
            .bytes_per_second
            .map_or_else(|| "-".to_owned(), |b| format!("{:.1}", b / f64::from(1 << 20)));
        println!("{:<46} | {:<18} | {records:>14} | {bytes:>12}", m.scenario, m.system);
        if let Some(note) = &m.note {
            println!("{:<46} | {note}", "");
        }
    }
    println!();
    println!("{:<66} | {:>9} | {:>7}", "ratio", "measured", "target");
    println!("{:-<66}-|-{:->9}-|-{:->7}", "", "", "");
    for r in ratios {
        let value = r.value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}{}", r.unit));
        println!("{:<66} | {value:>9} | {:>7}", r.what, target_text(r));
    }
}

fn write_outputs(
    out: &Path,
    measures: &[Measure],
    ratios: &[Ratio],
    quick: bool,
    took: Duration,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let json = json!({
        "machine": machine(),
        "quick": quick,
        "seconds": took.as_secs_f64(),
        "measures": measures.iter().map(|m| json!({
            "scenario": m.scenario, "system": m.system,
            "records_per_second": m.records_per_second, "bytes_per_second": m.bytes_per_second,
            "skipped": m.skipped, "note": m.note, "seconds": m.seconds,
        })).collect::<Vec<_>>(),
        "ratios": ratios.iter().map(|r| json!({
            "what": r.what, "value": r.value, "target": r.target, "unit": r.unit,
        })).collect::<Vec<_>>(),
    });
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&json)?)?;
    let mut md = format!(
        "Machine: {}. Mode: {}. Took {:.0} s. Figures are medians over the runs.\n\n| scenario | system | records/s | MiB/s |\n| --- | --- | ---: | ---: |\n",
        machine(),
        if quick { "--quick" } else { "full" },
        took.as_secs_f64()
    );
    for m in measures {
        let records = m.records_per_second.map_or_else(|| "-".to_owned(), human);
        let bytes = m
            .bytes_per_second
            .map_or_else(|| "-".to_owned(), |b| format!("{:.1}", b / f64::from(1 << 20)));
        let (records, bytes) = match &m.skipped {
            Some(why) => (format!("skipped: {why}"), String::new()),
            None => (records, bytes),
        };
        let _ = writeln!(md, "| {} | {} | {records} | {bytes} |", m.scenario, m.system);
        if let Some(note) = &m.note {
            let _ = writeln!(md, "| | {note} | | |");
        }
    }
    md.push_str("\n| ratio | measured | target |\n| --- | ---: | ---: |\n");
    for r in ratios {
        let value = r.value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}{}", r.unit));
        let _ = writeln!(md, "| {} | {value} | {} |", r.what, target_text(r));
    }
    std::fs::write(out.join("results.md"), md)?;
    plot(&out.join("throughput.svg"), measures)?;
    Ok(())
}

/// A horizontal bar per measure with a bandwidth, in MiB/s: Chronik beside its peers and the
/// fio limit.
fn plot(path: &Path, measures: &[Measure]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let bars: Vec<(String, f64)> = measures
        .iter()
        .filter_map(|m| {
            m.bytes_per_second
                .map(|b| (format!("{} ({})", m.scenario, m.system), b / f64::from(1 << 20)))
        })
        .collect();
    let height = 60 + 22 * bars.len() as u32;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let max = bars.iter().map(|b| b.1).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption("Throughput, MiB/s (one run, one machine)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(520)
        .build_cartesian_2d(0.0..max, (0..bars.len()).into_segmented())
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_label_formatter(&|y| match y {
            SegmentValue::CenterOf(i) => bars.get(*i).map_or_else(String::new, |b| b.0.clone()),
            _ => String::new(),
        })
        .y_labels(bars.len())
        .draw()
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (name, value))| {
            let color = if name.contains("chronik") { BLUE.mix(0.7) } else { RED.mix(0.5) };
            Rectangle::new(
                [(0.0, SegmentValue::Exact(i)), (*value, SegmentValue::Exact(i + 1))],
                color.filled(),
            )
        }))
        .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    Ok(())
}

/// A server process started for the run, killed when dropped.
struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(program: &str, args: &[&str]) -> anyhow::Result<Server> {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {program}"))?;
        Ok(Server { child })
    }
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Wait until something listens on `port`.
fn wait_for_port(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("nothing listens on 127.0.0.1:{port} after 10 s")
}
