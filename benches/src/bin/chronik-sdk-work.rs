//! The Rust SDK doing the Python benchmark's work (`benches/python/bench.py`), for its ratios:
//!
//! - `produce DIR --records N --value-bytes B --batch K`: append N records of B bytes, keyed
//!   `user-%08d` over `--users` keys, to topic `rust-sends` (one partition) in batches of K.
//! - `count DIR --application A --records N`: a one-thread counting processor over topic
//!   `clicks` (made by the benchmark), keys as strings, counts as JSON integers in store
//!   `counts` (what the Python handler does), on the calling thread until caught up
//!   (`Runner::run_until_caught_up`), which must count N records.
//!
//! Prints one JSON line: `{"records": N, "seconds": S}`.

use anyhow::bail;
use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig, Runner};
use chronik::{Chronik, Durability, Options, Record, RecordView, TopicConfig};
use clap::{Parser, Subcommand};
use std::time::Instant;

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
        #[arg(long, default_value_t = 100)]
        value_bytes: usize,
        #[arg(long, default_value_t = 10_000)]
        batch: usize,
        #[arg(long, default_value_t = 100_000)]
        users: u64,
    },
    Count {
        dir: String,
        #[arg(long)]
        application: String,
        #[arg(long)]
        records: u64,
    },
}

struct Counter;

impl Processor for Counter {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let user = std::str::from_utf8(record.key().unwrap_or_default())
            .map_err(|e| ProcessError::new(e.to_string()))?
            .to_owned();
        let mut counts = ctx.typed::<String, u64>("counts")?;
        let count = counts.get(&user)?.unwrap_or(0) + 1;
        counts.put(&user, &count)
    }
}

fn open(dir: &str) -> anyhow::Result<Chronik> {
    Ok(Chronik::open(dir, Options { durability: Durability::Os, ..Options::default() })?)
}

fn main() -> anyhow::Result<()> {
    let (records, elapsed) = match Cli::parse().work {
        Work::Produce { dir, records, value_bytes, batch, users } => {
            let chronik = open(&dir)?;
            chronik.create_topic("rust-sends", TopicConfig::default())?;
            let value = vec![0x42_u8; value_bytes];
            let keys: Vec<String> =
                (0..batch as u64).map(|i| format!("user-{:08}", i % users.max(1))).collect();
            let mut producer = chronik.producer("rust-sends");
            let started = Instant::now();
            let mut sent = 0;
            while sent < records {
                let n = batch.min(usize::try_from(records - sent)?);
                let batch: Vec<Record<'_>> =
                    keys[..n].iter().map(|k| Record::new(Some(k.as_bytes()), &value)).collect();
                producer.send_to(0, &batch)?;
                sent += n as u64;
            }
            chronik.flush()?;
            (sent, started.elapsed())
        }
        Work::Count { dir, application, records } => {
            let chronik = open(&dir)?;
            let config = ProcessorConfig::new(&application, "clicks").store("counts");
            let started = Instant::now();
            let mut runner = Runner::new(chronik.engine(), config, |_| Counter)?;
            let stats = runner.run_until_caught_up()?;
            if stats.records != records {
                bail!("counted {} records of {records}", stats.records);
            }
            (stats.records, started.elapsed())
        }
    };
    println!("{{\"records\": {records}, \"seconds\": {}}}", elapsed.as_secs_f64());
    Ok(())
}
