//! A stage's processor: each input record becomes an [`Event`] at its source's node and goes
//! down the operators; stateful operators keep everything in their stores, so the runtime's
//! commits and restores carry them exactly once.

use super::aggregate;
use super::bookkeeping::Bookkeeping;
use super::graph::{AggregateOp, Emit, Event, Op};
use super::join;
use super::plan::Plan;
use crate::RecordView;
use crate::processor::{Context, ProcessError, Processor};
use std::sync::Arc;

/// One task of one stage.
pub(crate) struct StageTask {
    plan: Arc<Plan>,
    stage: usize,
    /// The windowed operators' bookkeeping.
    bookkeeping: Bookkeeping,
}

impl StageTask {
    pub fn new(plan: Arc<Plan>, stage: usize) -> StageTask {
        let bookkeeping = Bookkeeping::new(Arc::clone(&plan.late_metric));
        StageTask { plan, stage, bookkeeping }
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
        for record in records {
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
                ctx.emit_with(topic, event.key, event.value, Some(event.timestamp), Vec::new());
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
