//! One seeded run: the real engine on [`SimDisk`] and [`SimClock`], driven by a workload drawn
//! from the seed, crashed and restarted, checked by the oracles after every restart.
//!
//! [`run`] is the only entry point. Everything it does is a function of the seed and the
//! options: the workload, the faults, the crash outcomes, the simulated time. The wall clock
//! is read only to report the speed-up.
//!
//! # A round
//!
//! 1. Open the engine (the durability mode is drawn per round), sometimes after an open tried
//!    under I/O faults or a power cut (faults inside recovery: it may fail, only with an I/O
//!    error), and run the oracles on what recovery kept; sometimes close and open again at
//!    once, which must find nothing to repair and the same records (recovery is idempotent).
//! 2. Maybe arm a power cut after a random number of disk calls; maybe switch on the seed's
//!    I/O faults.
//! 3. Run a random number of workload steps: appends, reads and tailing reads checked against
//!    the model, ticks, flushes, idle time, creates and deletes of the scratch topic. A
//!    poisoned engine is probed (everything refused until reopen) and ends the round. Some
//!    rounds flip a bit of synced data at a random step instead; the checks after the flip
//!    (corruption reported, never served) end the run.
//! 4. End with a clean close and a crash, a crash under the live engine, or a restart
//!    without a crash.
//!
//! After the last round: a final open and its checks, then the liveness phase (no faults;
//! every partition takes appends, a flush and a read back).
//!
//! Shrinking reruns a seed with [`RunOptions::without`] and [`RunOptions::skip`]: those
//! faults and steps are still drawn, so every other draw keeps its value, but not acted on.
//!
//! A crash under a live engine cuts the power first and then drops the engine, so its
//! destructor's calls all fail: the same as a process that died without running it, without
//! leaking the engine (and the whole simulated disk it holds) as `mem::forget` would.

use crate::clock::{EPOCH_MS, SimClock};
use crate::disk::{BitFlip, SimDisk, Stats};
use crate::model::{Model, ModelBatch, ModelRecord, TopicState, UncertainTransaction};
use crate::oracle::{self, Context, Oracle, Scan, ScannedRecord, SimEngine, Violation};
use crate::rng::Rng;
use crate::trace::{TRACE_EVENTS_MAX, Trace, fnv1a};
use crate::workload::{SCRATCH, Step, Swarm, TOPIC};
use chronik_engine::{
    AppendError, CommitError, Durability, Engine, GroupCommit, Offset, OpenError, Options,
    ReadError, Record, RecoveryReport, TopicError, TransactionWrite,
};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Workload steps of a run unless the options say otherwise.
pub const OPS_DEFAULT: u64 = 200;
/// Largest operation count a run accepts.
pub const OPS_MAX: u64 = 10_000_000;
/// Largest power-cut delay, in disk calls.
const POWER_CUT_CALLS_MAX: u64 = 400;
/// Chance (per million) that an open is followed by a close and a second open.
const DOUBLE_OPEN_PER_MILLION: u32 = 200_000;
/// Largest power-cut delay of a faulty open, in disk calls: recovery makes few.
const OPEN_POWER_CUT_CALLS_MAX: u64 = 60;
/// Batches each partition takes in the liveness phase at the end of a run.
const LIVENESS_BATCHES: u64 = 3;
/// Random reads of every partition after a bit flip, besides the full scan.
const ROT_READS_PER_PARTITION: u64 = 4;
/// The consumer group whose commits the workload makes.
const GROUP: &str = "sim";
/// The consumer group of the SDK's group consumers (`chronik::Consumer::in_group`),
/// recreated at every open.
const SDK_GROUP: &str = "sdk";
/// Most records a group consumer iterates after an open before it commits (one that polls
/// takes the whole fetch that reaches them).
const SDK_GROUP_RECORDS_MAX: u64 = 64;
/// Largest `max_bytes` of a group consumer's polls.
const SDK_GROUP_POLL_BYTES_MAX: u64 = 4096;
/// Chance (per million) that a tick with no power cut armed arms one inside its maintenance
/// work (retention, compaction and its segment swaps), where a round's cut rarely lands.
const TICK_POWER_CUT_PER_MILLION: u32 = 250_000;
/// The same for a forced compaction, which always has work to do.
const COMPACT_POWER_CUT_PER_MILLION: u32 = 500_000;
/// Chance that a delete step arms a power cut inside the call.
const DELETE_POWER_CUT_PER_MILLION: u32 = 300_000;
/// Largest power-cut delay armed by a tick, in disk calls, as a power of two: a compaction
/// pass makes tens to hundreds of calls, a tick with nothing to do a handful.
const TICK_POWER_CUT_CALLS_MAX_LOG2: u64 = 9;
/// Largest power-cut delay armed by a tick, in directory entry changes.
const TICK_POWER_CUT_ENTRY_CHANGES_MAX: u64 = 12;
/// Largest power-cut delay armed by a tick, in directory fsyncs.
const TICK_POWER_CUT_DIRECTORY_SYNCS_MAX: u64 = 4;

/// A kind of fault or event a run can leave out, for shrinking: the run still draws it (so
/// every later draw keeps its value) but does not act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// Power cuts armed during a round.
    PowerCuts,
    /// Rounds with I/O errors and a full disk.
    IoFaults,
    /// Opens run under I/O faults or a power cut before the real open.
    FaultyOpens,
    /// Bit rot in synced data.
    BitFlips,
    /// A close and a second open right after an open.
    DoubleOpens,
    /// Rounds that end in a crash under the live engine (they end in a clean close instead).
    LiveCrashes,
}

impl Feature {
    pub const ALL: [Feature; 6] = [
        Feature::PowerCuts,
        Feature::IoFaults,
        Feature::FaultyOpens,
        Feature::BitFlips,
        Feature::DoubleOpens,
        Feature::LiveCrashes,
    ];

    /// The name on the command line (`--without power-cuts,io-faults`).
    pub fn name(self) -> &'static str {
        match self {
            Feature::PowerCuts => "power-cuts",
            Feature::IoFaults => "io-faults",
            Feature::FaultyOpens => "faulty-opens",
            Feature::BitFlips => "bit-flips",
            Feature::DoubleOpens => "double-opens",
            Feature::LiveCrashes => "live-crashes",
        }
    }

    pub fn from_name(name: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// A deliberate lie told to the model, to prove the oracles can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// After the first recovery that finds the topic, the model is told a record was
    /// acknowledged (durably) that the engine never saw.
    PhantomAcknowledgement,
}

/// How to run a seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Workload steps over the whole run.
    pub ops: u64,
    /// Print every trace event to stderr as it happens.
    pub echo_trace: bool,
    /// Keep every file's final bytes in [`RunOutcome::snapshot`].
    pub keep_snapshot: bool,
    pub trace_events_max: usize,
    pub sabotage: Option<Sabotage>,
    /// Faults and events drawn but not acted on (shrinking).
    pub without: BTreeSet<Feature>,
    /// Workload steps drawn but not run, as half-open ranges of step numbers (shrinking).
    pub skip: Vec<(u64, u64)>,
}

impl RunOptions {
    /// The arguments of `chronik-sim run` that reproduce these options.
    pub fn arguments(&self) -> String {
        let mut arguments = vec![format!("--ops {}", self.ops)];
        if !self.without.is_empty() {
            let names: Vec<&str> = self.without.iter().map(|f| f.name()).collect();
            arguments.push(format!("--without {}", names.join(",")));
        }
        if !self.skip.is_empty() {
            arguments.push(format!("--skip {}", format_ranges(&self.skip)));
        }
        arguments.join(" ")
    }
}

/// `3-7,9` for the half-open ranges `[3, 8)` and `[9, 10)`.
pub fn format_ranges(ranges: &[(u64, u64)]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(
            |&(start, end)| {
                if end == start + 1 { start.to_string() } else { format!("{start}-{}", end - 1) }
            },
        )
        .collect();
    parts.join(",")
}

/// Parse what [`format_ranges`] prints.
pub fn parse_ranges(text: &str) -> Result<Vec<(u64, u64)>, String> {
    let mut ranges = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let bad = || format!("bad step range {part:?}: want N or N-M");
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (start, last): (u64, u64) =
            (first.parse().map_err(|_| bad())?, last.parse().map_err(|_| bad())?);
        if last < start || last == u64::MAX {
            return Err(bad());
        }
        ranges.push((start, last + 1));
    }
    Ok(ranges)
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            ops: OPS_DEFAULT,
            echo_trace: false,
            keep_snapshot: false,
            trace_events_max: TRACE_EVENTS_MAX,
            sabotage: None,
            without: BTreeSet::new(),
            skip: Vec::new(),
        }
    }
}

/// What the run exercised, so a run that checks nothing is visible.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub acknowledged_batches: u64,
    pub failed_appends: u64,
    pub reads: u64,
    pub ticks: u64,
    pub flushes: u64,
    pub truncated_bytes: u64,
    pub clean_closes: u64,
    pub crashes_under_a_live_engine: u64,
    pub restarts_without_crash: u64,
    pub double_opens: u64,
    pub power_cuts_reached: u64,
    pub poison_probes: u64,
    pub oracle_checks: u64,
    pub faulty_opens: u64,
    /// Opens that wrote segments with direct I/O.
    pub direct_opens: u64,
    /// Opens whose partitions were spread over two or three write shards.
    pub sharded_opens: u64,
    pub failed_opens: u64,
    pub bit_flips: u64,
    /// Partitions whose rot was reported (a read's `Corruption`, damage or a cut at recovery).
    pub rot_reported: u64,
    pub tail_reads: u64,
    pub liveness_checks: u64,
    /// Creates and deletes of the scratch topic tried.
    pub topic_changes: u64,
    /// Ticks after which retention had moved a log start.
    pub retention_moves: u64,
    /// `Engine::delete_records` calls, and those that moved a log start.
    pub deletes: u64,
    pub delete_moves: u64,
    /// Consumer-offset commits tried.
    pub commits: u64,
    /// Compaction passes run by ticks.
    pub compaction_passes: u64,
    /// Compaction passes abandoned on an I/O error without poisoning.
    pub compactions_abandoned: u64,
    /// Transactions committed, and failed (each partition's batch kept or dropped together).
    pub transactions: u64,
    pub failed_transactions: u64,
    /// Appends queued together by pipelined steps (`append_nowait`).
    pub pipelined_appends: u64,
    /// Records the SDK's group consumers read after opens, and their commits.
    pub group_consumer_records: u64,
    pub group_consumer_commits: u64,
    /// Offsets between a log start and end that compaction had removed, summed over the
    /// scans after opens: what readers (the SDK's included) had to read past.
    pub compacted_away: u64,
}

impl Counters {
    pub fn add(&mut self, other: &Counters) {
        self.acknowledged_batches += other.acknowledged_batches;
        self.failed_appends += other.failed_appends;
        self.reads += other.reads;
        self.ticks += other.ticks;
        self.flushes += other.flushes;
        self.truncated_bytes += other.truncated_bytes;
        self.clean_closes += other.clean_closes;
        self.crashes_under_a_live_engine += other.crashes_under_a_live_engine;
        self.restarts_without_crash += other.restarts_without_crash;
        self.double_opens += other.double_opens;
        self.power_cuts_reached += other.power_cuts_reached;
        self.poison_probes += other.poison_probes;
        self.oracle_checks += other.oracle_checks;
        self.faulty_opens += other.faulty_opens;
        self.direct_opens += other.direct_opens;
        self.sharded_opens += other.sharded_opens;
        self.failed_opens += other.failed_opens;
        self.bit_flips += other.bit_flips;
        self.rot_reported += other.rot_reported;
        self.tail_reads += other.tail_reads;
        self.liveness_checks += other.liveness_checks;
        self.topic_changes += other.topic_changes;
        self.retention_moves += other.retention_moves;
        self.deletes += other.deletes;
        self.delete_moves += other.delete_moves;
        self.commits += other.commits;
        self.compaction_passes += other.compaction_passes;
        self.compactions_abandoned += other.compactions_abandoned;
        self.transactions += other.transactions;
        self.failed_transactions += other.failed_transactions;
        self.pipelined_appends += other.pipelined_appends;
        self.group_consumer_records += other.group_consumer_records;
        self.group_consumer_commits += other.group_consumer_commits;
        self.compacted_away += other.compacted_away;
    }
}

/// The result of one run.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub seed: u64,
    /// The options' replay arguments (`--ops`, and any `--without` and `--skip`).
    pub arguments: String,
    /// Workload steps run.
    pub ops: u64,
    pub rounds: u64,
    pub crashes: u64,
    /// Faults the engine saw: I/O errors returned to the workload and power cuts reached.
    pub faults: u64,
    /// The disk's call trace combined with the model's events.
    pub trace_hash: u64,
    pub sim_time_us: u64,
    pub wall: Duration,
    pub violation: Option<Violation>,
    /// The last trace events, oldest first.
    pub trace: Vec<String>,
    pub snapshot: Option<BTreeMap<PathBuf, Vec<u8>>>,
    pub counters: Counters,
}

impl RunOutcome {
    /// Simulated time over wall time.
    pub fn speedup(&self) -> f64 {
        let wall_us = self.wall.as_secs_f64() * 1e6;
        if wall_us <= 0.0 { 0.0 } else { self.sim_time_us as f64 / wall_us }
    }

    /// The command that runs this seed again, exactly.
    pub fn replay_command(&self) -> String {
        format!("chronik-sim run --seed {} {}", self.seed, self.arguments)
    }

    /// The one-line summary every run ends with.
    pub fn summary_line(&self) -> String {
        format!(
            "seed={} ops={} crashes={} faults={} trace_hash={:016x} sim_time={}ms wall={}ms \
             speedup={:.0}x",
            self.seed,
            self.ops,
            self.crashes,
            self.faults,
            self.trace_hash,
            self.sim_time_us / 1000,
            self.wall.as_millis(),
            self.speedup()
        )
    }
}

/// Run `seed`. Never panics on a wrong engine: an oracle failure, and even a panic inside the
/// engine, comes back as [`RunOutcome::violation`].
pub fn run(seed: u64, options: &RunOptions) -> RunOutcome {
    assert!(options.ops <= OPS_MAX, "at most {OPS_MAX} operations");
    let start = Instant::now();
    let mut sim = Sim::new(seed, options);
    let result = catch_unwind(AssertUnwindSafe(|| sim.run_all()));
    let violation = match result {
        Ok(Ok(())) => None,
        Ok(Err(violation)) => Some(violation),
        Err(payload) => Some(Violation::new("no_panic", panic_message(&*payload))),
    };
    if let Some(violation) = &violation {
        sim.trace.event(format!("VIOLATION {violation}"));
    }
    let stats = sim.disk.stats();
    RunOutcome {
        seed,
        arguments: options.arguments(),
        ops: sim.ops_done,
        rounds: sim.rounds,
        crashes: stats.crashes,
        faults: sim.faults_seen + sim.counters.power_cuts_reached,
        trace_hash: fnv1a(sim.trace.hash(), &sim.disk.trace_hash().to_le_bytes()),
        sim_time_us: sim.elapsed_us,
        wall: start.elapsed(),
        violation,
        trace: sim.trace.last(),
        snapshot: options.keep_snapshot.then(|| sim.disk.snapshot()),
        counters: sim.counters,
    }
}

/// How a round ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// Flush, drop the engine (its close syncs), then crash the disk.
    CleanClose,
    /// Cut the power under the live engine, then crash: the process died.
    CrashLive,
    /// Drop the engine and open again without a crash.
    Restart,
}

/// Whether the workload goes on after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

struct Sim {
    ops_budget: u64,
    sabotage: Option<Sabotage>,
    /// What shrinking left out.
    without: BTreeSet<Feature>,
    skip: Vec<(u64, u64)>,
    /// Faulty opens and bit flips: where, when and how.
    fault_rng: Rng,
    /// Per partition, where its tailing consumer reads next.
    tails: Vec<Offset>,
    /// Compaction passes the open engine reported after the last tick.
    compaction_passes_seen: u64,
    /// A tick of this round armed a power cut.
    tick_armed_cut: bool,
    /// A bit flip ended the run early (after its own checks).
    ended: bool,
    /// The workload's stream: steps and round shapes.
    rng: Rng,
    /// What the oracles probe; separate so that a new probe does not shift the workload.
    check_rng: Rng,
    /// Crash outcomes.
    crash_rng: Rng,
    /// Costs of simulated time.
    time_rng: Rng,
    disk: SimDisk,
    clock: SimClock,
    swarm: Swarm,
    model: Model,
    trace: Trace,
    oracles: Vec<Box<dyn Oracle>>,
    elapsed_us: u64,
    ops_done: u64,
    rounds: u64,
    faults_seen: u64,
    counters: Counters,
    /// Whether the disk crashed since the last open: then what an open finds is durable.
    crashed_since_open: bool,
}

impl Sim {
    fn new(seed: u64, options: &RunOptions) -> Sim {
        let mut rng = Rng::new(seed);
        let disk = SimDisk::new(rng.fork());
        let swarm = Swarm::draw(&mut rng.fork());
        disk.set_faults(swarm.crash_faults);
        let mut trace = Trace::new(options.trace_events_max, options.echo_trace);
        trace.event(format!("seed {seed} swarm {swarm:?}"));
        Sim {
            ops_budget: options.ops,
            sabotage: options.sabotage,
            without: options.without.clone(),
            skip: options.skip.clone(),
            check_rng: rng.fork(),
            crash_rng: rng.fork(),
            time_rng: rng.fork(),
            fault_rng: rng.fork(),
            tails: vec![Offset::ZERO; swarm.topic.partitions as usize],
            compaction_passes_seen: 0,
            tick_armed_cut: false,
            ended: false,
            rng,
            disk,
            clock: SimClock::new(EPOCH_MS),
            model: Model {
                scratch_partitions: swarm.scratch.partitions,
                retention_ms: swarm.topic.retention_ms,
                retention_bytes: swarm.topic.retention_bytes,
                compacted: swarm.topic.cleanup.compacts(),
                delete_retention_ms: swarm.topic.delete_retention_ms,
                ..Model::new(swarm.topic.partitions)
            },
            swarm,
            trace,
            oracles: oracle::standard(),
            elapsed_us: 0,
            ops_done: 0,
            rounds: 0,
            faults_seen: 0,
            counters: Counters::default(),
            crashed_since_open: true,
        }
    }

    fn run_all(&mut self) -> Result<(), Violation> {
        while self.ops_done < self.ops_budget {
            self.round()?;
            if self.ended {
                return Ok(());
            }
        }
        self.finish()
    }

    /// Whether a drawn `feature` is acted on (shrinking may leave it out).
    fn has(&self, feature: Feature) -> bool {
        !self.without.contains(&feature)
    }

    /// Let `us` of simulated time pass; the engine's clock moves by whole milliseconds.
    fn spend(&mut self, us: u64) {
        let before_ms = self.elapsed_us / 1000;
        self.elapsed_us += us;
        self.clock.advance(self.elapsed_us / 1000 - before_ms);
    }

    /// Charge the disk calls made since `before` at the seed's latencies.
    fn spend_io(&mut self, before: Stats) {
        let after = self.disk.stats();
        let latency = self.swarm.latency;
        let mut cost = (after.reads - before.reads) * latency.read_us
            + (after.writes - before.writes) * latency.write_us
            + (after.syncs + after.directory_syncs - before.syncs - before.directory_syncs)
                * latency.sync_us;
        if self.time_rng.chance(latency.slow_per_million) {
            cost *= 100;
        }
        // The engine's own work between calls.
        cost += self.time_rng.between(1, 20);
        self.spend(cost);
    }

    fn now_ms(&self) -> i64 {
        use chronik_engine::Clock;
        self.clock.now_ms()
    }

    /// `Engine::open` on the simulated disk, its disk calls charged as simulated time.
    fn open_engine(
        &mut self,
        durability: Durability,
    ) -> Result<(SimEngine, RecoveryReport), OpenError> {
        // Half the opens write segments with direct I/O: whole blocks, the last one padded,
        // rewritten by the next append (the simulated disk refuses a misaligned direct write).
        let direct_io = self.rng.chance(crate::rng::PER_MILLION / 2);
        if direct_io {
            self.counters.direct_opens += 1;
            self.trace.event("open with direct I/O".to_owned());
        }
        // One to three write shards, by the round and operation counts (no draw from the
        // seed's streams, so the rest of a seed's run is as it was): a pipelined step's
        // appends and a flush then span several reactors.
        let write_shards = 1 + usize::try_from((self.rounds + self.ops_done) % 3).expect("small");
        if write_shards > 1 {
            self.counters.sharded_opens += 1;
        }
        let options = Options { durability, direct_io, write_shards, ..Options::default() };
        let before = self.disk.stats();
        let opened =
            Engine::open(self.disk.clone(), self.clock.shared(), Path::new("/data"), options);
        self.spend_io(before);
        opened
    }

    fn open(&mut self) -> Result<(SimEngine, RecoveryReport), Violation> {
        self.compaction_passes_seen = 0;
        if self.fault_rng.chance(self.swarm.faulty_open_per_million)
            && self.has(Feature::FaultyOpens)
        {
            self.faulty_open()?;
        }
        self.disk.set_faults(self.swarm.crash_faults);
        let durabilities = &self.swarm.durabilities;
        let durability = durabilities[self.rng.index(durabilities.len())];
        let opened = self.open_engine(durability);
        let (engine, report) =
            opened.map_err(|e| Violation::new("recovery_succeeds", format!("open failed: {e}")))?;
        self.trace.event(format!(
            "open {durability:?} truncated={}B/{} records clean={}",
            report.truncated_bytes(),
            report.truncated_records(),
            report.is_clean()
        ));
        self.counters.truncated_bytes += report.truncated_bytes();
        self.model.durability = durability;
        Ok((engine, report))
    }

    /// An open under the seed's I/O faults or a power cut: recovery itself meets the faults.
    /// It may fail, but only with an I/O error, never reporting damage or a lock it holds
    /// itself, and it must release every handle. A power cut then crashes the disk; either
    /// way the caller opens again without faults, and the oracles judge what that finds.
    fn faulty_open(&mut self) -> Result<(), Violation> {
        const ORACLE: &str = "open_errors";
        self.counters.faulty_opens += 1;
        let power_cut = self.fault_rng.chance(crate::rng::PER_MILLION / 2);
        if power_cut {
            let calls = self.fault_rng.below(OPEN_POWER_CUT_CALLS_MAX);
            self.trace.event(format!("faulty open: power cut after {calls} calls"));
            self.disk.cut_power_after(calls);
        } else {
            self.trace.event("faulty open: I/O faults on".to_owned());
            self.disk.set_faults(self.swarm.io_faults);
        }
        let opened = self.open_engine(Durability::Sync);
        self.disk.set_faults(self.swarm.crash_faults);
        match opened {
            Ok((engine, report)) => {
                self.trace.event(format!("faulty open succeeded: {:?}", report.lines()));
                self.counters.truncated_bytes += report.truncated_bytes();
                Self::check_no_damage(&report)?;
                drop(engine);
            }
            Err(OpenError::Io(error)) => {
                self.trace.event(format!("faulty open failed: {error}"));
                self.counters.failed_opens += 1;
                self.faults_seen += 1;
                if self.disk.open_handles() != 0 {
                    let detail =
                        format!("{} handles open after a failed open", self.disk.open_handles());
                    return Err(Violation::new("close_releases_handles", detail));
                }
            }
            Err(other) => {
                return Err(Violation::new(ORACLE, format!("open under faults: {other}")));
            }
        }
        if power_cut {
            self.disk.cut_power_after(0);
            self.crash();
        }
        Ok(())
    }

    /// The disk flips no bits yet, so recovery must never find damaged synced data. Checked
    /// after the other oracles, which say better what the damage cost.
    fn check_no_damage(report: &RecoveryReport) -> Result<(), Violation> {
        if let Some(damaged) = report.partitions.iter().find(|p| !p.damage.is_empty()) {
            let detail = format!("recovery found damage without bit flips: {:?}", damaged.damage);
            return Err(Violation::new("no_damage_without_corruption", detail));
        }
        Ok(())
    }

    /// Run the oracles on a freshly opened engine, then adopt what recovery kept.
    fn check(&mut self, engine: &SimEngine) -> Result<Scan, Violation> {
        let topic_exists = engine.partition_count(TOPIC).is_some();
        if self.sabotage == Some(Sabotage::PhantomAcknowledgement)
            && topic_exists
            && self.model.partitions[0].uncertain.is_empty()
        {
            self.sabotage = None;
            let phantom = ModelRecord { key: None, value: b"phantom".to_vec(), timestamp: 0 };
            let batch = ModelBatch { records: vec![phantom], appended_ms: 0 };
            self.model.durability = Durability::Sync;
            self.model.acknowledge(0, batch);
            self.trace.event("sabotage: phantom acknowledgement on partition 0".to_owned());
        }
        let scan = oracle::scan(engine, &self.model, &mut self.check_rng)?;
        let now_ms = self.now_ms();
        let context = Context { model: &self.model, engine, scan: &scan, topic_exists, now_ms };
        oracle::check_all(&self.oracles, &context, &mut self.check_rng)?;
        self.check_transaction(engine, &scan)?;
        self.check_commits(engine)?;
        self.counters.oracle_checks += 1;
        self.model.topic = if topic_exists { TopicState::Present } else { TopicState::Absent };
        self.model.scratch = if engine.partition_count(SCRATCH).is_some() {
            TopicState::Present
        } else {
            TopicState::Absent
        };
        for partition in 0..scan.partitions.len() {
            let count = scan.end(partition);
            let durable = self.model.partitions[partition].durable_records;
            self.model.adopt(partition as u32, count);
            let model = &mut self.model.partitions[partition];
            model.log_start = model.log_start.max(scan.starts[partition]);
            if !self.crashed_since_open {
                // Found without a crash: some of it may still be only in the page cache.
                self.model.partitions[partition].durable_records = durable;
            }
        }
        self.crashed_since_open = false;
        for (index, scanned) in scan.partitions.iter().enumerate() {
            let offsets = scan.end(index) - scan.starts[index];
            self.counters.compacted_away += offsets - scanned.len() as u64;
        }
        self.group_consumers(engine, &scan)?;
        let counts: Vec<usize> = scan.partitions.iter().map(Vec::len).collect();
        self.trace.event(format!("oracles passed, records {counts:?}"));
        Ok(scan)
    }

    fn round(&mut self) -> Result<(), Violation> {
        self.rounds += 1;
        let (mut engine, report) = self.open()?;
        let scan = self.check(&engine)?;
        Self::check_no_damage(&report)?;
        self.tails.fill(Offset::ZERO);
        if self.rng.chance(DOUBLE_OPEN_PER_MILLION) && self.has(Feature::DoubleOpens) {
            engine = self.reopen_idempotent(engine, &scan)?;
        }
        let power_cut = self.rng.chance(self.swarm.power_cut_per_million);
        let calls = self.rng.below(POWER_CUT_CALLS_MAX);
        let power_cut = power_cut && self.has(Feature::PowerCuts);
        if power_cut {
            self.trace.event(format!("power cut armed after {calls} calls"));
            self.disk.cut_power_after(calls);
        }
        if self.model.topic == TopicState::Absent {
            self.create_topic(&engine)?;
        }
        if self.rng.chance(self.swarm.faulty_round_per_million) && self.has(Feature::IoFaults) {
            self.trace.event("I/O faults on".to_owned());
            self.disk.set_faults(self.swarm.io_faults);
        }
        let steps = self.rng.between(1, self.swarm.round_steps_max);
        let flip_after = self
            .fault_rng
            .chance(self.swarm.bit_flip_per_million)
            .then(|| self.fault_rng.below(steps + 1))
            .filter(|_| self.has(Feature::BitFlips));
        let mut done = 0;
        while done < steps && self.ops_done < self.ops_budget {
            if flip_after == Some(done) && !self.disk.power_is_cut() {
                self.disk.restore_power();
                self.disk.set_faults(self.swarm.crash_faults);
                if let Some(flip) = self.disk.flip_bit(&mut self.fault_rng) {
                    return self.rot(engine, &flip);
                }
            }
            done += 1;
            self.ops_done += 1;
            if self.model.topic != TopicState::Present || self.disk.power_is_cut() {
                break;
            }
            let number = self.ops_done - 1;
            let flow = if self.skip.iter().any(|&(a, b)| (a..b).contains(&number)) {
                let now = self.now_ms();
                let step = self.swarm.step(&mut self.rng, now);
                self.trace.event(format!("skipped step {number}: {step:?}"));
                Flow::Continue
            } else {
                self.step(&engine)?
            };
            if flow == Flow::Stop {
                break;
            }
        }
        // A round that could not run a step still counts, so every run ends.
        if done == 0 {
            self.ops_done += 1;
        }
        self.disk.set_faults(self.swarm.crash_faults);
        self.counters.power_cuts_reached += u64::from(self.disk.power_is_cut());
        let power_cut = power_cut || std::mem::take(&mut self.tick_armed_cut);
        let mut ending = if power_cut {
            Ending::CrashLive
        } else {
            [Ending::CleanClose, Ending::CrashLive, Ending::Restart][self.rng.index(3)]
        };
        if ending == Ending::CrashLive && !self.has(Feature::LiveCrashes) {
            ending = Ending::CleanClose;
        }
        self.end_round(engine, ending)
    }

    /// One bit of synced data rots under the live engine. Every read, before and after a
    /// crash and a recovery, serves exactly the bytes written or reports `Corruption`; records
    /// known durable may go missing only where the damage was reported (a read's corruption,
    /// damage or a cut tail at recovery, or an open refused as corrupt). Ends the run: what
    /// comes next on a damaged partition is the operator's call.
    fn rot(&mut self, engine: SimEngine, flip: &BitFlip) -> Result<(), Violation> {
        self.ended = true;
        self.counters.bit_flips += 1;
        self.trace.event(format!(
            "bit flip: {} byte {} bit {}",
            flip.path.display(),
            flip.position,
            flip.bit
        ));
        self.check_rot(&engine, None)?;
        drop(engine);
        self.crash();
        match self.open_engine(Durability::Sync) {
            Ok((engine, report)) => {
                self.trace.event(format!("open after the flip: {:?}", report.lines()));
                self.check_rot(&engine, Some(&report))
            }
            Err(OpenError::Corruption(corruption)) => {
                self.trace.event(format!("open after the flip refused: {corruption}"));
                self.counters.rot_reported += 1;
                Ok(())
            }
            Err(other) => Err(Violation::new(
                "recovery_succeeds",
                format!("open after a bit flip failed with {other}"),
            )),
        }
    }

    /// The checks of [`Sim::rot`] on one engine; `report` is its recovery's, if just opened.
    fn check_rot(
        &mut self,
        engine: &SimEngine,
        report: Option<&RecoveryReport>,
    ) -> Result<(), Violation> {
        if engine.damaged_topics().iter().any(|damaged| damaged.name == TOPIC) {
            // A flip in the topic's metadata keeps it closed: every read must say so.
            if !matches!(engine.read(TOPIC, 0, Offset::ZERO, 1), Err(ReadError::Corruption(_))) {
                let detail = "a damaged topic's read did not report the damage".to_owned();
                return Err(Violation::new("corruption_never_served", detail));
            }
            self.counters.rot_reported += 1;
            return Ok(());
        }
        if engine.partition_count(TOPIC).is_none() {
            if self.model.topic == TopicState::Present {
                let lines = report.map(RecoveryReport::lines);
                let detail = format!("the topic is gone after a bit flip; recovery: {lines:?}");
                return Err(Violation::new("topic_survives", detail));
            }
            return Ok(());
        }
        for partition in 0..self.swarm.topic.partitions {
            let model = &self.model.partitions[partition as usize];
            let possible: Vec<ModelRecord> = model.possible_records().cloned().collect();
            let durable = model.durable_records;
            let reported_at_open = report.is_some_and(|report| {
                report.partitions.iter().any(|p| {
                    p.topic == TOPIC
                        && p.partition == partition
                        && (!p.damage.is_empty() || p.truncated_bytes > 0)
                })
            });
            let start = engine
                .describe_topic(TOPIC)
                .map_err(|e| Violation::new("reads_succeed", format!("describe: {e}")))?
                .partitions[partition as usize]
                .log_start_offset;
            let (end, mut reported) = self.rot_read(engine, partition, start, &possible, None)?;
            for _ in 0..ROT_READS_PER_PARTITION {
                let from = Offset::new(self.check_rng.between(start.get(), end.get()));
                reported |= self.rot_read(engine, partition, from, &possible, Some(1))?.1;
            }
            if reported || reported_at_open {
                self.counters.rot_reported += 1;
            } else if end.get() < durable {
                let detail = format!(
                    "partition {partition}: {durable} durable records, {end} served after a bit                      flip, and no damage reported"
                );
                return Err(Violation::new("acknowledged_survive", detail));
            }
        }
        self.trace.event("bit flip: nothing served but the bytes written".to_owned());
        Ok(())
    }

    /// Read `partition` from `from` (at most `fetches` fetches, or to the end), checking every
    /// record against what was written. Returns where it stopped, and whether it stopped at a
    /// reported `Corruption`.
    fn rot_read(
        &mut self,
        engine: &SimEngine,
        partition: u32,
        from: Offset,
        possible: &[ModelRecord],
        fetches: Option<u64>,
    ) -> Result<(Offset, bool), Violation> {
        const ORACLE: &str = "corruption_never_served";
        let high_watermark = engine
            .high_watermark(TOPIC, partition)
            .map_err(|e| Violation::new("reads_succeed", e.to_string()))?;
        let mut next = from;
        for _ in 0..fetches.unwrap_or(u64::MAX).min(oracle::SCAN_FETCHES_MAX) {
            let max_bytes = self.check_rng.between(1, oracle::SCAN_FETCH_BYTES_MAX) as usize;
            let fetch = match engine.read(TOPIC, partition, next, max_bytes) {
                Ok(fetch) => fetch,
                Err(ReadError::Corruption(_)) => return Ok((next, true)),
                Err(error) => {
                    let detail = format!("partition {partition} from {next}: {error}");
                    return Err(Violation::new("reads_succeed", detail));
                }
            };
            if fetch.is_empty() {
                if next < high_watermark {
                    let detail = format!(
                        "partition {partition}: empty fetch at {next} below the high watermark                          {high_watermark}, after a bit flip"
                    );
                    return Err(Violation::new("offsets_contiguous", detail));
                }
                return Ok((next, false));
            }
            for record in fetch.records() {
                let found = oracle::owned(&record);
                let expected =
                    usize::try_from(found.offset.get()).ok().and_then(|i| possible.get(i));
                let in_order =
                    if self.model.compacted { found.offset >= next } else { found.offset == next };
                if !in_order || expected != Some(&found.record) {
                    let detail = format!(
                        "partition {partition} offset {}: served {} after a bit flip",
                        found.offset,
                        oracle::describe(&found.record)
                    );
                    return Err(Violation::new(ORACLE, detail));
                }
                next = found.offset.plus(1);
            }
            next = next.max(fetch.next_offset());
        }
        if fetches.is_none() {
            let detail = format!("partition {partition}: scan after a bit flip never ended");
            return Err(Violation::new("liveness", detail));
        }
        Ok((next, false))
    }

    /// Close and open again without a crash: nothing to repair, the same records.
    fn reopen_idempotent(
        &mut self,
        engine: SimEngine,
        scan: &Scan,
    ) -> Result<SimEngine, Violation> {
        const ORACLE: &str = "recovery_idempotent";
        drop(engine);
        self.counters.double_opens += 1;
        let (engine, report) = self.open()?;
        if !report.is_clean() {
            return Err(Violation::new(
                ORACLE,
                format!("second open repaired: {:?}", report.lines()),
            ));
        }
        let again = self.check(&engine)?;
        Self::check_no_damage(&report)?;
        if again != *scan {
            return Err(Violation::new(ORACLE, "a second open found different records"));
        }
        Ok(engine)
    }

    fn create_topic(&mut self, engine: &SimEngine) -> Result<(), Violation> {
        let before = self.disk.stats();
        let result = engine.create_topic(TOPIC, self.swarm.topic);
        self.spend_io(before);
        self.trace.event(format!("create topic -> {result:?}"));
        match result {
            Ok(()) => self.model.topic = TopicState::Present,
            Err(_) if self.disk.power_is_cut() => self.model.topic = TopicState::Uncertain,
            Err(error) => {
                let detail = format!("create_topic failed without a fault: {error}");
                return Err(Violation::new("create_topic_succeeds", detail));
            }
        }
        Ok(())
    }

    fn end_round(&mut self, engine: SimEngine, ending: Ending) -> Result<(), Violation> {
        self.trace.event(format!("end round {}: {ending:?}", self.rounds));
        match ending {
            Ending::CleanClose | Ending::Restart => {
                if engine.flush().is_ok() {
                    self.model.all_synced();
                }
                drop(engine);
                if self.disk.open_handles() != 0 {
                    let detail = format!("{} handles open after close", self.disk.open_handles());
                    return Err(Violation::new("close_releases_handles", detail));
                }
                if ending == Ending::CleanClose {
                    self.counters.clean_closes += 1;
                    self.crash();
                } else {
                    self.counters.restarts_without_crash += 1;
                }
            }
            Ending::CrashLive => {
                self.counters.crashes_under_a_live_engine += 1;
                self.disk.cut_power_after(0);
                drop(engine);
                self.crash();
            }
        }
        Ok(())
    }

    fn crash(&mut self) {
        self.disk.crash(&mut self.crash_rng);
        self.crashed_since_open = true;
        self.trace.event("crash".to_owned());
    }

    /// The last recovery check, then the liveness phase: with every fault off (no I/O errors,
    /// no power cut), the topic is created if it is missing, and every partition takes
    /// [`LIVENESS_BATCHES`] appends at the offsets after the acknowledged records (none
    /// reused), a flush, and a read that returns exactly them: the engine makes progress
    /// again after whatever the run did to it.
    fn finish(&mut self) -> Result<(), Violation> {
        const ORACLE: &str = "liveness";
        let (engine, report) = self.open()?;
        self.check(&engine)?;
        Self::check_no_damage(&report)?;
        if self.model.topic != TopicState::Present {
            self.create_topic(&engine)?;
        }
        for partition in 0..self.swarm.topic.partitions {
            let first = self.model.partitions[partition as usize].acknowledged_records();
            let mut next = first;
            let mut written = Vec::new();
            for batch in 0..LIVENESS_BATCHES {
                let now = self.now_ms();
                let records: Vec<ModelRecord> = (0..=batch)
                    .map(|i| ModelRecord {
                        key: Some(format!("live-{i}").into_bytes()),
                        value: format!("liveness {partition}/{batch}/{i}").into_bytes(),
                        timestamp: now,
                    })
                    .collect();
                let views: Vec<Record<'_>> =
                    records.iter().map(|r| Record::new(r.key.as_deref(), &r.value)).collect();
                let appended = engine.append(TOPIC, partition, &views);
                let count = records.len() as u64;
                match appended {
                    Ok(a)
                        if (a.base_offset, a.last_offset)
                            == (Offset::new(next), Offset::new(next + count - 1)) => {}
                    other => {
                        let detail = format!("partition {partition}: expected {next}, {other:?}");
                        return Err(Violation::new("offsets_never_reused", detail));
                    }
                }
                next += count;
                written.extend(records);
                let pause = self.time_rng.between(1, 2_000);
                self.spend(pause);
            }
            if let Err(error) = engine.flush() {
                return Err(Violation::new(ORACLE, format!("flush without faults: {error}")));
            }
            // Just written and flushed, with no tick since: nothing compacted them.
            let (read, _) = oracle::scan_partition(
                &engine,
                partition,
                Offset::new(first),
                true,
                &mut self.check_rng,
            )?;
            let read: Vec<ModelRecord> = read.into_iter().map(|r| r.record).collect();
            if read != written {
                let detail = format!(
                    "partition {partition}: wrote {} records from {first}, read {} back",
                    written.len(),
                    read.len()
                );
                return Err(Violation::new(ORACLE, detail));
            }
            self.counters.liveness_checks += 1;
        }
        drop(engine);
        self.trace.event("liveness: every partition took appends again; finished".to_owned());
        Ok(())
    }

    fn step(&mut self, engine: &SimEngine) -> Result<Flow, Violation> {
        let now = self.now_ms();
        let step = self.swarm.step(&mut self.rng, now);
        let before = self.disk.stats();
        let flow = match step {
            Step::Append { partition, records } => self.append(engine, partition, records)?,
            Step::Pipelined { appends } => self.pipelined(engine, appends)?,
            Step::Read { partition, from_per_million, max_bytes } => {
                self.counters.reads += 1;
                let from = |start: u64, watermark: u64| {
                    start + (watermark - start) * u64::from(from_per_million) / 1_000_000
                };
                self.read(engine, partition, from, max_bytes)?.0
            }
            Step::Tail { partition, max_bytes } => {
                self.counters.tail_reads += 1;
                let position = self.tails[partition as usize].get();
                // A consumer whose position retention removed goes on from the log start.
                let from = |start: u64, watermark: u64| position.max(start).min(watermark);
                let (flow, next) = self.read(engine, partition, from, max_bytes)?;
                if let Some(next) = next {
                    self.tails[partition as usize] = next;
                }
                flow
            }
            Step::Tick => {
                self.counters.ticks += 1;
                self.maybe_cut_power_in_maintenance("a tick", TICK_POWER_CUT_PER_MILLION);
                let calls = self.disk.stats().calls;
                let result = engine.tick();
                self.end_maintenance_cut();
                let calls = self.disk.stats().calls - calls;
                self.trace.event(format!("tick -> {} ({calls} disk calls)", ok_or_error(&result)));
                if result.is_ok()
                    && let Durability::Interval { ms } = self.model.durability
                {
                    self.model.tick_succeeded(self.now_ms(), ms);
                }
                if result.is_ok() {
                    self.retention_left(engine)?;
                    let passes = engine.describe_topic(TOPIC).map_or(0, |d| {
                        d.partitions.iter().map(|p| p.compaction_passes).sum::<u64>()
                    });
                    if passes > self.compaction_passes_seen {
                        self.trace.event(format!("compaction passes: {passes}"));
                        self.counters.compaction_passes += passes - self.compaction_passes_seen;
                    }
                    self.compaction_passes_seen = passes;
                }
                self.after_error(engine, result.err())?
            }
            Step::Flush => {
                self.counters.flushes += 1;
                let result = engine.flush();
                self.trace.event(format!("flush -> {}", ok_or_error(&result)));
                if result.is_ok() {
                    self.model.all_synced();
                }
                self.after_error(engine, result.err())?
            }
            Step::Scratch => self.scratch(engine)?,
            Step::Compact { partition } => self.compact(engine, partition)?,
            Step::DeleteRecords { partition, offset_per_million } => {
                self.delete_records(engine, partition, offset_per_million)?
            }
            Step::Transaction { writes, commit_partition, offset_per_million } => {
                self.transaction(engine, writes, commit_partition, offset_per_million)?
            }
            Step::Commit { partition, offset_per_million } => {
                self.commit(engine, partition, offset_per_million)?
            }
            Step::Idle { us } => {
                self.trace.event(format!("idle {us}us"));
                self.spend(us);
                Flow::Continue
            }
        };
        self.spend_io(before);
        Ok(flow)
    }

    /// Create the scratch topic, or delete it if it exists. An acknowledged create or delete
    /// must survive any crash; a failed one poisons the engine and leaves the topic whole or
    /// gone.
    fn scratch(&mut self, engine: &SimEngine) -> Result<Flow, Violation> {
        self.counters.topic_changes += 1;
        let exists = engine.partition_count(SCRATCH).is_some();
        let poisoned_before = engine.poisoned().is_some();
        let result = if exists {
            engine.delete_topic(SCRATCH)
        } else {
            engine.create_topic(SCRATCH, self.swarm.scratch)
        };
        let verb = if exists { "delete" } else { "create" };
        self.trace.event(format!("{verb} topic {SCRATCH} -> {result:?}"));
        match result {
            Ok(()) => {
                self.model.scratch = if exists { TopicState::Absent } else { TopicState::Present };
                self.model.scratch_commit = None;
                self.model.scratch_uncertain_commit = None;
                self.model.scratch_commit_maybe_forgotten = false;
                self.scratch_commits_forgotten(engine)?;
                Ok(Flow::Continue)
            }
            Err(TopicError::Io(error)) => {
                self.model.scratch = TopicState::Uncertain;
                self.model.scratch_commit_maybe_forgotten = true;
                self.faults_seen += 1;
                if engine.poisoned().is_none() {
                    let detail = format!("a failed {verb} did not poison: {error}");
                    return Err(Violation::new("fail_stop", detail));
                }
                self.after_error(engine, None)
            }
            Err(TopicError::Poisoned(_)) => {
                // Poisoned during the call (a write of the commit tombstones' checkpoint
                // failed, say), not before it: the commits may be forgotten and the topic
                // changed, as after an I/O error (seed 1366).
                if !poisoned_before {
                    self.model.scratch = TopicState::Uncertain;
                    self.model.scratch_commit_maybe_forgotten = true;
                }
                self.after_error(engine, None)
            }
            Err(error) => Err(Violation::new("topic_errors", format!("{verb} {SCRATCH}: {error}"))),
        }
    }

    /// After an acknowledged create or delete of the scratch topic: no group position of it
    /// is left, so a topic created again under the name does not inherit the old one's.
    fn scratch_commits_forgotten(&self, engine: &SimEngine) -> Result<(), Violation> {
        for partition in 0..self.swarm.scratch.partitions {
            if let Some(found) = engine.committed_offset(GROUP, SCRATCH, partition) {
                let detail = format!(
                    "{SCRATCH} p{partition}: committed {} after the topic was created or deleted",
                    found.get()
                );
                return Err(Violation::new("commits_forgotten", detail));
            }
        }
        Ok(())
    }

    fn append(
        &mut self,
        engine: &SimEngine,
        partition: u32,
        records: Vec<ModelRecord>,
    ) -> Result<Flow, Violation> {
        let now = self.now_ms();
        let views = record_views(&records, now);
        let result = engine.append(TOPIC, partition, &views);
        drop(views);
        let count = records.len() as u64;
        self.trace.event(format!("append p{partition} n={count} -> {result:?}"));
        let batch = ModelBatch { records, appended_ms: now };
        match result {
            Ok(appended) => {
                self.acknowledged(partition, batch, appended)?;
                self.after_error(engine, None)
            }
            // Refused before writing anything.
            Err(AppendError::Poisoned(_)) => self.after_error(engine, None),
            Err(AppendError::Io(error)) => {
                self.counters.failed_appends += 1;
                self.model.fail(partition, batch);
                self.after_error(engine, Some(AppendError::Io(error)))
            }
            Err(error) => {
                Err(Violation::new("append_errors", format!("unexpected append error: {error}")))
            }
        }
    }

    /// An acknowledged append: at the offsets after those acknowledged before it, then
    /// acknowledged in the model.
    fn acknowledged(
        &mut self,
        partition: u32,
        batch: ModelBatch,
        appended: chronik_engine::Appended,
    ) -> Result<(), Violation> {
        let count = batch.records.len() as u64;
        let next = self.model.partitions[partition as usize].acknowledged_records();
        let expected = (Offset::new(next), Offset::new(next + count - 1));
        if (appended.base_offset, appended.last_offset) != expected {
            let detail = format!("partition {partition}: {appended:?}, expected {expected:?}");
            return Err(Violation::new("offsets_never_reused", detail));
        }
        self.model.acknowledge(partition, batch);
        self.counters.acknowledged_batches += 1;
        Ok(())
    }

    /// Appends queued together (`append_nowait`), several per turn of the write path, then
    /// their answers taken in the order queued: acknowledged ones at the offsets that order
    /// gives, failed ones uncertain.
    fn pipelined(
        &mut self,
        engine: &SimEngine,
        appends: Vec<(u32, Vec<ModelRecord>)>,
    ) -> Result<Flow, Violation> {
        let now = self.now_ms();
        let mut queued = Vec::new();
        for (partition, records) in appends {
            let views = record_views(&records, now);
            let result = engine.append_nowait(TOPIC, partition, &views);
            drop(views);
            match result {
                Ok(pending) => queued.push((partition, records, pending)),
                Err(AppendError::Poisoned(_)) => break,
                Err(error) => {
                    let detail = format!("unexpected refusal of a queued append: {error}");
                    return Err(Violation::new("append_errors", detail));
                }
            }
        }
        self.counters.pipelined_appends += queued.len() as u64;
        let mut flow = Flow::Continue;
        for (partition, records, pending) in queued {
            let result = pending.wait();
            let count = records.len() as u64;
            self.trace.event(format!("pipelined p{partition} n={count} -> {result:?}"));
            let batch = ModelBatch { records, appended_ms: now };
            match result {
                Ok(appended) => self.acknowledged(partition, batch, appended)?,
                Err(AppendError::Io(_)) => {
                    self.counters.failed_appends += 1;
                    self.model.fail(partition, batch);
                }
                Err(error) => {
                    let detail = format!("unexpected pipelined append error: {error}");
                    return Err(Violation::new("append_errors", detail));
                }
            }
        }
        if engine.poisoned().is_some() {
            flow = self.after_error(engine, None)?;
        }
        Ok(flow)
    }

    /// Read `partition` from `from(high watermark)` and check the records against the model;
    /// returns the offset after the last record read, unless the read failed.
    /// A transaction: one batch to each of `writes`' partitions and a position of the group
    /// `sim`, all or nothing. Committed, its batches are acknowledged and durable in every
    /// mode; failed, they and the position are uncertain together (`transactions_atomic`).
    fn transaction(
        &mut self,
        engine: &SimEngine,
        writes: Vec<(u32, Vec<ModelRecord>)>,
        commit_partition: u32,
        offset_per_million: u32,
    ) -> Result<Flow, Violation> {
        let now = self.now_ms();
        let views: Vec<Vec<Record<'_>>> =
            writes.iter().map(|(_, records)| record_views(records, now)).collect();
        let batches: Vec<TransactionWrite<'_>> = writes
            .iter()
            .zip(&views)
            .map(|((partition, _), records)| TransactionWrite {
                topic: TOPIC,
                partition: *partition,
                records,
            })
            .collect();
        let watermark = engine.high_watermark(TOPIC, commit_partition).map_or(0, Offset::get);
        let offset = watermark * u64::from(offset_per_million) / 1_000_000;
        let offsets = [(TOPIC, commit_partition, Offset::new(offset))];
        let result = engine
            .commit_transaction(&batches, Some(GroupCommit { group: GROUP, offsets: &offsets }));
        drop(batches);
        drop(views);
        let partitions: Vec<u32> = writes.iter().map(|(p, _)| *p).collect();
        self.trace.event(format!(
            "transaction {partitions:?}, commit p{commit_partition} {offset} -> {}",
            match &result {
                Ok(_) => "ok".to_owned(),
                Err(e) => format!("error: {e}"),
            }
        ));
        let error = match result {
            Ok(appended) => {
                for ((partition, records), appended) in writes.into_iter().zip(appended) {
                    let next = self.model.partitions[partition as usize].acknowledged_records();
                    let count = records.len() as u64;
                    let expected = (Offset::new(next), Offset::new(next + count - 1));
                    if (appended.base_offset, appended.last_offset) != expected {
                        let detail =
                            format!("partition {partition}: {appended:?}, expected {expected:?}");
                        return Err(Violation::new("offsets_never_reused", detail));
                    }
                    self.model.acknowledge(partition, ModelBatch { records, appended_ms: now });
                    let model = &mut self.model.partitions[partition as usize];
                    // Its commit made the partition durable, whatever the mode.
                    model.durable_records = model.acknowledged_records();
                }
                let model = &mut self.model.partitions[commit_partition as usize];
                model.committed = Some(offset);
                model.uncertain_commit = None;
                self.counters.transactions += 1;
                return self.after_error(engine, None);
            }
            Err(CommitError::Append(error)) => error,
            Err(CommitError::Topic(TopicError::Io(error))) => AppendError::Io(error),
            Err(CommitError::Topic(TopicError::Poisoned(poisoned))) => {
                AppendError::Poisoned(poisoned)
            }
            Err(other) => return Err(Violation::new("commit_errors", other.to_string())),
        };
        self.counters.failed_transactions += 1;
        for (partition, records) in writes {
            self.model.fail(partition, ModelBatch { records, appended_ms: now });
        }
        self.model.partitions[commit_partition as usize].uncertain_commit = Some(offset);
        self.model.uncertain_transaction =
            Some(UncertainTransaction { partitions, commit_partition, commit: offset });
        self.after_error(engine, Some(error))
    }

    /// After an open: a failed transaction left all of its batches and its position, or
    /// none of them.
    fn check_transaction(&mut self, engine: &SimEngine, scan: &Scan) -> Result<(), Violation> {
        const ORACLE: &str = "transactions_atomic";
        let Some(transaction) = self.model.uncertain_transaction.take() else { return Ok(()) };
        if scan.partitions.is_empty() {
            return Ok(());
        }
        let mut kept = Vec::new();
        for &partition in &transaction.partitions {
            let model = &self.model.partitions[partition as usize];
            kept.push(scan.end(partition as usize) > model.acknowledged_records());
        }
        let model = &self.model.partitions[transaction.commit_partition as usize];
        let found =
            engine.committed_offset(GROUP, TOPIC, transaction.commit_partition).map(Offset::get);
        if model.committed != Some(transaction.commit) {
            kept.push(found == Some(transaction.commit));
        }
        if kept.iter().any(|&k| k != kept[0]) {
            let detail = format!(
                "transaction {transaction:?}: kept per partition, then its position: {kept:?}"
            );
            return Err(Violation::new(ORACLE, detail));
        }
        Ok(())
    }

    /// Commit a position of the group `sim` for one partition. A commit is durable when it
    /// returns in every durability mode; a failed one may or may not be there after a crash.
    fn commit(
        &mut self,
        engine: &SimEngine,
        partition: u32,
        offset_per_million: u32,
    ) -> Result<Flow, Violation> {
        if engine.partition_count(TOPIC).is_none() {
            return Ok(Flow::Continue);
        }
        self.counters.commits += 1;
        let watermark = engine.high_watermark(TOPIC, partition).map_or(0, Offset::get);
        let offset = watermark * u64::from(offset_per_million) / 1_000_000;
        let mut offsets = vec![(TOPIC, partition, Offset::new(offset))];
        // The scratch topic holds no records: any position of it is past its end, which a
        // position surviving its delete and create again would show.
        let scratch = (self.model.scratch == TopicState::Present
            && engine.partition_count(SCRATCH).is_some())
        .then_some(offset + 1);
        if let Some(scratch) = scratch {
            offsets.push((SCRATCH, 0, Offset::new(scratch)));
        }
        let result = engine.commit_offsets(GROUP, &offsets);
        let also = scratch.map_or(String::new(), |o| format!(", {SCRATCH} p0 {o}"));
        self.trace.event(format!("commit p{partition} {offset}{also} -> {}", ok_or_error(&result)));
        let model = &mut self.model.partitions[partition as usize];
        if result.is_ok() {
            self.model.scratch_commit = scratch.or(self.model.scratch_commit);
            self.model.scratch_uncertain_commit = None;
        } else if scratch.is_some() {
            self.model.scratch_uncertain_commit = scratch;
        }
        match result {
            Ok(()) => {
                model.committed = Some(offset);
                model.uncertain_commit = None;
                Ok(Flow::Continue)
            }
            Err(CommitError::Append(error)) => {
                model.uncertain_commit = Some(offset);
                self.after_error(engine, Some(error))
            }
            Err(CommitError::Topic(TopicError::Io(error))) => {
                model.uncertain_commit = Some(offset);
                self.after_error(engine, Some(AppendError::Io(error)))
            }
            Err(CommitError::Topic(TopicError::Poisoned(poisoned))) => {
                self.after_error(engine, Some(AppendError::Poisoned(poisoned)))
            }
            Err(other) => Err(Violation::new("commit_errors", other.to_string())),
        }
    }

    /// After an open (and the model's adoption of what it found): the SDK's group consumer of
    /// every partition, recreated in the group `sdk`, starts at the position the group
    /// committed last (or zero), then yields exactly the engine's records from there (or from
    /// the log start, where retention or a delete removed the position) with no hole, across
    /// every crash and reopen before (oracle `sdk_readers`). It reads a few records and
    /// commits, but only a position whose records the model knows durable: a crash may take
    /// records that were not, and a position committed past the end a crash left is a
    /// different case (the consumer's reads then fail with `OffsetOutOfRange`, since the
    /// shared cursor resets only positions below the log start), not judged here.
    fn group_consumers(&mut self, engine: &SimEngine, scan: &Scan) -> Result<(), Violation> {
        const ORACLE: &str = "sdk_readers";
        if scan.partitions.is_empty() {
            // No topic (its create failed and was lost): nothing committed for it either.
            for model in &mut self.model.partitions {
                model.sdk_committed = None;
            }
            return Ok(());
        }
        for (index, scanned) in scan.partitions.iter().enumerate() {
            let partition = index as u32;
            let mut consumer =
                chronik::Consumer::in_group(engine.clone(), SDK_GROUP, TOPIC, partition);
            let model = &self.model.partitions[index];
            let committed = model.sdk_committed.unwrap_or(0);
            if consumer.position().get() != committed {
                let detail = format!(
                    "partition {partition}: the group consumer starts at {}, its group \
                     committed {committed}",
                    consumer.position()
                );
                return Err(Violation::new(ORACLE, detail));
            }
            let from = committed.max(scan.starts[index]);
            let first = scanned.partition_point(|r| r.offset.get() < from);
            let expected = &scanned[first..];
            // Half the group consumers iterate (each first fetch copies out a whole
            // megabyte), half poll a few KiB at a time, taking whole fetches.
            let wanted = self.check_rng.between(1, SDK_GROUP_RECORDS_MAX) as usize;
            let read = if self.check_rng.chance(crate::rng::PER_MILLION / 2) {
                oracle::iterate(&mut consumer, wanted)
            } else {
                let max_bytes = self.check_rng.between(1, SDK_GROUP_POLL_BYTES_MAX) as usize;
                oracle::poll(&mut consumer, max_bytes, wanted)
            };
            let read = read.map_err(|e| {
                Violation::new("reads_succeed", format!("group consumer p{partition}: {e}"))
            })?;
            let expected = &expected[..read.len().max(wanted).min(expected.len())];
            if read != expected {
                let offsets = |records: &[ScannedRecord]| -> Vec<u64> {
                    records.iter().map(|r| r.offset.get()).collect()
                };
                let detail = format!(
                    "partition {partition}: the group consumer resumed at {committed} and read \
                     offsets {:?}, the engine holds {:?} from {from}",
                    offsets(&read),
                    offsets(expected)
                );
                return Err(Violation::new(ORACLE, detail));
            }
            self.counters.group_consumer_records += read.len() as u64;
            let position = consumer.position().get();
            let durable = self.model.partitions[index].durable_records;
            if position <= durable && position != committed {
                consumer.commit().map_err(|e| {
                    let detail = format!("partition {partition}: a commit without faults: {e}");
                    Violation::new("commits_survive", detail)
                })?;
                self.counters.group_consumer_commits += 1;
                self.model.partitions[index].sdk_committed = Some(position);
            }
        }
        Ok(())
    }

    /// After an open: the group's committed position of every partition is the last
    /// acknowledged commit, or a failed one after it.
    fn check_commits(&mut self, engine: &SimEngine) -> Result<(), Violation> {
        const ORACLE: &str = "commits_survive";
        for partition in 0..self.model.partitions.len() {
            let found = engine.committed_offset(GROUP, TOPIC, partition as u32).map(Offset::get);
            let model = &mut self.model.partitions[partition];
            let allowed =
                found == model.committed || (found.is_some() && found == model.uncertain_commit);
            if !allowed {
                let detail = format!(
                    "partition {partition}: committed {found:?}, model {:?} (failed commit {:?})",
                    model.committed, model.uncertain_commit
                );
                return Err(Violation::new(ORACLE, detail));
            }
            model.committed = found;
            model.uncertain_commit = None;
        }
        self.check_scratch_commit(engine)
    }

    /// After an open: the group's position on the scratch topic is the last acknowledged
    /// one, a failed one after it, or none if a create or delete failed meanwhile (each
    /// forgets it). Never one an acknowledged create or delete forgot.
    fn check_scratch_commit(&mut self, engine: &SimEngine) -> Result<(), Violation> {
        let found = engine.committed_offset(GROUP, SCRATCH, 0).map(Offset::get);
        let model = &mut self.model;
        let allowed = found == model.scratch_commit
            || (found.is_some() && found == model.scratch_uncertain_commit)
            || (found.is_none() && model.scratch_commit_maybe_forgotten);
        if !allowed {
            let detail = format!(
                "{SCRATCH} p0: committed {found:?}, model {:?} (failed commit {:?}, maybe \
                 forgotten: {})",
                model.scratch_commit,
                model.scratch_uncertain_commit,
                model.scratch_commit_maybe_forgotten
            );
            return Err(Violation::new("commits_survive", detail));
        }
        model.scratch_commit = found;
        model.scratch_uncertain_commit = None;
        model.scratch_commit_maybe_forgotten = false;
        Ok(())
    }

    /// After a successful tick: where retention moved a log start, it left at least
    /// `retention_bytes` of what was acknowledged (it removes a segment only while what stays
    /// is that long), and never went past the bound of the `retention_bounds` oracle. Then the
    /// model takes the new log starts.
    fn retention_left(&mut self, engine: &SimEngine) -> Result<(), Violation> {
        const ORACLE: &str = "retention_bounds";
        let Ok(description) = engine.describe_topic(TOPIC) else { return Ok(()) };
        let now = self.now_ms();
        for (partition, described) in description.partitions.iter().enumerate() {
            let start = described.log_start_offset.get();
            let model = &self.model.partitions[partition];
            if start == model.log_start {
                continue;
            }
            let violation =
                |why: String| Err(Violation::new(ORACLE, format!("partition {partition}: {why}")));
            if let Some(why) = oracle::retention_violation(&self.model, partition, start, now) {
                return violation(why);
            }
            if let Some(limit) = self.model.retention_bytes {
                let left = model.bytes_from(start);
                if left < limit {
                    return violation(format!(
                        "retention left {left} bytes, under retention_bytes {limit}"
                    ));
                }
            }
            self.trace
                .event(format!("retention: p{partition} log start {} -> {start}", model.log_start));
            self.counters.retention_moves += 1;
            self.model.partitions[partition].log_start = start;
        }
        Ok(())
    }

    fn read(
        &mut self,
        engine: &SimEngine,
        partition: u32,
        from: impl FnOnce(u64, u64) -> u64,
        max_bytes: usize,
    ) -> Result<(Flow, Option<Offset>), Violation> {
        const ORACLE: &str = "reads_exact";
        let start = match engine.describe_topic(TOPIC) {
            Ok(description) => description.partitions[partition as usize].log_start_offset.get(),
            Err(error) => return Err(Violation::new(ORACLE, format!("describe: {error}"))),
        };
        let model_start = self.model.partitions[partition as usize].log_start;
        if start < model_start {
            let detail = format!("partition {partition}: log start {start} below {model_start}");
            return Err(Violation::new("retention_bounds", detail));
        }
        let (low, high) = self.model.visible_bounds(partition);
        let watermark = match engine.high_watermark(TOPIC, partition) {
            Ok(watermark) => watermark.get(),
            Err(error) => return Err(Violation::new(ORACLE, format!("high watermark: {error}"))),
        };
        if !(low..=high).contains(&watermark) {
            let detail =
                format!("partition {partition}: high watermark {watermark}, model {low}..={high}");
            return Err(Violation::new("visibility", detail));
        }
        let from = Offset::new(from(start, watermark));
        let result = engine.read(TOPIC, partition, from, max_bytes);
        let fetch = match result {
            Ok(fetch) => fetch,
            Err(error) => {
                self.trace.event(format!("read p{partition} from {from} -> {error}"));
                return Ok((self.after_read_error(engine, &error)?, None));
            }
        };
        let read: Vec<_> = fetch
            .records()
            .map(|r| (r.offset(), r.key().map(<[u8]>::to_vec), r.value().to_vec(), r.timestamp()))
            .collect();
        // A compacted fetch may end past its last record (removed offsets): go on from there.
        let fetch_next = if self.model.compacted { fetch.next_offset() } else { from };
        self.trace.event(format!("read p{partition} from {from} -> {} records", read.len()));
        let dense = !self.model.compacted;
        if dense && from.get() < watermark && read.first().map(|r| r.0) != Some(from) {
            return Err(Violation::new(
                ORACLE,
                format!("partition {partition}: read from {from} began elsewhere"),
            ));
        }
        let possible: Vec<&ModelRecord> =
            self.model.partitions[partition as usize].possible_records().collect();
        let mut next = from;
        for (offset, key, value, timestamp) in read {
            let found = ModelRecord { key, value, timestamp };
            let expected = usize::try_from(offset.get()).ok().and_then(|i| possible.get(i));
            let in_order = if dense { offset == next } else { offset >= next };
            if !in_order || offset.get() >= watermark || expected != Some(&&found) {
                let detail = format!(
                    "partition {partition} offset {offset}: read {}",
                    oracle::describe(&found)
                );
                return Err(Violation::new(ORACLE, detail));
            }
            next = offset.plus(1);
        }
        Ok((Flow::Continue, Some(next.max(fetch_next))))
    }

    fn after_read_error(
        &mut self,
        engine: &SimEngine,
        error: &ReadError,
    ) -> Result<Flow, Violation> {
        match error {
            ReadError::Poisoned(_) if engine.poisoned().is_some() => self.after_error(engine, None),
            ReadError::Io(_)
                if self.disk.faults().read_error_per_million > 0 || self.disk.power_is_cut() =>
            {
                self.faults_seen += 1;
                Ok(Flow::Continue)
            }
            other => {
                Err(Violation::new("reads_succeed", format!("unexpected read error: {other}")))
            }
        }
    }

    /// After a step: an I/O error must have poisoned the engine (fail-stop), and a poisoned
    /// engine must refuse everything until reopened. Either ends the round's workload.
    /// Sometimes arm a power cut inside the maintenance work about to run (retention,
    /// compaction and its segment swaps), where a round's cut rarely lands.
    fn maybe_cut_power_in_maintenance(&mut self, during: &str, per_million: u32) {
        if !self.disk.power_cut_armed()
            && self.has(Feature::PowerCuts)
            && self.fault_rng.chance(per_million)
        {
            // Besides a count of calls, a cut may count directory entry changes or directory
            // fsyncs, so that it lands inside a segment swap's few renames, removes and
            // commits whatever the reads and writes around them.
            match self.fault_rng.below(3) {
                0 => {
                    let changes = self.fault_rng.between(1, TICK_POWER_CUT_ENTRY_CHANGES_MAX);
                    self.trace.event(format!(
                        "power cut armed after {changes} entry changes, in {during}"
                    ));
                    self.disk.cut_power_after_entry_changes(changes);
                }
                1 => {
                    let syncs = self.fault_rng.between(1, TICK_POWER_CUT_DIRECTORY_SYNCS_MAX);
                    self.trace
                        .event(format!("power cut armed at directory fsync {syncs}, in {during}"));
                    self.disk.cut_power_at_directory_sync(syncs);
                }
                _ => {
                    let log2 = self.fault_rng.between(2, TICK_POWER_CUT_CALLS_MAX_LOG2);
                    let calls = self.fault_rng.below(1 << log2);
                    self.trace.event(format!("power cut armed after {calls} calls, in {during}"));
                    self.disk.cut_power_after(calls);
                }
            }
            self.tick_armed_cut = true;
        }
    }

    /// A cut armed for maintenance that the maintenance did not reach is disarmed: it is
    /// meant for the maintenance, not for whatever comes next.
    fn end_maintenance_cut(&mut self) {
        if self.tick_armed_cut && !self.disk.power_is_cut() {
            self.disk.restore_power();
            self.tick_armed_cut = false;
            self.trace.event("power cut disarmed: not reached".to_owned());
        }
    }

    /// `Engine::delete_records` below a visible offset: the log start it answers is never
    /// past the offset asked for (nor past an earlier request or retention's bound), never
    /// back, and readers then see it.
    fn delete_records(
        &mut self,
        engine: &SimEngine,
        partition: u32,
        offset_per_million: u32,
    ) -> Result<Flow, Violation> {
        if engine.partition_count(TOPIC).is_none() {
            return Ok(Flow::Continue);
        }
        self.counters.deletes += 1;
        let watermark = engine.high_watermark(TOPIC, partition).map_or(0, Offset::get);
        let before = watermark * u64::from(offset_per_million) / 1_000_000;
        let index = partition as usize;
        let model = &mut self.model.partitions[index];
        model.deleted_before = model.deleted_before.max(before);
        self.maybe_cut_power_in_maintenance("a delete", DELETE_POWER_CUT_PER_MILLION);
        let result = engine.delete_records(TOPIC, partition, Offset::new(before));
        self.end_maintenance_cut();
        self.trace.event(format!("delete p{partition} below {before} -> {result:?}"));
        match result {
            Ok(start) => {
                let start = start.get();
                let now = self.now_ms();
                if let Some(why) = oracle::retention_violation(&self.model, index, start, now) {
                    let detail = format!("partition {partition}: delete below {before}: {why}");
                    return Err(Violation::new("retention_bounds", detail));
                }
                let model = &mut self.model.partitions[index];
                if start > model.log_start {
                    self.counters.delete_moves += 1;
                    model.log_start = start;
                }
                Ok(Flow::Continue)
            }
            Err(error) => self.after_error(engine, Some(error)),
        }
    }

    /// A forced compaction of one partition. An I/O error may abandon the pass without
    /// poisoning (the log is as it was, which the next reads check) or, after a commit,
    /// poison the engine.
    fn compact(&mut self, engine: &SimEngine, partition: u32) -> Result<Flow, Violation> {
        self.maybe_cut_power_in_maintenance("a forced compaction", COMPACT_POWER_CUT_PER_MILLION);
        let calls = self.disk.stats().calls;
        let result = engine.compact_partition(TOPIC, partition);
        self.end_maintenance_cut();
        let calls = self.disk.stats().calls - calls;
        self.trace.event(format!(
            "compact p{partition} -> {} ({calls} disk calls)",
            match &result {
                Ok(Some(report)) => format!(
                    "{} of {} records kept, {} segments into {}",
                    report.records_kept, report.records_in, report.segments_in, report.segments_out
                ),
                Ok(None) => "nothing to do".to_owned(),
                Err(e) => format!("error: {e}"),
            }
        ));
        match result {
            Ok(Some(_)) => {
                self.counters.compaction_passes += 1;
                self.compaction_passes_seen += 1;
                Ok(Flow::Continue)
            }
            Ok(None) => Ok(Flow::Continue),
            Err(AppendError::Io(_)) if engine.poisoned().is_none() => {
                self.faults_seen += 1;
                self.counters.compactions_abandoned += 1;
                let kept = engine.compaction_error(TOPIC, partition).ok().flatten();
                if kept.is_none() {
                    let detail = format!("partition {partition}: an abandoned pass is not kept");
                    return Err(Violation::new("compaction_errors", detail));
                }
                Ok(Flow::Continue)
            }
            Err(error) => self.after_error(engine, Some(error)),
        }
    }

    fn after_error(
        &mut self,
        engine: &SimEngine,
        error: Option<AppendError>,
    ) -> Result<Flow, Violation> {
        const ORACLE: &str = "poisoned_until_reopen";
        if let Some(error) = error {
            match error {
                AppendError::Io(_) => self.faults_seen += 1,
                AppendError::Poisoned(_) => {}
                other => return Err(Violation::new("append_errors", other.to_string())),
            }
            if engine.poisoned().is_none() {
                return Err(Violation::new(
                    "fail_stop",
                    format!("an I/O error did not poison: {error:?}"),
                ));
            }
        }
        if engine.poisoned().is_none() {
            return Ok(Flow::Continue);
        }
        self.counters.poison_probes += 1;
        let append = engine.append(TOPIC, 0, &[Record::new(None, b"probe")]);
        if !matches!(append, Err(AppendError::Poisoned(_))) {
            return Err(Violation::new(ORACLE, format!("append on a poisoned engine: {append:?}")));
        }
        let read = engine.read(TOPIC, 0, Offset::ZERO, 1024).map(|f| f.len_bytes());
        if !matches!(read, Err(ReadError::Poisoned(_))) {
            return Err(Violation::new(ORACLE, format!("read on a poisoned engine: {read:?}")));
        }
        if engine.flush().is_ok() || engine.tick().is_ok() {
            return Err(Violation::new(ORACLE, "flush or tick succeeded on a poisoned engine"));
        }
        self.trace.event("poisoned: probes refused".to_owned());
        Ok(Flow::Stop)
    }
}

fn ok_or_error<E: std::fmt::Display>(result: &Result<(), E>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(error) => format!("error: {error}"),
    }
}

/// The records to append, as views; a record whose timestamp is the clock's (`now`) leaves it
/// to the engine, to cover both paths.
fn record_views(records: &[ModelRecord], now: i64) -> Vec<Record<'_>> {
    records
        .iter()
        .map(|r| {
            let record = Record::new(r.key.as_deref(), &r.value);
            if r.timestamp == now { record } else { record.with_timestamp(r.timestamp) }
        })
        .collect()
}

/// The message of a caught panic.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
