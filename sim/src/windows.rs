//! Topology workloads ([`chronik::dsl`]) and their models: what a windowed count (tumbling,
//! hopping or sliding windows), a session count and a stream-table join must produce from the
//! seed's input, worked out here on plain maps, independently of the operators. The
//! fault-free run's outputs and stores must equal the model's (oracle `topology_model`); every
//! faulted run's must equal the fault-free run's (`restore_equivalence`, `exactly_once_outputs`).

use crate::processor_workload::Workload;
use crate::rng::{PER_MILLION, Rng};
use chronik::TopicConfig;
use chronik::dsl::{Emit, JoinWindows, Topology, Windows};
use chronik::testing::SimulationReport;
use chronik::testing::{Entries, InputRecord, Outcome, Records, Simulation, SimulationFailure};
use std::collections::{BTreeMap, BTreeSet};

/// The windows of a windowed workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Window size (tumbling, hopping, sliding) or inactivity gap (sessions), milliseconds.
    pub size: i64,
    /// Hopping windows' advance; the size for tumbling ones (unused by sliding windows).
    pub advance: i64,
    /// Sliding windows instead of time windows (a `Windows` workload only).
    pub sliding: bool,
    pub grace: i64,
    pub emit: Emit,
    /// Go through a repartition topic first (a map that may change keys, here keeping them):
    /// two stages, the second reading what the first committed.
    pub repartition: bool,
    /// A stream join's kind (its window: `size`, its grace: `grace`).
    pub join: JoinKind,
}

/// Which stream join a `StreamJoin` workload runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
    Outer,
}

impl JoinKind {
    /// Whether events of `side` (0: events, 1: users) without a partner come out alone.
    fn keeps_unmatched(self, side: u8) -> bool {
        match self {
            JoinKind::Inner => false,
            JoinKind::Left => side == 0,
            JoinKind::Outer => true,
        }
    }
}

impl Shape {
    pub fn draw(rng: &mut Rng, sessions: bool) -> Shape {
        let size = rng.between(5, 80).cast_signed();
        let advance = if !sessions && rng.chance(PER_MILLION / 2) {
            rng.between(1, size.cast_unsigned()).cast_signed()
        } else {
            size
        };
        let grace = if rng.chance(PER_MILLION / 4) { 0 } else { rng.between(1, 60).cast_signed() };
        let emit = if rng.chance(PER_MILLION / 2) { Emit::Final } else { Emit::Updates };
        let repartition = rng.chance(PER_MILLION / 2);
        // From a copy of the generator, so that the draws after the shape (the seed's input)
        // stay what they were before sliding windows: a third of the time-window seeds slide.
        let sliding = !sessions && rng.clone().fork().chance(PER_MILLION / 3);
        Shape { size, advance, sliding, grace, emit, repartition, join: JoinKind::Inner }
    }

    /// How far back of the stream's time a late event may be drawn.
    pub fn reach(&self) -> u64 {
        (self.size + self.grace + 20).cast_unsigned()
    }

    fn windows(&self, sessions: bool) -> Windows {
        let windows = if sessions {
            Windows::session(self.size)
        } else if self.sliding {
            Windows::sliding(self.size)
        } else {
            Windows::hopping(self.size, self.advance)
        };
        windows.grace(self.grace)
    }
}

/// The output topics of a topology workload: results and late events.
pub fn outputs(_partitions: u32, rng: &mut Rng) -> Vec<(String, u32)> {
    vec![
        ("results".to_owned(), rng.between(1, 3) as u32),
        ("late".to_owned(), rng.between(1, 3) as u32),
    ]
}

/// The workload's topology.
pub fn topology(workload: Workload, shape: Shape) -> Topology {
    let topology = Topology::new("topology");
    // Small repartition segments, so that the runner purges them as the next stage commits.
    topology.repartition_config(TopicConfig { segment_bytes: 4096, ..TopicConfig::default() });
    let events = topology.stream("events");
    match workload {
        Workload::Windows | Workload::Sessions => {
            let sessions = workload == Workload::Sessions;
            let events = if shape.repartition { events.map(|event| event) } else { events };
            events
                .group_by_key()
                .named(if sessions { "sessions" } else { "windows" })
                .window(shape.windows(sessions))
                .emit(shape.emit)
                .late_to("late")
                .count()
                .map_values(|result| {
                    let window = result.window.expect("a windowed result");
                    let count = String::from_utf8_lossy(&result.value);
                    format!("{count}@{}-{}", window.start, window.end).into_bytes()
                })
                .to("results");
        }
        Workload::StreamJoin => {
            let users = topology.stream("users");
            let windows = JoinWindows::of(shape.size).grace(shape.grace);
            let joined = match shape.join {
                JoinKind::Inner => events.join_stream(&users, windows, |event, user| {
                    joined(Some(&event.value), Some(&user.value))
                }),
                JoinKind::Left => events.left_join_stream(&users, windows, |event, user| {
                    joined(Some(&event.value), user.map(|u| u.value.as_slice()))
                }),
                JoinKind::Outer => events.outer_join_stream(&users, windows, |event, user| {
                    joined(event.map(|e| e.value.as_slice()), user.map(|u| u.value.as_slice()))
                }),
            };
            joined.to("results");
        }
        _ => {
            let users = topology.table("users");
            events
                .left_join(&users, |click, user| {
                    [user.unwrap_or(b"?"), b":", &click.value].concat()
                })
                .to("results");
        }
    }
    topology
}

/// A stream join's result: both values, `-` for a missing side.
fn joined(event: Option<&[u8]>, user: Option<&[u8]>) -> Vec<u8> {
    [event.unwrap_or(b"-"), b"+", user.unwrap_or(b"-")].concat()
}

/// Run the seed's topology, checking the fault-free run against the model.
pub fn run(
    workload: Workload,
    simulation: &Simulation,
    shape: Shape,
) -> Result<SimulationReport, SimulationFailure> {
    let expected = model(workload, simulation, shape);
    let windows = match workload {
        Workload::Windows | Workload::Sessions => {
            format!("{}: ", shape.windows(workload == Workload::Sessions))
        }
        _ => String::new(),
    };
    simulation.run_topology_checked(&topology(workload, shape), |found| {
        compare(&expected, found).map_err(|difference| format!("{windows}{difference}"))
    })
}

/// The first difference between the model's outputs and stores and the run's.
fn compare(expected: &Outcome, found: &Outcome) -> Result<(), String> {
    for (key, records) in &expected.outputs {
        let other = found.outputs.get(key).map(Vec::as_slice).unwrap_or_default();
        if records.as_slice() != other {
            let at = records
                .iter()
                .zip(other)
                .position(|(a, b)| a != b)
                .unwrap_or(records.len().min(other.len()));
            return Err(format!(
                "output {key:?} differs from the model: {} records, the model {}; at record {at}: \
                 {:?}, the model {:?}",
                other.len(),
                records.len(),
                other.get(at).map(show),
                records.get(at).map(show),
            ));
        }
    }
    for (key, entries) in &expected.stores {
        let other = found.stores.get(key).map(Vec::as_slice).unwrap_or_default();
        if entries.as_slice() != other {
            return Err(format!(
                "store {key:?} differs from the model: {} entries, the model {} (closed windows \
                 left, open ones missing, or wrong counts)",
                other.len(),
                entries.len()
            ));
        }
    }
    Ok(())
}

fn show(record: &(Option<Vec<u8>>, Vec<u8>)) -> String {
    let key = record.0.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
    format!("{key} {}", String::from_utf8_lossy(&record.1))
}

/// What the model emits, topic by topic.
struct Emitted<'a> {
    simulation: &'a Simulation,
    outputs: BTreeMap<(String, u32), Records>,
}

impl Emitted<'_> {
    fn emit(&mut self, topic: &str, key: &[u8], value: Vec<u8>) {
        let partitions = self
            .simulation
            .outputs
            .iter()
            .find(|(name, _)| name == topic)
            .map_or(1, |(_, partitions)| *partitions);
        let partition = chronik::partition_for_key(key, partitions);
        let records = self.outputs.entry((topic.to_owned(), partition)).or_default();
        records.push((Some(key.to_vec()), value));
    }
}

/// The model's outcome: every output partition, and the stateful operator's stores.
fn model(workload: Workload, simulation: &Simulation, shape: Shape) -> Outcome {
    let mut emitted = Emitted { simulation, outputs: BTreeMap::new() };
    for (topic, partitions) in &simulation.outputs {
        for partition in 0..*partitions {
            emitted.outputs.insert((topic.clone(), partition), Vec::new());
        }
    }
    let mut stores = BTreeMap::new();
    for partition in 0..simulation.input_partitions {
        let of = |input: usize| -> Vec<&InputRecord> {
            simulation
                .input
                .iter()
                .filter(|r| r.partition == partition && r.input == input)
                .collect()
        };
        let (name, entries) = match workload {
            Workload::Windows if shape.sliding => {
                ("windows", sliding_windows(&of(0), shape, &mut emitted))
            }
            Workload::Windows => ("windows", time_windows(&of(0), shape, &mut emitted)),
            Workload::Sessions => ("sessions", sessions(&of(0), shape, &mut emitted)),
            Workload::StreamJoin => {
                // Its store's layout is the operator's business: outputs only.
                stream_join(&of(0), &of(1), shape, &mut emitted);
                continue;
            }
            _ => ("table-users", table_join(&of(0), &of(1), &mut emitted)),
        };
        stores.insert((name.to_owned(), partition), entries);
    }
    Outcome { stores, outputs: emitted.outputs }
}

fn time_of(record: &InputRecord) -> i64 {
    record.timestamp.expect("the workloads set every time")
}

fn key_of(record: &InputRecord) -> &[u8] {
    record.key.as_deref().unwrap_or_default()
}

/// A time as the stores lay it out (docs/format.md): big endian, sign bit flipped.
fn sortable(t: i64) -> [u8; 8] {
    (t.cast_unsigned() ^ (1 << 63)).to_be_bytes()
}

/// The bookkeeping entry: observed time, late events, events kept so far.
fn meta(observed: i64, late: u64, kept: u64) -> (Vec<u8>, Vec<u8>) {
    let mut value = sortable(observed).to_vec();
    value.extend_from_slice(&late.to_be_bytes());
    value.extend_from_slice(&kept.to_be_bytes());
    (vec![0], value)
}

fn time_windows(records: &[&InputRecord], shape: Shape, out: &mut Emitted<'_>) -> Entries {
    if records.is_empty() {
        return Vec::new();
    }
    let (mut observed, mut late) = (i64::MIN, 0);
    // (end, key) -> count: closing order is end, then key.
    let mut open: BTreeMap<(i64, Vec<u8>), u64> = BTreeMap::new();
    for record in records {
        let (t, key) = (time_of(record), key_of(record));
        observed = observed.max(t);
        let mut starts: Vec<i64> = Vec::new();
        let mut start = t.div_euclid(shape.advance) * shape.advance;
        while start + shape.size > t {
            starts.push(start);
            start -= shape.advance;
        }
        starts.reverse();
        let mut folded = false;
        for start in starts {
            let end = start + shape.size;
            if end + shape.grace <= observed {
                continue;
            }
            let count = open.entry((end, key.to_vec())).or_default();
            *count += 1;
            folded = true;
            if shape.emit == Emit::Updates {
                let value = format!("{count}@{start}-{end}").into_bytes();
                out.emit("results", key, value);
            }
        }
        if !folded {
            late += 1;
            out.emit("late", key, record.value.clone());
        }
        let closing: Vec<(i64, Vec<u8>)> =
            open.keys().take_while(|(end, _)| end + shape.grace <= observed).cloned().collect();
        for (end, key) in closing {
            let count = open.remove(&(end, key.clone())).expect("listed");
            if shape.emit == Emit::Final {
                let value = format!("{count}@{}-{end}", end - shape.size).into_bytes();
                out.emit("results", &key, value);
            }
        }
    }
    let mut entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::from([meta(observed, late, 0)]);
    for ((end, key), count) in open {
        let mut store_key = vec![b'W'];
        store_key.extend_from_slice(&sortable(end));
        store_key.extend_from_slice(&key);
        entries.insert(store_key, count.to_string().into_bytes());
    }
    entries.into_iter().collect()
}

/// Sliding windows as docs/operators.md defines them: each event has the window of its key
/// that ends at it, `(t - size, t]`, holding the key's events in it; an event out of order is
/// also counted in the open windows of the key's later events it falls in. An event is late
/// when all these windows are closed (a window `[start, end)` closes once the observed time
/// reaches `end + grace`); late events are in no window. An event is kept while a window ending
/// less than a size after it may still be open or come: until the observed time reaches its
/// time plus size plus grace.
fn sliding_windows(records: &[&InputRecord], shape: Shape, out: &mut Emitted<'_>) -> Entries {
    if records.is_empty() {
        return Vec::new();
    }
    let (size, grace) = (shape.size, shape.grace);
    let (mut observed, mut late, mut sequence) = (i64::MIN, 0, 0_u64);
    // (key, time, arrival) -> value: the events kept.
    let mut kept: BTreeMap<(Vec<u8>, i64, u64), Vec<u8>> = BTreeMap::new();
    // (last time, key) -> count: a window by the time of the events it ends at, closing order.
    let mut open: BTreeMap<(i64, Vec<u8>), u64> = BTreeMap::new();
    let show = |count: u64, last: i64| format!("{count}@{}-{}", last + 1 - size, last + 1);
    for record in records {
        let (t, key) = (time_of(record), key_of(record));
        observed = observed.max(t);
        let window_open = |last: i64| last + 1 + grace > observed;
        let later: Vec<i64> = kept
            .keys()
            .filter(|(k, time, _)| k == key && *time > t && *time < t + size)
            .map(|(_, time, _)| *time)
            .collect();
        let lasts: BTreeSet<i64> =
            std::iter::once(t).chain(later).filter(|&last| window_open(last)).collect();
        if lasts.is_empty() {
            late += 1;
            out.emit("late", key, record.value.clone());
            continue;
        }
        sequence += 1;
        kept.insert((key.to_vec(), t, sequence), record.value.clone());
        for last in lasts {
            let count = if last == t {
                // Its own window, of every event kept in it (those of its time before it too).
                kept.keys()
                    .filter(|(k, time, _)| k == key && *time > t - size && *time <= t)
                    .count() as u64
            } else if let Some(count) = open.get(&(last, key.to_vec())) {
                count + 1
            } else {
                // The later events' own windows were closed when they came: none to update.
                continue;
            };
            open.insert((last, key.to_vec()), count);
            if shape.emit == Emit::Updates {
                out.emit("results", key, show(count, last).into_bytes());
            }
        }
        let closing: Vec<(i64, Vec<u8>)> =
            open.keys().take_while(|(last, _)| !window_open(*last)).cloned().collect();
        for (last, key) in closing {
            let count = open.remove(&(last, key.clone())).expect("listed");
            if shape.emit == Emit::Final {
                out.emit("results", &key, show(count, last).into_bytes());
            }
        }
        kept.retain(|(_, time, _), _| time + size + grace > observed);
    }
    let mut entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::from([meta(observed, late, sequence)]);
    for ((last, key), count) in open {
        let mut window = vec![b'W'];
        window.extend_from_slice(&sortable(last + 1));
        window.extend_from_slice(&key);
        entries.insert(window, count.to_string().into_bytes());
    }
    // Kept events by key (side 0: the only input), and by time.
    for ((key, time, arrival), value) in kept {
        let mut by_key = vec![b'R', 0];
        by_key.extend_from_slice(&with_length(&key));
        by_key.extend_from_slice(&sortable(time));
        by_key.extend_from_slice(&arrival.to_be_bytes());
        entries.insert(by_key, value);
        let mut by_time = vec![b'T'];
        by_time.extend_from_slice(&sortable(time));
        by_time.push(0);
        by_time.extend_from_slice(&with_length(&key));
        by_time.extend_from_slice(&arrival.to_be_bytes());
        entries.insert(by_time, Vec::new());
    }
    entries.into_iter().collect()
}

fn with_length(key: &[u8]) -> Vec<u8> {
    let mut out = (key.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(key);
    out
}

fn sessions(records: &[&InputRecord], shape: Shape, out: &mut Emitted<'_>) -> Entries {
    if records.is_empty() {
        return Vec::new();
    }
    let (gap, grace) = (shape.size, shape.grace);
    let (mut observed, mut late) = (i64::MIN, 0);
    // (key, start) -> (end, count)
    let mut open: BTreeMap<(Vec<u8>, i64), (i64, u64)> = BTreeMap::new();
    for record in records {
        let (t, key) = (time_of(record), key_of(record));
        observed = observed.max(t);
        // The key's open sessions within a gap of the event (one the event's time just
        // closed is closed already).
        let touching: Vec<(i64, i64, u64)> = open
            .iter()
            .filter(|((k, start), (end, _))| {
                k == key && *start <= t + gap && end + gap >= t && end + gap + grace >= observed
            })
            .map(|((_, start), (end, count))| (*start, *end, *count))
            .collect();
        if touching.is_empty() && t + gap + grace < observed {
            late += 1;
            out.emit("late", key, record.value.clone());
            continue;
        }
        let (mut start, mut end, mut count) = (t, t, 1);
        for (s, e, c) in touching {
            open.remove(&(key.to_vec(), s));
            start = start.min(s);
            end = end.max(e);
            count += c;
        }
        open.insert((key.to_vec(), start), (end, count));
        if shape.emit == Emit::Updates {
            out.emit("results", key, format!("{count}@{start}-{}", end + 1).into_bytes());
        }
        let mut closing: Vec<(i64, Vec<u8>, i64)> = open
            .iter()
            .filter(|(_, (end, _))| end + gap + grace < observed)
            .map(|((key, start), (end, _))| (*end, key.clone(), *start))
            .collect();
        closing.sort_by_key(|a| (a.0, with_length(&a.1), a.2));
        for (end, key, start) in closing {
            let (_, count) = open.remove(&(key.clone(), start)).expect("listed");
            if shape.emit == Emit::Final {
                out.emit("results", &key, format!("{count}@{start}-{}", end + 1).into_bytes());
            }
        }
    }
    let mut entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::from([meta(observed, late, 0)]);
    for ((key, start), (end, count)) in open {
        let mut session = vec![b'S'];
        session.extend_from_slice(&with_length(&key));
        session.extend_from_slice(&sortable(start));
        let mut value = sortable(end).to_vec();
        value.extend_from_slice(count.to_string().as_bytes());
        entries.insert(session, value);
        let mut by_end = vec![b'E'];
        by_end.extend_from_slice(&sortable(end));
        by_end.extend_from_slice(&with_length(&key));
        by_end.extend_from_slice(&sortable(start));
        entries.insert(by_end, Vec::new());
    }
    entries.into_iter().collect()
}

/// Clicks and table updates merged by time (a tie: the click first), each click joined with
/// its user's row as of then.
fn table_join(clicks: &[&InputRecord], users: &[&InputRecord], out: &mut Emitted<'_>) -> Entries {
    let mut table: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let (mut c, mut u) = (0, 0);
    while c < clicks.len() || u < users.len() {
        let click_next =
            u >= users.len() || (c < clicks.len() && time_of(clicks[c]) <= time_of(users[u]));
        if click_next {
            let click = clicks[c];
            let row = table.get(key_of(click)).map_or(&b"?"[..], Vec::as_slice);
            out.emit("results", key_of(click), [row, b":", &click.value].concat());
            c += 1;
        } else {
            let user = users[u];
            if user.value.is_empty() {
                table.remove(key_of(user));
            } else {
                table.insert(key_of(user).to_vec(), user.value.clone());
            }
            u += 1;
        }
    }
    table.into_iter().collect()
}

/// A kept event in the model of a stream join, in the order of the operator's time index:
/// time, side, key (by length, then bytes), arrival sequence.
type KeptKey = (i64, u8, usize, Vec<u8>, u64);

/// The windowed join of one partition's events (side 0) and users (side 1), merged by time
/// (ties: events first): each event on time pairs with the other side's kept events of its key
/// at most `size` apart not past their wait (twice the size plus grace); events of a side the
/// join keeps come out alone as they expire (time at most the observed time minus the wait,
/// minus one) if nothing paired them; expiry comes before the event's pairs.
fn stream_join(
    events: &[&InputRecord],
    users: &[&InputRecord],
    shape: Shape,
    out: &mut Emitted<'_>,
) {
    let (width, grace) = (shape.size, shape.grace);
    let wait = 2 * width + grace;
    let mut kept: BTreeMap<KeptKey, (Vec<u8>, bool)> = BTreeMap::new();
    let (mut observed, mut sequence) = (i64::MIN, 0_u64);
    let (mut next_event, mut next_user) = (0, 0);
    while next_event < events.len() || next_user < users.len() {
        let event_next = next_user >= users.len()
            || (next_event < events.len()
                && time_of(events[next_event]) <= time_of(users[next_user]));
        let (side, record) = if event_next {
            next_event += 1;
            (0_u8, events[next_event - 1])
        } else {
            next_user += 1;
            (1_u8, users[next_user - 1])
        };
        let (t, key) = (time_of(record), key_of(record).to_vec());
        observed = observed.max(t);
        if t + width + grace < observed {
            continue;
        }
        sequence += 1;
        let own: KeptKey = (t, side, key.len(), key.clone(), sequence);
        kept.insert(own.clone(), (record.value.clone(), false));
        let limit = observed - wait - 1;
        let partners: Vec<KeptKey> = kept
            .keys()
            .filter(|(time, s, _, k, _)| {
                *s != side && *k == key && (t - width..=t + width).contains(time) && *time > limit
            })
            .cloned()
            .collect();
        if !partners.is_empty() {
            if shape.join.keeps_unmatched(side) {
                kept.get_mut(&own).expect("kept").1 = true;
            }
            if shape.join.keeps_unmatched(1 - side) {
                for partner in &partners {
                    kept.get_mut(partner).expect("kept").1 = true;
                }
            }
        }
        let expired: Vec<KeptKey> =
            kept.keys().take_while(|(time, ..)| *time <= limit).cloned().collect();
        for gone in expired {
            let (value, matched) = kept.remove(&gone).expect("kept");
            if !matched && shape.join.keeps_unmatched(gone.1) {
                let value = if gone.1 == 0 {
                    joined(Some(&value), None)
                } else {
                    joined(None, Some(&value))
                };
                out.emit("results", &gone.3, value);
            }
        }
        for partner in partners {
            let other = &kept[&partner].0;
            let value = if side == 0 {
                joined(Some(&record.value), Some(other))
            } else {
                joined(Some(other), Some(&record.value))
            };
            out.emit("results", &key, value);
        }
    }
}
