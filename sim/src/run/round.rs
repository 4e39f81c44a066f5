//! The life of a round: the open (sometimes under faults, sometimes twice), the workload's
//! steps, the ending (a clean close, a crash under the live engine or a restart), and the
//! final open and liveness phase of a run.

use super::steps::ok_or_error;
use super::{Ending, Feature, Flow, LastClose, Sim};
use crate::model::{ModelRecord, TopicState};
use crate::oracle::{self, Scan, SimEngine, Violation};
use crate::workload::TOPIC;
use chronik_engine::{
    CloseError, Durability, Engine, Offset, OpenError, Options, Record, RecoveryReport,
};
use std::path::Path;

/// Largest power-cut delay, in disk calls.
const POWER_CUT_CALLS_MAX: u64 = 400;

/// Chance (per million) that an open is followed by a close and a second open.
const DOUBLE_OPEN_PER_MILLION: u32 = 200_000;

/// Largest power-cut delay of a faulty open, in disk calls: recovery makes few.
const OPEN_POWER_CUT_CALLS_MAX: u64 = 60;

/// Most disk calls into a clean close before a power cut armed there fires.
const CLOSE_POWER_CUT_CALLS_MAX: u64 = 40;

/// Batches each partition takes in the liveness phase at the end of a run.
const LIVENESS_BATCHES: u64 = 3;

impl Sim {
    /// `Engine::open` on the simulated disk, its disk calls charged as simulated time.
    pub(super) fn open_engine(
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
        // Small recovery points on some opens, so that runs make many and crashes land
        // around their writes; the default (tens of MiB) on the others.
        let recovery_point_bytes = if (self.rounds + self.ops_done).is_multiple_of(2) {
            512 * (1 + self.rounds % 8)
        } else {
            0
        };
        let options = Options {
            durability,
            direct_io,
            write_shards,
            recovery_point_bytes,
            ..Options::default()
        };
        let before = self.disk.stats();
        let opened =
            Engine::open(self.disk.clone(), self.clock.shared(), Path::new("/data"), options);
        self.spend_io(before);
        if let Ok((_, report)) = &opened {
            if report.clean_shutdown && self.last_close != LastClose::Complete {
                let detail = "an open found the clean-shutdown mark, but the engine before it \
                              did not close completely"
                    .to_owned();
                self.lying_mark = self.lying_mark.take().or(Some(detail));
            }
            // A writer is live: from here on a mark would lie until its close completes.
            self.last_close = LastClose::Incomplete;
        }
        opened
    }

    /// Fail if an open found a clean-shutdown mark that lies.
    pub(super) fn check_mark(&mut self) -> Result<(), Violation> {
        match self.lying_mark.take() {
            Some(detail) => Err(Violation::new("clean_shutdown_mark_true", detail)),
            None => Ok(()),
        }
    }

    /// Close the engine through [`Engine::close`], and remember whether every partition
    /// closed (only a mark written after that may be found by the next open).
    pub(super) fn close_engine(&mut self, engine: SimEngine) {
        let closed = engine.close();
        self.trace.event(format!("close: {}", ok_or_error(&closed)));
        self.last_close = match closed {
            Ok(()) | Err(CloseError::Mark(_)) => LastClose::Complete,
            Err(_) => LastClose::Incomplete,
        };
    }

    pub(super) fn open(&mut self) -> Result<(SimEngine, RecoveryReport), Violation> {
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
        self.check_mark()?;
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
    pub(super) fn faulty_open(&mut self) -> Result<(), Violation> {
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
                self.check_mark()?;
                Self::check_no_damage(&report)?;
                self.close_engine(engine);
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

    pub(super) fn round(&mut self) -> Result<(), Violation> {
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

    /// Close and open again without a crash: nothing to repair, the same records.
    pub(super) fn reopen_idempotent(
        &mut self,
        engine: SimEngine,
        scan: &Scan,
    ) -> Result<SimEngine, Violation> {
        const ORACLE: &str = "recovery_idempotent";
        self.close_engine(engine);
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

    pub(super) fn create_topic(&mut self, engine: &SimEngine) -> Result<(), Violation> {
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

    pub(super) fn end_round(&mut self, engine: SimEngine, ending: Ending) -> Result<(), Violation> {
        self.trace.event(format!("end round {}: {ending:?}", self.rounds));
        match ending {
            Ending::CleanClose | Ending::Restart => {
                if engine.flush().is_ok() {
                    self.model.all_synced();
                }
                // Now and then the power goes in the middle of the close: the mark must not
                // be found by the next open unless every partition closed before the cut.
                let cut = ending == Ending::CleanClose
                    && self.has(Feature::PowerCuts)
                    && self.fault_rng.chance(crate::rng::PER_MILLION / 4);
                if cut {
                    let calls = self.fault_rng.below(CLOSE_POWER_CUT_CALLS_MAX);
                    self.trace.event(format!("power cut armed {calls} calls into the close"));
                    self.disk.cut_power_after(calls);
                }
                self.close_engine(engine);
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
                self.close_engine(engine);
                self.crash();
            }
        }
        Ok(())
    }

    /// The last recovery check, then the liveness phase: with every fault off (no I/O errors,
    /// no power cut), the topic is created if it is missing, and every partition takes
    /// [`LIVENESS_BATCHES`] appends at the offsets after the acknowledged records (none
    /// reused), a flush, and a read that returns exactly them: the engine makes progress
    /// again after whatever the run did to it.
    pub(super) fn finish(&mut self) -> Result<(), Violation> {
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
}
