//! A bit of synced data rots under the live engine: what every read serves afterwards,
//! before and after a crash and a recovery.

use super::Sim;
use crate::disk::BitFlip;
use crate::model::{ModelRecord, TopicState};
use crate::oracle::{self, SimEngine, Violation};
use crate::workload::TOPIC;
use chronik_engine::{Durability, Offset, OpenError, ReadError, RecoveryReport};

/// Random reads of every partition after a bit flip, besides the full scan.
const ROT_READS_PER_PARTITION: u64 = 4;

impl Sim {
    /// One bit of synced data rots under the live engine. Every read, before and after a
    /// crash and a recovery, serves exactly the bytes written or reports `Corruption`; records
    /// known durable may go missing only where the damage was reported (a read's corruption,
    /// damage or a cut tail at recovery, or an open refused as corrupt). Ends the run: what
    /// comes next on a damaged partition is the operator's call.
    pub(super) fn rot(&mut self, engine: SimEngine, flip: &BitFlip) -> Result<(), Violation> {
        self.ended = true;
        self.counters.bit_flips += 1;
        self.trace.event(format!(
            "bit flip: {} byte {} bit {}",
            flip.path.display(),
            flip.position,
            flip.bit
        ));
        self.check_rot(&engine, None)?;
        self.close_engine(engine);
        self.crash();
        match self.open_engine(Durability::Sync) {
            Ok((engine, report)) => {
                self.check_mark()?;
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
    pub(super) fn check_rot(
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
                    "partition {partition}: {durable} durable records, {end} served after a bit \
                     flip, and no damage reported"
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
    pub(super) fn rot_read(
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
                        "partition {partition}: empty fetch at {next} below the high watermark \
                         {high_watermark}, after a bit flip"
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
}
