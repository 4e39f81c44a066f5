//! Aggregations: a record folded into its key's aggregate, or into the windows it falls in
//! (time, session or sliding), and windows closed as the observed time passes them. Each
//! function hands back the results to pass on; the stage's task passes them on.

use super::bookkeeping::Bookkeeping;
use super::graph::{AggregateOp, Emit, Event};
use super::layout::{
    KEYED, SESSION_ENDS, SESSIONS, WINDOWS, damaged, expire_kept, keep, kept_between, push_key,
    session_end_key, session_key, sortable, split_key, unsortable, window_key,
};
use super::window::{Kind, Window, Windows};
use crate::processor::{Context, ProcessError};
use chronik_engine::canary::{self, Canary};
use std::ops::Bound;

/// An aggregation without windows: `event` folded into its key's aggregate; the new
/// aggregate, to pass on.
pub(crate) fn fold_keyed(
    op: &AggregateOp,
    event: Event,
    ctx: &mut Context<'_>,
) -> Result<Event, ProcessError> {
    let mut key = vec![KEYED];
    key.extend_from_slice(event.key());
    let store = ctx.store(&op.store)?;
    let aggregate = op.aggregator.fold(store.get(&key)?.as_deref(), &event);
    store.put(&key, &aggregate);
    Ok(Event { key: event.key, value: aggregate, timestamp: event.timestamp, window: None })
}

/// A windowed aggregation: `event` folded into the open windows it falls in (or counted
/// late). Returns the observed time after it, and each updated window's aggregate (to pass on
/// when the operator emits updates); [`close`] follows.
pub(crate) fn fold_windowed(
    state: &mut Bookkeeping,
    node: usize,
    op: &AggregateOp,
    windows: Windows,
    event: Event,
    ctx: &mut Context<'_>,
) -> Result<(i64, Vec<Event>), ProcessError> {
    let mut meta = state.meta(node, &op.store, ctx)?;
    meta.observed = meta.observed.max(event.timestamp);
    state.set_meta(node, meta);
    let updates = match windows.kind {
        Kind::Time { size, advance } => {
            fold_time(state, node, op, windows.grace, size, advance, meta.observed, event, ctx)?
        }
        Kind::Session { gap } => {
            fold_session(state, node, op, windows.grace, gap, meta.observed, event, ctx)?
        }
        Kind::Sliding { size } => {
            fold_sliding(state, node, op, windows.grace, size, meta.observed, event, ctx)?
        }
    };
    Ok((meta.observed, updates))
}

/// Fold into each time window of the event that is still open.
#[allow(clippy::too_many_arguments)]
fn fold_time(
    state: &mut Bookkeeping,
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
        let aggregate = op.aggregator.fold(store.get(&key)?.as_deref(), &event);
        store.put(&key, &aggregate);
        state.due(node, window.end.saturating_add(grace));
        updates.push(result(event.key(), aggregate, window));
    }
    if updates.is_empty() {
        state.late(node, op.late_to.as_ref(), event, ctx);
    }
    Ok(updates)
}

/// Merge the event with the key's sessions at most a gap away, or start one.
#[allow(clippy::too_many_arguments)]
fn fold_session(
    state: &mut Bookkeeping,
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
    for entry in store
        .range::<(Bound<&[u8]>, Bound<&[u8]>)>((Bound::Included(&prefix), Bound::Included(&high)))
    {
        let (key, value) = entry?;
        let start = unsortable(&key[prefix.len()..]).ok_or_else(|| damaged(&op.store))?;
        let end = unsortable(&value).ok_or_else(|| damaged(&op.store))?;
        let open = folded || !session_closed(end, gap, grace, observed);
        if open && end.saturating_add(gap) >= t {
            merged.push((start, end, value[8..].to_vec()));
        }
    }
    // Late: no open session to join, and a session of the event alone would be closed.
    if merged.is_empty() && session_closed(t, gap, grace, observed) && !folded {
        state.late(node, op.late_to.as_ref(), event, ctx);
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
    state.due(node, end.saturating_add(gap).saturating_add(grace).saturating_add(1));
    let window = Window { start, end: end.saturating_add(1) };
    Ok(vec![result(event.key(), aggregate, window)])
}

/// Keep the event, make its own window from the key's kept events, and fold it into the
/// open windows of the key's later events it falls in.
#[allow(clippy::too_many_arguments)]
fn fold_sliding(
    state: &mut Bookkeeping,
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
        state.late(node, op.late_to.as_ref(), event, ctx);
        return Ok(Vec::new());
    }
    let mut meta = state.loaded(node);
    meta.sequence += 1;
    state.set_meta(node, meta);
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
            let Some(stored) = store.get(&stored_key)? else { continue };
            op.aggregator.fold(Some(&stored), &event)
        };
        store.put(&stored_key, &aggregate);
        state.due(node, window.end.saturating_add(grace));
        updates.push(result(event.key(), aggregate, window));
    }
    // Kept events are needed while a window holding them may change.
    state.due(node, t.saturating_add(size).saturating_add(grace));
    Ok(updates)
}

/// Delete the windows the observed time closed, and drop kept events no open window needs.
/// Returns the closed windows' aggregates when the operator emits final results (to pass on),
/// and none otherwise.
pub(crate) fn close(
    state: &mut Bookkeeping,
    node: usize,
    op: &AggregateOp,
    windows: Windows,
    observed: i64,
    ctx: &mut Context<'_>,
) -> Result<Vec<Event>, ProcessError> {
    let grace = if canary::active(Canary::WindowFinalBeforeGrace) { 0 } else { windows.grace };
    if !state.is_due(node, observed) {
        return Ok(Vec::new());
    }
    let expire = !canary::active(Canary::WindowStateNotExpired);
    let store = ctx.store(&op.store)?;
    let mut closing: Vec<(Vec<u8>, Vec<u8>, Window)> = Vec::new();
    let mut next: Option<i64> = None;
    match windows.kind {
        Kind::Time { size, .. } | Kind::Sliding { size } => {
            for entry in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>((
                Bound::Included(&[WINDOWS]),
                Bound::Excluded(&[WINDOWS + 1]),
            )) {
                let (key, value) = entry?;
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
            for entry in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>((
                Bound::Included(&[SESSION_ENDS]),
                Bound::Excluded(&[SESSION_ENDS + 1]),
            )) {
                let (key, _) = entry?;
                let end = unsortable(&key[1..]).ok_or_else(|| damaged(&op.store))?;
                let due = end.saturating_add(gap).saturating_add(grace).saturating_add(1);
                if due > observed {
                    next = Some(due);
                    break;
                }
                let (user_key, rest) = split_key(&key[9..]).ok_or_else(|| damaged(&op.store))?;
                let start = unsortable(rest).ok_or_else(|| damaged(&op.store))?;
                let window = Window { start, end: end.saturating_add(1) };
                closing.push((user_key.to_vec(), sortable(end).to_vec(), window));
            }
            for (key, value, window) in &mut closing {
                // `value` holds the session's end until its aggregate replaces it.
                let end = unsortable(value).ok_or_else(|| damaged(&op.store))?;
                let session = session_key(key, window.start);
                let stored = store.get(&session)?.ok_or_else(|| damaged(&op.store))?;
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
        let (kept_next, _) = expire_kept(store, limit, None).map_err(|()| damaged(&op.store))?;
        let kept_next =
            kept_next.map(|time| time.saturating_add(size).saturating_add(windows.grace));
        next = match (next, kept_next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    state.set_next_due(node, next);
    if op.emit != Emit::Final {
        return Ok(Vec::new());
    }
    Ok(closing.into_iter().map(|(key, value, window)| result(&key, value, window)).collect())
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

fn result(key: &[u8], value: Vec<u8>, window: Window) -> Event {
    let timestamp = window.end.saturating_sub(1);
    Event { key: Some(key.to_vec()), value, timestamp, window: Some(window) }
}
