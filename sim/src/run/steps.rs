//! The workload's steps (appends, pipelined appends, transactions, commits, reads, ticks,
//! flushes, topic changes) and what follows an error: fail-stop, then poisoned until reopen.

use super::{Flow, GROUP, Sim};
use crate::model::{ModelBatch, ModelRecord, TopicState, UncertainTransaction};
use crate::oracle::{self, SimEngine, Violation};
use crate::workload::{SCRATCH, Step, TOPIC};
use chronik_engine::{
    AppendError, CommitError, Durability, GroupCommit, Offset, ReadError, Record, TopicError,
    TransactionWrite,
};

/// Chance (per million) that a tick with no power cut armed arms one inside its maintenance
/// work (retention, compaction and its segment swaps), where a round's cut rarely lands.
const TICK_POWER_CUT_PER_MILLION: u32 = 250_000;

impl Sim {
    pub(super) fn step(&mut self, engine: &SimEngine) -> Result<Flow, Violation> {
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

    pub(super) fn append(
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
    pub(super) fn acknowledged(
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
    pub(super) fn pipelined(
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

    /// A transaction: one batch to each of `writes`' partitions and a position of the group
    /// `sim`, all or nothing. Committed, its batches are acknowledged and durable in every
    /// mode; failed, they and the position are uncertain together (`transactions_atomic`).
    pub(super) fn transaction(
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

    /// Commit a position of the group `sim` for one partition. A commit is durable when it
    /// returns in every durability mode; a failed one may or may not be there after a crash.
    pub(super) fn commit(
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

    /// Read `partition` from `from(high watermark)` and check the records against the model;
    /// returns the offset after the last record read, unless the read failed.
    pub(super) fn read(
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

    pub(super) fn after_read_error(
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
    pub(super) fn after_error(
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

    /// Create the scratch topic, or delete it if it exists. An acknowledged create or delete
    /// must survive any crash; a failed one poisons the engine and leaves the topic whole or
    /// gone.
    pub(super) fn scratch(&mut self, engine: &SimEngine) -> Result<Flow, Violation> {
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
}

pub(super) fn ok_or_error<E: std::fmt::Display>(result: &Result<(), E>) -> String {
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
