//! The open benchmark's writer (`chronik-bench --only open` runs it): it fills a data directory
//! in a process of its own, so that the directory is left exactly as a writer that closed, or
//! one that died, leaves it; the bench then times the next open in its own process.
//!
//!     chronik-open-work DIR --partitions P --bytes B [--kill] [--backend io_uring|pread]
//!
//! Durability `sync`; topic `open` with P partitions and segments of 1 GiB, so that every byte
//! stays in the active segments (what an open reads past the recovery points). 1 KiB records
//! in batches of 64, 4 appends in flight per partition, round robin over the partitions, until
//! B bytes of values are acknowledged. Then a clean close (`Engine::close`: recovery points at
//! the ends of the segments, then the clean-shutdown mark), or with `--kill`, SIGKILL.
//!
//! Prints one JSON line before closing or dying: the bytes acknowledged and the seconds the
//! fill took.

use chronik::{Backend, Chronik, Durability, Options, PendingAppend, Record, TopicConfig};
use clap::Parser;
use std::collections::VecDeque;
use std::time::Instant;

const TOPIC: &str = "open";
const VALUE_BYTES: usize = 1024;
const BATCH: usize = 64;
const IN_FLIGHT: usize = 4;

#[derive(Parser)]
struct Cli {
    dir: String,
    #[arg(long)]
    partitions: u32,
    /// Bytes of record values to append (and have acknowledged) in all.
    #[arg(long)]
    bytes: u64,
    /// SIGKILL the process once everything is acknowledged, instead of closing.
    #[arg(long)]
    kill: bool,
    #[arg(long, default_value = "auto")]
    backend: Backend,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let options =
        Options { durability: Durability::Sync, io_backend: cli.backend, ..Options::default() };
    let chronik = Chronik::open(&cli.dir, options)?;
    let config = TopicConfig { segment_bytes: 1 << 30, ..TopicConfig::default() }
        .with_partitions(cli.partitions);
    chronik.create_topic(TOPIC, config)?;
    let started = Instant::now();
    let acknowledged = fill(&chronik, cli.partitions, cli.bytes)?;
    let seconds = started.elapsed().as_secs_f64();
    println!("{}", serde_json::json!({ "bytes": acknowledged, "seconds": seconds }));
    if cli.kill {
        // SAFETY: kill(2) with our own pid; no memory is touched.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    // Close explicitly, for its result: dropping would close too, but silently.
    chronik.engine().clone().close()?;
    Ok(())
}

/// Append round robin over the partitions, each keeping `IN_FLIGHT` appends queued (waiting
/// for its oldest when its window is full), until `bytes` bytes of values are sent; then wait
/// for every acknowledgement. Returns the bytes acknowledged.
fn fill(chronik: &Chronik, partitions: u32, bytes: u64) -> anyhow::Result<u64> {
    let mut producer = chronik.producer(TOPIC);
    let value = [0x5a_u8; VALUE_BYTES];
    let records: Vec<Record<'_>> = (0..BATCH).map(|_| Record::new(None, &value)).collect();
    let batch_bytes = (BATCH * VALUE_BYTES) as u64;
    let mut windows: Vec<VecDeque<PendingAppend>> =
        (0..partitions).map(|_| VecDeque::with_capacity(IN_FLIGHT)).collect();
    let mut acknowledged = 0;
    let mut sent = 0;
    for partition in (0..partitions).cycle() {
        if sent >= bytes {
            break;
        }
        let window = &mut windows[partition as usize];
        if window.len() == IN_FLIGHT
            && let Some(oldest) = window.pop_front()
        {
            oldest.wait()?;
            acknowledged += batch_bytes;
        }
        window.push_back(producer.send_async_to(partition, &records)?);
        sent += batch_bytes;
    }
    for pending in windows.into_iter().flatten() {
        pending.wait()?;
        acknowledged += batch_bytes;
    }
    Ok(acknowledged)
}
