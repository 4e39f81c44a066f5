//! A topology's stages, each run by the processor runtime as one application: the internal
//! topics created, the stages restored and run (on the calling thread or on their own), and
//! the repartition topics purged behind them.

use super::builder::Topology;
use super::graph::{Op, store_of};
use super::layout::{META, Meta};
use super::plan::{Plan, Prepared};
use super::task::StageTask;
use crate::processor::{ProcessorConfig, ProcessorError, RunStats, Runner};
use crate::store::Store;
use crate::{CommitError, Io, TopicConfig, TopicError};
use chronik_engine::Engine;
use chronik_engine::canary::{self, Canary};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// How often `run_until` looks at the caller's stop flag.
const HALT_POLL: Duration = Duration::from_millis(10);

/// `run_until` purges the repartition topics every this many polls (about a second).
const PURGE_EVERY_POLLS: u32 = 100;

impl Topology {
    /// Create the internal topics and changelogs that are missing, restore every stage's
    /// stores, and return the runner. Output topics (`to`) must exist.
    pub fn runner<I: Io>(&self, engine: &Engine<I>) -> Result<TopologyRunner<I>, ProcessorError> {
        TopologyRunner::new(engine, self)
    }
}

/// A topology's stages, restored and ready to run, each a [`Runner`] of its own.
pub struct TopologyRunner<I: Io> {
    engine: Engine<I>,
    plan: Arc<Plan>,
    runners: Vec<Runner<I, StageTask>>,
    /// The application: the group whose commits say what may be purged.
    application: String,
    /// Repartition topics, with their partition counts.
    repartitions: Vec<(String, u32)>,
}

impl<I: Io> std::fmt::Debug for TopologyRunner<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopologyRunner")
            .field("stages", &self.runners.len())
            .finish_non_exhaustive()
    }
}

impl<I: Io> TopologyRunner<I> {
    /// [`Topology::runner`].
    pub fn new(
        engine: &Engine<I>,
        topology: &Topology,
    ) -> Result<TopologyRunner<I>, ProcessorError> {
        TopologyRunner::with(engine, topology, |config| config)
    }

    /// [`TopologyRunner::new`] with each stage's configuration passed through `adjust`
    /// first (the simulator sets commit cadences and store kinds with it).
    pub fn with(
        engine: &Engine<I>,
        topology: &Topology,
        adjust: impl FnMut(ProcessorConfig) -> ProcessorConfig,
    ) -> Result<TopologyRunner<I>, ProcessorError> {
        TopologyRunner::build(engine, topology, adjust, false)
    }

    /// [`TopologyRunner::with`], deduplicating repartitioned records as on a cluster
    /// ([`Plan::deduplicate`]) when asked: the tests of that path run it on the engine.
    pub(crate) fn build(
        engine: &Engine<I>,
        topology: &Topology,
        adjust: impl FnMut(ProcessorConfig) -> ProcessorConfig,
        deduplicate: bool,
    ) -> Result<TopologyRunner<I>, ProcessorError> {
        let mut prepared =
            Prepared::new(&topology.lock(), adjust).map_err(ProcessorError::Config)?;
        if deduplicate {
            prepared.add_mark_stores();
        }
        let mut repartitions = Vec::new();
        for (topic, upstream) in &prepared.repartitions {
            let partitions = engine
                .partition_count(upstream)
                .ok_or_else(|| TopicError::NotFound { name: upstream.clone() })?;
            if engine.partition_count(topic).is_none() {
                let config = TopicConfig { partitions, ..prepared.repartition_config };
                match engine.create_topic(topic, config) {
                    Ok(()) | Err(TopicError::AlreadyExists { .. }) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            let partitions = engine
                .partition_count(topic)
                .ok_or_else(|| TopicError::NotFound { name: topic.clone() })?;
            repartitions.push((topic.clone(), partitions));
        }
        for topic in &prepared.outputs {
            require(engine, topic)?;
        }
        let metrics = engine.clone();
        let plan = prepared.plan(
            Arc::new(move |late| {
                chronik_engine::metrics::Metrics::add(
                    &metrics.metrics_registry().late_records,
                    late,
                );
            }),
            deduplicate,
        );
        let mut runners = Vec::with_capacity(prepared.configs.len());
        for (stage, config) in std::mem::take(&mut prepared.configs).into_iter().enumerate() {
            let plan_of_stage = Arc::clone(&plan);
            runners.push(Runner::new(engine, config, move |_| {
                StageTask::new(Arc::clone(&plan_of_stage), stage)
            })?);
        }
        let application = prepared.application;
        Ok(TopologyRunner { engine: engine.clone(), plan, runners, application, repartitions })
    }

    /// Run every stage on the calling thread until all have processed their input (a later
    /// stage's input grows as an earlier one runs), committing. Deterministic.
    pub fn run_until_caught_up(&mut self) -> Result<RunStats, ProcessorError> {
        let late = self.late_records()?;
        let mut total = RunStats::default();
        loop {
            let mut pass = RunStats::default();
            for runner in &mut self.runners {
                pass.add(runner.run_until_caught_up()?);
                purge(&self.engine, &self.application, &self.repartitions)?;
            }
            total.add(pass);
            if pass.records == 0 {
                total.late_records = self.late_records()?.saturating_sub(late);
                return Ok(total);
            }
        }
    }

    /// Run every stage (each on its configuration's threads) until `stop` is set, or until a
    /// stage fails (the others then stop too); then close and commit.
    pub fn run_until(&mut self, stop: &AtomicBool) -> Result<RunStats, ProcessorError> {
        let late = self.late_records()?;
        // Set when `stop` is, or when a stage fails.
        let halt = AtomicBool::new(false);
        let running = AtomicUsize::new(self.runners.len());
        let (outcomes, purged) = std::thread::scope(|scope| {
            let (halt, running) = (&halt, &running);
            let workers: Vec<_> = self
                .runners
                .iter_mut()
                .map(|runner| {
                    scope.spawn(move || {
                        let outcome = runner.run_until(halt);
                        if outcome.is_err() {
                            halt.store(true, Ordering::Relaxed);
                        }
                        running.fetch_sub(1, Ordering::Release);
                        outcome
                    })
                })
                .collect();
            let mut polls = 0u32;
            let mut purged = Ok(());
            while running.load(Ordering::Acquire) > 0 {
                if stop.load(Ordering::Relaxed) {
                    halt.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(HALT_POLL);
                polls += 1;
                if polls.is_multiple_of(PURGE_EVERY_POLLS) && purged.is_ok() {
                    purged = purge(&self.engine, &self.application, &self.repartitions);
                    // A failed purge (the engine poisoned, say) stops the stages too.
                    if purged.is_err() {
                        halt.store(true, Ordering::Relaxed);
                    }
                }
            }
            let outcomes: Vec<Result<RunStats, ProcessorError>> = workers
                .into_iter()
                .map(|w| w.join().unwrap_or(Err(ProcessorError::Panicked)))
                .collect();
            (outcomes, purged)
        });
        let mut total = RunStats::default();
        for outcome in outcomes {
            total.add(outcome?);
        }
        purged?;
        purge(&self.engine, &self.application, &self.repartitions)?;
        total.late_records = self.late_records()?.saturating_sub(late);
        Ok(total)
    }

    /// The store `name` of `partition` (for inspection: tests, examples, queries).
    pub fn store(&self, name: &str, partition: u32) -> Option<&Store> {
        self.runners.iter().find_map(|runner| runner.store(partition, name))
    }

    /// Every store, with its name and partition.
    pub fn stores(&self) -> Vec<(&str, u32, &Store)> {
        let mut all = Vec::new();
        for runner in &self.runners {
            for name in &runner.config().stores {
                for partition in 0..runner.positions().len() as u32 {
                    if let Some(store) = runner.store(partition, name) {
                        all.push((name.as_str(), partition, store));
                    }
                }
            }
        }
        all
    }

    /// The stages' configurations, in order.
    pub fn configs(&self) -> Vec<&ProcessorConfig> {
        self.runners.iter().map(Runner::config).collect()
    }

    /// Late events (their windows closed, or too late for a join) over every windowed
    /// operator and partition, as of the last commit: exact, whatever crashes came between
    /// (a disk store's read that fails is its error).
    pub fn late_records(&self) -> Result<u64, ProcessorError> {
        let mut late = 0;
        for node in &self.plan.nodes {
            let windowed = match &node.op {
                Op::Aggregate(aggregate) => aggregate.windows.is_some(),
                Op::StreamJoin(_) => true,
                _ => false,
            };
            let Some(name) = store_of(&node.op).filter(|_| windowed) else { continue };
            for (store_name, partition, store) in self.stores() {
                if store_name != name {
                    continue;
                }
                let stored = store.get(META).map_err(|source| ProcessorError::Store {
                    store: store_name.to_owned(),
                    partition,
                    source,
                })?;
                if let Some(meta) = stored.and_then(|bytes| Meta::decode(&bytes)) {
                    late += meta.late;
                }
            }
        }
        Ok(late)
    }
}

/// Delete what each repartition topic's reading stage committed past (whole sealed segments,
/// [`Engine::delete_records`]). A commit is durable when it returns, so a restart resumes at
/// or after the new log start.
fn purge<I: Io>(
    engine: &Engine<I>,
    application: &str,
    repartitions: &[(String, u32)],
) -> Result<(), ProcessorError> {
    for (topic, partitions) in repartitions {
        for partition in 0..*partitions {
            let before = if canary::active(Canary::RepartitionPurgedPastCommit) {
                engine.high_watermark(topic, partition)?
            } else {
                match engine.committed_offset(application, topic, partition) {
                    Some(offset) => offset,
                    None => continue,
                }
            };
            engine.delete_records(topic, partition, before).map_err(CommitError::from)?;
        }
    }
    Ok(())
}

fn require<I: Io>(engine: &Engine<I>, topic: &str) -> Result<(), ProcessorError> {
    match engine.partition_count(topic) {
        Some(_) => Ok(()),
        None => Err(TopicError::NotFound { name: topic.to_owned() }.into()),
    }
}
