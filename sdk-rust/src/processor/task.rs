//! One task: one input partition's processor, its stores and its pending outputs, and the
//! step and commit protocol that drive it over a [`TaskLog`]. A step merges one fetch of
//! every input by timestamp and hands the processor batches of it; a commit is one
//! transaction of every store's changes (to its changelog partition), the outputs and the
//! input positions. Invariants: store writes apply at once (a task reads its own writes) but
//! reach a disk store's files and a snapshot only after their commit, so what is local never
//! runs ahead of what is durable; after a failed commit the task must not go on.

use super::api::{
    BATCH_RECORDS_MAX, Context, Outputs, Processor, ProcessorError, Punctuation, RunStats,
};
use super::config::{DEAD_LETTER_HEADERS, OnDecodeError, ProcessorConfig};
use super::error::ProcessError;
use super::snapshot;
use super::task_log::TaskLog;
use crate::store::{DiskStore, Store};
use crate::{GroupCommit, Header, Offset, Record, RecordView, TopicError, TransactionWrite};
use chronik_engine::canary::{self, Canary};
use chronik_engine::metrics::Metrics;
use std::collections::BTreeMap;

/// Bytes of input one step reads.
const STEP_FETCH_BYTES: usize = 1 << 20;

/// Pending changelog and output bytes that force a commit before the interval: well under the
/// engine's batch limit, since one partition's writes of a commit are one batch.
const PENDING_BYTES_MAX: usize = 4 << 20;

/// One input partition's processor and its state: stores, positions, pending outputs, timers.
pub(crate) struct Task<P> {
    pub(super) partition: u32,
    processor: P,
    pub(super) stores: BTreeMap<String, Store>,
    /// Per input, the next offset to process.
    pub(super) positions: Vec<Offset>,
    /// Per input, the position as of the last commit.
    committed_positions: Vec<Offset>,
    /// The input of the record being processed.
    input: usize,
    outputs: Outputs,
    last_commit_ms: i64,
    /// Records processed since the last commit.
    uncommitted_records: u64,
    commits_since_snapshot: u64,
    stream_time: i64,
    next_stream_punctuation: Option<i64>,
    next_wall_punctuation: Option<i64>,
    pub(crate) stats: RunStats,
}

impl<P: Processor> Task<P> {
    /// A task of `partition` with restored `stores`, starting from `positions` (one per
    /// input); [`Task::with_stats`] then calls the processor's `init`.
    pub(crate) fn start(
        config: &ProcessorConfig,
        partition: u32,
        processor: P,
        stores: BTreeMap<String, Store>,
        positions: Vec<Offset>,
        now: i64,
    ) -> Task<P> {
        assert_eq!(positions.len(), config.inputs.len(), "a position per input");
        Task {
            partition,
            processor,
            stores,
            committed_positions: positions.clone(),
            positions,
            input: 0,
            outputs: Outputs::default(),
            last_commit_ms: now,
            uncommitted_records: 0,
            commits_since_snapshot: 0,
            stream_time: i64::MIN,
            next_stream_punctuation: None,
            next_wall_punctuation: config.punctuate_wall_ms.map(|ms| now + ms),
            stats: RunStats::default(),
        }
    }

    /// This task with what restoring it took counted, after the processor's `init`.
    /// The positions the log holds as committed for this task, when they are behind those it
    /// starts from (a commit marker whose group commit a crash lost, at least once): the
    /// task then has a commit pending, and its next one, idle or not, writes its positions.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn committed_at(mut self, positions: Vec<Offset>) -> Task<P> {
        assert_eq!(positions.len(), self.positions.len(), "a position per input");
        self.committed_positions = positions;
        self
    }

    pub(crate) fn with_stats(
        mut self,
        config: &ProcessorConfig,
        stats: RunStats,
    ) -> Result<Task<P>, ProcessorError> {
        self.stats = stats;
        self.call(&config.inputs[0], Processor::init)?;
        Ok(self)
    }

    /// Call the processor with a context over this task.
    fn call(
        &mut self,
        input: &str,
        f: impl FnOnce(&mut P, &mut Context<'_>) -> Result<(), ProcessError>,
    ) -> Result<(), ProcessorError> {
        let mut ctx = Context {
            stores: &mut self.stores,
            outputs: &mut self.outputs,
            partition: self.partition,
            stream_time: self.stream_time,
            input,
            offset: None,
        };
        let result = f(&mut self.processor, &mut ctx).map_err(|source| ProcessorError::Process {
            input: input.to_owned(),
            partition: self.partition,
            offset: ctx.offset.map(Offset::get),
            source,
        });
        self.check_stores()?;
        result
    }

    /// Fail if a disk store's read failed during the call: what the processor did after it
    /// may rest on a wrong answer, so nothing of it may be committed. A damaged store is
    /// condemned, so the next start rebuilds it from the changelog.
    fn check_stores(&self) -> Result<(), ProcessorError> {
        for (name, store) in &self.stores {
            store.check().map_err(|source| ProcessorError::Store {
                store: name.clone(),
                partition: self.partition,
                source,
            })?;
        }
        Ok(())
    }

    /// Flush the disk stores that want it (all with `every`), each at its changelog's end:
    /// right after a commit, so the state they take is exactly the committed state.
    pub(super) fn flush_stores<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
        every: bool,
    ) -> Result<(), ProcessorError> {
        for (name, store) in &mut self.stores {
            let Some(disk) = store.disk_mut() else { continue };
            if !(every || disk.wants_flush()) {
                continue;
            }
            let end = engine.high_watermark(&config.changelog(name), self.partition)?;
            let before = disk.merges();
            let flushed = disk.flush(end).map_err(|source| ProcessorError::Store {
                store: name.clone(),
                partition: self.partition,
                source,
            });
            if let Some(metrics) = engine.metrics() {
                let after = disk.merges();
                Metrics::add(&metrics.store_merges, after.installed - before.installed);
                Metrics::add(&metrics.store_stalls, after.stalls - before.stalls);
            }
            flushed?;
        }
        Ok(())
    }

    /// Whether every input's position has reached its high watermark: the one meaning of
    /// "caught up" (a step that processed nothing may only have read past batches that
    /// compaction emptied).
    pub(crate) fn caught_up<L: TaskLog + ?Sized>(
        &self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<bool, ProcessorError> {
        debug_assert_eq!(self.positions.len(), config.inputs.len());
        for (input, &position) in config.inputs.iter().zip(&self.positions) {
            if position < engine.high_watermark(input, self.partition)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Process one fetch of every input, merged by timestamp; returns how many records it
    /// processed. The merge stops where an input's fetch runs out while that input has more
    /// (the next step fetches it), so the order never depends on fetch sizes.
    pub(crate) fn step<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<usize, ProcessorError> {
        let mut fetches = Vec::with_capacity(config.inputs.len());
        for (i, input) in config.inputs.iter().enumerate() {
            let fetch = engine.read(input, self.partition, self.positions[i], STEP_FETCH_BYTES)?;
            let complete = fetch.next_offset() >= engine.high_watermark(input, self.partition)?;
            fetches.push((fetch, complete));
        }
        let mut heads: Vec<_> = fetches
            .iter()
            .zip(self.positions.clone())
            .map(|((fetch, _), from)| {
                fetch.records().filter(move |r| r.offset() >= from).peekable()
            })
            .collect();
        // The merged order first, then batches of it.
        let mut order: Vec<(usize, RecordView<'_>)> = Vec::new();
        loop {
            let mut next: Option<(i64, usize)> = None;
            let mut undecided = false;
            for (i, head) in heads.iter_mut().enumerate() {
                // The bug: later inputs (tables) drained first, whatever their time.
                let ahead = i > 0 && canary::active(Canary::JoinTableAheadOfStream);
                match head.peek() {
                    Some(record) if ahead || next.is_none_or(|(t, _)| record.timestamp() < t) => {
                        next = Some((record.timestamp(), i));
                    }
                    Some(_) => {}
                    None => undecided |= !fetches[i].1,
                }
            }
            let Some((_, i)) = next.filter(|_| !undecided) else { break };
            order.push((i, heads[i].next().expect("peeked")));
        }
        let mut processed = 0;
        let mut start = 0;
        while start < order.len() {
            let input = order[start].0;
            // Timers first: a record at or past a window's end belongs to the next window.
            self.stream_time = self.stream_time.max(order[start].1.timestamp());
            self.punctuate_stream(config)?;
            let until_commit = config
                .commit_every_records
                .map_or(u64::MAX, |n| n.saturating_sub(self.uncommitted_records).max(1));
            let mut end = start + 1;
            let mut time = self.stream_time;
            while end < order.len()
                && order[end].0 == input
                && end - start < BATCH_RECORDS_MAX
                && ((end - start) as u64) < until_commit
            {
                time = time.max(order[end].1.timestamp());
                if self.next_stream_punctuation.is_some_and(|due| time >= due) {
                    break; // That record fires a timer first.
                }
                end += 1;
            }
            let batch = self.screen(config, input, &order[start..end])?;
            self.input = input;
            if !batch.is_empty() {
                self.call(&config.inputs[input], |processor, ctx| {
                    processor.process_batch(&batch, ctx)
                })?;
            }
            let last = &order[end - 1].1;
            self.stream_time = self.stream_time.max(time);
            self.positions[input] = last.offset().plus(1);
            // Records left out count too: they move the position, and so call for a commit.
            processed += end - start;
            self.uncommitted_records += (end - start) as u64;
            if config.commit_every_records.is_some_and(|n| self.uncommitted_records >= n)
                || self.pending_bytes() > PENDING_BYTES_MAX
                || self.flush_due()
            {
                self.commit(engine, config)?;
            }
            start = end;
        }
        for (i, head) in heads.iter_mut().enumerate() {
            if head.peek().is_none() {
                // Past offsets compaction removed at the end of the fetch (or at the log start,
                // when retention removed the position).
                self.positions[i] = fetches[i].0.next_offset();
            }
        }
        self.stats.records += processed as u64;
        self.commit_if_due(engine, config, false)?;
        Ok(processed)
    }

    /// The records of `run` (all of input `input`) that pass the decode check, the others
    /// failed, skipped or dead-lettered as `config.on_decode_error` says.
    fn screen<'r>(
        &mut self,
        config: &ProcessorConfig,
        input: usize,
        run: &[(usize, RecordView<'r>)],
    ) -> Result<Vec<RecordView<'r>>, ProcessorError> {
        let records = run.iter().map(|(_, record)| record.clone());
        let Some(check) = &config.decode_check else { return Ok(records.collect()) };
        let topic = &config.inputs[input];
        debug_assert!(run.iter().all(|(i, _)| *i == input), "a run is of one input");
        let mut passed = Vec::with_capacity(run.len());
        for record in records {
            let Err(reason) = check(topic, &record) else {
                passed.push(record);
                continue;
            };
            match &config.on_decode_error {
                OnDecodeError::Fail => {
                    return Err(ProcessorError::Decode {
                        input: topic.clone(),
                        partition: self.partition,
                        offset: record.offset().get(),
                        reason,
                    });
                }
                OnDecodeError::Skip => self.stats.skipped_records += 1,
                OnDecodeError::DeadLetter { topic: dead } => {
                    self.dead_letter(dead, topic, &record, &reason);
                    self.stats.dead_letters += 1;
                }
            }
        }
        Ok(passed)
    }

    /// Emit `record` unchanged to the dead-letter topic `dead`, with where it came from and
    /// why in [`DEAD_LETTER_HEADERS`]: committed with the task's outputs, so exactly once.
    fn dead_letter(&mut self, dead: &str, input: &str, record: &RecordView<'_>, reason: &str) {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> =
            record.headers().map(|h| (h.key.to_vec(), h.value.to_vec())).collect();
        let [topic, partition, offset, error] = DEAD_LETTER_HEADERS;
        headers.push((topic.into(), input.into()));
        headers.push((partition.into(), self.partition.to_string().into_bytes()));
        headers.push((offset.into(), record.offset().get().to_string().into_bytes()));
        headers.push((error.into(), reason.into()));
        let mut ctx = Context {
            stores: &mut self.stores,
            outputs: &mut self.outputs,
            partition: self.partition,
            stream_time: self.stream_time,
            input,
            offset: Some(record.offset()),
        };
        let key = record.key().map(<[u8]>::to_vec);
        ctx.emit_with(dead, key, record.value().to_vec(), Some(record.timestamp()), headers);
    }

    fn punctuate_stream(&mut self, config: &ProcessorConfig) -> Result<(), ProcessorError> {
        let Some(every) = config.punctuate_stream_ms.filter(|&ms| ms > 0) else { return Ok(()) };
        // The first window ends at the first multiple of `every` after the first record.
        let next = *self
            .next_stream_punctuation
            .get_or_insert_with(|| self.stream_time - self.stream_time.rem_euclid(every) + every);
        if self.stream_time >= next {
            let time = self.stream_time - self.stream_time.rem_euclid(every);
            self.next_stream_punctuation = Some(time + every);
            let input = &config.inputs[self.input];
            self.call(input, |processor, ctx| {
                processor.punctuate(Punctuation::StreamTime(time), ctx)
            })?;
        }
        Ok(())
    }

    /// Whether a disk store of this task is due a flush, which only a commit brings: the
    /// memtables' share of the memory budget is spent (or this store's part of it).
    fn flush_due(&self) -> bool {
        self.stores.values().any(|store| store.disk().is_some_and(DiskStore::wants_flush))
    }

    fn pending_bytes(&self) -> usize {
        self.outputs.bytes + self.stores.values().map(Store::dirty_bytes).sum::<usize>()
    }

    pub(crate) fn commit_if_due<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
        idle: bool,
    ) -> Result<(), ProcessorError> {
        let now = engine.now_ms();
        if let Some(due) = self.next_wall_punctuation.filter(|&due| now >= due) {
            let every = config.punctuate_wall_ms.unwrap_or(1).max(1);
            self.next_wall_punctuation = Some(due + every * ((now - due) / every + 1));
            self.call(&config.inputs[0], |processor, ctx| {
                processor.punctuate(Punctuation::WallClock(now), ctx)
            })?;
        }
        let interval = i64::try_from(config.commit_interval_ms).unwrap_or(i64::MAX);
        let pending = self.pending_bytes() > 0 || self.positions != self.committed_positions;
        if pending && (idle || now.saturating_sub(self.last_commit_ms) >= interval) {
            self.commit(engine, config)?;
        } else if idle && !pending && self.flush_due() {
            // Nothing uncommitted: the memtables hold committed state, so a store due a flush
            // (the budget it shares is spent by others, or a restore left it large) flushes
            // without a commit; an idle task would otherwise hold its share for good.
            self.flush_stores(engine, config, false)?;
        }
        Ok(())
    }

    /// The bug of [`Canary::StoreAppliedBeforeCommit`]: disk stores take the changes before
    /// their transaction commits.
    fn canary_apply_before_commit<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<(), ProcessorError> {
        for disk in self.stores.values_mut().filter_map(Store::disk_mut) {
            disk.canary_take_uncommitted();
        }
        self.flush_stores(engine, config, true)
    }

    /// One transaction: every store's changes to its changelog partition, the outputs, and
    /// the input position.
    pub(crate) fn commit<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<(), ProcessorError> {
        if self.pending_bytes() == 0 && self.positions == self.committed_positions {
            return Ok(());
        }
        let started = engine.monotonic_us();
        if canary::active(Canary::SnapshotAheadOfChangelog) {
            self.snapshot(engine, config);
        }
        if canary::active(Canary::StoreAppliedBeforeCommit) {
            self.canary_apply_before_commit(engine, config)?;
        }
        let changelogs: Vec<(String, Vec<Record<'_>>)> = self
            .stores
            .iter()
            .filter(|(_, store)| store.has_changes())
            .map(|(name, store)| (config.changelog(name), store.changes()))
            .collect();
        let mut outputs: BTreeMap<(String, u32), Vec<usize>> = BTreeMap::new();
        for (i, output) in self.outputs.records.iter().enumerate() {
            let count = engine
                .partition_count(&output.topic)
                .ok_or_else(|| TopicError::NotFound { name: output.topic.clone() })?;
            let partition = match &output.key {
                Some(key) => crate::partition_for_key(key, count),
                None => self.partition % count,
            };
            outputs.entry((output.topic.clone(), partition)).or_default().push(i);
        }
        let headers: Vec<Vec<Header<'_>>> = self
            .outputs
            .records
            .iter()
            .map(|output| output.headers.iter().map(|(key, value)| Header { key, value }).collect())
            .collect();
        let output_records: Vec<Vec<Record<'_>>> = outputs
            .values()
            .map(|indexes| {
                indexes
                    .iter()
                    .map(|&i| {
                        let output = &self.outputs.records[i];
                        let record = Record::new(output.key.as_deref(), &output.value)
                            .with_headers(&headers[i]);
                        match output.timestamp {
                            Some(timestamp) => record.with_timestamp(timestamp),
                            None => record,
                        }
                    })
                    .collect()
            })
            .collect();
        let mut writes: Vec<TransactionWrite<'_>> = Vec::new();
        for (topic, records) in &changelogs {
            writes.push(TransactionWrite { topic, partition: self.partition, records });
        }
        for ((topic, partition), records) in outputs.keys().zip(&output_records) {
            writes.push(TransactionWrite { topic, partition: *partition, records });
        }
        let offsets: Vec<(&str, u32, Offset)> = config
            .inputs
            .iter()
            .zip(&self.positions)
            .map(|(input, &position)| (input.as_str(), self.partition, position))
            .collect();
        let group = GroupCommit { group: &config.application, offsets: &offsets };
        let early = changelogs.len();
        if canary::active(Canary::InputCommittedBeforeOutputs) {
            engine.commit(&[], Some(group))?;
            engine.commit(&writes, None)?;
        } else if canary::active(Canary::StateAppliedBeforeCommit) {
            engine.commit(&writes[..early], None)?;
            engine.commit(&writes[early..], Some(group))?;
        } else {
            engine.commit(&writes, Some(group))?;
        }
        self.stats.commits += 1;
        self.stats.emitted += self.outputs.records.len() as u64;
        drop(writes);
        drop(output_records);
        drop(headers);
        drop(changelogs);
        for store in self.stores.values_mut() {
            store.committed();
        }
        self.outputs = Outputs::default();
        self.committed_positions.clone_from(&self.positions);
        self.uncommitted_records = 0;
        self.last_commit_ms = engine.now_ms();
        self.flush_stores(engine, config, false)?;
        if let (Some(started), Some(now), Some(metrics)) =
            (started, engine.monotonic_us(), engine.metrics())
        {
            metrics.task_commit_latency.record(now.saturating_sub(started));
        }
        self.commits_since_snapshot += 1;
        if config.snapshot_every_commits.is_some_and(|n| self.commits_since_snapshot >= n) {
            self.snapshot(engine, config);
        }
        Ok(())
    }

    /// Write every store's snapshot, each with the changelog end it covers: right after a
    /// commit, so exactly the committed state. A snapshot that fails to write is skipped (the
    /// restore reads more of the changelog, that is all).
    pub(super) fn snapshot<L: TaskLog + ?Sized>(&mut self, engine: &L, config: &ProcessorConfig) {
        for (name, store) in &self.stores {
            if store.disk().is_some() {
                continue; // A disk store is its own snapshot.
            }
            let Ok(end) = engine.high_watermark(&config.changelog(name), self.partition) else {
                continue;
            };
            let bytes = snapshot::encode(end, store.memory_data());
            let name = config.snapshot_file(name, self.partition);
            if engine.state_dir().is_some_and(|state| state.write(&name, bytes).is_ok()) {
                self.stats.snapshots_written += 1;
            }
        }
        self.commits_since_snapshot = 0;
    }

    pub(crate) fn close<L: TaskLog + ?Sized>(
        &mut self,
        engine: &L,
        config: &ProcessorConfig,
    ) -> Result<(), ProcessorError> {
        self.call(&config.inputs[0], Processor::close)?;
        self.commit(engine, config)?;
        self.flush_stores(engine, config, true)?;
        self.snapshot(engine, config);
        Ok(())
    }
}
