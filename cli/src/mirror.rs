//! `chronik mirror`: copy topics from a data directory to a Kafka-protocol cluster, or back.
//!
//! Records keep their keys, values, headers and timestamps, partition by partition, in order.
//! A mirror stopped anywhere (Ctrl-C, `kill -9`, a broker gone) goes on where it stopped when
//! run again, writing no record twice:
//!
//! - directory to cluster: the source is opened read-only (no lock, no file changed), so a
//!   producer or an application may be writing it meanwhile. Each partition is copied up to
//!   its high watermark as the open found it (later records are the next run's). After each
//!   acknowledged chunk, one record of the destination's compacted topic
//!   `chronik-mirror.state` (key: the source directory's canonical path, the topic and the
//!   partition; value: how far the mirror got in the source and in the destination) notes
//!   the pair; the last record of a key is the note. One record is one write, so the two
//!   offsets are noted together or not at all. A run that finds records in the destination
//!   past its note (a chunk acknowledged, the note not yet written) skips that many source
//!   records. A partition with no note yet resumes from the state file an earlier version of
//!   this tool kept in the source directory (`state/mirror-to-<cluster>.progress`, only
//!   read now), if there is one.
//! - cluster to directory: each chunk and the cluster offset it reached are one transaction of
//!   the destination directory (the offset is kept as the commit of the consumer group
//!   `mirror-from-<cluster>`).
//!
//! The notes are named by the source's canonical path: a directory moved elsewhere starts
//! without them, and its first run counts the destination's records as copied source records
//! (exact for a source without offset gaps, as a topic never compacted).
//!
//! Why a topic and not the committed offsets of a consumer group on the destination: a commit
//! holds one number per partition (this client sets no commit metadata), and resuming needs
//! two noted together (a compacted source has gaps, so one does not give the other); two
//! groups committed one after the other can be seen half-written. Why not the source: a
//! read-only open writes nothing there, and writing needs the writer's lock.
//!
//! A read-only open sees what the writer wrote, synced or not (docs/format.md, "Reading beside
//! a writer"): should the writer's machine crash, records it had not synced, which the mirror
//! may already have copied, are lost from the source but not from the destination. The mirror
//! never refreshes its open, so the engine has no occasion to report that the writer
//! recovered and rewrote what was read; should a read report it (`ReadError::Changed`), the
//! mirror stops with an error before sending anything it read since its last note, and run
//! again it goes on from that note.

use anyhow::{Context as _, bail};
use chronik::kafka::{KafkaClient, KafkaConfig};
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
    /// Kafka client properties for the cluster, in the Java `client.properties` format
    /// (security.protocol, ssl.ca.location, sasl.mechanism, sasl.username, ...).
    /// Environment variables CHRONIK_KAFKA_<NAME> set the properties the file does not
    /// (CHRONIK_KAFKA_SASL_PASSWORD is sasl.password).
    #[arg(long, value_name = "FILE")]
    pub kafka_config: Option<std::path::PathBuf>,
}

pub fn run(args: &MirrorArgs) -> anyhow::Result<()> {
    let from_kafka = args.from.strip_prefix(chronik::KAFKA_SCHEME);
    let to_kafka = args.to.strip_prefix(chronik::KAFKA_SCHEME);
    match (from_kafka, to_kafka) {
        (None, Some(bootstrap)) => {
            let data = std::path::Path::new(&args.from);
            let source = crate::open_read_only(data)?;
            let cluster = connect(bootstrap, args)?;
            let mut state = SourceState::read(&source, data, &cluster)?;
            for topic in &args.topics {
                to_cluster(&source, &cluster, &mut state, topic, &progress(args))?;
            }
        }
        (Some(bootstrap), None) => {
            let cluster = connect(bootstrap, args)?;
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

/// The cluster at `bootstrap`, with the properties of `--kafka-config` and then those of the
/// `CHRONIK_KAFKA_*` environment variables it does not set.
fn connect(bootstrap: &str, args: &MirrorArgs) -> anyhow::Result<KafkaClient> {
    let mut config = KafkaConfig::new(bootstrap);
    if let Some(path) = &args.kafka_config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --kafka-config {}", path.display()))?;
        config = config
            .set_properties(&text)
            .with_context(|| format!("in --kafka-config {}", path.display()))?;
    }
    KafkaClient::connect_with(config).with_context(|| format!("cannot reach kafka://{bootstrap}"))
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

/// The compacted topic of the destination cluster where mirrors from directories note how far
/// they got, one record per source directory, topic and partition.
const STATE_TOPIC: &str = "chronik-mirror.state";

/// A topic and one of its partitions.
type PartitionKey = (String, u32);

/// How far a mirror got in one partition: the next source offset and the next destination
/// offset, the records before them copied.
type Progress = BTreeMap<PartitionKey, (u64, u64)>;

/// The notes of one source directory on the destination cluster.
struct SourceState {
    /// The source directory's canonical path: what names its notes.
    source: String,
    noted: Progress,
}

impl SourceState {
    /// The notes of `data` on `cluster` (creating the state topic if missing), falling back,
    /// partition by partition, on the state file an earlier version kept in the source.
    fn read(
        source: &Chronik,
        data: &std::path::Path,
        cluster: &KafkaClient,
    ) -> anyhow::Result<Self> {
        let canonical = std::fs::canonicalize(data)
            .with_context(|| format!("cannot resolve {}", data.display()))?;
        let name = canonical.to_string_lossy().into_owned();
        let mut noted = Progress::new();
        match cluster.partition_count(STATE_TOPIC)? {
            Some(_) => {
                for record in cluster.records(STATE_TOPIC, 0)? {
                    if let Some((key, value)) = parse_note(&record, &name)? {
                        noted.insert(key, value);
                    }
                }
            }
            None => match cluster.create_topic(STATE_TOPIC, 1, true) {
                // Another mirror created it meanwhile: it holds no note of this source yet.
                Ok(()) | Err(chronik::kafka::ClusterError::TopicExists { .. }) => {}
                Err(error) => return Err(error.into()),
            },
        }
        // Only read: the source is read-only. A note on the cluster is newer than the file.
        for (key, value) in read_progress(source, &state_file(cluster))? {
            noted.entry(key).or_insert(value);
        }
        Ok(SourceState { source: name, noted })
    }

    fn get(&self, topic: &str, partition: u32) -> (u64, u64) {
        self.noted.get(&(topic.to_owned(), partition)).copied().unwrap_or((0, 0))
    }

    /// Note `next` (source, destination) for `topic`/`partition`: one acknowledged record.
    fn note(
        &mut self,
        cluster: &KafkaClient,
        topic: &str,
        partition: u32,
        next: (u64, u64),
    ) -> anyhow::Result<()> {
        let key =
            serde_json::json!({"source": self.source, "topic": topic, "partition": partition});
        let value = serde_json::json!({"source_next": next.0, "destination_next": next.1});
        let (key, value) = (key.to_string(), value.to_string());
        let record = Record::new(Some(key.as_bytes()), value.as_bytes());
        cluster.send(STATE_TOPIC, 0, &[record]).context("cannot note the mirror's progress")?;
        self.noted.insert((topic.to_owned(), partition), next);
        Ok(())
    }
}

/// A record of the state topic: the partition it notes and the offsets, if it is a note of
/// `source`.
fn parse_note(
    record: &OwnedRecord,
    source: &str,
) -> anyhow::Result<Option<(PartitionKey, (u64, u64))>> {
    let bad = || format!("a bad record at offset {} of topic {STATE_TOPIC}", record.offset.get());
    let key: serde_json::Value =
        serde_json::from_slice(record.key.as_deref().unwrap_or_default()).with_context(bad)?;
    if key["source"].as_str() != Some(source) {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_slice(&record.value).with_context(bad)?;
    let topic = key["topic"].as_str().with_context(bad)?;
    let partition =
        key["partition"].as_u64().and_then(|p| u32::try_from(p).ok()).with_context(bad)?;
    let source_next = value["source_next"].as_u64().with_context(bad)?;
    let destination_next = value["destination_next"].as_u64().with_context(bad)?;
    Ok(Some(((topic.to_owned(), partition), (source_next, destination_next))))
}

/// The state file an earlier version kept in the source directory, for a mirror to `cluster`:
/// one line per partition, `topic TAB partition TAB source-next TAB destination-next`.
fn state_file(cluster: &KafkaClient) -> String {
    format!("mirror-to-{}.progress", safe(cluster.bootstrap()))
}

fn read_progress(source: &Chronik, name: &str) -> anyhow::Result<Progress> {
    let Some(bytes) = source.engine().state_dir().read(name)? else { return Ok(Progress::new()) };
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

/// The next record of `consumer` below `end`, if any.
fn next_below(
    consumer: &mut chronik::Consumer,
    end: u64,
    data: &std::path::Path,
) -> anyhow::Result<Option<OwnedRecord>> {
    if chronik::Consumer::position(consumer).get() >= end {
        return Ok(None);
    }
    match consumer.next() {
        Some(Ok(record)) if record.offset.get() < end => Ok(Some(record)),
        Some(Ok(_)) | None => Ok(None),
        Some(Err(error)) => Err(read_error(error, data)),
    }
}

/// The next records of `consumer` below `end`, at most [`CHUNK_RECORDS`]; empty at `end`.
fn chunk_below(
    consumer: &mut chronik::Consumer,
    end: u64,
    data: &std::path::Path,
) -> anyhow::Result<Vec<OwnedRecord>> {
    let mut chunk = Vec::new();
    while chunk.len() < CHUNK_RECORDS {
        let Some(record) = next_below(consumer, end, data)? else { break };
        chunk.push(record);
    }
    Ok(chunk)
}

/// A read error of the source, saying what to do when the writer rewrote what was read.
fn read_error(error: chronik::ReadError, data: &std::path::Path) -> anyhow::Error {
    let changed = matches!(error, chronik::ReadError::Changed { .. });
    let error = anyhow::Error::new(error);
    if changed {
        return error.context(format!(
            "the writer of {} recovered and rewrote records this mirror read; nothing read \
             since the last note was sent: run the mirror again to go on from there",
            data.display()
        ));
    }
    error.context(format!("cannot read {}", data.display()))
}

fn to_cluster(
    source: &Chronik,
    cluster: &KafkaClient,
    state: &mut SourceState,
    topic: &str,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    if topic == STATE_TOPIC {
        bail!(crate::UsageError(format!("{STATE_TOPIC} is the mirror's own topic")));
    }
    let data = source.engine().root().to_owned();
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
    // What the writer had made visible when the source was opened: a read-only open moves
    // on only when refreshed, which this mirror never does, so later records are the next
    // run's.
    let ends: Vec<u64> = (0..partitions)
        .map(|p| source.high_watermark(topic, p).map(Offset::get))
        .collect::<Result<_, _>>()?;
    let total: u64 = ends.iter().sum();
    let done: u64 = (0..partitions).map(|p| state.get(topic, p).0).sum();
    bar.set_length(total);
    bar.set_position(done.min(total));
    bar.set_message(format!("{topic} -> kafka"));
    let started = Instant::now();
    let mut copied = 0_u64;
    for (partition, &end) in (0..partitions).zip(&ends) {
        let (mut source_next, mut destination_next) = state.get(topic, partition);
        // Records past the note reached the destination before the note was written: they
        // are the next source records, in order (one producer, one partition).
        let ahead = cluster.reader(topic, partition, destination_next)?;
        let (ahead_count, ahead_next) = count_to_end(ahead)?;
        let mut consumer = source.consumer(topic, partition);
        consumer.seek(Offset::new(source_next));
        if ahead_count > 0 {
            for _ in 0..ahead_count {
                let record = next_below(&mut consumer, end, &data)?.with_context(|| {
                    format!(
                        "partition {partition} of {topic}: the destination holds more records \
                         than the source (below its high watermark {end})"
                    )
                })?;
                source_next = record.offset.get() + 1;
            }
            destination_next = ahead_next;
            state.note(cluster, topic, partition, (source_next, destination_next))?;
        }
        loop {
            let chunk = chunk_below(&mut consumer, end, &data)?;
            let Some(last) = chunk.last() else { break };
            let next = last.offset.get() + 1;
            assert!(source_next < next && next <= end, "a chunk outside {source_next}..{end}");
            let headers: Vec<Vec<Header<'_>>> =
                chunk.iter().map(OwnedRecord::header_views).collect();
            let records: Vec<Record<'_>> =
                chunk.iter().zip(&headers).map(|(r, h)| r.as_record(h)).collect();
            cluster.send(topic, partition, &records)?;
            source_next = next;
            destination_next = cluster.acknowledged(topic, partition).unwrap_or(destination_next);
            state.note(cluster, topic, partition, (source_next, destination_next))?;
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
            return Ok((count, reader.next_offset().get()));
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
            let next = reader.next_offset();
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
