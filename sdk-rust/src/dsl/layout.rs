//! How windowed state is laid out in an operator's store, and the reads and writes of it that
//! operators share: keys of windows and sessions, kept events, the bookkeeping entry.
//!
//! Every key of a windowed operator's store starts with one tag byte; times are 8 bytes,
//! big endian with the sign bit flipped (so byte order is time order); a key inside a store
//! key is preceded by its length (4 bytes, big endian), so a key is never a prefix of another:
//!
//! | tag | rest of the store key | value |
//! | --- | --- | --- |
//! | `0x00` | (nothing) | observed time (8, sortable), late events (8), sequence (8) |
//! | `K` | key | aggregate (aggregations without windows) |
//! | `W` | window end, key | aggregate (tumbling, hopping, sliding windows) |
//! | `S` | key length, key, session start | session end (8, sortable), aggregate |
//! | `E` | session end, key length, key, session start | (empty): sessions by end |
//! | `R` | side (1), key length, key, time, sequence (8) | value: events kept (sliding windows, joins) |
//! | `T` | time, side (1), key length, key, sequence (8) | (empty): kept events by time |
//! | `D` | topic length, topic, writer partition (4), writer input (4) | offset (8), index (4): the last record taken from that writer of a repartition topic (on a cluster) |

use super::graph::{Event, JoinKind};
use crate::processor::ProcessError;
use crate::store::Store;
use chronik_engine::canary::{self, Canary};
use std::ops::Bound;

pub(crate) const META: &[u8] = &[0];
pub(crate) const KEYED: u8 = b'K';
pub(crate) const WINDOWS: u8 = b'W';
pub(crate) const SESSIONS: u8 = b'S';
pub(crate) const SESSION_ENDS: u8 = b'E';
pub(crate) const KEPT: u8 = b'R';
pub(crate) const KEPT_TIMES: u8 = b'T';
pub(crate) const TAKEN: u8 = b'D';

/// A time as 8 bytes whose order is the time's.
pub fn sortable(t: i64) -> [u8; 8] {
    (t.cast_unsigned() ^ (1 << 63)).to_be_bytes()
}

/// The time `sortable` made these bytes from (`None`: not 8 bytes).
pub fn unsortable(bytes: &[u8]) -> Option<i64> {
    let bytes: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some((u64::from_be_bytes(bytes) ^ (1 << 63)).cast_signed())
}

/// A key inside a store key: its length first.
pub(crate) fn push_key(out: &mut Vec<u8>, key: &[u8]) {
    out.extend_from_slice(&u32::try_from(key.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(key);
}

/// The key pushed at `bytes`' start, and what follows it.
pub(crate) fn split_key(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let length = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let rest = &bytes[4..];
    (rest.len() >= length).then(|| rest.split_at(length))
}

/// An operator's bookkeeping, kept at [`META`] in its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    /// The largest event time the operator has seen.
    pub observed: i64,
    /// Late events so far.
    pub late: u64,
    /// The sequence number of the last event kept (sliding windows, joins): the last part of
    /// their store keys.
    pub sequence: u64,
}

impl Meta {
    pub const NEW: Meta = Meta { observed: i64::MIN, late: 0, sequence: 0 };

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        out.extend_from_slice(&sortable(self.observed));
        out.extend_from_slice(&self.late.to_be_bytes());
        out.extend_from_slice(&self.sequence.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Meta> {
        if bytes.len() != 24 {
            return None;
        }
        Some(Meta {
            observed: unsortable(&bytes[..8])?,
            late: u64::from_be_bytes(bytes[8..16].try_into().ok()?),
            sequence: u64::from_be_bytes(bytes[16..24].try_into().ok()?),
        })
    }
}

pub(crate) fn damaged(store: &str) -> ProcessError {
    ProcessError::new(format!("store {store}: a windowed entry does not decode"))
}

pub(crate) fn window_key(end: i64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + key.len());
    out.push(WINDOWS);
    out.extend_from_slice(&sortable(end));
    out.extend_from_slice(key);
    out
}

pub(crate) fn session_key(key: &[u8], start: i64) -> Vec<u8> {
    let mut out = vec![SESSIONS];
    push_key(&mut out, key);
    out.extend_from_slice(&sortable(start));
    out
}

pub(crate) fn session_end_key(end: i64, key: &[u8], start: i64) -> Vec<u8> {
    let mut out = vec![SESSION_ENDS];
    out.extend_from_slice(&sortable(end));
    push_key(&mut out, key);
    out.extend_from_slice(&sortable(start));
    out
}

/// Keep `event` on `side` (its key, time and sequence number), and in the time index.
pub(crate) fn keep(store: &mut Store, side: u8, event: &Event, sequence: u64) {
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

pub(crate) fn mark_matched(store: &mut Store, side: u8, key: &[u8], time: i64, sequence: u64) {
    store.put(&kept_time_key(side, key, time, sequence), MATCHED);
}

/// The events kept on `side` for `key` with times in `[from, to]`, in time and arrival order:
/// time, arrival sequence, value.
pub(crate) fn kept_between(
    store: &Store,
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
    for entry in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>(range) {
        // A failed read fails the call; the runner reports the store's own error first.
        let (stored, value) = entry.map_err(|_| ())?;
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
pub(crate) type Expired = (Option<i64>, Vec<(u8, Event)>);

/// Delete the kept events with times at most `limit`. `join`: the kind of the stream join
/// keeping them (`None`: a sliding window's), whose unmatched events are handed back.
pub(crate) fn expire_kept(
    store: &mut Store,
    limit: i64,
    join: Option<JoinKind>,
) -> Result<Expired, ()> {
    let mut expired = Vec::new();
    let mut next = None;
    for entry in store.range::<(Bound<&[u8]>, Bound<&[u8]>)>((
        Bound::Included(&[KEPT_TIMES]),
        Bound::Excluded(&[KEPT_TIMES + 1]),
    )) {
        let (key, value) = entry.map_err(|_| ())?;
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
            let value = store.get(&by_key).map_err(|_| ())?.ok_or(())?.into_owned();
            // Under the key it was joined by, as pairs are (an event without one: the empty key).
            unmatched.push((side, Event::new(Some(key.to_vec()), value, time)));
        }
        store.delete(&by_key);
        store.delete(&by_time);
    }
    Ok((next, unmatched))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sortable_times_sort_and_round_trip() {
        let times = [i64::MIN, -5, -1, 0, 1, 1_700_000_000_000, i64::MAX];
        for pair in times.windows(2) {
            assert!(sortable(pair[0]) < sortable(pair[1]));
        }
        for t in times {
            assert_eq!(unsortable(&sortable(t)), Some(t));
        }
        assert_eq!(unsortable(&[1, 2]), None);
        let meta = Meta { observed: -3, late: 7, sequence: 9 };
        assert_eq!(Meta::decode(&meta.encode()), Some(meta));
        assert_eq!(Meta::decode(&[0; 5]), None);
    }
}
