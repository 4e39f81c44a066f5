//! The checks after every open: the oracles, then what the model alone knows to check
//! (transactions, committed positions, the SDK's group consumers), before the model adopts
//! what recovery kept.

use super::{GROUP, Sabotage, Sim};
use crate::model::{ModelBatch, ModelRecord, TopicState};
use crate::oracle::{self, Context, Scan, ScannedRecord, SimEngine, Violation};
use crate::workload::{SCRATCH, TOPIC};
use chronik_engine::{Durability, Offset, RecoveryReport};

/// The consumer group of the SDK's group consumers (`chronik::Consumer::in_group`),
/// recreated at every open.
const SDK_GROUP: &str = "sdk";

/// Most records a group consumer iterates after an open before it commits (one that polls
/// takes the whole fetch that reaches them).
const SDK_GROUP_RECORDS_MAX: u64 = 64;

/// Largest `max_bytes` of a group consumer's polls.
const SDK_GROUP_POLL_BYTES_MAX: u64 = 4096;

impl Sim {
    /// The disk flips no bits yet, so recovery must never find damaged synced data. Checked
    /// after the other oracles, which say better what the damage cost.
    pub(super) fn check_no_damage(report: &RecoveryReport) -> Result<(), Violation> {
        if let Some(damaged) = report.partitions.iter().find(|p| !p.damage.is_empty()) {
            let detail = format!("recovery found damage without bit flips: {:?}", damaged.damage);
            return Err(Violation::new("no_damage_without_corruption", detail));
        }
        Ok(())
    }

    /// Run the oracles on a freshly opened engine, then adopt what recovery kept.
    pub(super) fn check(&mut self, engine: &SimEngine) -> Result<Scan, Violation> {
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

    /// After an open: a failed transaction left all of its batches and its position, or
    /// none of them.
    pub(super) fn check_transaction(
        &mut self,
        engine: &SimEngine,
        scan: &Scan,
    ) -> Result<(), Violation> {
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

    /// After an open: the group's committed position of every partition is the last
    /// acknowledged commit, or a failed one after it.
    pub(super) fn check_commits(&mut self, engine: &SimEngine) -> Result<(), Violation> {
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
    pub(super) fn check_scratch_commit(&mut self, engine: &SimEngine) -> Result<(), Violation> {
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

    /// After an acknowledged create or delete of the scratch topic: no group position of it
    /// is left, so a topic created again under the name does not inherit the old one's.
    pub(super) fn scratch_commits_forgotten(&self, engine: &SimEngine) -> Result<(), Violation> {
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

    /// After an open (and the model's adoption of what it found): the SDK's group consumer of
    /// every partition, recreated in the group `sdk`, starts at the position the group
    /// committed last (or zero), then yields exactly the engine's records from there (or from
    /// the log start, where retention or a delete removed the position) with no hole, across
    /// every crash and reopen before (oracle `sdk_readers`). It reads a few records and
    /// commits, but only a position whose records the model knows durable: a crash may take
    /// records that were not, and a position committed past the end a crash left is a
    /// different case (the consumer's reads then fail with `OffsetOutOfRange`, since the
    /// shared cursor resets only positions below the log start), not judged here.
    pub(super) fn group_consumers(
        &mut self,
        engine: &SimEngine,
        scan: &Scan,
    ) -> Result<(), Violation> {
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
}
