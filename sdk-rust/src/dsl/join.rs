//! Joins: a stream's event with its key's row in a table, and a stream's event with the other
//! stream's events of its key within a window (inner, left or outer). Each function hands back
//! the results to pass on; the stage's task passes them on.

use super::bookkeeping::Bookkeeping;
use super::graph::{Event, StreamJoinOp, TableJoiner};
use super::layout::{damaged, expire_kept, keep, kept_between, mark_matched};
use crate::processor::{Context, ProcessError};
use std::sync::Arc;

/// `event` joined with its key's row in the table materialized in `store`: the joined event,
/// or `None` when `joiner` drops it (an inner join without a row).
pub(crate) fn with_table(
    store: &str,
    joiner: &TableJoiner,
    mut event: Event,
    ctx: &mut Context<'_>,
) -> Result<Option<Event>, ProcessError> {
    let row = ctx.store(store)?.get(event.key())?.map(std::borrow::Cow::into_owned);
    let Some(value) = joiner(&event, row.as_deref()) else { return Ok(None) };
    event.value = value;
    Ok(Some(event))
}

/// A windowed stream join: keep the event for its partners to come, and find the other
/// side's events of the key within the window. Returns the results to pass on, or `None`
/// for a late event (counted).
pub(crate) fn with_stream(
    state: &mut Bookkeeping,
    node: usize,
    op: &Arc<StreamJoinOp>,
    left: bool,
    event: Event,
    ctx: &mut Context<'_>,
) -> Result<Option<Joined>, ProcessError> {
    let mut meta = state.meta(node, &op.store, ctx)?;
    meta.observed = meta.observed.max(event.timestamp);
    let t = event.timestamp;
    let (size, grace) = (op.windows.size, op.windows.grace);
    if t.saturating_add(size).saturating_add(grace) < meta.observed {
        state.set_meta(node, meta);
        state.late(node, None, event, ctx);
        return Ok(None);
    }
    meta.sequence += 1;
    state.set_meta(node, meta);
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
    let mut unmatched = Vec::new();
    if state.is_due(node, meta.observed) {
        let store = ctx.store(&op.store)?;
        let (next, expired) =
            expire_kept(store, limit, Some(op.kind)).map_err(|()| damaged(&op.store))?;
        state.set_next_due(node, next.map(|time| time.saturating_add(wait).saturating_add(1)));
        unmatched = expired;
    }
    state.due(node, t.saturating_add(wait).saturating_add(1));
    Ok(Some(Joined {
        op: Arc::clone(op),
        left,
        event,
        unmatched: unmatched.into_iter(),
        partners: partners.into_iter(),
    }))
}

/// A stream join's results for one event, each made by the join's function as it is taken
/// (so the function and the operators downstream take turns, result by result): first the
/// events no partner can join any more, alone, at their own times; then the event's pairs.
pub(crate) struct Joined {
    op: Arc<StreamJoinOp>,
    /// Whether `event` is on the join's left side.
    left: bool,
    event: Event,
    /// Expired events of a left or outer join's tracked sides, with their sides.
    unmatched: std::vec::IntoIter<(u8, Event)>,
    /// The event's partners: time, arrival sequence, value.
    partners: std::vec::IntoIter<(i64, u64, Vec<u8>)>,
}

impl Iterator for Joined {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        let op = &self.op;
        if let Some((side, alone)) = self.unmatched.next() {
            let value = if side == 0 {
                (op.joiner)(Some(&alone), None)
            } else {
                (op.joiner)(None, Some(&alone))
            };
            return Some(Event::new(alone.key, value, alone.timestamp));
        }
        let (time, _, value) = self.partners.next()?;
        let event = &self.event;
        let partner = Event::new(event.key.clone(), value, time);
        let value = if self.left {
            (op.joiner)(Some(event), Some(&partner))
        } else {
            (op.joiner)(Some(&partner), Some(event))
        };
        Some(Event::new(Some(event.key().to_vec()), value, event.timestamp.max(time)))
    }
}
