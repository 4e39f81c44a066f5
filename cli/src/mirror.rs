//! `chronik mirror`: copy topics from a data directory to a Kafka-protocol cluster, or back.
//!
//! Records keep their keys, values, headers and timestamps, partition by partition, in order.
//! A mirror stopped anywhere (Ctrl-C, `kill -9`, a broker gone) goes on where it stopped when
//! run again, writing no record twice:
//!
//! - directory to cluster: after each acknowledged chunk the source directory keeps, in a
//!   state file, how far it got in the source and in the destination; a run that finds records
//!   in the destination past its note (a chunk acknowledged, the note not yet written) skips
//!   that many source records.
//! - cluster to directory: each chunk and the cluster offset it reached are one transaction of
//!   the destination directory (the offset is kept as the commit of the consumer group
//!   `mirror-from-<cluster>`).

use anyhow::{Context as _, bail};
use chronik::kafka::KafkaClient;
use chronik::{Chronik, GroupCommit, Header, Offset, OwnedRecord, Record, TransactionWrite};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Instant;

/// Records one chunk of a partition holds at most.
const CHUNK_RECORDS: usize = 20_000;

#[derive(Args, Debug)]
pub struct MirrorArgs {
    /// Where to copy from: a data directory, or kafka://HOST:PORT.
    #[arg(long)]
    pub from: String,
    /// Where to copy to: kafka://HOST:PORT, or a data directory (created if missing).
    #[arg(long)]
    pub to: String,
    /// The topics to copy (each with the same name and partition count at the destination;
    /// created there if missing).
    #[arg(required = true)]
    pub topics: Vec<String>,
    /// No live progress display (it shows only on a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
}

pub fn run(args: &MirrorArgs) -> anyhow::Result<()> {
    let from_kafka = args.from.strip_prefix(chronik::KAFKA_SCHEME);
    let to_kafka = args.to.strip_prefix(chronik::KAFKA_SCHEME);
    match (from_kafka, to_kafka) {
        (None, Some(bootstrap)) => {
            let source = crate::open(std::path::Path::new(&args.from), chronik::Durability::Sync)?;
            let cluster = connect(bootstrap)?;
            for topic in &args.topics {
                to_cluster(&source, &cluster, topic, &progress(args))?;
            }
        }
        (Some(bootstrap), None) => {
            let cluster = connect(bootstrap)?;
            let destination =
                crate::open(std::path::Path::new(&args.to), chronik::Durability::Sync)?;
            for topic in &args.topics {
                from_cluster(&cluster, &destination, topic, &progress(args))?;
            }
        }
        _ => bail!(crate::UsageError(
            "one of --from and --to must be kafka://HOST:PORT, the other a data directory"
                .to_owned()
        )),
    }
    Ok(())
}

fn connect(bootstrap: &str) -> anyhow::Result<KafkaClient> {
    KafkaClient::connect(bootstrap).with_context(|| format!("cannot reach kafka://{bootstrap}"))
}

fn progress(args: &MirrorArgs) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if args.no_progress || !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} records, {per_sec}, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// A name made of the characters group and state-file names allow.
fn safe(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect()
}

/// The state file of a mirror from a directory to `cluster`: one line per partition,
/// `topic TAB partition TAB source-next TAB destination-next`.
fn state_file(cluster: &KafkaClient) -> String {
    format!("mirror-to-{}.progress", safe(cluster.bootstrap()))
}

type Progress = BTreeMap<(String, u32), (u64, u64)>;

fn read_progress(source: &Chronik, name: &str) -> anyhow::Result<Progress> {
    let Some(bytes) = source.read_state_file(name)? else { return Ok(Progress::new()) };
    let text = String::from_utf8(bytes).context("the mirror's progress file is not text")?;
    let mut progress = Progress::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        let [topic, partition, source_next, destination_next] = fields[..] else {
            bail!("the mirror's progress file has a bad line: {line:?}");
        };
        let number = |s: &str| s.parse::<u64>().with_context(|| format!("bad line {line:?}"));
        let partition = u32::try_from(number(partition)?)?;
        progress.insert(
            (topic.to_owned(), partition),
            (number(source_next)?, number(destination_next)?),
        );
    }
    Ok(progress)
}

fn write_progress(source: &Chronik, name: &str, progress: &Progress) -> anyhow::Result<()> {
    let mut text = String::new();
    for ((topic, partition), (source, destination)) in progress {
        use std::fmt::Write as _;
        let _ = writeln!(text, "{topic}\t{partition}\t{source}\t{destination}");
    }
    source.write_state_file(name, text.into_bytes())?;
    Ok(())
}

fn to_cluster(
    source: &Chronik,
    cluster: &KafkaClient,
    topic: &str,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    let description = source.describe_topic(topic)?;
    let partitions = description.partitions.len() as u32;
    match cluster.partition_count(topic)? {
        Some(count) if count == partitions => {}
        Some(count) => {
            bail!("topic {topic} has {count} partitions on the cluster, {partitions} here")
        }
        None => {
            let compacted = description.config.cleanup == chronik::Cleanup::Compact;
            cluster.create_topic(topic, partitions, compacted)?;
        }
    }
    let name = state_file(cluster);
    let mut progress = read_progress(source, &name)?;
    let total: u64 = (0..partitions)
        .map(|p| source.high_watermark(topic, p).map(Offset::get))
        .sum::<Result<u64, _>>()?;
    let done: u64 = (0..partitions)
        .map(|p| progress.get(&(topic.to_owned(), p)).map_or(0, |(next, _)| *next))
        .sum();
    bar.set_length(total);
    bar.set_position(done);
    bar.set_message(format!("{topic} -> kafka"));
    let started = Instant::now();
    let mut copied = 0_u64;
    for partition in 0..partitions {
        let key = (topic.to_owned(), partition);
        let (mut source_next, mut destination_next) = progress.get(&key).copied().unwrap_or((0, 0));
        // Records past the note reached the destination before the note was written: they
        // are the next source records, in order (one idempotent producer, one partition).
        let ahead = cluster.reader(topic, partition, destination_next)?;
        let (ahead_count, ahead_next) = count_to_end(ahead)?;
        let mut consumer = source.consumer(topic, partition);
        consumer.seek(Offset::new(source_next));
        if ahead_count > 0 {
            for _ in 0..ahead_count {
                let record = consumer
                    .next()
                    .transpose()?
                    .context("the destination holds more records than the source")?;
                source_next = record.offset.get() + 1;
            }
            destination_next = ahead_next;
            progress.insert(key.clone(), (source_next, destination_next));
            write_progress(source, &name, &progress)?;
        }
        loop {
            let chunk: Vec<OwnedRecord> =
                consumer.by_ref().take(CHUNK_RECORDS).collect::<Result<_, _>>()?;
            let Some(last) = chunk.last() else { break };
            let next = last.offset.get() + 1;
            let headers: Vec<Vec<Header<'_>>> =
                chunk.iter().map(OwnedRecord::header_views).collect();
            let records: Vec<Record<'_>> =
                chunk.iter().zip(&headers).map(|(r, h)| r.as_record(h)).collect();
            cluster.send(topic, partition, &records)?;
            source_next = next;
            destination_next = cluster.acknowledged(topic, partition).unwrap_or(destination_next);
            progress.insert(key.clone(), (source_next, destination_next));
            write_progress(source, &name, &progress)?;
            copied += chunk.len() as u64;
            bar.inc(chunk.len() as u64);
        }
    }
    bar.finish_and_clear();
    report(topic, "to", cluster.bootstrap(), copied, started);
    Ok(())
}

/// Read `reader` to the end: how many records, and the offset after the last.
fn count_to_end(mut reader: chronik::kafka::PartitionReader) -> anyhow::Result<(u64, u64)> {
    let mut count = 0;
    loop {
        let batch = reader.next_batch(50_000)?;
        count += batch.len() as u64;
        if batch.is_empty() && reader.at_end() {
            return Ok((count, reader.next_offset()));
        }
    }
}

fn from_cluster(
    cluster: &KafkaClient,
    destination: &Chronik,
    topic: &str,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    let partitions = cluster
        .partition_count(topic)?
        .with_context(|| format!("topic {topic} does not exist on the cluster"))?;
    match destination.partition_count(topic) {
        Some(count) if count == partitions => {}
        Some(count) => {
            bail!("topic {topic} has {count} partitions here, {partitions} on the cluster")
        }
        None => destination
            .create_topic(topic, chronik::TopicConfig::default().with_partitions(partitions))?,
    }
    let group = format!("mirror-from-{}", safe(cluster.bootstrap()));
    bar.set_message(format!("kafka -> {topic}"));
    let started = Instant::now();
    let mut copied = 0_u64;
    for partition in 0..partitions {
        let from = destination.committed_offset(&group, topic, partition).map_or(0, Offset::get);
        let mut reader = cluster.reader(topic, partition, from)?;
        loop {
            let chunk = reader.next_batch(CHUNK_RECORDS)?;
            if chunk.is_empty() {
                if reader.at_end() {
                    break;
                }
                continue;
            }
            let headers: Vec<Vec<Header<'_>>> =
                chunk.iter().map(OwnedRecord::header_views).collect();
            let records: Vec<Record<'_>> =
                chunk.iter().zip(&headers).map(|(r, h)| r.as_record(h)).collect();
            // The records and how far the cluster was read: one transaction. Batches are
            // bounded by the engine's batch limits, so split the chunk into several writes.
            let writes: Vec<TransactionWrite<'_>> = records
                .chunks(1000)
                .map(|records| TransactionWrite { topic, partition, records })
                .collect();
            let next = Offset::new(reader.next_offset());
            let offsets = [(topic, partition, next)];
            destination.commit_transaction(
                &writes,
                Some(GroupCommit { group: &group, offsets: &offsets }),
            )?;
            copied += chunk.len() as u64;
            bar.inc(chunk.len() as u64);
        }
    }
    bar.finish_and_clear();
    report(topic, "from", cluster.bootstrap(), copied, started);
    Ok(())
}

fn report(topic: &str, direction: &str, bootstrap: &str, copied: u64, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "chronik: mirrored {copied} records of {topic} {direction} kafka://{bootstrap} in {seconds:.1} s \
         ({:.0} records/s)",
        copied as f64 / seconds.max(1e-9)
    );
}
