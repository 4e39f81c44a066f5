//! `chronik`: the command-line tool for a Chronik data directory.
//!
//! Exit codes: 0 success, 1 failure, 2 usage error, 3 corrupted data found.

mod compact;
mod consume;
mod delete_records;
mod demo;
mod inspect;
#[cfg(feature = "kafka")]
mod mirror;
mod produce;
mod stats;
mod topic;

use anyhow::Context as _;
use chronik::{Chronik, Durability, Options};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "chronik", version, about = "Embedded log engine: topics, producers, consumers")]
struct Cli {
    /// The data directory (created if missing by produce, topic create and demo; every other
    /// command refuses one that does not exist).
    #[arg(long, global = true, env = "CHRONIK_DATA", value_name = "DIR")]
    data: Option<PathBuf>,
    /// The I/O backend: auto (io_uring where the kernel allows it), io_uring or pread.
    #[arg(long, global = true, env = "CHRONIK_IO", default_value = "auto", value_name = "BACKEND")]
    io: chronik::Backend,
    /// Write segment data with direct I/O (O_DIRECT), bypassing the page cache.
    #[arg(long, global = true, env = "CHRONIK_DIRECT_IO", value_parser = clap::builder::FalseyValueParser::new())]
    direct_io: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, list, describe and delete topics.
    #[command(subcommand)]
    Topic(topic::TopicCommand),
    /// Append one record per line of standard input; print PARTITION:OFFSET once acknowledged.
    Produce(produce::ProduceArgs),
    /// Print the records of a topic.
    Consume(consume::ConsumeArgs),
    /// Produce a click stream into a fresh topic, read it back, and report throughput.
    Demo(demo::DemoArgs),
    /// Compact every partition of a compacted topic now; print the sizes before and after.
    Compact(compact::CompactArgs),
    /// Delete the records below an offset in one or every partition, a whole sealed segment
    /// at a time; print each new log start.
    DeleteRecords(delete_records::DeleteRecordsArgs),
    /// Check every file of the data directory without opening it (checksums, offsets, indexes,
    /// metadata); exit 3 if anything durable is damaged.
    Verify(inspect::VerifyArgs),
    /// Print the batches (and with --records the records) of segment files, read directly.
    Dump(inspect::DumpArgs),
    /// Sizes, offsets, append rates and compaction state per topic and partition.
    Stats(stats::StatsArgs),
    /// Copy topics from a data directory to a Kafka-protocol cluster or back (kafka://HOST:PORT),
    /// resumable, keeping keys, values, headers and timestamps.
    #[cfg(feature = "kafka")]
    Mirror(mirror::MirrorArgs),
}

/// Parse `sync`, `os` or `interval:MS`.
pub fn parse_durability(text: &str) -> Result<Durability, String> {
    match text {
        "sync" => Ok(Durability::Sync),
        "os" => Ok(Durability::Os),
        _ => {
            let ms = text
                .strip_prefix("interval:")
                .ok_or_else(|| format!("{text:?} is not sync, os or interval:MS"))?;
            let ms: u64 =
                ms.parse().map_err(|_| format!("{ms:?} is not a number of milliseconds"))?;
            if ms == 0 {
                return Err("the interval must be at least 1 ms".to_owned());
            }
            Ok(Durability::Interval { ms })
        }
    }
}

/// Open the data directory, reporting on standard error what recovery did; created if missing
/// (for the commands that write: produce, topic create).
pub fn open(data: &std::path::Path, durability: Durability) -> anyhow::Result<Chronik> {
    open_with(data, Options { durability, ..default_options() })
}

/// As [`open`], for a command that changes only what is already there (compact, topic config,
/// topic delete, delete-records): a data directory that does not exist is refused.
pub fn open_existing(data: &std::path::Path, durability: Durability) -> anyhow::Result<Chronik> {
    require_existing(data)?;
    open(data, durability)
}

/// Open the data directory to change it, without the background maintainer a [`Chronik`]
/// starts (it applies retention and compacts at once, then every second): `compact` measures
/// the sizes before and after its own passes, and a pass beside it would make them say what
/// neither did. A data directory that does not exist is refused.
pub fn open_without_maintenance(data: &std::path::Path) -> anyhow::Result<chronik::DefaultEngine> {
    require_existing(data)?;
    let options = Options { durability: Durability::Sync, ..default_options() };
    let io = chronik::SystemIo::new(options.io_backend)
        .with_context(|| format!("cannot open data directory {}: set up I/O", data.display()))?;
    if let Some(reason) = io.fallback() {
        eprintln!("chronik: {reason}");
    }
    let clock = std::sync::Arc::new(chronik::SystemClock);
    let (engine, recovery) = chronik_engine::Engine::open(io, clock, data, options)
        .map_err(chronik::Error::from)
        .with_context(|| format!("cannot open data directory {}", data.display()))?;
    for line in recovery.lines() {
        eprintln!("chronik: recovery: {line}");
    }
    Ok(engine)
}

/// Refuse a data directory that does not exist, as a usage error: opening creates it, so a
/// mistyped `--data` would otherwise leave an empty directory behind and answer as if it held
/// nothing (no topics, or "topic does not exist") instead of naming the typo. A path that
/// exists but is not a directory is left to the open, which says so.
pub fn require_existing(data: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::metadata(data) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(UsageError(format!(
            "data directory {} does not exist (only produce, topic create and demo create one)",
            data.display()
        ))
        .into()),
        _ => Ok(()),
    }
}

/// Open the data directory to read it. If another process holds it (a producer is running),
/// read it beside that process without the lock and without changing any file. A data
/// directory that does not exist is refused, not created.
pub fn open_for_reading(data: &std::path::Path) -> anyhow::Result<Chronik> {
    require_existing(data)?;
    match Chronik::open(data, default_options()) {
        Err(chronik::Error::Open(chronik::OpenError::Locked { .. })) => {
            eprintln!(
                "chronik: {} is open in another process; reading beside it, without recovery",
                data.display()
            );
            open_with(data, Options { read_only: true, ..default_options() })
        }
        opened => report(opened, data),
    }
}

/// Open the data directory read-only whether or not another process writes it: no lock, no
/// file changed, recovery decided in memory only (see [`Options::read_only`]).
#[cfg(feature = "kafka")]
pub fn open_read_only(data: &std::path::Path) -> anyhow::Result<Chronik> {
    require_existing(data)?;
    open_with(data, Options { read_only: true, ..default_options() })
}

fn open_with(data: &std::path::Path, options: Options) -> anyhow::Result<Chronik> {
    report(Chronik::open(data, options), data)
}

/// The I/O backend every open of this process uses (`--io`, or `CHRONIK_IO`), and whether it
/// writes with direct I/O (`--direct-io`, or `CHRONIK_DIRECT_IO`).
static IO_CHOICE: std::sync::OnceLock<(chronik::Backend, bool)> = std::sync::OnceLock::new();

/// [`Options::default`] with the I/O chosen on the command line.
pub fn default_options() -> Options {
    let (io_backend, direct_io) = IO_CHOICE.get().copied().unwrap_or_default();
    // Partitions recover in parallel, one thread per core.
    let open_threads = std::thread::available_parallelism().map_or(1, usize::from);
    Options { io_backend, direct_io, open_threads, ..Options::default() }
}

fn report(
    opened: Result<Chronik, chronik::Error>,
    data: &std::path::Path,
) -> anyhow::Result<Chronik> {
    let chronik =
        opened.with_context(|| format!("cannot open data directory {}", data.display()))?;
    for line in chronik.recovery().lines() {
        eprintln!("chronik: recovery: {line}");
    }
    Ok(chronik)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let data = || {
        cli.data.clone().ok_or_else(|| {
            anyhow::Error::new(UsageError("--data DIR (or CHRONIK_DATA) is required".to_owned()))
        })
    };
    match cli.command {
        Command::Topic(command) => topic::run(&data()?, command),
        Command::Produce(args) => produce::run(&data()?, &args),
        Command::Consume(args) => consume::run(&data()?, &args),
        Command::Demo(args) => demo::run(&data()?, &args),
        Command::Compact(args) => compact::run(&data()?, &args),
        Command::DeleteRecords(args) => delete_records::run(&data()?, &args),
        Command::Verify(args) => inspect::run_verify(&data()?, &args),
        Command::Dump(args) => inspect::run_dump(cli.data.as_deref(), &args),
        Command::Stats(args) => stats::run(&data()?, &args),
        #[cfg(feature = "kafka")]
        Command::Mirror(args) => mirror::run(&args),
    }
}

/// A usage error found after argument parsing; exits with 2 like clap's own.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn exit_code(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if cause.is::<UsageError>() {
            return 2;
        }
        if cause.is::<chronik::Corruption>() || cause.is::<inspect::DamageFound>() {
            return 3;
        }
        let corrupt =
            cause.downcast_ref::<chronik::Error>().and_then(chronik::Error::corruption).is_some()
                || matches!(
                    cause.downcast_ref::<chronik::ReadError>(),
                    Some(chronik::ReadError::Corruption(_))
                )
                || matches!(
                    cause.downcast_ref::<chronik::AppendError>(),
                    Some(chronik::AppendError::Corruption(_))
                )
                || matches!(
                    cause.downcast_ref::<chronik::OpenError>(),
                    Some(chronik::OpenError::Corruption(_))
                );
        if corrupt {
            return 3;
        }
    }
    1
}

/// The error and its causes on one line, `: `-separated. A cause whose text its parent already
/// shows (an I/O error that prints its OS error and also returns it as its source) is left out,
/// so the line does not say "No space left on device" twice.
fn one_line(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    // One line: a multi-line cause (none is known today) would break `chronik ... 2>&1 | grep`.
    message.replace('\n', " ")
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Die quietly on a closed pipe (`chronik consume ... | head`) like other Unix tools, instead
/// of failing a print.
fn restore_default_sigpipe() {
    // SAFETY: called first thing in `main`, before any other thread exists; SIG_DFL is a valid
    // disposition for SIGPIPE and no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    IO_CHOICE.set((cli.io, cli.direct_io)).expect("set once, before any open");
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`chronik consume ... | head`) is not a failure.
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("chronik: error: {}", one_line(&error));
            ExitCode::from(exit_code(&error))
        }
    }
}
