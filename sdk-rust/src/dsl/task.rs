//! A stage's processor: each input record becomes an [`Event`] at its source's node and goes
//! down the operators; stateful operators keep everything in their stores, so the runtime's
//! commits and restores carry them exactly once.

use super::aggregate;
use super::bookkeeping::Bookkeeping;
use super::graph::{AggregateOp, Emit, Event, Op};
use super::join;
use super::layout::{TAKEN, push_key};
use super::plan::{Plan, mark_store};
use crate::RecordView;
use crate::processor::{Context, ProcessError, Processor};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A task writing to a repartition topic, as the records it writes name it: its partition,
/// and which input of its stage the record it processed came from (each input partition is
/// read in offset order, so the offsets of one writer only go up).
type Writer = (u32, u32);

/// The store key of the last record taken from `topic`'s `writer`.
fn taken_key(topic: &str, writer: Writer) -> Vec<u8> {
    let mut key = vec![TAKEN];
    push_key(&mut key, topic.as_bytes());
    key.extend_from_slice(&writer.0.to_be_bytes());
    key.extend_from_slice(&writer.1.to_be_bytes());
    key
}

fn decode_taken(value: &[u8]) -> Result<(u64, u32), ProcessError> {
    let damaged = || ProcessError::new("a repartition mark in a store is not 12 bytes");
    let offset =
        u64::from_be_bytes(value.get(..8).ok_or_else(damaged)?.try_into().map_err(|_| damaged())?);
    let index = value.get(8..).filter(|rest| rest.len() == 4).ok_or_else(damaged)?;
    Ok((offset, u32::from_be_bytes(index.try_into().map_err(|_| damaged())?)))
}

/// The header a record written to a repartition topic carries when the plan deduplicates:
/// the writing task's partition (4 bytes), the index of the input among its stage's (4), the
/// input record's offset (8), and the record's index among those that input record wrote
/// (4), big endian.
pub(crate) const FROM_HEADER: &[u8] = b"chronik.from";

/// One task of one stage.
pub(crate) struct StageTask {
    plan: Arc<Plan>,
    stage: usize,
    /// The windowed operators' bookkeeping.
    bookkeeping: Bookkeeping,
    /// The input record being processed (its writer identity, offset), and how many records
    /// it wrote to repartition topics so far.
    from: (Writer, u64),
    written: u32,
    /// Deduplicating: the store keeping what was taken from each repartition topic's writers
    /// (the stage's first aggregation or join store; `None`: the stage keeps no state, so a
    /// repeated record only repeats outputs), the repartition topics read, and the marks
    /// read so far (topic, writer) -> (offset, index), with those changed since
    /// the last batch.
    taken_in: Option<String>,
    repartitioned: BTreeSet<String>,
    taken: BTreeMap<(String, Writer), (u64, u32)>,
    /// Whether records this stage writes to repartition topics carry marks (see `new`).
    marks_writes: bool,
    changed: BTreeSet<(String, Writer)>,
}

impl StageTask {
    pub fn new(plan: Arc<Plan>, stage: usize) -> StageTask {
        let bookkeeping = Bookkeeping::new(Arc::clone(&plan.late_metric));
        let nodes = &plan.stages[stage].nodes;
        let marks = mark_store(stage);
        let taken_in = nodes
            .iter()
            .find_map(|&node| match &plan.nodes[node].op {
                Op::Aggregate(aggregate) => Some(aggregate.store.clone()),
                Op::StreamJoin(join) => Some(join.store.clone()),
                _ => None,
            })
            .or_else(|| plan.stages[stage].stores.contains(&marks).then_some(marks));
        // Only a stage with one stream input writes the same records, in the same order, when
        // it runs again: the merge of two streams (a join) depends on when records arrive, so
        // what a replay writes may pair other records, and is written unmarked instead (taken
        // as it comes: at least once, it may count twice, never drop).
        let marks_writes =
            nodes.iter().filter(|&&node| matches!(plan.nodes[node].op, Op::Source { .. })).count()
                <= 1;
        let repartitioned = plan
            .nodes
            .iter()
            .filter_map(|node| match &node.op {
                Op::Repartition { topic, .. } => Some(topic.clone()),
                _ => None,
            })
            .filter(|topic| plan.stages[stage].inputs.contains(topic))
            .collect();
        StageTask {
            plan,
            stage,
            bookkeeping,
            marks_writes,
            from: ((0, 0), 0),
            written: 0,
            taken_in,
            repartitioned,
            taken: BTreeMap::new(),
            changed: BTreeSet::new(),
        }
    }

    /// Whether `record`, read from a repartition topic, is new: its writer's (offset, index)
    /// past the last one taken from that writer. A writer that ran again after a crash
    /// (at least once) writes the same records with the same marks.
    fn is_new(
        &mut self,
        store: &str,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<bool, ProcessError> {
        let Some(header) = record.headers().find(|h| h.key == FROM_HEADER) else {
            // Written without marks (embedded, or by a stage joining two streams): taken.
            return Ok(true);
        };
        let damaged = || {
            ProcessError::new(format!(
                "{} offset {}: header {} is not 20 bytes",
                ctx.input(),
                record.offset().get(),
                String::from_utf8_lossy(FROM_HEADER)
            ))
        };
        let bytes: &[u8; 20] = header.value.try_into().map_err(|_| damaged())?;
        let field = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let writer = (field(0), field(4));
        let mut offset = [0; 8];
        offset.copy_from_slice(&bytes[8..16]);
        let (offset, index) = (u64::from_be_bytes(offset), field(16));
        let id = (ctx.input().to_owned(), writer);
        let mut last = self.taken.get(&id).copied();
        if last.is_none() {
            // Read once per writer: kept in `taken` whether this record is taken or dropped.
            let stored = ctx.store(store)?.get(&taken_key(&id.0, writer))?;
            last = stored.map(|value| decode_taken(&value)).transpose()?;
            if let Some(last) = last {
                self.taken.insert(id.clone(), last);
            }
        }
        if last.is_some_and(|last| (offset, index) <= last) {
            return Ok(false);
        }
        self.taken.insert(id.clone(), (offset, index));
        self.changed.insert(id);
        Ok(true)
    }

    /// Write the marks changed in this batch to their store.
    fn save_taken(&mut self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let Some(store) = &self.taken_in else { return Ok(()) };
        for id in std::mem::take(&mut self.changed) {
            let (offset, index) = self.taken[&id];
            let mut value = offset.to_be_bytes().to_vec();
            value.extend_from_slice(&index.to_be_bytes());
            ctx.store(store)?.put(&taken_key(&id.0, id.1), &value);
        }
        Ok(())
    }

    fn run_batch(
        &mut self,
        records: &[RecordView<'_>],
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let plan = Arc::clone(&self.plan);
        let Some(sources) = plan.stages[self.stage].sources.get(ctx.input()) else {
            return Err(ProcessError::new(format!("no operator reads {}", ctx.input())));
        };
        let deduplicate = plan.deduplicate && self.repartitioned.contains(ctx.input());
        let inputs = &plan.stages[self.stage].inputs;
        let input = inputs.iter().position(|topic| topic == ctx.input()).unwrap_or(usize::MAX);
        let input = u32::try_from(input).unwrap_or(u32::MAX);
        for record in records {
            if deduplicate
                && let Some(store) = self.taken_in.clone()
                && !self.is_new(&store, record, ctx)?
            {
                continue;
            }
            self.from = ((ctx.partition(), input), record.offset().get());
            self.written = 0;
            let event = Event {
                key: record.key().map(<[u8]>::to_vec),
                value: record.value().to_vec(),
                timestamp: record.timestamp(),
                window: None,
            };
            for &source in sources {
                match &plan.nodes[source].op {
                    Op::Table { store, .. } => {
                        let table = ctx.store(store)?;
                        if event.value.is_empty() {
                            table.delete(event.key());
                        } else {
                            table.put(event.key(), &event.value);
                        }
                    }
                    _ => self.forward(&plan, source, event.clone(), ctx)?,
                }
            }
        }
        self.save_taken(ctx)?;
        self.bookkeeping.save(&plan.nodes, ctx)
    }

    /// Hand `event` to each operator after `node`.
    fn forward(
        &mut self,
        plan: &Plan,
        node: usize,
        event: Event,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let Some((&last, others)) = plan.nodes[node].children.split_last() else { return Ok(()) };
        for &child in others {
            self.apply(plan, child, node, event.clone(), ctx)?;
        }
        self.apply(plan, last, node, event, ctx)
    }

    fn apply(
        &mut self,
        plan: &Plan,
        node: usize,
        from: usize,
        mut event: Event,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        match &plan.nodes[node].op {
            Op::Source { .. } | Op::Table { .. } => Ok(()),
            Op::Filter(keep) => {
                if keep(&event) {
                    self.forward(plan, node, event, ctx)?;
                }
                Ok(())
            }
            Op::Map(f) => self.forward(plan, node, f(event), ctx),
            Op::MapValues(f) => {
                event.value = f(&event);
                self.forward(plan, node, event, ctx)
            }
            Op::FlatMap(f) => {
                for event in f(event) {
                    self.forward(plan, node, event, ctx)?;
                }
                Ok(())
            }
            Op::Peek(f) => {
                f(&event);
                self.forward(plan, node, event, ctx)
            }
            Op::Repartition { topic, key, .. } => {
                if let Some(key) = key {
                    event.key = Some(key(&event));
                }
                let mut headers = Vec::new();
                if plan.deduplicate && self.marks_writes {
                    let ((partition, input), offset) = self.from;
                    let mut from = partition.to_be_bytes().to_vec();
                    from.extend_from_slice(&input.to_be_bytes());
                    from.extend_from_slice(&offset.to_be_bytes());
                    from.extend_from_slice(&self.written.to_be_bytes());
                    self.written = self.written.saturating_add(1);
                    headers.push((FROM_HEADER.to_vec(), from));
                }
                ctx.emit_with(topic, event.key, event.value, Some(event.timestamp), headers);
                Ok(())
            }
            Op::To { topic } => {
                let headers = event.window.map_or_else(Vec::new, |window| {
                    vec![
                        (b"window.start".to_vec(), window.start.to_string().into_bytes()),
                        (b"window.end".to_vec(), window.end.to_string().into_bytes()),
                    ]
                });
                ctx.emit_with(topic, event.key, event.value, Some(event.timestamp), headers);
                Ok(())
            }
            Op::Aggregate(aggregate) => {
                let aggregate = Arc::clone(aggregate);
                self.aggregate(plan, node, &aggregate, event, ctx)
            }
            Op::TableJoin { store, joiner, .. } => {
                match join::with_table(store, joiner, event, ctx)? {
                    Some(joined) => self.forward(plan, node, joined, ctx),
                    None => Ok(()),
                }
            }
            Op::StreamJoin(op) => {
                let left = from == op.left;
                let bookkeeping = &mut self.bookkeeping;
                let Some(joined) = join::with_stream(bookkeeping, node, op, left, event, ctx)?
                else {
                    return Ok(());
                };
                for result in joined {
                    self.forward(plan, node, result, ctx)?;
                }
                Ok(())
            }
        }
    }

    /// An aggregation: fold, pass the updates on (when it emits them), close what the
    /// observed time closed and pass the final results on (when it emits those).
    fn aggregate(
        &mut self,
        plan: &Plan,
        node: usize,
        op: &AggregateOp,
        event: Event,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let Some(windows) = op.windows else {
            let result = aggregate::fold_keyed(op, event, ctx)?;
            return self.forward(plan, node, result, ctx);
        };
        let bookkeeping = &mut self.bookkeeping;
        let (observed, updates) =
            aggregate::fold_windowed(bookkeeping, node, op, windows, event, ctx)?;
        if op.emit == Emit::Updates {
            for update in updates {
                self.forward(plan, node, update, ctx)?;
            }
        }
        let bookkeeping = &mut self.bookkeeping;
        for result in aggregate::close(bookkeeping, node, op, windows, observed, ctx)? {
            self.forward(plan, node, result, ctx)?;
        }
        Ok(())
    }
}

impl Processor for StageTask {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        self.process_batch(std::slice::from_ref(record), ctx)
    }

    fn process_batch(
        &mut self,
        records: &[RecordView<'_>],
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        match self.plan.around_batch.clone() {
            Some(around) => around(&mut || self.run_batch(records, ctx)),
            None => self.run_batch(records, ctx),
        }
    }
}
