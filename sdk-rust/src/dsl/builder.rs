//! The fluent API users build a topology with: [`Topology`], and the [`Stream`], [`Grouped`],
//! [`Windowed`] and [`Table`] handles its operators return. Each call adds nodes to the
//! topology's `Graph`; nothing runs here (the runner runs it).

// The operators, each with an example: docs/operators.md.

use super::graph::{
    AggregateOp, Aggregator, AroundBatch, Emit, Event, Graph, JoinKind, Op, StreamJoinOp,
    StreamJoiner, TableJoiner, default_repartition_config, reducer, store_of,
};
use super::plan;
use super::window::{JoinWindows, Windows};
use crate::TopicConfig;
use crate::processor::ProcessorConfig;
use crate::store::StoreKind;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

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
    pub fn around_batch(&self, around: AroundBatch) {
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
        plan::describe(&self.lock())
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
