//! Simulation for users: run your processor over given input on a simulated disk that loses
//! power at random points (and sometimes fails I/O), restarting it after each crash, over
//! many seeds, and check that its final stores and outputs equal those of a run without
//! faults. A processor that keeps state outside its stores, or talks to the world outside its
//! context, fails here the way it would fail in production.
//!
//! ```
//! use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig};
//! use chronik::testing::{InputRecord, Simulation};
//! use chronik::RecordView;
//!
//! struct Counter;
//! impl Processor for Counter {
//!     fn process(&mut self, record: &RecordView<'_>, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
//!         let key = record.key().unwrap_or_default();
//!         let store = ctx.store("counts")?;
//!         let n = store.get(key)?.map_or(0, |v| v[0]) + 1;
//!         store.put(key, &[n]);
//!         ctx.emit("totals", Some(key), &[n]);
//!         Ok(())
//!     }
//! }
//!
//! let input = (0..200).map(|i| InputRecord::new(i % 2, Some(vec![(i % 5) as u8]), vec![])).collect();
//! let simulation = Simulation {
//!     config: ProcessorConfig::new("counter", "clicks").store("counts"),
//!     input_partitions: 2,
//!     outputs: vec![("totals".into(), 2)],
//!     input,
//!     seeds: 0..20,
//!     crashes_max: 4,
//! };
//! let report = simulation.run(|_| Counter).expect("exactly once under crashes");
//! assert!(report.crashes > 0);
//! ```
//!
//! A failure names its seed and how to replay only that one: set `CHRONIK_SIM_SEED=S` (the
//! run then uses seed `S` alone), or pass `seeds: S..S + 1`.
//!
//! [`CountByKey`] is a ready-made processor for tests: it counts records per key into a store.

mod count_by_key;

pub use count_by_key::{CountByKey, CountEncoding};

use crate::dsl::{Topology, TopologyRunner};
use crate::processor::{
    Processor, ProcessorConfig, ProcessorError, RestoreProgress, RunStats, Runner,
};
use crate::store::{DiskOptions, Store, StoreError, StoreKind, StoreMemory};
use crate::{Cleanup, Durability, Offset, Options, Record, TopicConfig};
use chronik_engine::Engine;
use chronik_simdisk::{Faults, Rng, SimClock, SimDisk};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// One input record: which input topic (an index into [`ProcessorConfig::inputs`]), its
/// partition, key, value and timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputRecord {
    pub input: usize,
    pub partition: u32,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    /// Milliseconds since the epoch; `None` takes the simulated clock's time.
    pub timestamp: Option<i64>,
}

impl InputRecord {
    pub fn new(partition: u32, key: Option<Vec<u8>>, value: Vec<u8>) -> InputRecord {
        InputRecord { input: 0, partition, key, value, timestamp: None }
    }

    /// The record goes to input `input` (an index into [`ProcessorConfig::inputs`]).
    #[must_use]
    pub fn on(mut self, input: usize) -> InputRecord {
        self.input = input;
        self
    }

    #[must_use]
    pub fn at(mut self, timestamp: i64) -> InputRecord {
        self.timestamp = Some(timestamp);
        self
    }
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Simulation {
    /// The application: its name, input topic and stores (threads are ignored: the simulation
    /// runs on one thread; each seed commits every 1 to 64 records, and half of them write
    /// store snapshots every 1 to 6 commits). Memory stores become disk stores in half the
    /// seeds, and every disk store gets a memory budget of a few KiB of its own, so that it
    /// writes runs and merges them many times in a run; store files have bits rotted between attempts.
    pub config: ProcessorConfig,
    pub input_partitions: u32,
    /// Every topic the processor emits to, with its partition count.
    pub outputs: Vec<(String, u32)>,
    pub input: Vec<InputRecord>,
    pub seeds: Range<u64>,
    /// Crashes per seed at most; after them the processor runs to the end without faults.
    pub crashes_max: u32,
}

/// What the simulation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimulationReport {
    pub seeds: u64,
    /// Power losses and failed runs the processor was restarted after, over all seeds.
    pub crashes: u64,
    /// Input records processed by the attempts that ran to the end (a seed's last attempt
    /// processes what its earlier ones left uncommitted).
    pub records_processed: u64,
    /// Input records compaction removed before the runs, over all seeds, when the input
    /// topics are compacted ([`Simulation::run_on_compacted_input`]): what the runs read past.
    pub input_records_compacted: u64,
    /// Disk-store merges installed, and disk-store files a crash left half built (no
    /// manifest named them) removed at a later open, over all attempts of all seeds: the
    /// crashes reached merges under way.
    pub store_merges: u64,
    pub store_files_removed: u64,
}

impl SimulationReport {
    /// Count what an attempt's engine saw its disk stores do.
    fn add_store_work(&mut self, metrics: &chronik_engine::metrics::MetricsSnapshot) {
        self.store_merges += metrics.store_merges;
        self.store_files_removed += metrics.store_unnamed_removed;
    }
}

/// A seed whose final state or outputs differ from the fault-free run, or that failed.
#[derive(Debug, thiserror::Error)]
#[error("seed {seed}: {detail}\nreplay: CHRONIK_SIM_SEED={seed} (or seeds: {seed}..{})", seed + 1)]
pub struct SimulationFailure {
    pub seed: u64,
    pub kind: FailureKind,
    pub detail: String,
}

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// A store's final entries differ from the fault-free run's: a restore (from the
    /// changelog, or a snapshot and the changelog after it) did not rebuild the state.
    State,
    /// An output partition differs: a record duplicated, lost, reordered or different.
    Outputs,
    /// The processor failed without a fault to blame, or the fault-free run failed.
    Run,
    /// The fault-free run's outcome fails the caller's check
    /// ([`Simulation::run_topology_checked`]): a model of what the application must produce.
    Model,
    /// A restore read more of the changelog than lies past the offset its snapshot or disk
    /// store holds: the store's offset was not used, and restarts cost the whole state.
    Tail,
    /// A disk store was found damaged at a restart while no bit of it had rotted: a crash
    /// or an I/O error left it so, which its write protocol must never allow.
    Damage,
}

/// A store's entries, in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;
/// A partition's records: key and value, in offset order.
pub type Records = Vec<(Option<Vec<u8>>, Vec<u8>)>;

/// Final stores (per store and partition) and outputs (per topic and partition, in order).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub stores: BTreeMap<(String, u32), Entries>,
    pub outputs: BTreeMap<(String, u32), Records>,
}

/// What a simulation runs and restarts: a processor application, or a topology's stages.
trait App {
    fn run_until_caught_up(&mut self) -> Result<RunStats, ProcessorError>;
    /// Every store, with its name and partition.
    fn every_store(&self) -> Vec<(&str, u32, &Store)>;
    /// The configuration of every application it runs (a topology's stages).
    fn configs(&self) -> Vec<&ProcessorConfig>;
}

impl<P: Processor> App for Runner<SimDisk, P> {
    fn run_until_caught_up(&mut self) -> Result<RunStats, ProcessorError> {
        Runner::run_until_caught_up(self)
    }

    fn every_store(&self) -> Vec<(&str, u32, &Store)> {
        let mut all = Vec::new();
        for name in &self.config().stores {
            for partition in 0..self.positions().len() as u32 {
                if let Some(store) = self.store(partition, name) {
                    all.push((name.as_str(), partition, store));
                }
            }
        }
        all
    }

    fn configs(&self) -> Vec<&ProcessorConfig> {
        vec![self.config()]
    }
}

impl App for TopologyRunner<SimDisk> {
    fn run_until_caught_up(&mut self) -> Result<RunStats, ProcessorError> {
        TopologyRunner::run_until_caught_up(self)
    }

    fn every_store(&self) -> Vec<(&str, u32, &Store)> {
        self.stores()
    }

    fn configs(&self) -> Vec<&ProcessorConfig> {
        TopologyRunner::configs(self)
    }
}

/// Check every store, which condemns a damaged one (so the next start rebuilds it), and
/// count the damaged: all of them, not only up to the first, since each left unchecked would
/// need a rerun of its own.
fn condemn_damaged(app: &impl App) -> usize {
    app.every_store().iter().filter(|(_, _, store)| store.check().is_err()).count()
}

/// The detail of a [`FailureKind::Run`] failure starts with this when a run until caught up
/// ended with an input position short of its high watermark.
pub const NOT_CAUGHT_UP: &str = "an input was not read to its high watermark";

/// After `run_until_caught_up`: every application's committed position in every partition of
/// every input has reached that partition's high watermark. A fetch that held no record (the
/// input's batches there emptied by compaction) is not the end of the input.
fn check_caught_up(engine: &SimEngine, app: &impl App) -> Result<(), String> {
    for config in app.configs() {
        for input in &config.inputs {
            let partitions = engine.partition_count(input).ok_or_else(|| {
                format!("{NOT_CAUGHT_UP}: the input {input} of {} is gone", config.application)
            })?;
            for partition in 0..partitions {
                let end = engine.high_watermark(input, partition).map_err(|e| e.to_string())?;
                let committed = engine
                    .committed_offset(&config.application, input, partition)
                    .unwrap_or(Offset::ZERO);
                if committed < end {
                    return Err(format!(
                        "{NOT_CAUGHT_UP}: {} committed {committed} of {input} partition \
                         {partition} after running until caught up; its high watermark is {end}",
                        config.application
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whether a run writes store snapshots, and how often.
#[derive(Clone, Copy)]
enum Snapshots {
    AsConfigured,
    Every(Option<u64>),
}

/// A seed's settings for every application (or stage) it runs: the commit cadence,
/// snapshots, store kinds, and the tail oracle.
#[derive(Clone)]
struct Settings {
    commit_every_records: u64,
    /// The seed's snapshot cadence, replacing the configuration's (fault-free: kept).
    snapshots: Snapshots,
    /// The cache of every disk store, and whether memory stores become disk stores.
    disk: Option<(usize, bool)>,
    tail: Option<Arc<Oracle>>,
}

/// What the restore listener checks, shared with the seed's loop: the first violation, and
/// whether any store bit has rotted so far (damage without rot is a bug).
#[derive(Default)]
struct Oracle {
    violation: Mutex<Option<(FailureKind, String)>>,
    rotted: std::sync::atomic::AtomicBool,
}

impl Settings {
    /// The fault-free run: commits after every record, the stores as configured.
    const FAULT_FREE: Settings = Settings {
        commit_every_records: 1,
        snapshots: Snapshots::AsConfigured,
        disk: None,
        tail: None,
    };

    /// Draw a seed's settings; `memory` says whether its stores are memory stores by default.
    fn draw(rng: &mut Rng, memory: bool, tail: Arc<Oracle>) -> Settings {
        // Commits every few records, so crashes land between commits as well as inside them;
        // the outcome must not depend on where the commits fall.
        let commit_every_records = rng.between(1, 64);
        // Half the seeds restore from snapshots plus the changelog after them.
        let snapshots = Snapshots::Every(rng.chance(500_000).then(|| rng.between(1, 6)));
        // Memory stores on disk in half the seeds, and every disk store in a small budget of
        // its own (shared by its partitions): a memtable flushes at 8 to 512 bytes.
        let cache_bytes = rng.between(256, 16_384) as usize;
        let to_disk = memory && rng.chance(500_000);
        Settings {
            commit_every_records,
            snapshots,
            disk: Some((cache_bytes, to_disk)),
            tail: Some(tail),
        }
    }

    fn apply(&self, mut config: ProcessorConfig) -> ProcessorConfig {
        config.commit_every_records = Some(self.commit_every_records);
        // A budget of this run's own: simulations running side by side in one process never
        // share the process's, whose flush decisions would then depend on one another.
        if config.store_memory.is_none() {
            config.store_memory = Some(StoreMemory::new(StoreMemory::DEFAULT_BYTES));
        }
        // One thread, as documented: partitions restored side by side would share a budget in
        // an order no seed decides.
        config.threads = 1;
        if let Snapshots::Every(every) = self.snapshots {
            config.snapshot_every_commits = every;
        }
        if let Some((cache_bytes, to_disk)) = self.disk {
            let small = StoreKind::Disk(DiskOptions { budget_bytes: Some(cache_bytes) });
            if to_disk && config.store_kind == StoreKind::Memory {
                config.store_kind = small;
            }
            if matches!(config.store_kind, StoreKind::Disk(_)) {
                config.store_kind = small;
            }
            for kind in config.store_kinds.values_mut() {
                if matches!(kind, StoreKind::Disk(_)) {
                    *kind = small;
                }
            }
        }
        match &self.tail {
            Some(tail) => with_tail_oracle(config, Arc::clone(tail)),
            None => config,
        }
    }
}

type SimEngine = Engine<SimDisk>;

/// What a simulation's input topics are like.
#[derive(Clone, Copy, Debug)]
struct Inputs {
    /// The application's stores are memory stores by default.
    memory: bool,
    /// Compacted topics, compacted before the first run.
    compacted: bool,
}

/// Segments of compacted input topics: small, so that a few hundred records fill several
/// and compaction has sealed ones to empty.
const COMPACTED_SEGMENT_BYTES: u64 = 4096;

/// The simulated data directory.
const DATA: &str = "/data";
/// Chance that a bit of a synced store file (snapshot, run, manifest) rots before an attempt.
const ROT_PER_MILLION: u32 = 500_000;
/// Attempts without faults a seed may rerun to rebuild stores found damaged. Each condemns
/// at least one store and rots nothing, so the reruns end within the number of stores (a
/// task's stores times the partitions): this bounds a bug that would rerun forever.
const DAMAGE_RERUNS_MAX: u32 = 64;

/// Before an attempt that may fail: sometimes rot a bit of a store file, sometimes fail
/// I/O, and cut the power after some of the disk calls.
fn arm_faults(disk: &SimDisk, rng: &mut Rng, calls: u64, io_faults: Faults, oracle: &Oracle) {
    let with_io_faults = rng.chance(300_000);
    if rng.chance(ROT_PER_MILLION) {
        for _ in 0..rng.between(1, 3) {
            if disk.flip_bit_under(&Path::new(DATA).join("state"), rng).is_some() {
                oracle.rotted.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
    // Log-uniform up to the calls of a run committing every record: early and late cuts
    // alike, whatever the seed's commit cadence.
    let bits = u64::from(64 - calls.leading_zeros()).max(CUT_CALLS_MIN_LOG2);
    let log2 = rng.between(CUT_CALLS_MIN_LOG2, bits);
    disk.cut_power_after(rng.below(1 << log2));
    if with_io_faults {
        disk.set_faults(io_faults);
    }
}

/// What a seed's crashes keep and tear, and the same with I/O errors.
fn seed_faults(rng: &mut Rng) -> (Faults, Faults) {
    let kept = rng.below(1_000_001) as u32;
    let crash_faults = Faults {
        sector_kept_per_million: kept,
        sector_torn_per_million: rng.below(u64::from(1_000_000 - kept) + 1) as u32,
        resize_kept_per_million: rng.below(1_000_001) as u32,
        directory_kept_per_million: 200_000,
        directory_subset_per_million: if rng.chance(500_000) { 500_000 } else { 0 },
        ..Faults::NONE
    };
    let io_faults = Faults {
        read_error_per_million: 2_000,
        write_error_per_million: 2_000,
        sync_error_per_million: 2_000,
        ..crash_faults
    };
    (crash_faults, io_faults)
}

/// `config` with the tail oracle listening to its restores (and the listener it had): a
/// restore that starts from a snapshot's or disk store's offset reads no more records than
/// lie between that offset and the changelog's end.
fn with_tail_oracle(mut config: ProcessorConfig, oracle: Arc<Oracle>) -> ProcessorConfig {
    let theirs = config.on_restore.take();
    config.on_restore = Some(Arc::new(move |progress: RestoreProgress<'_>| {
        if let Some(listener) = &theirs {
            listener(progress);
        }
        let violated = |kind: FailureKind, detail: String| {
            oracle.violation.lock().expect("oracle lock").get_or_insert((kind, detail));
        };
        // A disk store found damaged at open, while no bit rotted: a crash or an I/O error
        // left it so, which the store's write protocol must never allow.
        let rotted = oracle.rotted.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(reason) = progress.rebuilt
            && !rotted
            && !reason.starts_with("missing: no store files")
            && !reason.starts_with("stale:")
        {
            violated(
                FailureKind::Damage,
                format!(
                    "store {:?} partition {}: rebuilt as damaged ({reason}) though no bit rotted",
                    progress.store, progress.partition
                ),
            );
        }
        let Some(from) = progress.from_snapshot.filter(|_| progress.done) else { return };
        let tail = progress.end.get().saturating_sub(from.get());
        if progress.restored > tail {
            violated(
                FailureKind::Tail,
                format!(
                    "store {:?} partition {}: the restore read {} changelog records, but only {tail} \
                 lie past offset {} its state starts from (the changelog ends at {})",
                    progress.store,
                    progress.partition,
                    progress.restored,
                    from.get(),
                    progress.end.get()
                ),
            );
        }
    }));
    config
}

/// The earliest power cuts come after at most 2^this many disk calls.
const CUT_CALLS_MIN_LOG2: u64 = 3;

impl Simulation {
    /// Run every seed (or only `CHRONIK_SIM_SEED`); stop at the first failure.
    pub fn run<P, F>(&self, factory: F) -> Result<SimulationReport, SimulationFailure>
    where
        P: Processor,
        F: FnMut(u32) -> P,
    {
        self.run_processor(factory, false)
    }

    /// [`Simulation::run`] on compacted input topics: `cleanup = compact` in segments of
    /// 4 KiB, compacted once the input is written and before any run, so that the processor
    /// reads past batches compaction emptied (give records keys, some of them repeated).
    /// Every run, the fault-free one included, sees the same compacted input; each must
    /// still read every input to its high watermark.
    pub fn run_on_compacted_input<P, F>(
        &self,
        factory: F,
    ) -> Result<SimulationReport, SimulationFailure>
    where
        P: Processor,
        F: FnMut(u32) -> P,
    {
        self.run_processor(factory, true)
    }

    fn run_processor<P, F>(
        &self,
        mut factory: F,
        compacted: bool,
    ) -> Result<SimulationReport, SimulationFailure>
    where
        P: Processor,
        F: FnMut(u32) -> P,
    {
        let memory = self.config.store_kind == StoreKind::Memory;
        let config = &self.config;
        let open = |engine: &SimEngine, settings: &Settings| {
            Runner::new(engine, settings.apply(config.clone()), &mut factory)
        };
        self.run_app(&config.inputs, Inputs { memory, compacted }, open, |_| Ok(()))
    }

    /// Run `topology` instead of a processor: its stages, with each seed's settings applied
    /// to every stage. `config` is not used (the topology has its own); input records go to
    /// [`Topology::sources`], in order ([`InputRecord::on`] indexes them).
    pub fn run_topology(&self, topology: &Topology) -> Result<SimulationReport, SimulationFailure> {
        self.run_topology_checked(topology, |_| Ok(()))
    }

    /// [`Simulation::run_topology`], also checking the fault-free run's outcome with `check`
    /// (every seed's must equal it): a model of what the topology must produce.
    pub fn run_topology_checked(
        &self,
        topology: &Topology,
        check: impl Fn(&Outcome) -> Result<(), String>,
    ) -> Result<SimulationReport, SimulationFailure> {
        let mut memory = false;
        topology.configure(|config| {
            memory = config.store_kind == StoreKind::Memory;
            config
        });
        let open = |engine: &SimEngine, settings: &Settings| {
            TopologyRunner::with(engine, topology, |config| settings.apply(config))
        };
        self.run_app(&topology.sources(), Inputs { memory, compacted: false }, open, check)
    }

    fn run_app<A: App>(
        &self,
        inputs: &[String],
        kind: Inputs,
        mut open: impl FnMut(&SimEngine, &Settings) -> Result<A, ProcessorError>,
        check: impl Fn(&Outcome) -> Result<(), String>,
    ) -> Result<SimulationReport, SimulationFailure> {
        let seeds = match std::env::var("CHRONIK_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
            Some(seed) => seed..seed + 1,
            None => self.seeds.clone(),
        };
        let failure =
            |seed, detail: String| SimulationFailure { seed, kind: FailureKind::Run, detail };
        let disk = SimDisk::new(Rng::new(0));
        let clock = SimClock::new(chronik_simdisk::clock::EPOCH_MS);
        let (engine, compacted) = self
            .setup(&disk, &clock, inputs, kind.compacted)
            .map_err(|e| failure(u64::MAX, format!("setup: {e}")))?;
        let before = disk.stats().calls;
        // Committing after every record: the most disk calls a seed's run can make, the range
        // its power cuts are drawn from.
        let mut app = open(&engine, &Settings::FAULT_FREE)
            .map_err(|e| failure(u64::MAX, format!("fault-free run: {e}")))?;
        app.run_until_caught_up().map_err(|e| failure(u64::MAX, format!("fault-free run: {e}")))?;
        check_caught_up(&engine, &app).map_err(|e| failure(u64::MAX, e))?;
        let calls = disk.stats().calls - before;
        let (expected, damaged) = self.outcome(&engine, &app).map_err(|e| failure(u64::MAX, e))?;
        if damaged {
            return Err(failure(u64::MAX, "the fault-free run read a damaged store".into()));
        }
        check(&expected).map_err(|detail| SimulationFailure {
            seed: u64::MAX,
            kind: FailureKind::Model,
            detail: format!("the fault-free run: {detail}"),
        })?;
        drop(app);
        drop(engine);
        let mut report = SimulationReport::default();
        for seed in seeds {
            let found = self.run_seed(seed, calls, inputs, kind, &mut open, &mut report)?;
            if let Some((kind, detail)) = difference(&expected, &found) {
                return Err(SimulationFailure { seed, kind, detail });
            }
            report.seeds += 1;
            report.input_records_compacted += compacted;
        }
        Ok(report)
    }

    fn run_seed<A: App>(
        &self,
        seed: u64,
        calls: u64,
        inputs: &[String],
        kind: Inputs,
        open: &mut impl FnMut(&SimEngine, &Settings) -> Result<A, ProcessorError>,
        report: &mut SimulationReport,
    ) -> Result<Outcome, SimulationFailure> {
        let failure = |detail: String| SimulationFailure { seed, kind: FailureKind::Run, detail };
        let mut rng = Rng::new(seed);
        let disk = SimDisk::new(rng.fork());
        let clock = SimClock::new(chronik_simdisk::clock::EPOCH_MS);
        let (crash_faults, io_faults) = seed_faults(&mut rng);
        disk.set_faults(crash_faults);
        let oracle: Arc<Oracle> = Arc::default();
        let settings = Settings::draw(&mut rng, kind.memory, Arc::clone(&oracle));
        let tail = || oracle.violation.lock().expect("oracle lock").take();
        let tail_failure = |(kind, detail)| SimulationFailure { seed, kind, detail };
        let (engine, _) = self
            .setup(&disk, &clock, inputs, kind.compacted)
            .map_err(|e| failure(format!("setup: {e}")))?;
        let mut engine = Some(engine);
        // A rotted store file may surface only when the outcome is read, or in the last
        // attempt; every store found damaged is condemned, and the run goes on without faults
        // (no rot, no cut), so each rerun rebuilds at least one store for good.
        let mut damage_reruns = DAMAGE_RERUNS_MAX;
        let mut rebuilding = false;
        let mut attempt = 0;
        loop {
            let last = attempt >= self.crashes_max || rebuilding;
            attempt += 1;
            if let Some(detail) = tail() {
                return Err(tail_failure(detail));
            }
            let live = match engine.take() {
                Some(engine) => engine,
                None => open_engine(&disk, &clock).map_err(|e| failure(format!("reopen: {e}")))?,
            };
            if !last {
                arm_faults(&disk, &mut rng, calls, io_faults, &oracle);
            }
            let result = open(&live, &settings).and_then(|mut runner| {
                let stats = runner.run_until_caught_up();
                stats.map(|stats| (runner, stats))
            });
            disk.set_faults(crash_faults);
            report.add_store_work(&live.metrics());
            if let Some(detail) = tail() {
                return Err(tail_failure(detail));
            }
            match result {
                Ok((runner, stats)) if !disk.power_is_cut() && live.poisoned().is_none() => {
                    report.records_processed += stats.records;
                    if !last {
                        disk.restore_power();
                    }
                    let (outcome, damaged_read) = self.outcome(&live, &runner).map_err(failure)?;
                    check_caught_up(&live, &runner).map_err(failure)?;
                    // Every store checked: each damaged one is condemned, and a store whose
                    // damage the outcome's reading met was condemned then.
                    let damaged = condemn_damaged(&runner) + usize::from(damaged_read);
                    if damaged == 0 {
                        return Ok(outcome);
                    }
                    if damage_reruns == 0 {
                        return Err(failure(format!(
                            "a damaged store was not rebuilt: {damaged} damaged after \
                             {DAMAGE_RERUNS_MAX} reruns without faults"
                        )));
                    }
                    // Rot the run never read surfaced when the outcome was read: the stores
                    // are condemned, and the next attempt, without faults, rebuilds them.
                    damage_reruns -= 1;
                    rebuilding = true;
                    report.crashes += 1;
                    drop(runner);
                    drop(live);
                    disk.restore_power();
                }
                Err(ProcessorError::Store { source: StoreError::Damaged(_), .. })
                    if last && damage_reruns > 0 =>
                {
                    damage_reruns -= 1;
                    rebuilding = true;
                    drop(live);
                    disk.restore_power();
                }
                Ok(_)
                | Err(
                    ProcessorError::Commit(_)
                    | ProcessorError::Read(_)
                    | ProcessorError::Topic(_)
                    | ProcessorError::Store { .. },
                ) => {
                    report.crashes += 1;
                    drop(live);
                    if disk.power_is_cut() || rng.chance(500_000) {
                        // A power loss (or a process killed, then the machine lost power).
                        disk.crash(&mut rng);
                    } else {
                        // The process restarts; the machine did not crash.
                        disk.restore_power();
                    }
                }
                Err(error) if last => {
                    return Err(failure(format!("the run without faults failed: {error}")));
                }
                Err(error) => {
                    if !disk.power_is_cut() && live.poisoned().is_none() {
                        return Err(failure(format!("the processor failed: {error}")));
                    }
                    report.crashes += 1;
                    drop(live);
                    disk.crash(&mut rng);
                }
            }
        }
    }

    /// A disk with the topics and the input (compacted, with `compacted`), and how many
    /// input records compaction removed.
    fn setup(
        &self,
        disk: &SimDisk,
        clock: &SimClock,
        inputs: &[String],
        compacted: bool,
    ) -> Result<(SimEngine, u64), String> {
        let engine = open_engine(disk, clock)?;
        let mut input = TopicConfig { partitions: self.input_partitions, ..TopicConfig::default() };
        if compacted {
            input.cleanup = Cleanup::Compact;
            input.segment_bytes = COMPACTED_SEGMENT_BYTES;
            input.min_cleanable_dirty_ratio = 0.0;
        }
        for topic in inputs {
            engine.create_topic(topic, input).map_err(|e| e.to_string())?;
        }
        for (topic, partitions) in &self.outputs {
            let config = TopicConfig { partitions: *partitions, ..TopicConfig::default() };
            engine.create_topic(topic, config).map_err(|e| e.to_string())?;
        }
        for record in &self.input {
            let mut view = Record::new(record.key.as_deref(), &record.value);
            if let Some(timestamp) = record.timestamp {
                view = view.with_timestamp(timestamp);
            }
            let topic = inputs
                .get(record.input)
                .ok_or("an input record's input is not one of the inputs")?;
            engine.append(topic, record.partition, &[view]).map_err(|e| e.to_string())?;
        }
        let mut removed = 0;
        if compacted {
            // Records are cleanable once their time has come: the clock goes past the
            // latest input timestamp first.
            let latest = self.input.iter().filter_map(|r| r.timestamp).max().unwrap_or(0);
            let now = engine.now_ms();
            if latest >= now {
                clock.advance(u64::try_from(latest - now).unwrap_or(0) + 1);
            }
            for topic in inputs {
                for partition in 0..self.input_partitions {
                    let report =
                        engine.compact_partition(topic, partition).map_err(|e| e.to_string())?;
                    removed += report.map_or(0, |r| r.records_in - r.records_kept);
                }
            }
        }
        Ok((engine, removed))
    }

    /// The stores and outputs after a run, and whether reading a store met damage (each
    /// damaged store is then condemned, so the next runner rebuilds it: every store is read,
    /// not only up to the first damaged one).
    fn outcome(&self, engine: &SimEngine, app: &impl App) -> Result<(Outcome, bool), String> {
        let mut outcome = Outcome::default();
        let mut damaged = false;
        for (name, partition, store) in app.every_store() {
            let mut entries = Vec::new();
            for entry in store {
                match entry {
                    Ok((k, v)) => entries.push((k.to_vec(), v.to_vec())),
                    Err(StoreError::Damaged(_)) => damaged = true,
                    Err(e) => return Err(format!("store {name} of partition {partition}: {e}")),
                }
            }
            outcome.stores.insert((name.to_owned(), partition), entries);
        }
        for (topic, partitions) in &self.outputs {
            for partition in 0..*partitions {
                let mut records = Vec::new();
                let mut from = Offset::ZERO;
                loop {
                    let fetch =
                        engine.read(topic, partition, from, 1 << 20).map_err(|e| e.to_string())?;
                    if fetch.is_empty() {
                        break;
                    }
                    for record in fetch.records().filter(|r| r.offset() >= from) {
                        records.push((record.key().map(<[u8]>::to_vec), record.value().to_vec()));
                    }
                    from = fetch.next_offset();
                }
                outcome.outputs.insert((topic.clone(), partition), records);
            }
        }
        Ok((outcome, damaged))
    }
}

fn open_engine(disk: &SimDisk, clock: &SimClock) -> Result<SimEngine, String> {
    let options = Options { durability: Durability::Sync, ..Options::default() };
    Engine::open(disk.clone(), clock.shared(), Path::new(DATA), options)
        .map(|(engine, _)| engine)
        .map_err(|e| e.to_string())
}

/// The first difference between the fault-free outcome and a seed's, described.
fn difference(expected: &Outcome, found: &Outcome) -> Option<(FailureKind, String)> {
    for (key, entries) in &expected.stores {
        let other = found.stores.get(key).map(Vec::as_slice).unwrap_or_default();
        if entries.as_slice() != other {
            let (store, partition) = key;
            let first = entries.iter().zip(other).position(|(a, b)| a != b);
            return Some((
                FailureKind::State,
                format!(
                    "store {store:?} partition {partition} differs from the fault-free run: {} \
                 entries, expected {}; first difference at entry {first:?}",
                    other.len(),
                    entries.len()
                ),
            ));
        }
    }
    for (key, records) in &expected.outputs {
        let other = found.outputs.get(key).map(Vec::as_slice).unwrap_or_default();
        if records.as_slice() != other {
            let (topic, partition) = key;
            let first = records.iter().zip(other).position(|(a, b)| a != b);
            return Some((
                FailureKind::Outputs,
                format!(
                    "output {topic:?} partition {partition} differs from the fault-free run: {} \
                 records, expected {} (duplicated, lost or different); first difference at \
                 record {first:?}",
                    other.len(),
                    records.len()
                ),
            ));
        }
    }
    None
}

#[cfg(feature = "kafka")]
mod broker;
#[cfg(feature = "kafka")]
pub use broker::{TestBroker, TestCertificates};
