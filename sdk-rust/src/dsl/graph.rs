//! The node graph a topology is built into: each operator a node (`Op`), with its parents
//! and children, and the events that flow along the edges. Data only: the builder adds nodes,
//! the plan cuts them into stages, the operators run them.

use super::window::{JoinWindows, Window, Windows};
use crate::TopicConfig;
use crate::processor::{ProcessError, ProcessorConfig};
use crate::store::StoreKind;
use std::collections::BTreeMap;
use std::sync::Arc;

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

pub(crate) type Predicate = Arc<dyn Fn(&Event) -> bool + Send + Sync>;
pub(crate) type Mapper = Arc<dyn Fn(Event) -> Event + Send + Sync>;
pub(crate) type ValueMapper = Arc<dyn Fn(&Event) -> Vec<u8> + Send + Sync>;
pub(crate) type FlatMapper = Arc<dyn Fn(Event) -> Vec<Event> + Send + Sync>;
pub(crate) type Inspector = Arc<dyn Fn(&Event) + Send + Sync>;
pub(crate) type KeyFn = Arc<dyn Fn(&Event) -> Vec<u8> + Send + Sync>;
pub(crate) type Init = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;
pub(crate) type Adder = Arc<dyn Fn(&[u8], &Event) -> Vec<u8> + Send + Sync>;
pub(crate) type Merger = Arc<dyn Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync>;
pub(crate) type TableJoiner = Arc<dyn Fn(&Event, Option<&[u8]>) -> Option<Vec<u8>> + Send + Sync>;
/// A stream join's function: both sides for a pair; one side alone (the other `None`) for an
/// event of a left or outer join that found no partner in its window.
pub(crate) type StreamJoiner = Arc<dyn Fn(Option<&Event>, Option<&Event>) -> Vec<u8> + Send + Sync>;

/// Runs a batch with the lock or resource the operators' functions need held once (the
/// Python SDK takes the GIL), and returns what the batch returned.
pub type AroundBatch = Arc<
    dyn Fn(&mut dyn FnMut() -> Result<(), ProcessError>) -> Result<(), ProcessError> + Send + Sync,
>;

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

    pub(crate) fn name(self) -> &'static str {
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

    pub(crate) fn count() -> Aggregator {
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

pub(crate) fn reducer(f: impl Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync + 'static) -> Aggregator {
    let f = Arc::new(f);
    let add = Arc::clone(&f);
    Aggregator {
        init: None,
        add: Arc::new(move |aggregate, event| add(aggregate, &event.value)),
        merge: Some(Arc::new(move |a, b| f(a, b))),
        name: "reduce",
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
    pub around_batch: Option<AroundBatch>,
    /// Settings of the repartition topics the runner creates (their partitions are the
    /// upstream input's).
    pub repartition_config: TopicConfig,
}

/// Repartition topics' settings unless [`Topology::repartition_config`] says otherwise:
/// deleted, never compacted, in segments of 64 MiB rolled at least every 10 minutes, so that
/// the runner can purge what the next stage committed soon after it did.
///
/// [`Topology::repartition_config`]: crate::dsl::Topology::repartition_config
pub fn default_repartition_config() -> TopicConfig {
    TopicConfig {
        segment_bytes: 64 * 1024 * 1024,
        segment_ms: 10 * 60 * 1000,
        ..TopicConfig::default()
    }
}

impl Graph {
    pub(crate) fn add(
        &mut self,
        kind: &str,
        op: Op,
        parents: &[usize],
        key_changed: bool,
    ) -> usize {
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
    pub(crate) fn repartition(&mut self, node: usize, key: Option<KeyFn>) -> usize {
        let id = self.nodes.len();
        let topic = format!("{}-repartition-{id:04}", self.application);
        let source = id + 1;
        let op = Op::Repartition { topic: topic.clone(), key, source };
        self.add("repartition", op, &[node], false);
        self.add("source", Op::Source { topic }, &[], false)
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
