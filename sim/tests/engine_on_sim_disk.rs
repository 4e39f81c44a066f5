//! The real engine on the simulated disk, over many seeds: append in `Sync` mode, crash at a
//! random point in one of three ways, reopen on the same disk, and check that every
//! acknowledged record survived byte for byte and that each partition is a prefix of what was
//! appended, with offsets contiguous from zero.

use chronik_engine::{
    AppendError, Durability, Engine, Offset, Options, ReadError, Record, RecoveryReport,
    TopicConfig,
};
use chronik_sim::clock::EPOCH_MS;
use chronik_sim::{Faults, Rng, SimClock, SimDisk};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const SEEDS: u64 = 50;
const ROUNDS: u32 = 4;
const TOPIC: &str = "events";
const PARTITIONS: u32 = 2;
const STEPS_MAX: u64 = 40;
const VALUE_BYTES_MAX: u64 = 700;

/// A record as the test remembers it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Owned {
    key: Option<Vec<u8>>,
    value: Vec<u8>,
}

/// How a round ends.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// Drop the engine (its close flushes), then crash the disk.
    CleanClose,
    /// Crash the disk under a live engine, then leak the engine: the process died.
    CrashThenLeak,
    /// Cut the power after a random number of disk calls, so an append fails midway; then
    /// crash and leak the engine.
    PowerCut,
}

type SimEngine = Engine<SimDisk>;

/// What the seeds exercised, printed at the end so a run that checks nothing is visible.
#[derive(Debug, Default)]
struct Summary {
    acknowledged_batches: u64,
    failed_appends: u64,
    failed_batches_recovered: u64,
    truncated_bytes: u64,
    clean_closes: u64,
    crashes_under_a_live_engine: u64,
    power_cuts_reached: u64,
    crashes: u64,
    failed_syncs: u64,
    topic_creations_cut: u64,
}

struct Run {
    seed: u64,
    rng: Rng,
    disk: SimDisk,
    clock: SimClock,
    /// What each partition must hold after recovery: every acknowledged record, in order.
    acknowledged: Vec<Vec<Owned>>,
    /// The batch whose append failed: after recovery it is there entirely or not at all.
    in_flight: Option<(u32, Vec<Owned>)>,
    topic_exists: bool,
    /// How this seed's crashes treat unsynced state (swarm: weights vary per seed).
    crash_faults: Faults,
    summary: Summary,
}

fn small_segments() -> TopicConfig {
    TopicConfig {
        partitions: PARTITIONS,
        segment_bytes: 4096,
        index_interval_bytes: 512,
        ..TopicConfig::default()
    }
}

impl Run {
    fn new(seed: u64) -> Run {
        let mut rng = Rng::new(seed);
        let disk = SimDisk::new(rng.fork());
        let kept = rng.below(1_000_001) as u32;
        let crash_faults = Faults {
            sector_kept_per_million: kept,
            sector_torn_per_million: rng.below(u64::from(1_000_000 - kept) + 1) as u32,
            resize_kept_per_million: rng.below(1_000_001) as u32,
            directory_kept_per_million: if rng.chance(500_000) { 500_000 } else { 0 },
            ..Faults::NONE
        };
        disk.set_faults(crash_faults);
        Run {
            seed,
            rng,
            disk,
            clock: SimClock::new(EPOCH_MS),
            acknowledged: vec![Vec::new(); PARTITIONS as usize],
            in_flight: None,
            topic_exists: false,
            crash_faults,
            summary: Summary::default(),
        }
    }

    fn open(&mut self) -> SimEngine {
        self.open_reporting().0
    }

    fn open_reporting(&mut self) -> (SimEngine, RecoveryReport) {
        let options = Options { durability: Durability::Sync, ..Options::default() };
        let (engine, report) =
            Engine::open(self.disk.clone(), self.clock.shared(), Path::new("/data"), options)
                .unwrap_or_else(|e| panic!("seed {}: open failed: {e}", self.seed));
        self.summary.truncated_bytes += report.truncated_bytes();
        for partition in &report.partitions {
            assert!(partition.damage.is_empty(), "seed {}: {:?}", self.seed, report.lines());
        }
        let topics = engine.list_topics();
        if self.topic_exists {
            assert_eq!(topics, [TOPIC], "seed {}: an acknowledged topic was lost", self.seed);
        } else {
            // A creation cut short by a crash is either complete or gone, never half there.
            assert!(topics.is_empty() || topics == [TOPIC], "seed {}: {topics:?}", self.seed);
            self.topic_exists = !topics.is_empty();
        }
        (engine, report)
    }

    /// Check every partition against the model, then adopt what recovery kept.
    fn check(&mut self, engine: &SimEngine) {
        if !self.topic_exists {
            return;
        }
        let mut in_flight = self.in_flight.take();
        for partition in 0..PARTITIONS {
            let recovered = read_all(engine, partition, self.seed);
            let expected = &mut self.acknowledged[partition as usize];
            let seed = self.seed;
            assert!(recovered.len() >= expected.len(), "seed {seed}: acknowledged records lost");
            assert_eq!(recovered[..expected.len()], expected[..], "seed {seed}: bytes differ");
            let extra = &recovered[expected.len()..];
            if !extra.is_empty() {
                let batch = match &in_flight {
                    Some((p, batch)) if *p == partition => batch,
                    _ => panic!("seed {seed}: partition {partition} invented {extra:?}"),
                };
                assert_eq!(extra, &batch[..], "seed {seed}: a failed batch came back in part");
                self.summary.failed_batches_recovered += 1;
                in_flight = None;
            }
            *expected = recovered;
        }
    }

    fn batch(&mut self) -> Vec<Owned> {
        let count = self.rng.between(1, 4);
        (0..count)
            .map(|_| {
                let key = self.rng.chance(500_000).then(|| self.rng.bytes(8));
                let length = self.rng.below(VALUE_BYTES_MAX) as usize;
                Owned { key, value: self.rng.bytes(length) }
            })
            .collect()
    }

    /// Append random batches until the steps run out or an append fails.
    fn workload(&mut self, engine: &SimEngine) {
        let steps = self.rng.between(1, STEPS_MAX);
        for _ in 0..steps {
            self.clock.advance(self.rng.below(50));
            let partition = self.rng.below(u64::from(PARTITIONS)) as u32;
            let batch = self.batch();
            let records: Vec<Record<'_>> =
                batch.iter().map(|r| Record::new(r.key.as_deref(), &r.value)).collect();
            match engine.append(TOPIC, partition, &records) {
                Ok(appended) => {
                    let expected = &mut self.acknowledged[partition as usize];
                    assert_eq!(appended.base_offset, Offset::new(expected.len() as u64));
                    let last = expected.len() as u64 + batch.len() as u64 - 1;
                    assert_eq!(appended.last_offset, Offset::new(last));
                    expected.extend(batch);
                    self.summary.acknowledged_batches += 1;
                }
                // An earlier append that was acknowledged may have poisoned the engine after
                // its fsync (a failed checkpoint write): then this batch was never written.
                Err(AppendError::Poisoned(_)) => return,
                Err(error) => {
                    assert!(matches!(error, AppendError::Io(_)), "seed {}: {error}", self.seed);
                    assert!(engine.poisoned().is_some(), "seed {}: fail-stop", self.seed);
                    self.in_flight = Some((partition, batch));
                    self.summary.failed_appends += 1;
                    return;
                }
            }
            if self.rng.chance(100_000) {
                // Reads return exactly the acknowledged bytes while the engine runs, unless
                // the power went out under the read or an acknowledged append poisoned it.
                match try_read_all(engine, partition, self.seed) {
                    Ok(read) => assert_eq!(read, self.acknowledged[partition as usize]),
                    // A read EIO fails that read only; a poisoned engine refuses reads.
                    Err(ReadError::Poisoned(_)) => return,
                    Err(ReadError::Io(_)) if self.disk.faults().read_error_per_million > 0 => {}
                    Err(error) => {
                        assert!(self.disk.power_is_cut(), "seed {}: {error}", self.seed);
                        return;
                    }
                }
            }
        }
    }

    fn round(&mut self) {
        let mut engine = self.open();
        self.check(&engine);
        if self.rng.chance(200_000) {
            // Recovery is idempotent: a second open without a crash finds nothing to repair.
            drop(engine);
            let (reopened, report) = self.open_reporting();
            assert!(report.is_clean(), "seed {}: {:?}", self.seed, report.lines());
            engine = reopened;
            self.check(&engine);
        }
        let ending = match self.rng.below(3) {
            0 => Ending::CleanClose,
            1 => Ending::CrashThenLeak,
            _ => Ending::PowerCut,
        };
        if let Ending::PowerCut = ending {
            self.disk.cut_power_after(self.rng.below(400));
        }
        if !self.topic_exists {
            match engine.create_topic(TOPIC, small_segments()) {
                Ok(()) => self.topic_exists = true,
                // The power went out during creation: the next open tells whether it stuck.
                Err(error) => {
                    assert!(self.disk.power_is_cut(), "seed {}: {error}", self.seed);
                    self.summary.topic_creations_cut += 1;
                }
            }
        }
        if self.rng.chance(300_000) {
            // Rare I/O errors: each one poisons the engine and ends the workload.
            let faults = Faults {
                read_error_per_million: 3_000,
                write_error_per_million: 3_000,
                sync_error_per_million: 3_000,
                ..self.crash_faults
            };
            self.disk.set_faults(faults);
        }
        if self.topic_exists {
            self.workload(&engine);
        }
        self.disk.set_faults(self.crash_faults);
        self.summary.power_cuts_reached += u64::from(self.disk.power_is_cut());
        let mut crash_rng = self.rng.fork();
        match ending {
            Ending::CleanClose => {
                drop(engine);
                assert_eq!(self.disk.open_handles(), 0, "seed {}: a close leaked", self.seed);
                self.summary.clean_closes += 1;
                self.disk.crash(&mut crash_rng);
            }
            Ending::CrashThenLeak | Ending::PowerCut => {
                self.summary.crashes_under_a_live_engine += 1;
                self.disk.crash(&mut crash_rng);
                std::mem::forget(engine);
            }
        }
    }

    /// All rounds, then a last recovery check; returns the final disk for determinism checks.
    fn run(self) -> (BTreeMap<PathBuf, Vec<u8>>, u64) {
        self.run_summarised().0
    }

    fn run_summarised(mut self) -> ((BTreeMap<PathBuf, Vec<u8>>, u64), Summary) {
        for _ in 0..ROUNDS {
            self.round();
        }
        let engine = self.open();
        self.check(&engine);
        // Offsets continue after recovery: never reused.
        for partition in 0..PARTITIONS {
            let next = self.acknowledged[partition as usize].len() as u64;
            let appended = engine.append(TOPIC, partition, &[Record::new(None, b"after")]);
            assert_eq!(appended.unwrap().base_offset, Offset::new(next), "seed {}", self.seed);
        }
        drop(engine);
        let stats = self.disk.stats();
        self.summary.crashes = stats.crashes;
        self.summary.failed_syncs = stats.failed_syncs;
        ((self.disk.snapshot(), self.disk.trace_hash()), self.summary)
    }
}

/// Every visible record of a partition, checking offsets are contiguous from zero.
fn read_all(engine: &SimEngine, partition: u32, seed: u64) -> Vec<Owned> {
    try_read_all(engine, partition, seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"))
}

fn try_read_all(engine: &SimEngine, partition: u32, seed: u64) -> Result<Vec<Owned>, ReadError> {
    let mut records = Vec::new();
    let mut next = Offset::ZERO;
    loop {
        let fetch = engine.read(TOPIC, partition, next, 1 << 16)?;
        if fetch.is_empty() {
            assert_eq!(next, engine.high_watermark(TOPIC, partition)?, "seed {seed}");
            return Ok(records);
        }
        for record in fetch.records() {
            assert_eq!(record.offset(), Offset::new(records.len() as u64), "seed {seed}: hole");
            records.push(Owned {
                key: record.key().map(<[u8]>::to_vec),
                value: record.value().to_vec(),
            });
        }
        assert!(fetch.next_offset() > next, "seed {seed}: a fetch moves forward");
        next = fetch.next_offset();
    }
}

/// The seeds to run: `SEEDS` from 0, or `CHRONIK_SIM_SEEDS=first..end` to explore more.
fn seeds() -> std::ops::Range<u64> {
    let Ok(range) = std::env::var("CHRONIK_SIM_SEEDS") else {
        return 0..SEEDS;
    };
    let (first, end) = range.split_once("..").expect("CHRONIK_SIM_SEEDS=first..end");
    first.parse().expect("a first seed")..end.parse().expect("an end seed")
}

#[test]
fn acknowledged_records_survive_crashes_on_every_seed() {
    let mut total = Summary::default();
    let seeds = seeds();
    for seed in seeds.clone() {
        let (_, summary) = Run::new(seed).run_summarised();
        total.acknowledged_batches += summary.acknowledged_batches;
        total.failed_appends += summary.failed_appends;
        total.failed_batches_recovered += summary.failed_batches_recovered;
        total.truncated_bytes += summary.truncated_bytes;
        total.clean_closes += summary.clean_closes;
        total.crashes_under_a_live_engine += summary.crashes_under_a_live_engine;
        total.power_cuts_reached += summary.power_cuts_reached;
        total.crashes += summary.crashes;
        total.failed_syncs += summary.failed_syncs;
        total.topic_creations_cut += summary.topic_creations_cut;
    }
    eprintln!("seeds {seeds:?}: {total:?}");
    // The run must have exercised the interesting paths, or it proves nothing.
    assert!(total.acknowledged_batches > 0 && total.crashes > 0);
    assert!(total.failed_appends > 0 && total.truncated_bytes > 0);
}

#[test]
fn the_same_seed_gives_the_same_disk() {
    for seed in [0, 7, 31] {
        assert_eq!(Run::new(seed).run(), Run::new(seed).run(), "seed {seed}");
    }
    assert_ne!(Run::new(1).run(), Run::new(2).run());
}

#[test]
fn a_failed_fsync_poisons_the_engine_and_recovery_keeps_the_acknowledged() {
    for seed in 0..20 {
        let mut run = Run::new(seed);
        let engine = run.open();
        engine.create_topic(TOPIC, small_segments()).unwrap();
        run.topic_exists = true;
        for _ in 0..run.rng.between(1, 20) {
            let length = run.rng.below(VALUE_BYTES_MAX) as usize;
            let value = run.rng.bytes(length);
            engine.append(TOPIC, 0, &[Record::new(None, &value)]).unwrap();
            run.acknowledged[0].push(Owned { key: None, value });
        }
        run.disk.fail_next_syncs(1);
        let error = engine.append(TOPIC, 0, &[Record::new(None, b"doomed")]).unwrap_err();
        assert!(matches!(error, AppendError::Io(_)), "seed {seed}: {error}");
        assert!(engine.poisoned().is_some());
        let error = engine.append(TOPIC, 1, &[Record::new(None, b"later")]).unwrap_err();
        assert!(matches!(error, AppendError::Poisoned(_)), "seed {seed}: {error}");
        let syncs = run.disk.stats().syncs;
        drop(engine);
        assert_eq!(run.disk.stats().syncs, syncs, "seed {seed}: a poisoned engine synced");
        run.disk.crash(&mut Rng::new(seed));
        // Linux dropped the doomed batch's pages at the failed fsync: it cannot come back.
        let engine = run.open();
        run.check(&engine);
        assert_eq!(read_all(&engine, 1, seed), []);
    }
}
