//! `chronik produce`: one record per line of standard input.
//!
//! A reader thread feeds lines into a bounded channel; the main thread takes everything that is
//! already there (up to a batch limit) and appends it as one batch per partition. An interactive
//! line is acknowledged at once; a fast pipe is written in large batches.

use crate::UsageError;
use anyhow::Context as _;
use chronik::{Chronik, Durability, Record, TopicConfig};
use clap::Args;
use crossbeam_channel::{Receiver, bounded};
use std::io::{BufRead, Write};
use std::path::Path;

const BATCH_RECORDS_MAX: usize = 8192;
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
const CHANNEL_LINES_MAX: usize = 65_536;

#[derive(Args, Debug)]
pub struct ProduceArgs {
    pub topic: String,
    /// Send every record to this partition (default: by key hash, or round-robin per batch
    /// for records without a key).
    #[arg(long)]
    pub partition: Option<u32>,
    /// Split each line at the first SEP into key and value.
    #[arg(long, value_name = "SEP")]
    pub key_separator: Option<String>,
    /// When a record is acknowledged: sync (after fsync), interval:MS, or os.
    #[arg(long, default_value = "sync", value_parser = crate::parse_durability)]
    pub durability: Durability,
    /// Partitions of the topic if it has to be created.
    #[arg(long, default_value_t = 1)]
    pub create_partitions: u32,
}

pub fn run(data: &Path, args: &ProduceArgs) -> anyhow::Result<()> {
    if args.key_separator.as_deref() == Some("") {
        return Err(UsageError("--key-separator must not be empty".to_owned()).into());
    }
    // A data directory that does not exist yet holds no topic: check what creating one needs
    // before the open creates the directory, so that a bad argument leaves nothing behind.
    if matches!(std::fs::metadata(data), Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
        check_new_topic(args)?;
    }
    let chronik = crate::open(data, args.durability)?;
    let partitions = ensure_topic(&chronik, args)?;
    assert!(args.partition.is_none_or(|p| p < partitions), "checked before");
    let lines = spawn_reader();
    let mut producer = chronik.producer(&args.topic);
    let mut round_robin = 0u32;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    // A line that would take the batch past its byte limit waits for the next batch, so a
    // batch passes the limit only when it is that one line alone.
    let mut carried: Option<Vec<u8>> = None;
    // Lines of standard input acknowledged so far.
    let mut acknowledged = 0u64;
    loop {
        let first = match carried.take() {
            Some(line) => line,
            None => match lines.recv() {
                Ok(line) => line?,
                Err(_) => break,
            },
        };
        let mut bytes = first.len();
        let mut batch = vec![first];
        while batch.len() < BATCH_RECORDS_MAX {
            let Ok(line) = lines.try_recv() else { break };
            let line = line?;
            if bytes + line.len() > BATCH_BYTES_MAX {
                carried = Some(line);
                break;
            }
            bytes += line.len();
            batch.push(line);
        }
        debug_assert!(batch.len() == 1 || bytes <= BATCH_BYTES_MAX);
        let records: Vec<Record<'_>> =
            batch.iter().map(|line| split(line, args.key_separator.as_deref())).collect();
        let targets: Vec<u32> = records
            .iter()
            .map(|record| match (args.partition, record.key) {
                (Some(partition), _) => partition,
                (None, Some(key)) => chronik::partition_for_key(key, partitions),
                (None, None) => round_robin,
            })
            .collect();
        round_robin = (round_robin + 1) % partitions;
        let offsets = append_grouped(&mut producer, &records, &targets)
            .map_err(|error| too_large_line(error, &batch, acknowledged))?;
        for (partition, offset) in targets.iter().zip(offsets) {
            writeln!(out, "{partition}:{offset}")?;
        }
        // Acknowledgements leave the process only after the append returned.
        out.flush()?;
        acknowledged += batch.len() as u64;
    }
    Ok(())
}

/// A line too large for one record (only such a line fills a batch past the engine's limit,
/// alone in its batch): say which line, instead of the engine's "batch of N bytes".
fn too_large_line(error: anyhow::Error, batch: &[Vec<u8>], acknowledged: u64) -> anyhow::Error {
    let too_large = error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<chronik::Error>(),
            Some(chronik::Error::Append(chronik::AppendError::BatchTooLarge { .. }))
        )
    });
    match batch {
        [line] if too_large => anyhow::anyhow!(
            "line {} of standard input holds {} bytes, more than one record can (a batch is at \
             most {} bytes with its headers); the {acknowledged} lines before it are \
             acknowledged",
            acknowledged + 1,
            line.len(),
            chronik_engine::limits::BATCH_BYTES_MAX
        ),
        _ => error,
    }
}

/// The topic's partition count, creating the topic if it does not exist. `--partition` is
/// checked first, against the partitions the topic has or would be created with: a bad one
/// creates nothing.
fn ensure_topic(chronik: &Chronik, args: &ProduceArgs) -> anyhow::Result<u32> {
    match chronik.engine().topic_partitions(&args.topic) {
        Ok(count) => {
            check_partition(args, count, false)?;
            return Ok(count);
        }
        // Damage keeps the topic closed: never create a new one over it.
        Err(error @ chronik::TopicError::Corruption(_)) => {
            return Err(chronik::Error::from(error).into());
        }
        Err(_) => {}
    }
    check_new_topic(args)?;
    let config = TopicConfig::default().with_partitions(args.create_partitions);
    chronik.create_topic(&args.topic, config).map_err(crate::topic::usage_if_invalid)?;
    eprintln!("chronik: created topic {} with {} partitions", args.topic, args.create_partitions);
    Ok(args.create_partitions)
}

/// The topic `args` would create is valid (name, partition count), and `--partition` is one
/// of its partitions.
fn check_new_topic(args: &ProduceArgs) -> anyhow::Result<()> {
    chronik_engine::internals::topic::validate_name(&args.topic)
        .map_err(crate::topic::usage_if_invalid)?;
    let config = TopicConfig::default().with_partitions(args.create_partitions);
    config.validate().map_err(crate::topic::usage_if_invalid)?;
    check_partition(args, args.create_partitions, true)
}

/// `--partition` is below `partitions`, the count the topic has (or, `new`, would be created
/// with).
fn check_partition(args: &ProduceArgs, partitions: u32, new: bool) -> anyhow::Result<()> {
    let Some(partition) = args.partition.filter(|&p| p >= partitions) else { return Ok(()) };
    let topic = &args.topic;
    let message = if new {
        format!(
            "topic {topic} does not exist and would be created with {partitions} partitions, \
             no {partition} (--create-partitions sets how many); nothing was created"
        )
    } else {
        format!("topic {topic} has {partitions} partitions, no {partition}")
    };
    Err(UsageError(message).into())
}

/// Append `records` with one batch per target partition; offsets come back in input order.
fn append_grouped(
    producer: &mut chronik::Producer,
    records: &[Record<'_>],
    targets: &[u32],
) -> anyhow::Result<Vec<u64>> {
    let mut offsets = vec![0u64; records.len()];
    let mut partitions: Vec<u32> = targets.to_vec();
    partitions.sort_unstable();
    partitions.dedup();
    for partition in partitions {
        let indices: Vec<usize> = (0..records.len()).filter(|&i| targets[i] == partition).collect();
        let group: Vec<Record<'_>> = indices.iter().map(|&i| records[i]).collect();
        let appended = producer.send_to(partition, &group).map_err(chronik::Error::from)?;
        for (n, &i) in indices.iter().enumerate() {
            offsets[i] = appended.base_offset.get() + n as u64;
        }
    }
    Ok(offsets)
}

fn split<'a>(line: &'a [u8], separator: Option<&str>) -> Record<'a> {
    let Some(separator) = separator.map(str::as_bytes) else {
        return Record::new(None, line);
    };
    match line.windows(separator.len()).position(|window| window == separator) {
        Some(at) => Record::new(Some(&line[..at]), &line[at + separator.len()..]),
        None => Record::new(None, line),
    }
}

/// Read standard input line by line on a thread, without the line terminator.
fn spawn_reader() -> Receiver<std::io::Result<Vec<u8>>> {
    let (sender, receiver) = bounded(CHANNEL_LINES_MAX);
    std::thread::spawn(move || {
        let mut input = std::io::stdin().lock();
        loop {
            let mut line = Vec::new();
            match input.read_until(b'\n', &mut line).context("reading standard input") {
                Ok(0) => return,
                Ok(_) => {
                    if line.last() == Some(&b'\n') {
                        line.pop();
                        if line.last() == Some(&b'\r') {
                            line.pop();
                        }
                    }
                    if sender.send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(error) => {
                    let error = std::io::Error::other(format!("{error:#}"));
                    let _ = sender.send(Err(error));
                    return;
                }
            }
        }
    });
    receiver
}
