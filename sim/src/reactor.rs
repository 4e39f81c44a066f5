//! The second design's write path (partition logs driven by the reactor) on the simulated
//! disk: seeded workloads, faults and crashes, checked against what was submitted.
//!
//! A seed draws the partitions (one to three), the durability mode, direct or buffered
//! writes, the segment size, I/O error rates and a power cut after a number of disk calls.
//! Appends (batches of one to three records) and flushes are queued between reactor turns;
//! the simulated disk runs each turn's chains in a seeded order, so unlinked operations
//! complete out of order and a power cut falls between any two completions. On half the
//! seeds it defers completions: an operation runs and completes in a later turn, so a log
//! queues writes while its fdatasync is in flight, and a write may land after it. At the end the
//! disk crashes and the engine's own recovery opens the directory. Oracles:
//! - `recovery_clean`: the open succeeds and every partition reads back without an error
//!   (a checkpoint claiming unsynced bytes would show up here as damage to synced data);
//! - `prefix_of_submitted`: each partition holds a prefix of what was submitted to it, in
//!   submission order: no hole, no duplicate, nothing invented;
//! - `offsets_as_submitted`: an acknowledgement names exactly the offsets its batch got;
//! - `acknowledged_survive`: in `sync` mode every acknowledged append, and in every mode
//!   every acknowledged flush, is in the recovered partition;
//! - `watermark_durable`: in `sync` and `interval` modes nothing a reader was shown (the
//!   highest watermark the log published) is lost by the crash;
//! - `liveness`: when no fault was met, every request was answered with success and every
//!   log is idle after the last turn.

use crate::clock::EPOCH_MS;
use crate::oracle::Violation;
use crate::run::panic_message;
use crate::{Rng, SimClock, SimDisk};
use chronik_engine::internals::checkpoint::CheckpointWriter;
use chronik_engine::internals::format;
use chronik_engine::internals::layout::{self, LOG_SUFFIX, partition_directory};
use chronik_engine::internals::log::{
    Acked, Batch, Config, PartitionLog, Recovered, Ticket, WRITE_BYTES_MAX,
};
use chronik_engine::internals::reactor::{IndexHost, PartitionId, Reactor};
use chronik_engine::internals::segment::SegmentFile;
use chronik_engine::io::{DIRECT_ALIGNMENT, OpenMode};
use chronik_engine::{Durability, Engine, Offset, Options, Record, TopicConfig};
use chronik_simdisk::Faults;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

const TOPIC: &str = "events";
const ROOT: &str = "/data";

/// What one seed draws.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub partitions: u32,
    pub durability: Durability,
    pub direct: bool,
    pub segment_bytes: u64,
    pub steps: u64,
    /// Disk calls before the power is cut, if it is.
    pub power_cut_after: Option<u64>,
    /// I/O errors on writes and syncs, per million calls.
    pub errors_per_million: u32,
    /// Most bytes per coalesced write: one block on some seeds, so that a turn holds several
    /// writes of a partition (and direct ones share blocks, linked).
    pub write_bytes_max: usize,
    /// Bytes past a partition's recovery point that make a new one: small, so that a run
    /// makes many, and crashes land around their writes.
    pub recovery_point_bytes: u64,
    /// The disk defers completions: an operation takes effect, and completes, in a later
    /// turn than the one that submitted it (writes land while an fdatasync is in flight).
    pub deferred: bool,
}

/// Draw a seed's plan.
pub fn draw(seed: u64) -> Plan {
    let mut rng = Rng::new(seed ^ 0x005e_ed0f_1234);
    let durability = match rng.below(10) {
        0..=5 => Durability::Sync,
        6..=7 => Durability::Interval { ms: rng.between(5, 60) },
        _ => Durability::Os,
    };
    Plan {
        partitions: 1 + rng.below(3) as u32,
        durability,
        direct: rng.below(10) < 3,
        segment_bytes: 4096 * rng.between(1, 8),
        steps: rng.between(20, 240),
        power_cut_after: (rng.below(10) < 7).then(|| rng.between(10, 800)),
        errors_per_million: if rng.below(10) < 2 { 3_000 } else { 0 },
        write_bytes_max: if rng.below(10) < 4 { DIRECT_ALIGNMENT } else { WRITE_BYTES_MAX },
        recovery_point_bytes: 512 * rng.between(1, 16),
        deferred: rng.below(2) == 0,
    }
}

/// What one seed did, for totals and the determinism check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub acknowledged: u64,
    pub refused: u64,
    pub flushes: u64,
    pub turns: u64,
    /// Operations submitted plus operations completed, over all turns.
    pub operations: u64,
    /// Turns that ended with operations still in flight.
    pub turns_in_flight: u64,
    /// Records recovered that were submitted but never acknowledged.
    pub kept_unacknowledged: u64,
    pub faults_met: bool,
    pub trace_hash: u64,
}

/// A request waiting for its answer.
#[derive(Clone, Debug)]
enum Asked {
    Append { partition: usize, range: std::ops::Range<usize> },
    Flush { partition: usize },
}

/// Run one seed; the first oracle that failed, if any. A panic (an assertion of the engine or
/// of the simulated disk's contract, such as overlapping concurrent writes) is a violation.
pub fn run_seed(seed: u64) -> Result<Report, Violation> {
    std::panic::catch_unwind(|| run_seed_unguarded(seed))
        .unwrap_or_else(|payload| Err(Violation::new("no_panic", panic_message(&*payload))))
}

fn run_seed_unguarded(seed: u64) -> Result<Report, Violation> {
    let plan = draw(seed);
    let mut rng = Rng::new(seed);
    let disk = SimDisk::new(rng.fork());
    let clock = SimClock::new(EPOCH_MS);
    create_topic(&disk, &clock, &plan);
    let (mut reactor, ids) = reactor(&disk, &plan);
    if plan.errors_per_million > 0 {
        let errors = plan.errors_per_million;
        let faults = Faults {
            write_error_per_million: errors,
            sync_error_per_million: errors,
            ..Faults::NONE
        };
        disk.set_faults(faults);
    }
    if let Some(calls) = plan.power_cut_after {
        disk.cut_power_after(calls);
    }
    disk.set_deferred_completions(plan.deferred);
    let mut run = Run::new(ids);
    let mut now_ms = EPOCH_MS;
    for step in 0..plan.steps {
        for _ in 0..rng.below(4) {
            run.queue(&mut reactor, &mut rng, seed, step);
        }
        for _ in 0..rng.below(3) {
            now_ms += i64::try_from(rng.below(20)).expect("small");
            run.turn(&mut reactor, now_ms);
        }
    }
    // Flush every partition, then let everything finish (or fail on the cut power): a turn
    // that submits nothing waits for an operation in flight, so this ends with none.
    for partition in 0..plan.partitions as usize {
        run.flush(&mut reactor, partition);
    }
    while run.turn(&mut reactor, now_ms) > 0 {}
    assert_eq!(reactor.in_flight(), 0, "an idle turn leaves nothing in flight");
    run.answer_all()?;
    let poisoned = run.ids.iter().any(|&id| reactor.log(id).expect("driven").poisoned().is_some());
    run.report.faults_met = poisoned || run.report.refused > 0;
    if !run.report.faults_met {
        check_liveness(&run, &reactor)?;
    }
    drop(reactor);
    disk.crash(&mut rng);
    if plan.power_cut_after.is_some() {
        disk.restore_power();
    }
    disk.set_faults(Faults::NONE);
    run.check_recovered(&disk, &clock, &plan)?;
    run.report.trace_hash = disk.trace_hash();
    Ok(run.report)
}

fn create_topic(disk: &SimDisk, clock: &SimClock, plan: &Plan) {
    let engine = open_engine(disk, clock).expect("a fresh disk opens");
    let config = TopicConfig {
        partitions: plan.partitions,
        segment_bytes: plan.segment_bytes,
        index_interval_bytes: 512,
        ..TopicConfig::default()
    };
    engine.create_topic(TOPIC, config).expect("a fresh disk takes a topic");
    drop(engine);
    // The reactor writes as an engine would, and an engine's open takes the mark of the last
    // close away first.
    let mark = Path::new(ROOT).join(layout::CLEAN_SHUTDOWN_FILE);
    chronik_engine::io::Namespace::remove_file(disk, &mark).expect("the close left its mark");
    chronik_engine::io::sync_directory(disk, Path::new(ROOT)).expect("a fresh disk syncs");
}

fn open_engine(disk: &SimDisk, clock: &SimClock) -> Result<Engine<SimDisk>, String> {
    let options = Options { durability: Durability::Sync, ..Options::default() };
    Engine::open(disk.clone(), clock.shared(), Path::new(ROOT), options)
        .map(|(engine, _)| engine)
        .map_err(|error| error.to_string())
}

fn reactor(disk: &SimDisk, plan: &Plan) -> (Reactor<SimDisk>, Vec<PartitionId>) {
    let io = Arc::new(disk.clone());
    let mut reactor = Reactor::new(Arc::clone(&io));
    let mut ids = Vec::new();
    for partition in 0..plan.partitions {
        let directory = partition_directory(Path::new(ROOT), TOPIC, partition);
        let path = directory.join(layout::file_name(Offset::ZERO, LOG_SUFFIX));
        let mode = OpenMode::ReadWrite.with_direct(plan.direct);
        let active = SegmentFile::open(&io, path, mode).expect("the topic's first segment");
        let checkpoint = CheckpointWriter::open(&io, &directory, None).expect("its checkpoint");
        let config = Config {
            durability: plan.durability,
            segment_bytes: plan.segment_bytes,
            segment_ms: i64::MAX,
            direct: plan.direct,
            write_bytes_max: plan.write_bytes_max,
            recovery_point_bytes: plan.recovery_point_bytes,
            recovery_point_ms: 50,
        };
        let recovered = Recovered {
            base_offset: Offset::ZERO,
            size: 0,
            next_offset: Offset::ZERO,
            created_ms: EPOCH_MS,
            tail: Vec::new(),
            max_timestamp: i64::MIN,
            recovery_point: 0,
        };
        let log = PartitionLog::new(config, recovered, EPOCH_MS);
        let host = IndexHost::new(Offset::ZERO, 512);
        ids.push(reactor.add(directory, log, Arc::new(active), checkpoint, host));
    }
    (reactor, ids)
}

/// The run's books: what was submitted, asked and answered.
struct Run {
    /// The reactor's names of the partitions, by partition number.
    ids: Vec<PartitionId>,
    /// Per partition, the values submitted, in submission order.
    submitted: Vec<Vec<Vec<u8>>>,
    asked: BTreeMap<u64, Asked>,
    answers: Vec<(u64, Result<Acked, String>)>,
    /// Per partition: the end of the acknowledged appends (durable in `sync` mode only).
    appended: Vec<usize>,
    /// Per partition: the end the acknowledged flushes made durable, in every mode.
    flushed: Vec<usize>,
    /// Per partition: the highest watermark the log published.
    shown: Vec<u64>,
    report: Report,
}

impl Run {
    fn new(ids: Vec<PartitionId>) -> Run {
        let partitions = ids.len();
        Run {
            ids,
            submitted: vec![Vec::new(); partitions],
            asked: BTreeMap::new(),
            answers: Vec::new(),
            appended: vec![0; partitions],
            flushed: vec![0; partitions],
            shown: vec![0; partitions],
            report: Report::default(),
        }
    }

    fn queue(&mut self, reactor: &mut Reactor<SimDisk>, rng: &mut Rng, seed: u64, step: u64) {
        let partition = rng.index(self.submitted.len());
        if rng.below(20) == 0 {
            self.flush(reactor, partition);
            return;
        }
        let count = 1 + rng.index(3);
        let values: Vec<Vec<u8>> = (0..count)
            .map(|i| {
                let mut value = format!("{seed}/{partition}/{step}/{i}/").into_bytes();
                let padding = rng.index(600);
                value.extend(rng.bytes(padding));
                value
            })
            .collect();
        let records: Vec<Record<'_>> = values.iter().map(|v| Record::new(None, v)).collect();
        let mut bytes = Vec::new();
        let info = format::encode_batch(&mut bytes, Offset::ZERO, &records, EPOCH_MS, Offset::ZERO)
            .expect("small batches encode");
        let ticket = self.asked.len() as u64;
        let log = reactor.log_mut(self.ids[partition]).expect("driven");
        if log.append(Ticket(ticket), Batch { bytes, info }).is_err() {
            self.report.refused += 1;
            return;
        }
        let start = self.submitted[partition].len();
        self.submitted[partition].extend(values);
        let range = start..self.submitted[partition].len();
        self.asked.insert(ticket, Asked::Append { partition, range });
    }

    fn flush(&mut self, reactor: &mut Reactor<SimDisk>, partition: usize) {
        let ticket = self.asked.len() as u64;
        let log = reactor.log_mut(self.ids[partition]).expect("driven");
        if log.flush(Ticket(ticket)).is_err() {
            self.report.refused += 1;
            return;
        }
        self.asked.insert(ticket, Asked::Flush { partition });
    }

    fn turn(&mut self, reactor: &mut Reactor<SimDisk>, now_ms: i64) -> usize {
        let mut acks = Vec::new();
        let operations = reactor.turn(now_ms, &mut acks);
        self.report.turns += 1;
        self.report.operations += operations as u64;
        self.report.turns_in_flight += u64::from(reactor.in_flight() > 0);
        for (_, ack) in acks {
            let result = ack.result.map_err(|refusal| format!("{refusal:?}"));
            self.answers.push((ack.ticket.0, result));
        }
        for (partition, shown) in self.shown.iter_mut().enumerate() {
            let log = reactor.log(self.ids[partition]).expect("driven");
            *shown = (*shown).max(log.watermark().get());
        }
        operations
    }

    /// Check every answer against its request, and note what each promised.
    fn answer_all(&mut self) -> Result<(), Violation> {
        for (ticket, result) in std::mem::take(&mut self.answers) {
            let asked = self.asked.get(&ticket).cloned().ok_or_else(|| {
                Violation::new(
                    "offsets_as_submitted",
                    format!("an answer to unknown ticket {ticket}"),
                )
            })?;
            match (asked, result) {
                (_, Err(_)) => self.report.refused += 1,
                (
                    Asked::Append { partition, range },
                    Ok(Acked::Appended { base_offset, next_offset }),
                ) => {
                    let got = offset_range(base_offset, next_offset);
                    if got != range {
                        let detail =
                            format!("ticket {ticket}: offsets {got:?}, submitted as {range:?}");
                        return Err(Violation::new("offsets_as_submitted", detail));
                    }
                    self.report.acknowledged += 1;
                    self.appended[partition] = self.appended[partition].max(range.end);
                }
                (Asked::Flush { partition }, Ok(Acked::Flushed { end })) => {
                    self.report.flushes += 1;
                    let end = usize::try_from(end.get()).expect("small");
                    self.flushed[partition] = self.flushed[partition].max(end);
                }
                (request, Ok(answer)) => {
                    let detail = format!("ticket {ticket}: {request:?} answered with {answer:?}");
                    return Err(Violation::new("offsets_as_submitted", detail));
                }
            }
        }
        Ok(())
    }

    fn check_recovered(
        &mut self,
        disk: &SimDisk,
        clock: &SimClock,
        plan: &Plan,
    ) -> Result<(), Violation> {
        let engine = open_engine(disk, clock).map_err(|e| Violation::new("recovery_clean", e))?;
        for partition in 0..plan.partitions {
            let index = partition as usize;
            let kept =
                read_all(&engine, partition).map_err(|e| Violation::new("recovery_clean", e))?;
            let submitted = &self.submitted[index];
            if kept.len() > submitted.len() || kept[..] != submitted[..kept.len()] {
                let detail =
                    format!("partition {partition}: {} records kept, not a prefix", kept.len());
                return Err(Violation::new("prefix_of_submitted", detail));
            }
            let promised = match plan.durability {
                Durability::Sync => self.appended[index].max(self.flushed[index]),
                // An append in these modes is acknowledged once written; only a flush
                // promises durability.
                _ => self.flushed[index],
            };
            if kept.len() < promised {
                let detail = format!(
                    "partition {partition}: {} records kept, {promised} acknowledged",
                    kept.len()
                );
                return Err(Violation::new("acknowledged_survive", detail));
            }
            let shown = usize::try_from(self.shown[index]).expect("small");
            if plan.durability != Durability::Os && kept.len() < shown {
                let detail =
                    format!("partition {partition}: {} records kept, {shown} shown", kept.len());
                return Err(Violation::new("watermark_durable", detail));
            }
            self.report.kept_unacknowledged +=
                kept.len().saturating_sub(promised.max(shown)) as u64;
        }
        Ok(())
    }
}

fn offset_range(base: Offset, next: Offset) -> std::ops::Range<usize> {
    let to_index = |offset: Offset| usize::try_from(offset.get()).expect("small");
    to_index(base)..to_index(next)
}

fn check_liveness(run: &Run, reactor: &Reactor<SimDisk>) -> Result<(), Violation> {
    let answered = run.report.acknowledged + run.report.flushes;
    if answered != run.asked.len() as u64 {
        let detail =
            format!("{answered} of {} requests answered with no fault met", run.asked.len());
        return Err(Violation::new("liveness", detail));
    }
    for (partition, &id) in run.ids.iter().enumerate() {
        if !reactor.log(id).expect("driven").is_idle() {
            return Err(Violation::new("liveness", format!("partition {partition} is not idle")));
        }
    }
    Ok(())
}

fn read_all(engine: &Engine<SimDisk>, partition: u32) -> Result<Vec<Vec<u8>>, String> {
    let mut values = Vec::new();
    loop {
        let next = Offset::new(values.len() as u64);
        let fetch = engine.read(TOPIC, partition, next, 1 << 20).map_err(|e| e.to_string())?;
        let before = values.len();
        for record in fetch.records() {
            if record.offset() != Offset::new(values.len() as u64) {
                return Err(format!("partition {partition}: a hole before {:?}", record.offset()));
            }
            values.push(record.value().to_vec());
        }
        if values.len() == before {
            return Ok(values);
        }
    }
}
