//! A topology cut into stages, each run by the processor runtime as one application.

use super::exec::{AroundBatch, StageTask};
use super::window::{Kind, META, Meta};
use super::{Graph, Node, Op, Topology, store_of};
use crate::processor::{ProcessorConfig, ProcessorError, RunStats, Runner};
use crate::store::Store;
use crate::{CommitError, Io, TopicConfig, TopicError};
use chronik_engine::Engine;
use chronik_engine::internals::canary::{self, Canary};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// How often `run_until` looks at the caller's stop flag.
const HALT_POLL: Duration = Duration::from_millis(10);

/// `run_until` purges the repartition topics every this many polls (about a second).
const PURGE_EVERY_POLLS: u32 = 100;

/// A topology's operators and stages, shared by its tasks.
pub(crate) struct Plan {
    pub nodes: Vec<Node>,
    pub stages: Vec<StagePlan>,
    pub around_batch: Option<AroundBatch>,
    /// Counts late events in the engine's metrics (`late_records`).
    pub late_metric: Box<dyn Fn(u64) + Send + Sync>,
}

/// The operators connected without a repartition between them: one application of the
/// runtime.
pub(crate) struct StagePlan {
    /// Its operators, in the order built.
    pub nodes: Vec<usize>,
    /// The topics it reads: streams first, then tables (so a table's update and a stream's
    /// event at the same time are taken stream first).
    pub inputs: Vec<String>,
    /// Per topic read, the source (or table) operators reading it.
    pub sources: BTreeMap<String, Vec<usize>>,
    pub stores: Vec<String>,
}

/// The stages of `graph`, checked.
pub(crate) fn stages(graph: &Graph) -> Result<Vec<StagePlan>, String> {
    fn find(root: &mut [usize], mut node: usize) -> usize {
        while root[node] != node {
            root[node] = root[root[node]];
            node = root[node];
        }
        node
    }
    let count = graph.nodes.len();
    let mut root: Vec<usize> = (0..count).collect();
    for (id, node) in graph.nodes.iter().enumerate() {
        for &parent in &node.parents {
            let (a, b) = (find(&mut root, id), find(&mut root, parent));
            root[a.max(b)] = a.min(b);
        }
    }
    let mut by_root: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for id in 0..count {
        let r = find(&mut root, id);
        by_root.entry(r).or_default().push(id);
    }
    let mut stages = Vec::new();
    let mut readers: BTreeMap<&str, usize> = BTreeMap::new();
    let mut stores: BTreeMap<&str, usize> = BTreeMap::new();
    for nodes in by_root.into_values() {
        let stage = stages.len();
        let mut streams = Vec::new();
        let mut tables = Vec::new();
        let mut sources: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut stage_stores = Vec::new();
        for &id in &nodes {
            let node = &graph.nodes[id];
            match &node.op {
                Op::Source { topic } | Op::Table { topic, .. } => {
                    if readers.insert(topic, stage).is_some_and(|other| other != stage) {
                        return Err(format!(
                            "topic {topic} is read by two parts of the topology that are not \
                             connected (or only through a repartition): read it once with \
                             `stream` and use that stream for both"
                        ));
                    }
                    let list = if matches!(node.op, Op::Table { .. }) {
                        &mut tables
                    } else {
                        &mut streams
                    };
                    if !list.contains(topic) {
                        list.push(topic.clone());
                    }
                    sources.entry(topic.clone()).or_default().push(id);
                }
                Op::Aggregate(aggregate) => {
                    if let Some(windows) = &aggregate.windows {
                        windows.check()?;
                        let session = matches!(windows.kind, Kind::Session { .. });
                        if session && aggregate.aggregator.merge.is_none() {
                            return Err(format!(
                                "{}: an aggregate in session windows needs a merge \
                                 (aggregate_merging)",
                                node.name
                            ));
                        }
                    }
                }
                Op::StreamJoin(join) => {
                    if node.parents.len() != 2 || node.parents[0] == node.parents[1] {
                        return Err(format!("{}: a stream joined with itself", node.name));
                    }
                    if join.windows.size < 0 || join.windows.grace < 0 {
                        return Err(format!("{}: join windows must not be negative", node.name));
                    }
                }
                _ => {}
            }
            if let Some(store) = store_of(&node.op) {
                if stores.insert(store, id).is_some() {
                    return Err(format!("two operators have the store {store}"));
                }
                stage_stores.push(store.to_owned());
            }
        }
        if streams.is_empty() {
            return Err(format!("a table ({}) is joined with no stream", tables.join(", ")));
        }
        // A topic read as a stream and as a table is one input, read once.
        // An event goes to a topic's streams before its table takes it: a stream joined with
        // its own topic's table sees the row as it was before the event.
        for readers in sources.values_mut() {
            readers.sort_by_key(|&id| (matches!(graph.nodes[id].op, Op::Table { .. }), id));
        }
        tables.retain(|table| !streams.contains(table));
        streams.extend(tables);
        stages.push(StagePlan { nodes, inputs: streams, sources, stores: stage_stores });
    }
    Ok(upstream_first(graph, stages))
}

/// `stages` ordered so that a stage comes after every stage writing a repartition topic it
/// reads (otherwise, in the order built): a pass of `run_until_caught_up` then hands each
/// stage all its upstream input before it runs, and a join of a repartitioned stream never
/// races ahead of its other side.
fn upstream_first(graph: &Graph, stages: Vec<StagePlan>) -> Vec<StagePlan> {
    let writer: BTreeMap<&str, usize> = stages
        .iter()
        .enumerate()
        .flat_map(|(i, stage)| stage.nodes.iter().map(move |&node| (node, i)))
        .filter_map(|(node, i)| match &graph.nodes[node].op {
            Op::Repartition { topic, .. } => Some((topic.as_str(), i)),
            _ => None,
        })
        .collect();
    let upstream: Vec<Vec<usize>> = stages
        .iter()
        .enumerate()
        .map(|(i, stage)| {
            let inputs = stage.inputs.iter().filter_map(|topic| writer.get(topic.as_str()));
            inputs.copied().filter(|&w| w != i).collect()
        })
        .collect();
    let mut order: Vec<usize> = Vec::with_capacity(stages.len());
    while order.len() < stages.len() {
        // The first stage not placed whose upstream stages all are; a cycle (impossible when
        // repartitions only feed later operators) falls back to the first not placed.
        let unplaced = (0..stages.len()).filter(|i| !order.contains(i));
        let ready = unplaced.clone().find(|&i| upstream[i].iter().all(|u| order.contains(u)));
        order.push(ready.or_else(|| unplaced.min()).expect("a stage not placed yet"));
    }
    let mut slots: Vec<Option<StagePlan>> = stages.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
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
        mut adjust: impl FnMut(ProcessorConfig) -> ProcessorConfig,
    ) -> Result<TopologyRunner<I>, ProcessorError> {
        let graph = topology.lock();
        let stages = stages(&graph).map_err(ProcessorError::Config)?;
        let stage_of: BTreeMap<usize, usize> = stages
            .iter()
            .enumerate()
            .flat_map(|(i, stage)| stage.nodes.iter().map(move |&node| (node, i)))
            .collect();
        for (id, node) in graph.nodes.iter().enumerate() {
            match &node.op {
                Op::Repartition { topic, .. } => {
                    let upstream = &stages[stage_of[&id]].inputs[0];
                    let partitions = engine
                        .partition_count(upstream)
                        .ok_or_else(|| TopicError::NotFound { name: upstream.clone() })?;
                    if engine.partition_count(topic).is_none() {
                        let config = TopicConfig { partitions, ..graph.repartition_config };
                        match engine.create_topic(topic, config) {
                            Ok(()) | Err(TopicError::AlreadyExists { .. }) => {}
                            Err(error) => return Err(error.into()),
                        }
                    }
                }
                Op::To { topic } => require(engine, topic)?,
                Op::Aggregate(aggregate) => {
                    if let Some(topic) = &aggregate.late_to {
                        require(engine, topic)?;
                    }
                }
                _ => {}
            }
        }
        let configs: Vec<ProcessorConfig> = stages
            .iter()
            .map(|stage| {
                let mut config = ProcessorConfig {
                    application: graph.application.clone(),
                    inputs: stage.inputs.clone(),
                    stores: stage.stores.clone(),
                    ..graph.template.clone()
                };
                for store in &stage.stores {
                    if let Some(kind) = graph.store_kinds.get(store) {
                        config.store_kinds.insert(store.clone(), *kind);
                    }
                }
                adjust(config)
            })
            .collect();
        let metrics = engine.clone();
        let plan = Arc::new(Plan {
            nodes: graph.nodes.clone(),
            stages,
            around_batch: graph.around_batch.clone(),
            late_metric: Box::new(move |late| {
                chronik_engine::metrics::Metrics::add(
                    &metrics.metrics_registry().late_records,
                    late,
                );
            }),
        });
        let application = graph.application.clone();
        drop(graph);
        let mut runners = Vec::with_capacity(configs.len());
        for (stage, config) in configs.into_iter().enumerate() {
            let plan_of_stage = Arc::clone(&plan);
            runners.push(Runner::new(engine, config, move |_| {
                StageTask::new(Arc::clone(&plan_of_stage), stage)
            })?);
        }
        let mut repartitions = Vec::new();
        for node in &plan.nodes {
            if let Op::Repartition { topic, .. } = &node.op {
                let partitions = engine
                    .partition_count(topic)
                    .ok_or_else(|| TopicError::NotFound { name: topic.clone() })?;
                repartitions.push((topic.clone(), partitions));
            }
        }
        Ok(TopologyRunner { engine: engine.clone(), plan, runners, application, repartitions })
    }

    /// Run every stage on the calling thread until all have processed their input (a later
    /// stage's input grows as an earlier one runs), committing. Deterministic.
    pub fn run_until_caught_up(&mut self) -> Result<RunStats, ProcessorError> {
        let late = self.late_records();
        let mut total = RunStats::default();
        loop {
            let mut pass = RunStats::default();
            for runner in &mut self.runners {
                pass.add(runner.run_until_caught_up()?);
                purge(&self.engine, &self.application, &self.repartitions)?;
            }
            total.add(pass);
            if pass.records == 0 {
                total.late_records = self.late_records().saturating_sub(late);
                return Ok(total);
            }
        }
    }

    /// Run every stage (each on its configuration's threads) until `stop` is set, or until a
    /// stage fails (the others then stop too); then close and commit.
    pub fn run_until(&mut self, stop: &AtomicBool) -> Result<RunStats, ProcessorError> {
        let late = self.late_records();
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
        total.late_records = self.late_records().saturating_sub(late);
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
    /// operator and partition, as of the last commit: exact, whatever crashes came between.
    pub fn late_records(&self) -> u64 {
        let mut late = 0;
        for node in &self.plan.nodes {
            let windowed = match &node.op {
                Op::Aggregate(aggregate) => aggregate.windows.is_some(),
                Op::StreamJoin(_) => true,
                _ => false,
            };
            let Some(name) = store_of(&node.op).filter(|_| windowed) else { continue };
            for (store_name, _, store) in self.stores() {
                if store_name == name
                    && let Some(meta) = store.get(META).and_then(|bytes| Meta::decode(&bytes))
                {
                    late += meta.late;
                }
            }
        }
        late
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
