//! The oracles: checks of the engine against the reference model, run after every recovery
//! and at the end of a run.
//!
//! Each oracle is a small type implementing [`Oracle`]; [`standard`] lists them in the order
//! they run. Later work (compaction, changelogs, liveness) adds its oracles to that list. An
//! oracle never panics on a wrong engine: it returns a [`Violation`] naming itself.
//!
//! Every oracle reads the same [`Scan`]: each partition read from offset zero to the high
//! watermark. Building the scan is itself checked (oracle `offsets_contiguous`): offsets start
//! at zero, strictly increase without holes, each fetch moves forward, and the scan ends at
//! the high watermark.

use crate::disk::SimDisk;
use crate::model::{Model, ModelRecord, TopicState};
use crate::rng::Rng;
use crate::workload::{SCRATCH, TOPIC};
use chronik::Consumer;
use chronik_engine::{Engine, Offset};
use std::fmt;

/// The engine as the simulator runs it.
pub type SimEngine = Engine<SimDisk>;

/// Largest fetch the scan asks for: small, so scans cross segments and batches often.
pub const SCAN_FETCH_BYTES_MAX: u64 = 16 * 1024;
/// Fetches in one scan before it is called stuck: a liveness bound, not a size limit.
pub const SCAN_FETCHES_MAX: u64 = 1 << 20;
/// Random offsets each `reads_exact` and `timestamp_lookup` check tries per partition.
const PROBES_PER_PARTITION: u64 = 8;
/// Largest `max_bytes` the `sdk_readers` poll loops ask for, as a power of two: from a single
/// batch (any fetch returns at least one) to many.
const POLL_BYTES_MAX_LOG2: u64 = 16;
/// Chance that `sdk_readers` reads a topic that is not compacted after an open.
const SDK_READS_UNCOMPACTED_PER_MILLION: u32 = 250_000;

/// An oracle found the engine wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The oracle's name, stable across versions: tests and reports key on it.
    pub oracle: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn new(oracle: &'static str, detail: impl Into<String>) -> Violation {
        Violation { oracle, detail: detail.into() }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oracle {} violated: {}", self.oracle, self.detail)
    }
}

impl std::error::Error for Violation {}

/// One record as a read returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedRecord {
    pub offset: Offset,
    pub record: ModelRecord,
}

/// Every visible record of every partition, read front to back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Per partition, from its log start; empty when the topic does not exist.
    pub partitions: Vec<Vec<ScannedRecord>>,
    /// Per partition, the log start (retention removed every offset below it).
    pub starts: Vec<u64>,
    /// Per partition, the offset the scan ended at: the end of the log.
    pub ends: Vec<u64>,
}

impl Scan {
    /// The end of `partition`'s log: every offset below it was written (records below the log
    /// start, or removed by compaction, count: they were there).
    pub fn end(&self, partition: usize) -> u64 {
        self.ends.get(partition).copied().unwrap_or(0)
    }
}

/// What every oracle sees.
#[derive(Debug)]
pub struct Context<'a> {
    pub model: &'a Model,
    pub engine: &'a SimEngine,
    pub scan: &'a Scan,
    /// Whether the topic exists in the engine.
    pub topic_exists: bool,
    /// The simulated clock now.
    pub now_ms: i64,
}

/// A check of the engine against the model.
pub trait Oracle: fmt::Debug + Send + Sync {
    /// A stable name: `Violation::oracle` of what this check reports.
    fn name(&self) -> &'static str;
    /// Check; `rng` chooses what to probe when checking everything would cost too much.
    fn check(&self, context: &Context<'_>, rng: &mut Rng) -> Result<(), Violation>;
}

/// The oracles every run checks, in order.
pub fn standard() -> Vec<Box<dyn Oracle>> {
    vec![
        Box::new(TopicSurvives),
        Box::new(AcknowledgedSurvive),
        Box::new(PrefixOfWritten),
        Box::new(ReadsExact),
        Box::new(TimestampLookup),
        Box::new(RetentionBounds),
        Box::new(CompactionKeepsLatest),
        Box::new(SdkReaders),
    ]
}

/// Run `oracles` in order and return the first violation.
pub fn check_all(
    oracles: &[Box<dyn Oracle>],
    context: &Context<'_>,
    rng: &mut Rng,
) -> Result<(), Violation> {
    for oracle in oracles {
        oracle.check(context, rng)?;
    }
    Ok(())
}

/// A record as read, owned.
pub fn owned(record: &chronik_engine::RecordView<'_>) -> ScannedRecord {
    ScannedRecord {
        offset: record.offset(),
        record: ModelRecord {
            key: record.key().map(<[u8]>::to_vec),
            value: record.value().to_vec(),
            timestamp: record.timestamp(),
        },
    }
}

/// Read one partition from `from` to the high watermark, checking offsets as it goes: they
/// increase by one (`dense`), or at least increase (a compacted topic, whose reads skip the
/// offsets compaction removed). Returns the records and the offset the scan ended at.
pub fn scan_partition(
    engine: &SimEngine,
    partition: u32,
    from: Offset,
    dense: bool,
    rng: &mut Rng,
) -> Result<(Vec<ScannedRecord>, Offset), Violation> {
    const ORACLE: &str = "offsets_contiguous";
    let read_error = |e| Violation::new("reads_succeed", format!("partition {partition}: {e}"));
    let high_watermark = engine.high_watermark(TOPIC, partition).map_err(read_error)?;
    let mut records: Vec<ScannedRecord> = Vec::new();
    let mut next = from;
    for _ in 0..SCAN_FETCHES_MAX {
        let max_bytes = rng.between(1, SCAN_FETCH_BYTES_MAX) as usize;
        let fetch = engine.read(TOPIC, partition, next, max_bytes).map_err(read_error)?;
        if fetch.is_empty() {
            if next != high_watermark {
                let detail = format!(
                    "partition {partition}: empty fetch at {next}, high watermark {high_watermark}"
                );
                return Err(Violation::new(ORACLE, detail));
            }
            return Ok((records, next));
        }
        for record in fetch.records() {
            let wrong = if dense { record.offset() != next } else { record.offset() < next };
            if wrong {
                let detail = format!(
                    "partition {partition}: expected offset {next}, read {}",
                    record.offset()
                );
                return Err(Violation::new(ORACLE, detail));
            }
            records.push(owned(&record));
            next = record.offset().plus(1);
        }
        let moved_on =
            if dense { fetch.next_offset() == next } else { fetch.next_offset() >= next };
        if !moved_on || fetch.next_offset() > high_watermark {
            let detail = format!(
                "partition {partition}: fetch says next {} after reading up to {next}",
                fetch.next_offset()
            );
            return Err(Violation::new(ORACLE, detail));
        }
        next = fetch.next_offset();
    }
    Err(Violation::new("liveness", format!("partition {partition}: scan never ended")))
}

/// Scan every partition of the workload's topic.
pub fn scan(engine: &SimEngine, model: &Model, rng: &mut Rng) -> Result<Scan, Violation> {
    if engine.partition_count(TOPIC).is_none() {
        return Ok(Scan::default());
    }
    let mut partitions = Vec::with_capacity(model.partitions.len());
    let mut starts = Vec::with_capacity(model.partitions.len());
    let description = engine
        .describe_topic(TOPIC)
        .map_err(|e| Violation::new("reads_succeed", format!("describe: {e}")))?;
    let mut ends = Vec::with_capacity(model.partitions.len());
    for partition in 0..model.partitions.len() as u32 {
        let start = description.partitions[partition as usize].log_start_offset;
        let (records, end) = scan_partition(engine, partition, start, !model.compacted, rng)?;
        partitions.push(records);
        starts.push(start.get());
        ends.push(end.get());
    }
    Ok(Scan { partitions, starts, ends })
}

/// An acknowledged topic is there after every crash with all its partitions, an acknowledged
/// delete stays deleted, and a topic whose creation or deletion failed is there whole or not
/// at all. No other topic appears.
#[derive(Debug)]
pub struct TopicSurvives;

impl Oracle for TopicSurvives {
    fn name(&self) -> &'static str {
        "topic_survives"
    }

    fn check(&self, context: &Context<'_>, _rng: &mut Rng) -> Result<(), Violation> {
        let topics = context.engine.list_topics();
        let model = context.model;
        let expected = [
            (TOPIC, model.topic, model.partitions.len() as u32),
            (SCRATCH, model.scratch, model.scratch_partitions),
        ];
        if let Some(stranger) = topics.iter().find(|t| !expected.iter().any(|e| e.0 == *t)) {
            let detail = format!("unexpected topic {stranger:?} in {topics:?}");
            return Err(Violation::new(self.name(), detail));
        }
        for (name, state, partitions) in expected {
            let listed = topics.iter().any(|t| t == name);
            let wrong = match state {
                TopicState::Present => !listed,
                TopicState::Absent => listed,
                TopicState::Uncertain => false,
            };
            let count = context.engine.partition_count(name);
            if wrong || (listed && count != Some(partitions)) {
                let detail =
                    format!("{name}: model {state:?}, engine topics {topics:?}, {count:?}");
                return Err(Violation::new(self.name(), detail));
            }
        }
        Ok(())
    }
}

/// Every record known durable (per the durability mode in force when it was acknowledged)
/// is still there.
#[derive(Debug)]
pub struct AcknowledgedSurvive;

impl Oracle for AcknowledgedSurvive {
    fn name(&self) -> &'static str {
        "acknowledged_survive"
    }

    fn check(&self, context: &Context<'_>, _rng: &mut Rng) -> Result<(), Violation> {
        for (partition, model) in context.model.partitions.iter().enumerate() {
            let found = context.scan.end(partition);
            if found < model.durable_records {
                let detail = format!(
                    "partition {partition}: {} durable records acknowledged, {found} recovered",
                    model.durable_records
                );
                return Err(Violation::new(self.name(), detail));
            }
        }
        Ok(())
    }
}

/// Each partition is a prefix of what was written, ending at a batch boundary: no holes, no
/// duplicates, no invented records, no part of a batch, and every byte as written.
#[derive(Debug)]
pub struct PrefixOfWritten;

impl Oracle for PrefixOfWritten {
    fn name(&self) -> &'static str {
        "prefix_of_written"
    }

    fn check(&self, context: &Context<'_>, _rng: &mut Rng) -> Result<(), Violation> {
        for (partition, scanned) in context.scan.partitions.iter().enumerate() {
            let model = &context.model.partitions[partition];
            let possible: Vec<&ModelRecord> = model.possible_records().collect();
            for found in scanned {
                let at = usize::try_from(found.offset.get()).unwrap_or(usize::MAX);
                let Some(expected) = possible.get(at).copied() else {
                    let detail =
                        format!("partition {partition}: invented record at {}", found.offset);
                    return Err(Violation::new(self.name(), detail));
                };
                if *expected != found.record {
                    let detail = format!(
                        "partition {partition} offset {}: expected {}, found {}",
                        found.offset,
                        describe(expected),
                        describe(&found.record)
                    );
                    return Err(Violation::new(self.name(), detail));
                }
            }
            let count = context.scan.end(partition);
            if !model.batch_ends().contains(&count) {
                let detail =
                    format!("partition {partition}: recovery ends inside a batch at {count}");
                return Err(Violation::new(self.name(), detail));
            }
        }
        Ok(())
    }
}

/// Short description of a record for a violation message.
pub fn describe(record: &ModelRecord) -> String {
    let hash = crate::trace::fnv1a(0, &record.value);
    format!(
        "key={:?} value={}B#{hash:016x} ts={}",
        record.key.as_deref().map(String::from_utf8_lossy),
        record.value.len(),
        record.timestamp
    )
}

/// Reads from offsets in the middle (found through the offset index) return exactly what the
/// full scan returned from there.
#[derive(Debug)]
pub struct ReadsExact;

impl Oracle for ReadsExact {
    fn name(&self) -> &'static str {
        "reads_exact"
    }

    fn check(&self, context: &Context<'_>, rng: &mut Rng) -> Result<(), Violation> {
        for (partition, scanned) in context.scan.partitions.iter().enumerate() {
            if scanned.is_empty() {
                continue;
            }
            for _ in 0..PROBES_PER_PARTITION {
                let start = rng.index(scanned.len());
                let from = scanned[start].offset;
                let max_bytes = rng.between(1, SCAN_FETCH_BYTES_MAX) as usize;
                let fetch = context
                    .engine
                    .read(TOPIC, partition as u32, from, max_bytes)
                    .map_err(|e| Violation::new("reads_succeed", e.to_string()))?;
                let read: Vec<ScannedRecord> = fetch.records().map(|r| owned(&r)).collect();
                let expected = &scanned[start..(start + read.len()).min(scanned.len())];
                if read.is_empty() || read != expected {
                    let detail = format!(
                        "partition {partition}: read from {from} returned {} records that \
                         differ from the scan",
                        read.len()
                    );
                    return Err(Violation::new(self.name(), detail));
                }
            }
        }
        Ok(())
    }
}

/// `offset_for_timestamp` (through the time index) agrees with the first record of the full
/// scan at or after the timestamp.
#[derive(Debug)]
pub struct TimestampLookup;

impl Oracle for TimestampLookup {
    fn name(&self) -> &'static str {
        "timestamp_lookup"
    }

    fn check(&self, context: &Context<'_>, rng: &mut Rng) -> Result<(), Violation> {
        for (partition, scanned) in context.scan.partitions.iter().enumerate() {
            let mut probes = vec![i64::MIN, i64::MAX];
            for _ in 0..PROBES_PER_PARTITION.min(scanned.len() as u64) {
                let timestamp = scanned[rng.index(scanned.len())].record.timestamp;
                probes.extend([timestamp - 1, timestamp, timestamp + 1]);
            }
            for timestamp in probes {
                let expected =
                    scanned.iter().find(|r| r.record.timestamp >= timestamp).map(|r| r.offset);
                let found = context
                    .engine
                    .offset_for_timestamp(TOPIC, partition as u32, timestamp)
                    .map_err(|e| Violation::new("reads_succeed", e.to_string()))?;
                if found != expected {
                    let detail = format!(
                        "partition {partition}: timestamp {timestamp}: index says {found:?}, \
                         scan says {expected:?}"
                    );
                    return Err(Violation::new(self.name(), detail));
                }
            }
        }
        Ok(())
    }
}

/// Retention removes only what the topic's settings let it: the log start never moves back
/// (across crashes too: it is made durable before any file goes), never past the last batch
/// (the active segment stays), with `retention_ms` never past a record younger than that,
/// and with `retention_bytes` never so far that less than that is left of what was there when
/// the records were written (checked after each tick in the run loop, see `retention_left`).
#[derive(Debug)]
pub struct RetentionBounds;

impl Oracle for RetentionBounds {
    fn name(&self) -> &'static str {
        "retention_bounds"
    }

    fn check(&self, context: &Context<'_>, _rng: &mut Rng) -> Result<(), Violation> {
        for partition in 0..context.model.partitions.len() {
            let Some(&start) = context.scan.starts.get(partition) else { continue };
            if let Some(why) = retention_violation(context.model, partition, start, context.now_ms)
            {
                return Err(Violation::new(self.name(), format!("partition {partition}: {why}")));
            }
        }
        Ok(())
    }
}

/// What is wrong with a log start of `start` for `partition` by `now_ms`, if anything: below
/// the highest one seen (it moved back), or past what the topic's retention may remove.
pub fn retention_violation(
    model: &Model,
    partition: usize,
    start: u64,
    now_ms: i64,
) -> Option<String> {
    let seen = model.partitions[partition].log_start;
    if start < seen {
        return Some(format!("log start {start} moved back below {seen}"));
    }
    let bound = model.retention_bound(partition, now_ms);
    (start > seen && start > bound).then(|| {
        let record = model.partitions[partition].possible_records().nth(bound as usize);
        let timestamp = record.map(|r| r.timestamp);
        format!(
            "log start {start} past what retention and deletes may remove ({bound}: its \
             record's timestamp {timestamp:?}, now {now_ms}, retention_ms {:?})",
            model.retention_ms
        )
    })
}

/// On a compacted topic, compaction removes only records a later record of the same key
/// replaced, and tombstones older than `delete_retention_ms`: of everything below the end of
/// the log (and above its start), every record without a key, and the latest record of every
/// key, is there. (What is there is exactly what was written at its offset:
/// `prefix_of_written` checks that.)
#[derive(Debug)]
pub struct CompactionKeepsLatest;

impl Oracle for CompactionKeepsLatest {
    fn name(&self) -> &'static str {
        "compaction_keeps_latest"
    }

    fn check(&self, context: &Context<'_>, _rng: &mut Rng) -> Result<(), Violation> {
        if !context.model.compacted {
            return Ok(());
        }
        for (partition, scanned) in context.scan.partitions.iter().enumerate() {
            let model = &context.model.partitions[partition];
            let (start, end) = (context.scan.starts[partition], context.scan.end(partition));
            let present: std::collections::BTreeSet<u64> =
                scanned.iter().map(|r| r.offset.get()).collect();
            let records: Vec<&ModelRecord> = model.possible_records().collect();
            let mut latest: std::collections::BTreeMap<&[u8], u64> =
                std::collections::BTreeMap::new();
            for (offset, record) in records.iter().enumerate().take(end as usize) {
                if let Some(key) = &record.key {
                    latest.insert(key, offset as u64);
                }
            }
            let horizon = context.now_ms.saturating_sub(context.model.delete_retention_ms);
            for (offset, record) in
                records.iter().enumerate().take(end as usize).skip(start as usize)
            {
                let offset = offset as u64;
                let needed = match &record.key {
                    None => true,
                    Some(key) => {
                        let tombstone_may_go =
                            record.value.is_empty() && record.timestamp < horizon;
                        latest[key.as_slice()] == offset && !tombstone_may_go
                    }
                };
                if needed && !present.contains(&offset) {
                    let detail = format!(
                        "partition {partition}: offset {offset} ({}) is gone, but nothing \
                         replaced it",
                        describe(record)
                    );
                    return Err(Violation::new(self.name(), detail));
                }
            }
        }
        Ok(())
    }
}

/// The SDK's readers of a partition yield exactly what the engine's own full read (the scan,
/// checked by the oracles before this one) yields, and end at the high watermark, never
/// before: [`chronik::Consumer`]'s iterator from offset zero (the log start, where retention
/// or `delete_records` moved it), and a loop of [`Consumer::poll`] with a seeded `max_bytes`
/// (down to one batch per fetch) until it returns an empty fetch. Both run on the shared
/// cursor (`chronik::next_fetch`), which reads past batches compaction emptied and fetches
/// that hold no record at or past the position; a reader taking such a fetch for its end
/// stops short of the high watermark here.
#[derive(Debug)]
pub struct SdkReaders;

impl Oracle for SdkReaders {
    fn name(&self) -> &'static str {
        "sdk_readers"
    }

    /// One of the two surfaces per partition and open, drawn, and on a topic that is not
    /// compacted only at one open in [`SDK_READS_UNCOMPACTED_PER_MILLION`]: each is a full
    /// read, and both at every open of every seed cost the swarm a third more. Compacted
    /// topics, where batches hold no record or fewer than their offsets, are read every time.
    fn check(&self, context: &Context<'_>, rng: &mut Rng) -> Result<(), Violation> {
        if !context.model.compacted && !rng.chance(SDK_READS_UNCOMPACTED_PER_MILLION) {
            return Ok(());
        }
        for (index, scanned) in context.scan.partitions.iter().enumerate() {
            let partition = index as u32;
            let mut consumer = Consumer::new(context.engine.clone(), TOPIC, partition);
            let (surface, read) = if rng.chance(crate::rng::PER_MILLION / 2) {
                // One more than the scan holds, so that a reader yielding too many is seen.
                ("the iterator".to_owned(), iterate(&mut consumer, scanned.len() + 1))
            } else {
                let max_bytes = 1_u64 << rng.between(0, POLL_BYTES_MAX_LOG2);
                let max_bytes = rng.between(1, max_bytes) as usize;
                let surface = format!("a poll loop of {max_bytes} bytes");
                (surface, poll_to_the_end(&mut consumer, max_bytes))
            };
            let read = read.map_err(|e| {
                Violation::new("reads_succeed", format!("partition {partition}: {surface}: {e}"))
            })?;
            let end = Offset::new(context.scan.end(index));
            self.judge(partition, &surface, &read, scanned, &consumer, end)?;
        }
        Ok(())
    }
}

/// At most `records_max` records from `consumer`'s iterator, until it ends.
pub fn iterate(
    consumer: &mut Consumer<SimDisk>,
    records_max: usize,
) -> Result<Vec<ScannedRecord>, chronik_engine::ReadError> {
    let mut read = Vec::new();
    for item in consumer.by_ref().take(records_max) {
        let record = item?;
        let model =
            ModelRecord { key: record.key, value: record.value, timestamp: record.timestamp };
        read.push(ScannedRecord { offset: record.offset, record: model });
    }
    Ok(read)
}

/// `consumer.poll(max_bytes)` until it returns an empty fetch, and every record it returned.
fn poll_to_the_end(
    consumer: &mut Consumer<SimDisk>,
    max_bytes: usize,
) -> Result<Vec<ScannedRecord>, chronik_engine::ReadError> {
    poll(consumer, max_bytes, usize::MAX)
}

/// `consumer.poll(max_bytes)` until it returns an empty fetch or at least `records_min`
/// records, and every record it returned.
pub fn poll(
    consumer: &mut Consumer<SimDisk>,
    max_bytes: usize,
    records_min: usize,
) -> Result<Vec<ScannedRecord>, chronik_engine::ReadError> {
    let mut read = Vec::new();
    for _ in 0..SCAN_FETCHES_MAX {
        if read.len() >= records_min {
            break;
        }
        let fetch = consumer.poll(max_bytes)?;
        if fetch.is_empty() {
            break;
        }
        read.extend(fetch.records().map(|r| owned(&r)));
    }
    Ok(read)
}

impl SdkReaders {
    /// What `surface` read, from the log start to where it said it was done, against the
    /// scan; its position must be the high watermark, and it must say it is caught up.
    fn judge(
        &self,
        partition: u32,
        surface: &str,
        read: &[ScannedRecord],
        scanned: &[ScannedRecord],
        consumer: &Consumer<SimDisk>,
        end: Offset,
    ) -> Result<(), Violation> {
        let position = consumer.position();
        if let Some(at) =
            (0..read.len().max(scanned.len())).find(|&i| read.get(i) != scanned.get(i))
        {
            let (found, expected) = (read.get(at), scanned.get(at));
            let detail = format!(
                "partition {partition}: {surface} yielded {} records, the engine's read {}; \
                 record {at} is {:?}, the read's {:?} (the reader stopped at {position}, \
                 the high watermark is {end})",
                read.len(),
                scanned.len(),
                found.map(|r| (r.offset.get(), describe(&r.record))),
                expected.map(|r| (r.offset.get(), describe(&r.record))),
            );
            return Err(Violation::new(self.name(), detail));
        }
        let caught_up = consumer.caught_up();
        if position != end || !matches!(caught_up, Ok(true)) {
            let detail = format!(
                "partition {partition}: {surface} ended at {position} (caught up: \
                 {caught_up:?}), the high watermark is {end}"
            );
            return Err(Violation::new(self.name(), detail));
        }
        Ok(())
    }
}
