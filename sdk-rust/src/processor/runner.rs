//! [`Runner`]: a processor application over the embedded engine, its tasks restored and
//! ready to run, on the calling thread ([`Runner::run_until_caught_up`], deterministic) or
//! on worker threads ([`Runner::run_until`]). Invariants: every task belongs to exactly one
//! worker for the whole run (no task is stepped by two threads); a failed run poisons the
//! runner, since a task's memory is then ahead of what is durable and only a new runner
//! (which restores) may go on.

use super::api::{Processor, ProcessorError, RunStats};
use super::config::{OnDecodeError, ProcessorConfig};
use super::restore::restore_all;
use super::task::Task;
use crate::store::Store;
use crate::{Io, Offset, TopicConfig, TopicError};
use chronik_engine::Engine;
use chronik_engine::canary::{self, Canary};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long an idle worker waits for input before looking again (and at the stop flag).
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// A processor application over an engine: its tasks, restored and ready to run.
pub struct Runner<I: Io, P: Processor> {
    engine: Engine<I>,
    config: ProcessorConfig,
    tasks: Vec<Task<P>>,
    /// A failed commit or processor leaves a task's memory ahead of what is durable.
    failed: bool,
}

impl<I: Io, P: Processor> std::fmt::Debug for Runner<I, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("config", &self.config)
            .field("tasks", &self.tasks.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl<I: Io, P: Processor> Runner<I, P> {
    /// Create the changelog topics that are missing (compacted, as many partitions as the
    /// input), restore every task's stores, and call each processor's `init`.
    pub fn new(
        engine: &Engine<I>,
        config: ProcessorConfig,
        mut factory: impl FnMut(u32) -> P,
    ) -> Result<Runner<I, P>, ProcessorError> {
        let first =
            config.inputs.first().ok_or_else(|| ProcessorError::Config("no input".into()))?;
        let partitions = engine
            .partition_count(first)
            .ok_or_else(|| TopicError::NotFound { name: first.clone() })?;
        for input in &config.inputs {
            let count = engine
                .partition_count(input)
                .ok_or_else(|| TopicError::NotFound { name: input.clone() })?;
            if count != partitions {
                return Err(ProcessorError::Config(format!(
                    "input {input} has {count} partitions, {first} {partitions}: inputs must be \
                     co-partitioned"
                )));
            }
        }
        if config.commit_interval_ms == 0 || config.threads == 0 {
            return Err(ProcessorError::Config("commit interval and threads must be > 0".into()));
        }
        // Now, not at the first bad record, which may come long after.
        if let OnDecodeError::DeadLetter { topic } = &config.on_decode_error
            && engine.partition_count(topic).is_none()
        {
            return Err(TopicError::NotFound { name: topic.clone() }.into());
        }
        for store in &config.stores {
            let topic = config.changelog(store);
            match engine.partition_count(&topic) {
                Some(count) if count == partitions => {}
                Some(count) => {
                    return Err(ProcessorError::Config(format!(
                        "changelog {topic} has {count} partitions, the input {partitions}"
                    )));
                }
                None => {
                    let changelog = TopicConfig {
                        partitions,
                        cleanup: crate::Cleanup::Compact,
                        ..TopicConfig::default()
                    };
                    match engine.create_topic(&topic, changelog) {
                        Ok(()) | Err(TopicError::AlreadyExists { .. }) => {}
                        Err(error) => return Err(error.into()),
                    }
                }
            }
        }
        let now = engine.now_ms();
        let restored = restore_all(engine, &config, partitions)?;
        let mut tasks = Vec::with_capacity(partitions as usize);
        for (partition, (stores, stats)) in (0..partitions).zip(restored) {
            let positions: Vec<Offset> = config
                .inputs
                .iter()
                .map(|input| {
                    engine
                        .committed_offset(&config.application, input, partition)
                        .unwrap_or(Offset::ZERO)
                })
                .collect();
            let task = Task::start(&config, partition, factory(partition), stores, positions, now);
            tasks.push(task.with_stats(&config, stats)?);
        }
        Ok(Runner { engine: engine.clone(), config, tasks, failed: false })
    }

    /// Run on the calling thread until every task has processed its input up to the high
    /// watermark, then commit. Deterministic: what the simulator and tests use.
    pub fn run_until_caught_up(&mut self) -> Result<RunStats, ProcessorError> {
        self.check_usable()?;
        let result = (|| {
            for task in &mut self.tasks {
                while !task.caught_up(&self.engine, &self.config)? {
                    let before = task.positions.clone();
                    let processed = task.step(&self.engine, &self.config)?;
                    if processed == 0 && canary::active(Canary::ReaderStopsAtEmptyFetch) {
                        break; // The bug: a step without a record taken for "caught up".
                    }
                    assert!(
                        processed > 0 || task.positions != before,
                        "a step below the high watermark processes records or moves on"
                    );
                }
                task.commit(&self.engine, &self.config)?;
                task.flush_stores(&self.engine, &self.config, true)?;
                if self.config.snapshot_every_commits.is_some() {
                    task.snapshot(&self.engine, &self.config);
                }
            }
            Ok(())
        })();
        self.finish(result)
    }

    /// Run the tasks on [`ProcessorConfig::threads`] worker threads until `stop` is set; then
    /// close the processors and commit.
    pub fn run_until(&mut self, stop: &AtomicBool) -> Result<RunStats, ProcessorError> {
        self.check_usable()?;
        let threads = self.config.threads.min(self.tasks.len()).max(1);
        let (engine, config) = (&self.engine, &self.config);
        let mut shares: Vec<Vec<&mut Task<P>>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, task) in self.tasks.iter_mut().enumerate() {
            shares[i % threads].push(task);
        }
        let outcomes: Vec<Result<(), ProcessorError>> = std::thread::scope(|scope| {
            let workers: Vec<_> = shares
                .into_iter()
                .map(|mut share| scope.spawn(move || work(engine, config, &mut share, stop)))
                .collect();
            workers.into_iter().map(|w| w.join().unwrap_or(Err(ProcessorError::Panicked))).collect()
        });
        let result = outcomes.into_iter().collect::<Result<Vec<()>, _>>().map(|_| ());
        let result = result.and_then(|()| {
            for task in &mut self.tasks {
                task.close(&self.engine, &self.config)?;
            }
            Ok(())
        });
        self.finish(result)
    }

    fn check_usable(&self) -> Result<(), ProcessorError> {
        if self.failed {
            return Err(ProcessorError::Config(
                "an earlier run failed: open a new runner to restore the state".into(),
            ));
        }
        // Only a run's own reads count: a failed read between runs (through `Runner::store`)
        // was returned to its caller, and damage condemned its store already.
        for store in self.tasks.iter().flat_map(|task| task.stores.values()) {
            let _outside = store.check();
        }
        Ok(())
    }

    fn finish(&mut self, result: Result<(), ProcessorError>) -> Result<RunStats, ProcessorError> {
        if let Err(error) = result {
            self.failed = true;
            return Err(error);
        }
        let mut stats = RunStats::default();
        for task in &mut self.tasks {
            stats.add(std::mem::take(&mut task.stats));
        }
        Ok(stats)
    }

    /// The application's configuration.
    pub fn config(&self) -> &ProcessorConfig {
        &self.config
    }

    /// A task's store, for inspection (tests, examples).
    pub fn store(&self, partition: u32, name: &str) -> Option<&Store> {
        self.tasks.get(partition as usize)?.stores.get(name)
    }

    /// Every task's stores.
    pub fn stores(&self) -> impl Iterator<Item = &Store> {
        self.tasks.iter().flat_map(|task| task.stores.values())
    }

    /// Every task's position in its first input (the next offset to process).
    pub fn positions(&self) -> Vec<Offset> {
        self.tasks.iter().map(|t| t.positions[0]).collect()
    }
}

fn work<I: Io, P: Processor>(
    engine: &Engine<I>,
    config: &ProcessorConfig,
    tasks: &mut [&mut Task<P>],
    stop: &AtomicBool,
) -> Result<(), ProcessorError> {
    while !stop.load(Ordering::Relaxed) {
        let mut processed = 0;
        for task in tasks.iter_mut() {
            processed += task.step(engine, config)?;
        }
        if processed == 0 {
            for task in tasks.iter_mut() {
                task.commit_if_due(engine, config, true)?;
            }
            if let Some(task) = tasks.first() {
                let (input, position) = (&config.inputs[0], task.positions[0]);
                engine.wait_for(input, task.partition, position, IDLE_WAIT)?;
            }
        }
    }
    Ok(())
}
