//! A stage's processor: each input record becomes an [`Event`] at its source's node and goes
//! down the operators; stateful operators keep everything in their stores, so the runtime's
//! commits and restores carry them exactly once.

use super::window::{
    KEPT, KEPT_TIMES, KEYED, Kind, META, Meta, SESSION_ENDS, SESSIONS, WINDOWS, Window, Windows,
    push_key, sortable, split_key, unsortable,
};
use super::{AggregateOp, Emit, Event, JoinKind, Op, StreamJoinOp};
use crate::RecordView;
use crate::processor::{Context, ProcessError, Processor};
use chronik_engine::internals::canary::{self, Canary};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use super::runner::Plan;

/// Runs a batch with the lock or resource the operators' functions need held once (the
/// Python SDK takes the GIL), and returns what the batch returned.
pub type AroundBatch = Arc<
    dyn Fn(&mut dyn FnMut() -> Result<(), ProcessError>) -> Result<(), ProcessError> + Send + Sync,
>;

/// One task of one stage.
pub(crate) struct StageTask {
    plan: Arc<Plan>,
    stage: usize,
    /// Windowed operators' bookkeeping, read from their stores when first needed and written
    /// back after each batch.
    metas: BTreeMap<usize, Meta>,
    /// Per windowed operator, the earliest time at which something may close or expire
    /// (`None`: unknown, look). Derived from the store; never persisted.
    next_due: BTreeMap<usize, Option<i64>>,
}

impl StageTask {
    pub fn new(plan: Arc<Plan>, stage: usize) -> StageTask {
        StageTask { plan, stage, metas: BTreeMap::new(), next_due: BTreeMap::new() }
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
        for (&node, meta) in &self.metas {
            let Some(store) = super::store_of(&plan.nodes[node].op) else { continue };
            ctx.store(store)?.put(META, &meta.encode());
        }
        Ok(())
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
                let row = ctx.store(store)?.get(event.key()).map(std::borrow::Cow::into_owned);
                if let Some(value) = joiner(&event, row.as_deref()) {
                    event.value = value;
                    self.forward(plan, node, event, ctx)?;
                }
                Ok(())
            }
            Op::StreamJoin(join) => {
                let join = Arc::clone(join);
                self.stream_join(plan, node, &join, from == join.left, event, ctx)
            }
        }
    }

    /// The operator's bookkeeping, from the store the first time.
    fn meta(
        &mut self,
        node: usize,
        store: &str,
        ctx: &mut Context<'_>,
    ) -> Result<Meta, ProcessError> {
        if let Some(meta) = self.metas.get(&node) {
            return Ok(*meta);
        }
        let meta = match ctx.store(store)?.get(META) {
            None => Meta::NEW,
            Some(bytes) => Meta::decode(&bytes).ok_or_else(|| {
                ProcessError::new(format!("store {store}: its bookkeeping entry is not 24 bytes"))
            })?,
        };
        self.metas.insert(node, meta);
        Ok(meta)
    }

    /// A late event: counted, and sent to the operator's late topic if it has one.
    fn late(&mut self, node: usize, late_to: Option<&String>, event: Event, ctx: &mut Context<'_>) {
        if let Some(meta) = self.metas.get_mut(&node) {
            meta.late += 1;
        }
        (self.plan.late_metric)(1);
        if let Some(topic) = late_to {
            ctx.emit_with(topic, event.key, event.value, Some(event.timestamp), Vec::new());
        }
    }

    fn aggregate(
        &mut self,
        plan: &Plan,
        node: usize,
        op: &AggregateOp,
        event: Event,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let Some(windows) = op.windows else {
            let mut key = vec![KEYED];
            key.extend_from_slice(event.key());
            let store = ctx.store(&op.store)?;
            let aggregate = op.aggregator.fold(store.get(&key).as_deref(), &event);
            store.put(&key, &aggregate);
            let result = Event {
                key: event.key,
                value: aggregate,
                timestamp: event.timestamp,
                window: None,
            };
            return self.forward(plan, node, result, ctx);
        };
        let mut meta = self.meta(node, &op.store, ctx)?;
        meta.observed = meta.observed.max(event.timestamp);
        self.metas.insert(node, meta);
        let updates = match windows.kind {
            Kind::Time { size, advance } => {
                self.fold_time(node, op, windows.grace, size, advance, meta.observed, event, ctx)?
            }
            Kind::Session { gap } => {
                self.fold_session(node, op, windows.grace, gap, meta.observed, event, ctx)?
            }
            Kind::Sliding { size } => {
                self.fold_sliding(node, op, windows.grace, size, meta.observed, event, ctx)?
            }
        };
        if op.emit == Emit::Updates {
            for update in updates {
                self.forward(plan, node, update, ctx)?;
            }
        }
        self.close(plan, node, op, windows, meta.observed, ctx)
    }

    /// Fold into each time window of the event that is still open.
    #[allow(clippy::too_many_arguments)]
    fn fold_time(
        &mut self,
        node: usize,
        op: &AggregateOp,
        grace: i64,
        size: i64,
        advance: i64,
        observed: i64,
        event: Event,
        ctx: &mut Context<'_>,
    ) -> Result<Vec<Event>, ProcessError> {
        let mut updates = Vec::new();
        let store = ctx.store(&op.store)?;
        for window in Windows::time_windows(size, advance, event.timestamp) {
            if closed(window.end, grace, observed) && !canary::active(Canary::LateRecordFolded) {
                continue;
            }
            let key = window_key(window.end, event.key());
            let aggregate = op.aggregator.fold(store.get(&key).as_deref(), &event);
            store.put(&key, &aggregate);
            self.due(node, window.end.saturating_add(grace));
            updates.push(result(event.key(), aggregate, window));
        }
        if updates.is_empty() {
            self.late(node, op.late_to.as_ref(), event, ctx);
        }
        Ok(updates)
    }

    /// Merge the event with the key's sessions at most a gap away, or start one.
    #[allow(clippy::too_many_arguments)]
    fn fold_session(
        &mut self,
        node: usize,
        op: &AggregateOp,
        grace: i64,
        gap: i64,
        observed: i64,
        event: Event,
        ctx: &mut Context<'_>,
    ) -> Result<Vec<Event>, ProcessError> {
        let t = event.timestamp;
        let folded = canary::active(Canary::LateRecordFolded);
        let store = ctx.store(&op.store)?;
        let mut prefix = vec![SESSIONS];
        push_key(&mut prefix, event.key());
        let mut high = prefix.clone();
        high.extend_from_slice(&sortable(t.saturating_add(gap)));
        // The key's open sessions starting at most a gap after the event, ending at most a gap
        // before it. A closed one still in the store (its close not yet run) is left alone:
        // what an event does must not depend on when closing last ran.
        let mut merged: Vec<(i64, i64, Vec<u8>)> = Vec::new();
        for (key, value) in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>((
            Bound::Included(&prefix),
            Bound::Included(&high),
        )) {
            let start = unsortable(&key[prefix.len()..]).ok_or_else(|| damaged(&op.store))?;
            let end = unsortable(&value).ok_or_else(|| damaged(&op.store))?;
            let open = folded || !session_closed(end, gap, grace, observed);
            if open && end.saturating_add(gap) >= t {
                merged.push((start, end, value[8..].to_vec()));
            }
        }
        // Late: no open session to join, and a session of the event alone would be closed.
        if merged.is_empty() && session_closed(t, gap, grace, observed) && !folded {
            self.late(node, op.late_to.as_ref(), event, ctx);
            return Ok(Vec::new());
        }
        let (mut start, mut end) = (t, t);
        let mut aggregate: Option<Vec<u8>> = None;
        for (s, e, value) in &merged {
            start = start.min(*s);
            end = end.max(*e);
            aggregate = Some(match (aggregate, &op.aggregator.merge) {
                (None, _) => value.clone(),
                (Some(a), Some(merge)) => merge(&a, value),
                (Some(a), None) => a,
            });
            store.delete(&session_key(event.key(), *s));
            store.delete(&session_end_key(*e, event.key(), *s));
        }
        let aggregate = op.aggregator.fold(aggregate.as_deref(), &event);
        let mut value = sortable(end).to_vec();
        value.extend_from_slice(&aggregate);
        store.put(&session_key(event.key(), start), &value);
        store.put(&session_end_key(end, event.key(), start), &[]);
        self.due(node, end.saturating_add(gap).saturating_add(grace).saturating_add(1));
        let window = Window { start, end: end.saturating_add(1) };
        Ok(vec![result(event.key(), aggregate, window)])
    }

    /// Keep the event, make its own window from the key's kept events, and fold it into the
    /// open windows of the key's later events it falls in.
    #[allow(clippy::too_many_arguments)]
    fn fold_sliding(
        &mut self,
        node: usize,
        op: &AggregateOp,
        grace: i64,
        size: i64,
        observed: i64,
        event: Event,
        ctx: &mut Context<'_>,
    ) -> Result<Vec<Event>, ProcessError> {
        let t = event.timestamp;
        let store = ctx.store(&op.store)?;
        // The key's kept events from one window before the event to one after.
        let mut kept: Vec<(i64, Vec<u8>)> =
            kept_between(store, 0, event.key(), t.saturating_sub(size), t.saturating_add(size))
                .map_err(|()| damaged(&op.store))?
                .into_iter()
                .map(|(time, _, value)| (time, value))
                .collect();
        // The windows holding the event: its own, and those ending at the key's later events
        // less than a size after it; the event is late only if all of them are closed.
        let folded = canary::active(Canary::LateRecordFolded);
        let mut ends: Vec<i64> = std::iter::once(t)
            .chain(kept.iter().map(|(time, _)| *time).filter(|&e| e > t && in_sliding(t, e, size)))
            .filter(|&end| folded || !closed(end.saturating_add(1), grace, observed))
            .collect();
        ends.sort_unstable();
        ends.dedup();
        if ends.is_empty() {
            self.late(node, op.late_to.as_ref(), event, ctx);
            return Ok(Vec::new());
        }
        let mut meta = self.metas[&node];
        meta.sequence += 1;
        self.metas.insert(node, meta);
        let store = ctx.store(&op.store)?;
        keep(store, 0, &event, meta.sequence);
        // In time order, and after the events kept before it at its time.
        let at = kept.partition_point(|(time, _)| *time <= t);
        kept.insert(at, (t, event.value.clone()));
        let mut updates = Vec::new();
        for end in ends {
            let window = Window {
                start: end.saturating_sub(size).saturating_add(1),
                end: end.saturating_add(1),
            };
            let stored_key = window_key(window.end, event.key());
            let aggregate = if end == t {
                // Its own window: the kept events in it, in time order.
                let mut aggregate: Option<Vec<u8>> = None;
                for (time, value) in kept.iter().filter(|(time, _)| in_sliding(*time, end, size)) {
                    let member = Event::new(event.key.clone(), value.clone(), *time);
                    aggregate = Some(op.aggregator.fold(aggregate.as_deref(), &member));
                }
                aggregate.ok_or_else(|| damaged(&op.store))?
            } else {
                // A later event's window takes it in, as it came: one fold, not a recount.
                // (A window missing was closed when its event came, and is closed now.)
                let Some(stored) = store.get(&stored_key) else { continue };
                op.aggregator.fold(Some(&stored), &event)
            };
            store.put(&stored_key, &aggregate);
            self.due(node, window.end.saturating_add(grace));
            updates.push(result(event.key(), aggregate, window));
        }
        // Kept events are needed while a window holding them may change.
        self.due(node, t.saturating_add(size).saturating_add(grace));
        Ok(updates)
    }

    /// Emit (final) and delete the windows the observed time closed; drop kept events no
    /// open window needs.
    fn close(
        &mut self,
        plan: &Plan,
        node: usize,
        op: &AggregateOp,
        windows: Windows,
        observed: i64,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let grace = if canary::active(Canary::WindowFinalBeforeGrace) { 0 } else { windows.grace };
        if !self.is_due(node, observed) {
            return Ok(());
        }
        let expire = !canary::active(Canary::WindowStateNotExpired);
        let store = ctx.store(&op.store)?;
        let mut closing: Vec<(Vec<u8>, Vec<u8>, Window)> = Vec::new();
        let mut next: Option<i64> = None;
        match windows.kind {
            Kind::Time { size, .. } | Kind::Sliding { size } => {
                for (key, value) in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>((
                    Bound::Included(&[WINDOWS]),
                    Bound::Excluded(&[WINDOWS + 1]),
                )) {
                    let end = unsortable(&key[1..]).ok_or_else(|| damaged(&op.store))?;
                    if !closed(end, grace, observed) {
                        next = Some(end.saturating_add(grace));
                        break;
                    }
                    let window = Window { start: end.saturating_sub(size), end };
                    closing.push((key[9..].to_vec(), value.into_owned(), window));
                }
                if expire {
                    for (key, _, window) in &closing {
                        store.delete(&window_key(window.end, key));
                    }
                }
            }
            Kind::Session { gap } => {
                for (key, _) in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>((
                    Bound::Included(&[SESSION_ENDS]),
                    Bound::Excluded(&[SESSION_ENDS + 1]),
                )) {
                    let end = unsortable(&key[1..]).ok_or_else(|| damaged(&op.store))?;
                    let due = end.saturating_add(gap).saturating_add(grace).saturating_add(1);
                    if due > observed {
                        next = Some(due);
                        break;
                    }
                    let (user_key, rest) =
                        split_key(&key[9..]).ok_or_else(|| damaged(&op.store))?;
                    let start = unsortable(rest).ok_or_else(|| damaged(&op.store))?;
                    let window = Window { start, end: end.saturating_add(1) };
                    closing.push((user_key.to_vec(), sortable(end).to_vec(), window));
                }
                for (key, value, window) in &mut closing {
                    // `value` holds the session's end until its aggregate replaces it.
                    let end = unsortable(value).ok_or_else(|| damaged(&op.store))?;
                    let session = session_key(key, window.start);
                    let stored = store.get(&session).ok_or_else(|| damaged(&op.store))?;
                    *value = stored.get(8..).ok_or_else(|| damaged(&op.store))?.to_vec();
                    if expire {
                        store.delete(&session);
                        store.delete(&session_end_key(end, key, window.start));
                    }
                }
            }
        }
        if let Kind::Sliding { size } = windows.kind {
            let limit = observed.saturating_sub(size).saturating_sub(windows.grace);
            let (kept_next, _) =
                expire_kept(store, limit, None).map_err(|()| damaged(&op.store))?;
            let kept_next =
                kept_next.map(|time| time.saturating_add(size).saturating_add(windows.grace));
            next = match (next, kept_next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        self.next_due.insert(node, next);
        if op.emit == Emit::Final {
            for (key, value, window) in closing {
                self.forward(plan, node, result(&key, value, window), ctx)?;
            }
        }
        Ok(())
    }

    /// Whether something of `node` may close or expire at `observed`.
    fn is_due(&self, node: usize, observed: i64) -> bool {
        match self.next_due.get(&node) {
            None => true,
            Some(None) => false,
            Some(Some(due)) => *due <= observed,
        }
    }

    /// Something of `node` may be due at `time`.
    fn due(&mut self, node: usize, time: i64) {
        match self.next_due.get_mut(&node) {
            None => {}
            Some(due @ None) => *due = Some(time),
            Some(Some(due)) => *due = (*due).min(time),
        }
    }

    /// A windowed inner join: keep the event for its partners to come, and join it with the
    /// other side's events of the key within the window.
    fn stream_join(
        &mut self,
        plan: &Plan,
        node: usize,
        op: &StreamJoinOp,
        left: bool,
        event: Event,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let mut meta = self.meta(node, &op.store, ctx)?;
        meta.observed = meta.observed.max(event.timestamp);
        let t = event.timestamp;
        let (size, grace) = (op.windows.size, op.windows.grace);
        if t.saturating_add(size).saturating_add(grace) < meta.observed {
            self.metas.insert(node, meta);
            self.late(node, None, event, ctx);
            return Ok(());
        }
        meta.sequence += 1;
        self.metas.insert(node, meta);
        let store = ctx.store(&op.store)?;
        let (own_side, other_side) = if left { (0, 1) } else { (1, 0) };
        keep(store, own_side, &event, meta.sequence);
        // An event on time (`t + size + grace` not before the observed time) joins partners
        // back to `t - size`: events are kept while `p + 2 size + grace` is not before it.
        // Partners past that are not joined, whether or not they were deleted yet: the result
        // must not depend on when expiry last ran.
        let wait = size.saturating_mul(2).saturating_add(grace);
        let limit = meta.observed.saturating_sub(wait).saturating_sub(1);
        let partners = kept_between(
            store,
            other_side,
            event.key(),
            t.saturating_sub(size),
            t.saturating_add(size),
        )
        .map_err(|()| damaged(&op.store))?;
        let partners: Vec<(i64, u64, Vec<u8>)> =
            partners.into_iter().filter(|(time, ..)| *time > limit).collect();
        if !partners.is_empty() {
            let store = ctx.store(&op.store)?;
            if op.kind.keeps_unmatched(own_side) {
                mark_matched(store, own_side, event.key(), t, meta.sequence);
            }
            if op.kind.keeps_unmatched(other_side) {
                for (time, sequence, _) in &partners {
                    mark_matched(store, other_side, event.key(), *time, *sequence);
                }
            }
        }
        if self.is_due(node, meta.observed) {
            let store = ctx.store(&op.store)?;
            let (next, unmatched) =
                expire_kept(store, limit, Some(op.kind)).map_err(|()| damaged(&op.store))?;
            self.next_due
                .insert(node, next.map(|time| time.saturating_add(wait).saturating_add(1)));
            // Events no partner can join any more, alone, at their own times.
            for (side, alone) in unmatched {
                let value = if side == 0 {
                    (op.joiner)(Some(&alone), None)
                } else {
                    (op.joiner)(None, Some(&alone))
                };
                let result = Event::new(alone.key, value, alone.timestamp);
                self.forward(plan, node, result, ctx)?;
            }
        }
        self.due(node, t.saturating_add(wait).saturating_add(1));
        for (time, _, value) in partners {
            let partner = Event::new(event.key.clone(), value, time);
            let value = if left {
                (op.joiner)(Some(&event), Some(&partner))
            } else {
                (op.joiner)(Some(&partner), Some(&event))
            };
            let joined = Event::new(Some(event.key().to_vec()), value, t.max(time));
            self.forward(plan, node, joined, ctx)?;
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

/// A session ending at `end` is closed once the observed time is past its end, gap and grace.
fn session_closed(end: i64, gap: i64, grace: i64, observed: i64) -> bool {
    i128::from(end) + i128::from(gap) + i128::from(grace) < i128::from(observed)
}

/// Whether the sliding window of `size` ending at `end`, `(end - size, end]`, holds `time`.
fn in_sliding(time: i64, end: i64, size: i64) -> bool {
    let (time, end) = (i128::from(time), i128::from(end));
    time > end - i128::from(size) && time <= end
}

/// A window ending at `end` is closed once the observed time reaches its end plus grace.
fn closed(end: i64, grace: i64, observed: i64) -> bool {
    end.saturating_add(grace) <= observed
}

fn damaged(store: &str) -> ProcessError {
    ProcessError::new(format!("store {store}: a windowed entry does not decode"))
}

fn result(key: &[u8], value: Vec<u8>, window: Window) -> Event {
    let timestamp = window.end.saturating_sub(1);
    Event { key: Some(key.to_vec()), value, timestamp, window: Some(window) }
}

fn window_key(end: i64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + key.len());
    out.push(WINDOWS);
    out.extend_from_slice(&sortable(end));
    out.extend_from_slice(key);
    out
}

fn session_key(key: &[u8], start: i64) -> Vec<u8> {
    let mut out = vec![SESSIONS];
    push_key(&mut out, key);
    out.extend_from_slice(&sortable(start));
    out
}

fn session_end_key(end: i64, key: &[u8], start: i64) -> Vec<u8> {
    let mut out = vec![SESSION_ENDS];
    out.extend_from_slice(&sortable(end));
    push_key(&mut out, key);
    out.extend_from_slice(&sortable(start));
    out
}

/// Keep `event` on `side` (its key, time and sequence number), and in the time index.
fn keep(store: &mut crate::store::Store, side: u8, event: &Event, sequence: u64) {
    let mut by_key = vec![KEPT, side];
    push_key(&mut by_key, event.key());
    by_key.extend_from_slice(&sortable(event.timestamp));
    by_key.extend_from_slice(&sequence.to_be_bytes());
    store.put(&by_key, &event.value);
    store.put(&kept_time_key(side, event.key(), event.timestamp, sequence), &[]);
}

/// A kept event's entry in the time index (its value: empty, or [`MATCHED`]).
fn kept_time_key(side: u8, key: &[u8], time: i64, sequence: u64) -> Vec<u8> {
    let mut by_time = vec![KEPT_TIMES];
    by_time.extend_from_slice(&sortable(time));
    by_time.push(side);
    push_key(&mut by_time, key);
    by_time.extend_from_slice(&sequence.to_be_bytes());
    by_time
}

/// The time-index value of a kept event that a left or outer join paired: it will not come
/// out alone when it expires.
const MATCHED: &[u8] = b"m";

fn mark_matched(store: &mut crate::store::Store, side: u8, key: &[u8], time: i64, sequence: u64) {
    store.put(&kept_time_key(side, key, time, sequence), MATCHED);
}

/// The events kept on `side` for `key` with times in `[from, to]`, in time and arrival order:
/// time, arrival sequence, value.
fn kept_between(
    store: &crate::store::Store,
    side: u8,
    key: &[u8],
    from: i64,
    to: i64,
) -> Result<Vec<(i64, u64, Vec<u8>)>, ()> {
    let mut prefix = vec![KEPT, side];
    push_key(&mut prefix, key);
    let mut low = prefix.clone();
    low.extend_from_slice(&sortable(from));
    let mut high = prefix.clone();
    high.extend_from_slice(&sortable(to));
    high.extend_from_slice(&[0xff; 8]);
    let range = (Bound::Included(low.as_slice()), Bound::Included(high.as_slice()));
    let mut kept = Vec::new();
    for (stored, value) in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>(range) {
        let rest = stored.get(prefix.len()..).ok_or(())?;
        let time = unsortable(rest).ok_or(())?;
        let sequence = rest.get(8..16).ok_or(())?;
        let sequence = u64::from_be_bytes(sequence.try_into().map_err(|_| ())?);
        kept.push((time, sequence, value.into_owned()));
    }
    Ok(kept)
}

/// What [`expire_kept`] found: the earliest time still kept, and the expired events of a
/// left or outer join's tracked sides that no partner joined, with their sides, in time order.
type Expired = (Option<i64>, Vec<(u8, Event)>);

/// Delete the kept events with times at most `limit`. `join`: the kind of the stream join
/// keeping them (`None`: a sliding window's), whose unmatched events are handed back.
fn expire_kept(
    store: &mut crate::store::Store,
    limit: i64,
    join: Option<JoinKind>,
) -> Result<Expired, ()> {
    let mut expired = Vec::new();
    let mut next = None;
    for (key, value) in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>((
        Bound::Included(&[KEPT_TIMES]),
        Bound::Excluded(&[KEPT_TIMES + 1]),
    )) {
        let time = unsortable(key.get(1..).ok_or(())?).ok_or(())?;
        if time > limit {
            next = Some(time);
            break;
        }
        expired.push((key.into_owned(), time, value.as_ref() == MATCHED));
    }
    let mut unmatched = Vec::new();
    if canary::active(Canary::WindowStateNotExpired) {
        return Ok((next, unmatched));
    }
    for (by_time, time, matched) in expired {
        let side = *by_time.get(9).ok_or(())?;
        let (key, rest) = split_key(by_time.get(10..).ok_or(())?).ok_or(())?;
        let mut by_key = vec![KEPT, side];
        push_key(&mut by_key, key);
        by_key.extend_from_slice(&by_time[1..9]);
        by_key.extend_from_slice(rest);
        if !matched && join.is_some_and(|kind| kind.keeps_unmatched(side)) {
            let value = store.get(&by_key).ok_or(())?.into_owned();
            // Under the key it was joined by, as pairs are (an event without one: the empty key).
            unmatched.push((side, Event::new(Some(key.to_vec()), value, time)));
        }
        store.delete(&by_key);
        store.delete(&by_time);
    }
    Ok((next, unmatched))
}
