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
//!
//! The one `Sim` is implemented across files by responsibility, none of which draws from a
//! stream in an order another file decides:
//! - this file: the options, the outcome, the `Sim` state and its clock and crash helpers;
//! - `round`: the life of a round (opens, the step loop, its ending) and the final liveness
//!   phase;
//! - `steps`: the workload's steps and what follows an error (fail-stop, then poisoned until
//!   reopen);
//! - `maintenance`: retention, deletes and forced compactions, with power cuts inside them;
//! - `checks`: the checks after every open, then the model's adoption of what recovery kept;
//! - `rot`: the checks after a bit flip.

use crate::clock::{EPOCH_MS, SimClock};
use crate::disk::{SimDisk, Stats};
use crate::model::Model;
use crate::oracle::{self, Oracle, Violation};
use crate::rng::Rng;
use crate::trace::{TRACE_EVENTS_MAX, Trace, fnv1a};
use crate::workload::Swarm;
use chronik_engine::Offset;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod checks;
mod maintenance;
mod rot;
mod round;
mod steps;

/// Workload steps of a run unless the options say otherwise.
pub const OPS_DEFAULT: u64 = 200;
/// Largest operation count a run accepts.
pub const OPS_MAX: u64 = 10_000_000;
/// The consumer group whose commits the workload makes.
const GROUP: &str = "sim";

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
    /// Seeds whose disk defers completions (operations complete turns after submission).
    pub deferred_seeds: u64,
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
        self.deferred_seeds += other.deferred_seeds;
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

/// How the last engine on the simulated disk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LastClose {
    /// Every partition closed (the clean-shutdown mark may be there).
    Complete,
    /// It crashed, its close failed, or it is still live.
    Incomplete,
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
    /// How the last engine on the disk ended: only after a complete close (every partition
    /// closed) may an open find the clean-shutdown mark.
    last_close: LastClose,
    /// An open found the clean-shutdown mark although the engine before it did not close
    /// completely (it crashed, or its close failed): the mark lied.
    lying_mark: Option<String>,
}

impl Sim {
    fn new(seed: u64, options: &RunOptions) -> Sim {
        let mut rng = Rng::new(seed);
        let disk = SimDisk::new(rng.fork());
        let swarm = Swarm::draw(&mut rng.fork());
        disk.set_faults(swarm.crash_faults);
        let deferred = swarm.deferred_completions;
        disk.set_deferred_completions(deferred);
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
            counters: Counters { deferred_seeds: u64::from(deferred), ..Counters::default() },
            crashed_since_open: true,
            last_close: LastClose::Incomplete,
            lying_mark: None,
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

    fn crash(&mut self) {
        self.disk.crash(&mut self.crash_rng);
        self.crashed_since_open = true;
        self.trace.event("crash".to_owned());
    }
}

/// The message of a caught panic.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
