//! Streams as operators: `map`, `filter`, `flat_map`, `group_by`, `count`, `reduce` and
//! `aggregate`, over tumbling, hopping, sliding and session windows on event time, and joins
//! of a stream with a table or with another stream in a window, built into a [`Topology`] and
//! run by the processor runtime ([`crate::processor`]), so every operator keeps exactly-once
//! outputs and changelog-backed state.
//!
//! ```
//! use chronik::dsl::{Topology, Windows};
//!
//! let topology = Topology::new("clicks-per-user");
//! topology
//!     .stream("clicks")
//!     .filter(|click| !click.value.is_empty())
//!     .group_by_key()
//!     .window(Windows::tumbling(60_000).grace(5_000))
//!     .emit_final()
//!     .count()
//!     .to("clicks-per-minute");
//! assert!(topology.describe().contains("count"));
//! ```
//!
//! A topology is cut into **stages** where records change partition: `group_by` (and
//! `group_by_key` after an operator that changed keys) writes to an internal repartition topic
//! `<application>-repartition-<n>`, which the next stage reads. Each stage is one
//! processor application of the runtime (tasks per partition, commits, restores); all stages
//! commit their input positions in the consumer group named after the application, and each
//! stateful operator has a store with its changelog `<application>-<store>-changelog`.
//!
//! **Time.** Windows are on event time, the records' timestamps. Each windowed operator keeps
//! its *observed time*, the largest timestamp it has seen, in its store (so a restart goes on
//! from it). A window closes when the observed time reaches its end plus the grace period; a
//! record arriving for windows that are all closed is *late*: it is counted (see
//! [`TopologyRunner::late_records`]), sent to the operator's `late_to` topic if it has one,
//! and otherwise dropped. A closed window's state is deleted then (a tombstone in the
//! changelog): stores hold open windows only.

mod exec;
mod runner;
mod window;

pub use runner::TopologyRunner;
pub use window::{JoinWindows, Window, Windows};

// The operators, each with an example: docs/operators.md.

use crate::TopicConfig;
use crate::processor::{ProcessorConfig, ProcessorError};
use crate::store::StoreKind;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

/// A record as operators see it: key, value, event time, and for an aggregation's result in
/// a window, the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    /// Milliseconds since the epoch.
    pub timestamp: i64,
    pub window: Option<Window>,
}

impl Event {
    pub fn new(key: Option<Vec<u8>>, value: Vec<u8>, timestamp: i64) -> Event {
        Event { key, value, timestamp, window: None }
    }

    /// The key, or no bytes.
    pub fn key(&self) -> &[u8] {
        self.key.as_deref().unwrap_or_default()
    }
}

/// When a windowed aggregation emits its results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Emit {
    /// After every record folded in: the window's aggregate so far.
    #[default]
    Updates,
    /// Once per window, when it closes (observed time past its end plus grace).
    Final,
}

type Predicate = Arc<dyn Fn(&Event) -> bool + Send + Sync>;
type Mapper = Arc<dyn Fn(Event) -> Event + Send + Sync>;
type ValueMapper = Arc<dyn Fn(&Event) -> Vec<u8> + Send + Sync>;
type FlatMapper = Arc<dyn Fn(Event) -> Vec<Event> + Send + Sync>;
type Inspector = Arc<dyn Fn(&Event) + Send + Sync>;
type KeyFn = Arc<dyn Fn(&Event) -> Vec<u8> + Send + Sync>;
type Init = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;
type Adder = Arc<dyn Fn(&[u8], &Event) -> Vec<u8> + Send + Sync>;
type Merger = Arc<dyn Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync>;
type TableJoiner = Arc<dyn Fn(&Event, Option<&[u8]>) -> Option<Vec<u8>> + Send + Sync>;
/// A stream join's function: both sides for a pair; one side alone (the other `None`) for an
/// event of a left or outer join that found no partner in its window.
type StreamJoiner = Arc<dyn Fn(Option<&Event>, Option<&Event>) -> Vec<u8> + Send + Sync>;

/// Which events of a windowed stream-stream join come out without a partner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JoinKind {
    /// None: pairs only.
    Inner,
    /// The left side's events, once their window and grace have passed without a partner.
    Left,
    /// Both sides' events, likewise.
    Outer,
}

impl JoinKind {
    /// Whether events of `side` (0 left, 1 right) that found no partner come out alone.
    pub fn keeps_unmatched(self, side: u8) -> bool {
        match self {
            JoinKind::Inner => false,
            JoinKind::Left => side == 0,
            JoinKind::Outer => true,
        }
    }

    fn name(self) -> &'static str {
        match self {
            JoinKind::Inner => "join",
            JoinKind::Left => "left_join",
            JoinKind::Outer => "outer_join",
        }
    }
}

/// How an aggregation folds records: from `init` (or, without one, the first record's value)
/// by `add`; `merge` joins two aggregates (session windows that a record bridges).
#[derive(Clone)]
pub(crate) struct Aggregator {
    pub init: Option<Init>,
    pub add: Adder,
    pub merge: Option<Merger>,
    /// For `describe`: count, reduce or aggregate.
    pub name: &'static str,
}

impl Aggregator {
    /// `aggregate` with `event` folded in.
    pub fn fold(&self, aggregate: Option<&[u8]>, event: &Event) -> Vec<u8> {
        match (aggregate, &self.init) {
            (Some(aggregate), _) => (self.add)(aggregate, event),
            (None, Some(init)) => (self.add)(&init(), event),
            (None, None) => event.value.clone(),
        }
    }

    fn count() -> Aggregator {
        Aggregator {
            init: Some(Arc::new(|| b"0".to_vec())),
            add: Arc::new(|count, _| (parse_count(count) + 1).to_string().into_bytes()),
            merge: Some(Arc::new(|a, b| {
                (parse_count(a) + parse_count(b)).to_string().into_bytes()
            })),
            name: "count",
        }
    }
}

/// A count as `count` writes it: decimal ASCII (JSON too). Anything else counts as 0.
pub fn parse_count(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()).unwrap_or(0)
}

pub(crate) struct AggregateOp {
    pub store: String,
    pub windows: Option<Windows>,
    pub aggregator: Aggregator,
    pub emit: Emit,
    pub late_to: Option<String>,
}

pub(crate) struct StreamJoinOp {
    pub store: String,
    /// The node whose events are the join's left side.
    pub left: usize,
    pub windows: JoinWindows,
    pub joiner: StreamJoiner,
    pub kind: JoinKind,
}

#[derive(Clone)]
pub(crate) enum Op {
    Source {
        topic: String,
    },
    Table {
        topic: String,
        store: String,
    },
    Filter(Predicate),
    Map(Mapper),
    MapValues(ValueMapper),
    FlatMap(FlatMapper),
    Peek(Inspector),
    /// Re-key (`group_by`'s function, if any) and write to an internal topic, which `source`
    /// reads in the next stage.
    Repartition {
        topic: String,
        key: Option<KeyFn>,
        source: usize,
    },
    Aggregate(Arc<AggregateOp>),
    TableJoin {
        store: String,
        joiner: TableJoiner,
        inner: bool,
    },
    StreamJoin(Arc<StreamJoinOp>),
    To {
        topic: String,
    },
}

#[derive(Clone)]
pub(crate) struct Node {
    pub name: String,
    pub op: Op,
    pub parents: Vec<usize>,
    pub children: Vec<usize>,
    /// An operator on the way from the stage's source may have changed the key, so the
    /// records may not be in the partition of their key.
    pub key_changed: bool,
}

pub(crate) struct Graph {
    pub application: String,
    pub template: ProcessorConfig,
    pub nodes: Vec<Node>,
    /// Store kinds chosen per operator.
    pub store_kinds: BTreeMap<String, StoreKind>,
    /// Tables, by topic: their node.
    pub tables: BTreeMap<String, usize>,
    pub around_batch: Option<exec::AroundBatch>,
    /// Settings of the repartition topics the runner creates (their partitions are the
    /// upstream input's).
    pub repartition_config: TopicConfig,
}

/// Repartition topics' settings unless [`Topology::repartition_config`] says otherwise:
/// deleted, never compacted, in segments of 64 MiB rolled at least every 10 minutes, so that
/// the runner can purge what the next stage committed soon after it did.
pub fn default_repartition_config() -> TopicConfig {
    TopicConfig {
        segment_bytes: 64 * 1024 * 1024,
        segment_ms: 10 * 60 * 1000,
        ..TopicConfig::default()
    }
}

impl Graph {
    fn add(&mut self, kind: &str, op: Op, parents: &[usize], key_changed: bool) -> usize {
        let id = self.nodes.len();
        for &parent in parents {
            self.nodes[parent].children.push(id);
        }
        let changed = key_changed || parents.iter().any(|&p| self.nodes[p].key_changed);
        let name = format!("{kind}-{id:04}");
        self.nodes.push(Node {
            name,
            op,
            parents: parents.to_vec(),
            children: Vec::new(),
            key_changed: changed,
        });
        id
    }

    /// A repartition of `node`'s records (re-keyed by `key`), and the source of the next
    /// stage that reads them.
    fn repartition(&mut self, node: usize, key: Option<KeyFn>) -> usize {
        let id = self.nodes.len();
        let topic = format!("{}-repartition-{id:04}", self.application);
        let source = id + 1;
        let op = Op::Repartition { topic: topic.clone(), key, source };
        self.add("repartition", op, &[node], false);
        self.add("source", Op::Source { topic }, &[], false)
    }
}

/// An application's operators, built from [`Topology::stream`] and [`Topology::table`]; run
/// it with [`Topology::runner`]. Cheap to clone: clones share the graph.
#[derive(Clone)]
pub struct Topology {
    graph: Arc<Mutex<Graph>>,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Topology {
    /// A topology of the application `application`: its consumer group, and the prefix of its
    /// internal topics.
    pub fn new(application: &str) -> Topology {
        let graph = Graph {
            application: application.to_owned(),
            template: ProcessorConfig::new(application, ""),
            nodes: Vec::new(),
            store_kinds: BTreeMap::new(),
            tables: BTreeMap::new(),
            around_batch: None,
            repartition_config: default_repartition_config(),
        };
        Topology { graph: Arc::new(Mutex::new(graph)) }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Settings of every stage: commit interval, threads, snapshots, the stores' kind
    /// (`store_kind`), restore listener. The application, inputs and stores are the
    /// topology's own.
    pub fn configure(&self, adjust: impl FnOnce(ProcessorConfig) -> ProcessorConfig) -> &Topology {
        let mut graph = self.lock();
        let template = std::mem::replace(&mut graph.template, ProcessorConfig::new("", ""));
        graph.template = adjust(template);
        self
    }

    /// Settings of the repartition topics the runner creates, when it creates them (an
    /// existing topic keeps its own): segment size and age, retention. Their partitions are
    /// always the upstream input's. The runner deletes a repartition topic's records once the
    /// stage reading them has committed past them, a sealed segment at a time
    /// ([`chronik_engine::Engine::delete_records`]), so their segments bound the disk a
    /// repartition takes.
    pub fn repartition_config(&self, config: TopicConfig) -> &Topology {
        self.lock().repartition_config = config;
        self
    }

    /// Run each batch of records through `around`, which must call the function it is given
    /// once (the Python SDK holds the GIL around a batch with it).
    #[doc(hidden)]
    pub fn around_batch(&self, around: exec::AroundBatch) {
        self.lock().around_batch = Some(around);
    }

    pub fn application(&self) -> String {
        self.lock().application.clone()
    }

    /// The records of `topic`, as a stream.
    pub fn stream(&self, topic: &str) -> Stream {
        let node = self.lock().add("source", Op::Source { topic: topic.to_owned() }, &[], false);
        Stream { topology: self.clone(), node }
    }

    /// The latest value of each key of `topic` (an empty value deletes it), for joins:
    /// materialized in a store named after the topic. `topic` must be partitioned like the
    /// streams joined with it, by the same keys.
    pub fn table(&self, topic: &str) -> Table {
        let mut graph = self.lock();
        if let Some(&node) = graph.tables.get(topic) {
            return Table { topology: self.clone(), node };
        }
        let store = format!("table-{topic}");
        let node = graph.add("table", Op::Table { topic: topic.to_owned(), store }, &[], false);
        graph.tables.insert(topic.to_owned(), node);
        Table { topology: self.clone(), node }
    }

    /// The topics the topology reads that it does not write itself, in the order first used.
    pub fn sources(&self) -> Vec<String> {
        let graph = self.lock();
        let mut topics: Vec<String> = Vec::new();
        for node in &graph.nodes {
            let (Op::Source { topic } | Op::Table { topic, .. }) = &node.op else { continue };
            let internal = graph.nodes.iter().any(
                |n| matches!(&n.op, Op::Repartition { topic: written, .. } if written == topic),
            );
            if !internal && !topics.contains(topic) {
                topics.push(topic.clone());
            }
        }
        topics
    }

    /// The topics `to` writes.
    pub fn outputs(&self) -> Vec<String> {
        let mut topics: Vec<String> = Vec::new();
        for node in &self.lock().nodes {
            if let Op::To { topic } = &node.op
                && !topics.contains(topic)
            {
                topics.push(topic.clone());
            }
        }
        topics
    }

    /// The stores of the stateful operators (each with its changelog).
    pub fn stores(&self) -> Vec<String> {
        let graph = self.lock();
        graph.nodes.iter().filter_map(|node| store_of(&node.op)).map(str::to_owned).collect()
    }

    /// The stages, operators, topics and stores, one per line.
    pub fn describe(&self) -> String {
        let graph = self.lock();
        let stages = match runner::stages(&graph) {
            Ok(stages) => stages,
            Err(error) => return format!("Topology {} (invalid: {error})", graph.application),
        };
        let mut text = format!("Topology {}\n", graph.application);
        for (i, stage) in stages.iter().enumerate() {
            let _ = writeln!(text, "  Stage {i} (reads {})", stage.inputs.join(", "));
            for &id in &stage.nodes {
                let node = &graph.nodes[id];
                let _ = write!(text, "    {} {}", node.name, describe_op(&graph, &node.op));
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

    /// Create the internal topics and changelogs that are missing, restore every stage's
    /// stores, and return the runner. Output topics (`to`) must exist.
    pub fn runner<I: crate::Io>(
        &self,
        engine: &chronik_engine::Engine<I>,
    ) -> Result<TopologyRunner<I>, ProcessorError> {
        TopologyRunner::new(engine, self)
    }
}

pub(crate) fn store_of(op: &Op) -> Option<&str> {
    match op {
        Op::Table { store, .. } => Some(store),
        Op::Aggregate(aggregate) => Some(&aggregate.store),
        Op::StreamJoin(join) => Some(&join.store),
        _ => None,
    }
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

/// A stream of events in a topology. Operators return new streams; a stream may feed several.
#[derive(Clone)]
pub struct Stream {
    topology: Topology,
    node: usize,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("node", &self.node).finish_non_exhaustive()
    }
}

impl Stream {
    fn then(&self, kind: &str, op: Op, key_changed: bool) -> Stream {
        let node = self.topology.lock().add(kind, op, &[self.node], key_changed);
        Stream { topology: self.topology.clone(), node }
    }

    /// The events for which `keep` is true.
    #[must_use]
    pub fn filter(&self, keep: impl Fn(&Event) -> bool + Send + Sync + 'static) -> Stream {
        self.then("filter", Op::Filter(Arc::new(keep)), false)
    }

    /// Each event replaced by `f`'s; the key may change (a later `group_by_key` repartitions).
    #[must_use]
    pub fn map(&self, f: impl Fn(Event) -> Event + Send + Sync + 'static) -> Stream {
        self.then("map", Op::Map(Arc::new(f)), true)
    }

    /// Each event with its value replaced by `f`'s; the key stays.
    #[must_use]
    pub fn map_values(&self, f: impl Fn(&Event) -> Vec<u8> + Send + Sync + 'static) -> Stream {
        self.then("map_values", Op::MapValues(Arc::new(f)), false)
    }

    /// Each event replaced by the events `f` returns (none, one or many); keys may change.
    #[must_use]
    pub fn flat_map(&self, f: impl Fn(Event) -> Vec<Event> + Send + Sync + 'static) -> Stream {
        self.then("flat_map", Op::FlatMap(Arc::new(f)), true)
    }

    /// The same events, each shown to `f` first (logging, metrics).
    #[must_use]
    pub fn peek(&self, f: impl Fn(&Event) + Send + Sync + 'static) -> Stream {
        self.then("peek", Op::Peek(Arc::new(f)), false)
    }

    /// Events grouped by the key `key` computes: they are repartitioned by it, through an
    /// internal topic, so that each key's events meet in one task.
    #[must_use]
    pub fn group_by(&self, key: impl Fn(&Event) -> Vec<u8> + Send + Sync + 'static) -> Grouped {
        let source = self.topology.lock().repartition(self.node, Some(Arc::new(key)));
        Grouped::new(Stream { topology: self.topology.clone(), node: source })
    }

    /// Events grouped by their key: repartitioned first only if an operator since the source
    /// may have changed keys.
    #[must_use]
    pub fn group_by_key(&self) -> Grouped {
        Grouped::new(self.partitioned())
    }

    /// This stream, repartitioned by key if its keys may have changed since its source.
    fn partitioned(&self) -> Stream {
        let mut graph = self.topology.lock();
        if !graph.nodes[self.node].key_changed {
            return self.clone();
        }
        let source = graph.repartition(self.node, None);
        Stream { topology: self.topology.clone(), node: source }
    }

    /// Each event joined with its key's row in `table` as of the event's time: `f` makes the
    /// new value. Events whose key has no row are dropped.
    #[must_use]
    pub fn join(
        &self,
        table: &Table,
        f: impl Fn(&Event, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Stream {
        let joiner: TableJoiner = Arc::new(move |event, row| row.map(|row| f(event, row)));
        self.table_join(table, joiner, true)
    }

    /// [`Stream::join`] keeping events without a row: `f` gets `None` for them.
    #[must_use]
    pub fn left_join(
        &self,
        table: &Table,
        f: impl Fn(&Event, Option<&[u8]>) -> Vec<u8> + Send + Sync + 'static,
    ) -> Stream {
        let joiner: TableJoiner = Arc::new(move |event, row| Some(f(event, row)));
        self.table_join(table, joiner, false)
    }

    fn table_join(&self, table: &Table, joiner: TableJoiner, inner: bool) -> Stream {
        let stream = self.partitioned();
        let mut graph = self.topology.lock();
        let Op::Table { store, .. } = &graph.nodes[table.node].op else {
            unreachable!("a table's node is a table")
        };
        let op = Op::TableJoin { store: store.clone(), joiner, inner };
        let node = graph.add("join", op, &[stream.node, table.node], false);
        Stream { topology: self.topology.clone(), node }
    }

    /// Each pair of events with the same key, one from this stream and one from `other`,
    /// whose times are at most `windows`' size apart: `f(this, other)` makes the joined
    /// value (key: theirs; time: the later of the two). Events wait in a store for their
    /// partners until the window and grace have passed.
    #[must_use]
    pub fn join_stream(
        &self,
        other: &Stream,
        windows: JoinWindows,
        f: impl Fn(&Event, &Event) -> Vec<u8> + Send + Sync + 'static,
    ) -> Stream {
        let joiner = move |this: Option<&Event>, other: Option<&Event>| match (this, other) {
            (Some(this), Some(other)) => f(this, other),
            _ => unreachable!("an inner join makes pairs only"),
        };
        self.stream_join(other, windows, Arc::new(joiner), JoinKind::Inner)
    }

    /// [`Stream::join_stream`], and each event of this stream that no event of `other` joined
    /// within the window: `f(this, None)`, once the window and grace have passed (when the
    /// join's observed time is past its time plus twice the window plus the grace), stamped
    /// with its own time.
    #[must_use]
    pub fn left_join_stream(
        &self,
        other: &Stream,
        windows: JoinWindows,
        f: impl Fn(&Event, Option<&Event>) -> Vec<u8> + Send + Sync + 'static,
    ) -> Stream {
        let joiner = move |this: Option<&Event>, other: Option<&Event>| match this {
            Some(this) => f(this, other),
            None => unreachable!("a left join's results all have a left side"),
        };
        self.stream_join(other, windows, Arc::new(joiner), JoinKind::Left)
    }

    /// [`Stream::left_join_stream`] on both sides: pairs, and the events of either stream
    /// that found no partner (`f(Some(this), None)` or `f(None, Some(other))`).
    #[must_use]
    pub fn outer_join_stream(
        &self,
        other: &Stream,
        windows: JoinWindows,
        f: impl Fn(Option<&Event>, Option<&Event>) -> Vec<u8> + Send + Sync + 'static,
    ) -> Stream {
        self.stream_join(other, windows, Arc::new(f), JoinKind::Outer)
    }

    /// A windowed stream join of any kind.
    fn stream_join(
        &self,
        other: &Stream,
        windows: JoinWindows,
        joiner: StreamJoiner,
        kind: JoinKind,
    ) -> Stream {
        let left = self.partitioned();
        let right = other.partitioned();
        let mut graph = self.topology.lock();
        let store = format!("join-{:04}", graph.nodes.len());
        let op = StreamJoinOp { store, left: left.node, windows, joiner, kind };
        let node = graph.add("join", Op::StreamJoin(Arc::new(op)), &[left.node, right.node], false);
        Stream { topology: self.topology.clone(), node }
    }

    /// Write each event to `topic` (which must exist), keyed as it is, with its time. An
    /// aggregation's windowed result carries its window in the headers `window.start` and
    /// `window.end` (decimal milliseconds; the end is exclusive).
    pub fn to(&self, topic: &str) {
        let _ = self.then("to", Op::To { topic: topic.to_owned() }, false);
    }
}

/// A stream of events grouped by key, to aggregate, in windows or not.
#[derive(Clone, Debug)]
pub struct Grouped {
    stream: Stream,
    store: Option<String>,
    kind: Option<StoreKind>,
}

impl Grouped {
    fn new(stream: Stream) -> Grouped {
        Grouped { stream, store: None, kind: None }
    }

    /// The aggregation's store (and changelog) name, instead of one made from its position.
    #[must_use]
    pub fn named(mut self, store: &str) -> Grouped {
        self.store = Some(store.to_owned());
        self
    }

    /// The kind of the aggregation's store (default: the topology's `store_kind`).
    #[must_use]
    pub fn store_kind(mut self, kind: StoreKind) -> Grouped {
        self.kind = Some(kind);
        self
    }

    /// Aggregate in windows.
    #[must_use]
    pub fn window(self, windows: Windows) -> Windowed {
        Windowed { grouped: self, windows, emit: Emit::Updates, late_to: None }
    }

    /// The number of events per key so far, as decimal ASCII (JSON too), after each event.
    #[must_use]
    pub fn count(self) -> Stream {
        self.build(None, Aggregator::count(), Emit::Updates, None)
    }

    /// Per key, the events' values combined by `f(aggregate, value)`, starting from the first
    /// value; after each event.
    #[must_use]
    pub fn reduce(self, f: impl Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync + 'static) -> Stream {
        self.build(None, reducer(f), Emit::Updates, None)
    }

    /// Per key, `add(aggregate, event)` folded from `init()`; after each event.
    #[must_use]
    pub fn aggregate(
        self,
        init: impl Fn() -> Vec<u8> + Send + Sync + 'static,
        add: impl Fn(&[u8], &Event) -> Vec<u8> + Send + Sync + 'static,
    ) -> Stream {
        let aggregator = Aggregator {
            init: Some(Arc::new(init)),
            add: Arc::new(add),
            merge: None,
            name: "aggregate",
        };
        self.build(None, aggregator, Emit::Updates, None)
    }

    fn build(
        self,
        windows: Option<Windows>,
        aggregator: Aggregator,
        emit: Emit,
        late_to: Option<String>,
    ) -> Stream {
        let topology = self.stream.topology.clone();
        let mut graph = topology.lock();
        let store =
            self.store.unwrap_or_else(|| format!("{}-{:04}", aggregator.name, graph.nodes.len()));
        if let Some(kind) = self.kind {
            graph.store_kinds.insert(store.clone(), kind);
        }
        let op = AggregateOp { store, windows, aggregator, emit, late_to };
        let node = graph.add("aggregate", Op::Aggregate(Arc::new(op)), &[self.stream.node], false);
        drop(graph);
        Stream { topology, node }
    }
}

fn reducer(f: impl Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync + 'static) -> Aggregator {
    let f = Arc::new(f);
    let add = Arc::clone(&f);
    Aggregator {
        init: None,
        add: Arc::new(move |aggregate, event| add(aggregate, &event.value)),
        merge: Some(Arc::new(move |a, b| f(a, b))),
        name: "reduce",
    }
}

/// A grouped stream in windows, to aggregate.
#[derive(Clone, Debug)]
pub struct Windowed {
    grouped: Grouped,
    windows: Windows,
    emit: Emit,
    late_to: Option<String>,
}

impl Windowed {
    /// Emit each window's result once, when it closes, instead of after every event.
    #[must_use]
    pub fn emit_final(self) -> Windowed {
        self.emit(Emit::Final)
    }

    #[must_use]
    pub fn emit(mut self, emit: Emit) -> Windowed {
        self.emit = emit;
        self
    }

    /// Write late events (all their windows closed) to `topic`, as they came.
    #[must_use]
    pub fn late_to(mut self, topic: &str) -> Windowed {
        self.late_to = Some(topic.to_owned());
        self
    }

    /// Events per key and window, as decimal ASCII.
    #[must_use]
    pub fn count(self) -> Stream {
        self.grouped.build(Some(self.windows), Aggregator::count(), self.emit, self.late_to)
    }

    /// Per key and window, the values combined by `f(aggregate, value)` from the first.
    #[must_use]
    pub fn reduce(self, f: impl Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync + 'static) -> Stream {
        self.grouped.build(Some(self.windows), reducer(f), self.emit, self.late_to)
    }

    /// Per key and window, `add(aggregate, event)` folded from `init()`. Session windows
    /// also need `merge(a, b)`, for two sessions a late event bridges
    /// ([`Windowed::aggregate_merging`]).
    #[must_use]
    pub fn aggregate(
        self,
        init: impl Fn() -> Vec<u8> + Send + Sync + 'static,
        add: impl Fn(&[u8], &Event) -> Vec<u8> + Send + Sync + 'static,
    ) -> Stream {
        let aggregator = Aggregator {
            init: Some(Arc::new(init)),
            add: Arc::new(add),
            merge: None,
            name: "aggregate",
        };
        self.grouped.build(Some(self.windows), aggregator, self.emit, self.late_to)
    }

    /// [`Windowed::aggregate`] with the merge session windows need.
    #[must_use]
    pub fn aggregate_merging(
        self,
        init: impl Fn() -> Vec<u8> + Send + Sync + 'static,
        add: impl Fn(&[u8], &Event) -> Vec<u8> + Send + Sync + 'static,
        merge: impl Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Stream {
        let aggregator = Aggregator {
            init: Some(Arc::new(init)),
            add: Arc::new(add),
            merge: Some(Arc::new(merge)),
            name: "aggregate",
        };
        self.grouped.build(Some(self.windows), aggregator, self.emit, self.late_to)
    }
}

/// A table: a topic's latest value per key, to join streams with.
#[derive(Clone)]
pub struct Table {
    topology: Topology,
    node: usize,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("node", &self.node).finish_non_exhaustive()
    }
}

impl Table {
    /// The store the table is materialized in.
    pub fn store(&self) -> String {
        match &self.topology.lock().nodes[self.node].op {
            Op::Table { store, .. } => store.clone(),
            _ => unreachable!("a table's node is a table"),
        }
    }
}

#[cfg(test)]
mod tests;
