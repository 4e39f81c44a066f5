//! Maintenance under power cuts: retention after a tick, deletes of records, forced
//! compactions, and the power cuts armed inside them.

use super::{Feature, Flow, Sim};
use crate::oracle::{self, SimEngine, Violation};
use crate::workload::TOPIC;
use chronik_engine::{AppendError, Offset};

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

impl Sim {
    /// Sometimes arm a power cut inside the maintenance work about to run (retention,
    /// compaction and its segment swaps), where a round's cut rarely lands.
    pub(super) fn maybe_cut_power_in_maintenance(&mut self, during: &str, per_million: u32) {
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
    pub(super) fn end_maintenance_cut(&mut self) {
        if self.tick_armed_cut && !self.disk.power_is_cut() {
            self.disk.restore_power();
            self.tick_armed_cut = false;
            self.trace.event("power cut disarmed: not reached".to_owned());
        }
    }

    /// After a successful tick: where retention moved a log start, it left at least
    /// `retention_bytes` of what was acknowledged (it removes a segment only while what stays
    /// is that long), and never went past the bound of the `retention_bounds` oracle. Then the
    /// model takes the new log starts.
    pub(super) fn retention_left(&mut self, engine: &SimEngine) -> Result<(), Violation> {
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

    /// `Engine::delete_records` below a visible offset: the log start it answers is never
    /// past the offset asked for (nor past an earlier request or retention's bound), never
    /// back, and readers then see it.
    pub(super) fn delete_records(
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
    pub(super) fn compact(
        &mut self,
        engine: &SimEngine,
        partition: u32,
    ) -> Result<Flow, Violation> {
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
}
