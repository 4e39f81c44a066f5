//! One seeded run: the real engine on [`SimDisk`] and [`SimClock`], driven by a workload drawn
//! from the seed, crashed and restarted, checked by the oracles after every restart.
//!
//! [`run`] is the only entry point. Everything it does is a function of the seed and the
//! options: the workload, the faults, the crash outcomes, the simulated time. The wall clock
//! is read only to report the speed-up.
//!
//! # A round
//!
//! 1. Open the engine (the durability mode is drawn per round) and run the oracles on what
//!    recovery kept; sometimes close and open again at once, which must find nothing to
//!    repair and the same records (recovery is idempotent).
//! 2. Maybe arm a power cut after a random number of disk calls; maybe switch on the seed's
//!    I/O faults.
//! 3. Run a random number of workload steps: appends, reads checked against the model, ticks,
//!    flushes, idle time. A poisoned engine is probed (everything refused until reopen) and
//!    ends the round.
//! 4. End with a clean close and a crash, a crash under the live engine, or a restart
//!    without a crash.
//!
//! A crash under a live engine cuts the power first and then drops the engine, so its
//! destructor's calls all fail: the same as a process that died without running it, without
//! leaking the engine (and the whole simulated disk it holds) as `mem::forget` would.

use crate::clock::{EPOCH_MS, SimClock};
use crate::disk::{SimDisk, Stats};
use crate::model::{Model, ModelBatch, ModelRecord, TopicState};
use crate::oracle::{self, Context, Oracle, Scan, SimEngine, Violation};
use crate::rng::Rng;
use crate::trace::{TRACE_EVENTS_MAX, Trace, fnv1a};
use crate::workload::{Step, Swarm, TOPIC};
use chronik_engine::{
    AppendError, Durability, Engine, Offset, Options, ReadError, Record, RecoveryReport,
};
use std::collections::BTreeMap;
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
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            ops: OPS_DEFAULT,
            echo_trace: false,
            keep_snapshot: false,
            trace_events_max: TRACE_EVENTS_MAX,
            sabotage: None,
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
    }
}

/// The result of one run.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub seed: u64,
    /// The operation budget asked for (part of the replay command).
    pub ops_budget: u64,
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
        format!("chronik-sim run --seed {} --ops {}", self.seed, self.ops_budget)
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
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(ToString::to_string)
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            Some(Violation::new("no_panic", message))
        }
    };
    if let Some(violation) = &violation {
        sim.trace.event(format!("VIOLATION {violation}"));
    }
    let stats = sim.disk.stats();
    RunOutcome {
        seed,
        ops_budget: options.ops,
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
            check_rng: rng.fork(),
            crash_rng: rng.fork(),
            time_rng: rng.fork(),
            rng,
            disk,
            clock: SimClock::new(EPOCH_MS),
            model: Model::new(swarm.topic.partitions),
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
        }
        self.finish()
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

    fn open(&mut self) -> Result<(SimEngine, RecoveryReport), Violation> {
        self.disk.set_faults(self.swarm.crash_faults);
        let durabilities = &self.swarm.durabilities;
        let durability = durabilities[self.rng.index(durabilities.len())];
        let options = Options { durability, ..Options::default() };
        let before = self.disk.stats();
        let opened =
            Engine::open(self.disk.clone(), self.clock.shared(), Path::new("/data"), options);
        self.spend_io(before);
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
        if self.sabotage == Some(Sabotage::PhantomAcknowledgement) && topic_exists {
            self.sabotage = None;
            let phantom = ModelRecord { key: None, value: b"phantom".to_vec(), timestamp: 0 };
            let batch = ModelBatch { records: vec![phantom], appended_ms: 0 };
            self.model.durability = Durability::Sync;
            self.model.acknowledge(0, batch);
            self.trace.event("sabotage: phantom acknowledgement on partition 0".to_owned());
        }
        let scan = oracle::scan(engine, &self.model, &mut self.check_rng)?;
        let context = Context { model: &self.model, engine, scan: &scan, topic_exists };
        oracle::check_all(&self.oracles, &context, &mut self.check_rng)?;
        self.counters.oracle_checks += 1;
        self.model.topic = if topic_exists { TopicState::Present } else { TopicState::Absent };
        for (partition, records) in scan.partitions.iter().enumerate() {
            let count = records.len() as u64;
            let durable = self.model.partitions[partition].durable_records;
            self.model.adopt(partition as u32, count);
            if !self.crashed_since_open {
                // Found without a crash: some of it may still be only in the page cache.
                self.model.partitions[partition].durable_records = durable;
            }
        }
        self.crashed_since_open = false;
        let counts: Vec<usize> = scan.partitions.iter().map(Vec::len).collect();
        self.trace.event(format!("oracles passed, records {counts:?}"));
        Ok(scan)
    }

    fn round(&mut self) -> Result<(), Violation> {
        self.rounds += 1;
        let (mut engine, report) = self.open()?;
        let scan = self.check(&engine)?;
        Self::check_no_damage(&report)?;
        if self.rng.chance(DOUBLE_OPEN_PER_MILLION) {
            engine = self.reopen_idempotent(engine, &scan)?;
        }
        let power_cut = self.rng.chance(self.swarm.power_cut_per_million);
        if power_cut {
            let calls = self.rng.below(POWER_CUT_CALLS_MAX);
            self.trace.event(format!("power cut armed after {calls} calls"));
            self.disk.cut_power_after(calls);
        }
        if self.model.topic == TopicState::Absent {
            self.create_topic(&engine)?;
        }
        if self.rng.chance(self.swarm.faulty_round_per_million) {
            self.trace.event("I/O faults on".to_owned());
            self.disk.set_faults(self.swarm.io_faults);
        }
        let steps = self.rng.between(1, self.swarm.round_steps_max);
        let mut done = 0;
        while done < steps && self.ops_done < self.ops_budget {
            done += 1;
            self.ops_done += 1;
            if self.model.topic != TopicState::Present || self.disk.power_is_cut() {
                break;
            }
            if self.step(&engine)? == Flow::Stop {
                break;
            }
        }
        // A round that could not run a step still counts, so every run ends.
        if done == 0 {
            self.ops_done += 1;
        }
        self.disk.set_faults(self.swarm.crash_faults);
        self.counters.power_cuts_reached += u64::from(self.disk.power_is_cut());
        let ending = if power_cut {
            Ending::CrashLive
        } else {
            [Ending::CleanClose, Ending::CrashLive, Ending::Restart][self.rng.index(3)]
        };
        self.end_round(engine, ending)
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

    /// The last recovery check, then one append per partition: offsets continue where the
    /// acknowledged records end, never reusing one.
    fn finish(&mut self) -> Result<(), Violation> {
        let (engine, report) = self.open()?;
        self.check(&engine)?;
        Self::check_no_damage(&report)?;
        if self.model.topic == TopicState::Present {
            for partition in 0..self.swarm.topic.partitions {
                let next = self.model.partitions[partition as usize].acknowledged_records();
                let appended = engine.append(TOPIC, partition, &[Record::new(None, b"after")]);
                match appended {
                    Ok(a) if a.base_offset == Offset::new(next) => {}
                    other => {
                        let detail = format!("partition {partition}: expected {next}, {other:?}");
                        return Err(Violation::new("offsets_never_reused", detail));
                    }
                }
            }
        }
        drop(engine);
        self.trace.event("finished".to_owned());
        Ok(())
    }

    fn step(&mut self, engine: &SimEngine) -> Result<Flow, Violation> {
        let now = self.now_ms();
        let step = self.swarm.step(&mut self.rng, now);
        let before = self.disk.stats();
        let flow = match step {
            Step::Append { partition, records } => self.append(engine, partition, records)?,
            Step::Read { partition, from_per_million, max_bytes } => {
                self.read(engine, partition, from_per_million, max_bytes)?
            }
            Step::Tick => {
                self.counters.ticks += 1;
                let result = engine.tick();
                self.trace.event(format!("tick -> {}", ok_or_error(&result)));
                if result.is_ok()
                    && let Durability::Interval { ms } = self.model.durability
                {
                    self.model.tick_succeeded(self.now_ms(), ms);
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
            Step::Idle { us } => {
                self.trace.event(format!("idle {us}us"));
                self.spend(us);
                Flow::Continue
            }
        };
        self.spend_io(before);
        Ok(flow)
    }

    fn append(
        &mut self,
        engine: &SimEngine,
        partition: u32,
        records: Vec<ModelRecord>,
    ) -> Result<Flow, Violation> {
        let now = self.now_ms();
        let views: Vec<Record<'_>> = records
            .iter()
            .map(|r| {
                let record = Record::new(r.key.as_deref(), &r.value);
                if r.timestamp == now { record } else { record.with_timestamp(r.timestamp) }
            })
            .collect();
        let result = engine.append(TOPIC, partition, &views);
        drop(views);
        let count = records.len() as u64;
        self.trace.event(format!("append p{partition} n={count} -> {result:?}"));
        let batch = ModelBatch { records, appended_ms: now };
        match result {
            Ok(appended) => {
                let next = self.model.partitions[partition as usize].acknowledged_records();
                let expected = (Offset::new(next), Offset::new(next + count - 1));
                if (appended.base_offset, appended.last_offset) != expected {
                    let detail =
                        format!("partition {partition}: {appended:?}, expected {expected:?}");
                    return Err(Violation::new("offsets_never_reused", detail));
                }
                self.model.acknowledge(partition, batch);
                self.counters.acknowledged_batches += 1;
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

    fn read(
        &mut self,
        engine: &SimEngine,
        partition: u32,
        from_per_million: u32,
        max_bytes: usize,
    ) -> Result<Flow, Violation> {
        const ORACLE: &str = "reads_exact";
        self.counters.reads += 1;
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
        let from = Offset::new(watermark * u64::from(from_per_million) / 1_000_000);
        let result = engine.read(TOPIC, partition, from, max_bytes);
        let fetch = match result {
            Ok(fetch) => fetch,
            Err(error) => {
                self.trace.event(format!("read p{partition} from {from} -> {error}"));
                return self.after_read_error(engine, &error);
            }
        };
        let read: Vec<_> = fetch
            .records()
            .map(|r| (r.offset(), r.key().map(<[u8]>::to_vec), r.value().to_vec(), r.timestamp()))
            .collect();
        self.trace.event(format!("read p{partition} from {from} -> {} records", read.len()));
        if from.get() < watermark && read.first().map(|r| r.0) != Some(from) {
            return Err(Violation::new(
                ORACLE,
                format!("partition {partition}: read from {from} began elsewhere"),
            ));
        }
        let mut expected =
            self.model.partitions[partition as usize].possible_records().skip(from.get() as usize);
        for (offset, key, value, timestamp) in read {
            let found = ModelRecord { key, value, timestamp };
            if offset.get() >= watermark || expected.next() != Some(&found) {
                let detail = format!(
                    "partition {partition} offset {offset}: read {}",
                    oracle::describe(&found)
                );
                return Err(Violation::new(ORACLE, detail));
            }
        }
        Ok(Flow::Continue)
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
