//! A topology's graph cut into stages, checked, and described: what the builder's
//! `Topology::describe` prints and what the runner runs.

use super::graph::{AroundBatch, Graph, Node, Op, store_of};
use super::window::Kind;
use crate::TopicConfig;
use crate::processor::ProcessorConfig;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

/// A topology's operators and stages, shared by its tasks.
pub(crate) struct Plan {
    pub nodes: Vec<Node>,
    pub stages: Vec<StagePlan>,
    pub around_batch: Option<AroundBatch>,
    /// Counts late events in the engine's metrics (`late_records`).
    pub late_metric: Arc<dyn Fn(u64) + Send + Sync>,
    /// Whether records written to repartition topics carry where they came from, and the
    /// stages reading them drop the ones they have taken already: on a cluster, where an
    /// upstream stage at least once may write a record twice. Embedded, every commit is one
    /// transaction and nothing is written twice.
    pub deduplicate: bool,
}

/// A topology checked and cut into stages, with each stage's processor configuration, before
/// anything runs: what both backends' runners start from.
pub(crate) struct Prepared {
    pub application: String,
    pub nodes: Vec<Node>,
    pub stages: Vec<StagePlan>,
    pub configs: Vec<ProcessorConfig>,
    pub around_batch: Option<AroundBatch>,
    /// Each repartition topic, with the topic whose partition count it takes (the first
    /// input of the stage writing it).
    pub repartitions: Vec<(String, String)>,
    /// The topics the topology writes and does not create: its outputs and late topics.
    pub outputs: Vec<String>,
    pub repartition_config: TopicConfig,
}

impl Prepared {
    /// Check `graph` and cut it into stages; `adjust` sees each stage's configuration.
    pub fn new(
        graph: &Graph,
        mut adjust: impl FnMut(ProcessorConfig) -> ProcessorConfig,
    ) -> Result<Prepared, String> {
        let stages = stages(graph)?;
        let stage_of: BTreeMap<usize, usize> = stages
            .iter()
            .enumerate()
            .flat_map(|(i, stage)| stage.nodes.iter().map(move |&node| (node, i)))
            .collect();
        let mut repartitions = Vec::new();
        let mut outputs = Vec::new();
        for (id, node) in graph.nodes.iter().enumerate() {
            match &node.op {
                Op::Repartition { topic, .. } => {
                    let upstream = stages[stage_of[&id]].inputs[0].clone();
                    repartitions.push((topic.clone(), upstream));
                }
                Op::To { topic } => outputs.push(topic.clone()),
                Op::Aggregate(aggregate) => outputs.extend(aggregate.late_to.clone()),
                _ => {}
            }
        }
        let configs = stages
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
        Ok(Prepared {
            application: graph.application.clone(),
            nodes: graph.nodes.clone(),
            stages,
            configs,
            around_batch: graph.around_batch.clone(),
            repartitions,
            outputs,
            repartition_config: graph.repartition_config,
        })
    }

    /// Give each stage that reads a repartition topic and has no aggregation or join store a
    /// memory store of its own ([`mark_store`]) for the marks of what it took (on a cluster:
    /// a stage that only passes records on would otherwise pass a record written twice on
    /// twice, under two marks of its own).
    pub fn add_mark_stores(&mut self) {
        let repartitioned: Vec<&String> = self.repartitions.iter().map(|(t, _)| t).collect();
        for (i, stage) in self.stages.iter_mut().enumerate() {
            let reads = stage.inputs.iter().any(|input| repartitioned.contains(&input));
            let keeps = stage
                .nodes
                .iter()
                .any(|&node| matches!(self.nodes[node].op, Op::Aggregate(_) | Op::StreamJoin(_)));
            if reads && !keeps {
                let store = mark_store(i);
                stage.stores.push(store.clone());
                self.configs[i].stores.push(store.clone());
                self.configs[i].store_kinds.insert(store, crate::processor::StoreKind::Memory);
            }
        }
    }

    /// The plan the stages' tasks share (the configurations stay here).
    pub fn plan(
        &mut self,
        late_metric: Arc<dyn Fn(u64) + Send + Sync>,
        deduplicate: bool,
    ) -> Arc<Plan> {
        Arc::new(Plan {
            nodes: std::mem::take(&mut self.nodes),
            stages: std::mem::take(&mut self.stages),
            around_batch: self.around_batch.take(),
            late_metric,
            deduplicate,
        })
    }
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

/// The store a stage keeps its repartition marks in when it has no aggregation or join store
/// ([`Prepared::add_mark_stores`]); its changelog is `<application>-stage-<n>-marks-changelog`.
pub(crate) fn mark_store(stage: usize) -> String {
    format!("stage-{stage}-marks")
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

/// The stages, operators, topics and stores of `graph`, one per line.
pub(crate) fn describe(graph: &Graph) -> String {
    let stages = match stages(graph) {
        Ok(stages) => stages,
        Err(error) => return format!("Topology {} (invalid: {error})", graph.application),
    };
    let mut text = format!("Topology {}\n", graph.application);
    for (i, stage) in stages.iter().enumerate() {
        let _ = writeln!(text, "  Stage {i} (reads {})", stage.inputs.join(", "));
        for &id in &stage.nodes {
            let node = &graph.nodes[id];
            let _ = write!(text, "    {} {}", node.name, describe_op(graph, &node.op));
            if !node.children.is_empty() {
                let children: Vec<&str> =
                    node.children.iter().map(|&c| graph.nodes[c].name.as_str()).collect();
                let _ = write!(text, " -> {}", children.join(", "));
            }
            text.push('\n');
        }
    }
    text
}

fn describe_op(graph: &Graph, op: &Op) -> String {
    match op {
        Op::Source { topic } => format!("source {topic}"),
        Op::Table { topic, store } => format!("table {topic} (store {store})"),
        Op::Filter(_) => "filter".into(),
        Op::Map(_) => "map".into(),
        Op::MapValues(_) => "map_values".into(),
        Op::FlatMap(_) => "flat_map".into(),
        Op::Peek(_) => "peek".into(),
        Op::Repartition { topic, key, source } => format!(
            "{} to {topic} -> {}",
            if key.is_some() { "group_by, repartition" } else { "repartition" },
            graph.nodes[*source].name
        ),
        Op::Aggregate(aggregate) => {
            let mut text = aggregate.aggregator.name.to_owned();
            if let Some(windows) = &aggregate.windows {
                let _ = write!(text, " in {windows}, emit {:?}", aggregate.emit);
            }
            let _ = write!(text, " (store {})", aggregate.store);
            if let Some(topic) = &aggregate.late_to {
                let _ = write!(text, ", late records to {topic}");
            }
            text
        }
        Op::TableJoin { store, inner, .. } => {
            format!("{} with table store {store}", if *inner { "join" } else { "left_join" })
        }
        Op::StreamJoin(join) => format!(
            "{} with {} in {} (store {})",
            join.kind.name(),
            graph.nodes[join.left].name,
            join.windows,
            join.store
        ),
        Op::To { topic } => format!("to {topic}"),
    }
}
