//! Three topologies over the same clicks, each exactly once under kills (on a data directory,
//! or a Kafka-protocol cluster with transactions):
//!
//! - `per-minute`: clicks per user in tumbling one-minute windows, emitted once per window
//!   when it closes (5 s of grace for late clicks; later ones go to `late-clicks`);
//! - `sessions`: each user's sessions (clicks less than 30 s apart), emitted when they close;
//! - `enriched`: each click joined with its user's row in the `users` table as of the click's
//!   time;
//! - `pages`: clicks per page in one-minute windows, updated with each click: two stages, the
//!   clicks repartitioned by page between them (checked: each window's last count).
//!
//!     cargo run --release -p chronik --example clicks_windows -- [DIR] [CLICKS] [TOPOLOGY]
//!
//! DIR (a data directory or `kafka://host:port`) defaults to `./windows-data`, CLICKS to
//! 1,000,000, TOPOLOGY (or `CLICKS_TOPOLOGY`) to
//! `per-minute`. The clicks: one every 3 ms of event time; each 60 s of them comes from one
//! tenth of the users; every 101st click is 2 s late (within grace) and every 997th two
//! minutes late (beyond it). Every 25,000 clicks, 20 users change plan in `users`. Kill the
//! example at any moment and start it again: the last line checks every output record
//! against the same results worked out in plain Rust (`exact: ...`). With
//! `CHRONIK_GUARANTEE=at-least-once` on a cluster, a windowed result written again after a
//! kill is counted and dropped before the check. `CLICKS_STORE=disk` keeps the windows in disk
//! stores (on a cluster under `state.dir`, `CHRONIK_KAFKA_STATE_DIR`).

use chronik::Log;
use chronik::dsl::{Topology, Windows};
use chronik::processor::{Guarantee, ProcessorConfig, StoreKind, Until};
use chronik::{Connection, Durability, Options, OwnedRecord, Record, TransactionWrite};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

const PARTITIONS: u32 = 4;
const START_MS: i64 = 1_700_000_000_000;
const BATCH: u64 = 1_000;
const GRACE_MS: i64 = 5_000;
const MINUTE_MS: i64 = 60_000;
const GAP_MS: i64 = 30_000;
/// The pages' windows stay open for an hour: past the clicks' whole span, so no click is late
/// however the repartitioned clicks of the four partitions interleave.
const PAGES_GRACE_MS: i64 = 3_600_000;

/// A click or a plan change: the user, the page or plan, the time.
type Row = (String, String, i64);

/// Click `i`: its user, page and time.
fn click(i: u64) -> Row {
    let block = i / 20_000;
    let user = format!("user-{:04}", (block % 10) * 100 + (i * 7919) % 100);
    let mut time = START_MS + 3 * i.cast_signed();
    if i.is_multiple_of(101) {
        time -= 2_000;
    }
    if i.is_multiple_of(997) {
        time -= 120_000;
    }
    (user, format!("/page/{}", i % 50), time)
}

/// The plan changes made in the batch starting at click `i`: (user, plan, time).
fn plan_changes(i: u64) -> Vec<Row> {
    let time = START_MS + 3 * i.cast_signed();
    if i == 0 {
        return (0..1000).map(|u| (format!("user-{u:04}"), "free".to_owned(), time - 1)).collect();
    }
    if !i.is_multiple_of(25_000) {
        return Vec::new();
    }
    let version = i / 25_000;
    (0..20)
        .map(|n| {
            (format!("user-{:04}", (version * 37 + n * 50) % 1000), format!("pro-{version}"), time)
        })
        .collect()
}

/// Produce the batches not produced yet: each batch's clicks and plan changes in one
/// transaction, so a kill leaves whole batches.
fn produce(log: &Connection, clicks: u64) -> Result<(), Box<dyn std::error::Error>> {
    let done: u64 =
        (0..PARTITIONS).map(|p| log.record_count("clicks", p)).sum::<Result<u64, _>>()?;
    let started = Instant::now();
    for batch in (done..clicks).step_by(BATCH as usize) {
        let mut by_topic: BTreeMap<(&str, u32), Vec<Row>> = BTreeMap::new();
        for (user, plan, time) in plan_changes(batch) {
            let partition = chronik::partition_for_key(user.as_bytes(), PARTITIONS);
            by_topic.entry(("users", partition)).or_default().push((user, plan, time));
        }
        for i in batch..(batch + BATCH).min(clicks) {
            let (user, page, time) = click(i);
            let partition = chronik::partition_for_key(user.as_bytes(), PARTITIONS);
            by_topic.entry(("clicks", partition)).or_default().push((user, page, time));
        }
        let records: Vec<Vec<Record<'_>>> = by_topic
            .values()
            .map(|rows| {
                rows.iter()
                    .map(|(k, v, t)| {
                        Record::new(Some(k.as_bytes()), v.as_bytes()).with_timestamp(*t)
                    })
                    .collect()
            })
            .collect();
        let writes: Vec<TransactionWrite<'_>> = by_topic
            .keys()
            .zip(&records)
            .map(|(&(topic, partition), records)| TransactionWrite { topic, partition, records })
            .collect();
        log.send_all(&writes)?;
    }
    if clicks > done {
        println!("produced clicks {done}..{clicks} in {:.2?}", started.elapsed());
    }
    Ok(())
}

/// The topology, its output topic, and a line per output record (`user value [window]`).
fn topology(name: &str) -> Result<(Topology, &'static str), String> {
    let topology = Topology::new(name);
    let clicks = topology.stream("clicks");
    let output = match name {
        "per-minute" => {
            clicks
                .group_by_key()
                .named("per-minute")
                .window(Windows::tumbling(MINUTE_MS).grace(GRACE_MS))
                .emit_final()
                .late_to("late-clicks")
                .count()
                .to("clicks-per-minute");
            "clicks-per-minute"
        }
        "sessions" => {
            clicks
                .group_by_key()
                .named("sessions")
                .window(Windows::session(GAP_MS).grace(GRACE_MS))
                .emit_final()
                .count()
                .to("sessions");
            "sessions"
        }
        "enriched" => {
            let users = topology.table("users");
            clicks
                .left_join(&users, |click, plan| {
                    [plan.unwrap_or(b"unknown"), b" ", &click.value].concat()
                })
                .to("clicks-enriched");
            "clicks-enriched"
        }
        "pages" => {
            clicks
                .group_by(|click| click.value.clone())
                .named("pages")
                .window(Windows::tumbling(MINUTE_MS).grace(PAGES_GRACE_MS))
                .count()
                .to("clicks-per-page");
            "clicks-per-page"
        }
        other => {
            return Err(format!("no topology {other:?}: per-minute, sessions, enriched or pages"));
        }
    };
    if let Ok(kind) = std::env::var("CLICKS_STORE") {
        let store_kind: StoreKind = kind.parse()?;
        topology.configure(|config| ProcessorConfig { store_kind, ..config });
    }
    Ok((topology, output))
}

/// The per-minute check of `late-clicks`: each late click written once (repeats dropped
/// first when allowed; returns how many), and embedded, counted once in the stores.
fn late_clicks(
    log: &Connection,
    topology: &Topology,
    expected: &BTreeMap<u32, Vec<String>>,
    repeats_allowed: bool,
) -> Result<usize, Box<dyn std::error::Error>> {
    let mut repeated = 0;
    let mut late = 0;
    for partition in 0..PARTITIONS {
        let mut written: Vec<OwnedRecord> = log.records("late-clicks", partition)?;
        if repeats_allowed {
            let mut seen = std::collections::BTreeSet::new();
            let before = written.len();
            written.retain(|r| seen.insert((r.key.clone(), r.value.clone(), r.timestamp)));
            repeated += before - written.len();
        }
        late += written.len();
    }
    let wanted = expected.values().flatten().filter(|line| line.ends_with(" late")).count();
    if late != wanted {
        return Err(format!("MISMATCH: {late} late clicks written, {wanted} expected").into());
    }
    // Embedded, the stores' count of late clicks too (on a cluster the stores are the
    // group's, read by whoever holds each partition).
    if let Connection::Embedded(chronik) = log {
        let counted = topology.runner(chronik.engine())?.late_records()?;
        if counted != late as u64 {
            return Err(format!("MISMATCH: {late} late clicks written, {counted} counted").into());
        }
    }
    println!("late clicks: {late}, each written to late-clicks once");
    Ok(repeated)
}

/// The `pages` check: each page's last count in each window (the updates before it may
/// repeat, at least once) equals the clicks counted in plain Rust.
fn last_counts(
    log: &Connection,
    output: &str,
    clicks: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut found: BTreeMap<String, String> = BTreeMap::new();
    let mut updates = 0;
    for partition in 0..PARTITIONS {
        for record in log.records(output, partition)? {
            let text = line(&record);
            let mut parts = text.splitn(3, ' ');
            let (page, count, window) = (parts.next(), parts.next(), parts.next());
            let (Some(page), Some(count), Some(window)) = (page, count, window) else {
                return Err(format!("MISMATCH: {output} holds {text:?}").into());
            };
            found.insert(format!("{page} {window}"), count.to_owned());
            updates += 1;
        }
    }
    let mut counts: BTreeMap<(String, i64), u64> = BTreeMap::new();
    for i in 0..clicks {
        let (_, page, time) = click(i);
        *counts.entry((page, time - time.rem_euclid(MINUTE_MS))).or_default() += 1;
    }
    let wanted: BTreeMap<String, String> = counts
        .into_iter()
        .map(|((page, start), count)| {
            (format!("{page} [{start}, {})", start + MINUTE_MS), count.to_string())
        })
        .collect();
    if found != wanted {
        let differs = wanted.iter().find(|(k, v)| found.get(*k) != Some(*v));
        return Err(format!(
            "MISMATCH in {output}: {} page windows, expected {}; first difference: {differs:?} \
             found {:?}",
            found.len(),
            wanted.len(),
            differs.and_then(|(k, _)| found.get(k)),
        )
        .into());
    }
    println!(
        "exact: {} pages' last counts in their windows ({updates} updates), as worked out from \
         the clicks",
        found.len()
    );
    Ok(())
}

/// A record as the check compares it: key, value, and its window if it has one.
fn line(record: &OwnedRecord) -> String {
    let header = |name: &[u8]| {
        record.headers.iter().find(|(k, _)| k == name).map(|(_, v)| String::from_utf8_lossy(v))
    };
    let mut text = format!(
        "{} {}",
        String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()),
        String::from_utf8_lossy(&record.value)
    );
    if let (Some(start), Some(end)) = (header(b"window.start"), header(b"window.end")) {
        let _ = write!(text, " [{start}, {end})");
    }
    text
}

/// Per partition, what the topology must emit, worked out on plain maps: clicks (and plan
/// changes) in each partition's order, as the tasks read them.
fn expected(name: &str, clicks: u64) -> BTreeMap<u32, Vec<String>> {
    // Per partition: its clicks, and its plan changes.
    let mut inputs: BTreeMap<u32, (Vec<Row>, Vec<Row>)> = BTreeMap::new();
    for batch in (0..clicks).step_by(BATCH as usize) {
        for change in plan_changes(batch) {
            let partition = chronik::partition_for_key(change.0.as_bytes(), PARTITIONS);
            inputs.entry(partition).or_default().1.push(change);
        }
        for i in batch..(batch + BATCH).min(clicks) {
            let c = click(i);
            inputs
                .entry(chronik::partition_for_key(c.0.as_bytes(), PARTITIONS))
                .or_default()
                .0
                .push(c);
        }
    }
    let mut out = BTreeMap::new();
    for (partition, (clicks, changes)) in inputs {
        let lines = match name {
            "per-minute" => per_minute(&clicks),
            "sessions" => sessions(&clicks),
            _ => enriched(&clicks, &changes),
        };
        out.insert(partition, lines);
    }
    out
}

/// The results, and a `user late` line for each click beyond grace.
fn per_minute(clicks: &[Row]) -> Vec<String> {
    let (mut observed, mut lines) = (i64::MIN, Vec::new());
    let mut open: BTreeMap<(i64, String), u64> = BTreeMap::new();
    for (user, _, time) in clicks {
        observed = observed.max(*time);
        let end = time - time.rem_euclid(MINUTE_MS) + MINUTE_MS;
        if end + GRACE_MS > observed {
            *open.entry((end, user.clone())).or_default() += 1;
        } else {
            lines.push(format!("{user} late"));
        }
        while let Some(entry) = open.first_entry().filter(|e| e.key().0 + GRACE_MS <= observed) {
            let ((end, user), count) = entry.remove_entry();
            lines.push(format!("{user} {count} [{}, {end})", end - MINUTE_MS));
        }
    }
    lines
}

fn sessions(clicks: &[Row]) -> Vec<String> {
    let (mut observed, mut lines) = (i64::MIN, Vec::new());
    // Per user, open sessions: start -> (end, count).
    let mut open: BTreeMap<String, BTreeMap<i64, (i64, u64)>> = BTreeMap::new();
    for (user, _, time) in clicks {
        observed = observed.max(*time);
        let mine = open.entry(user.clone()).or_default();
        // The user's open sessions within a gap of the click (one this click's time just
        // closed is closed already); a click with none, whose own session would be closed
        // at once, is late.
        let touching: Vec<i64> = mine
            .iter()
            .filter(|(start, (end, _))| {
                **start <= time + GAP_MS
                    && end + GAP_MS >= *time
                    && end + GAP_MS + GRACE_MS >= observed
            })
            .map(|(start, _)| *start)
            .collect();
        if !touching.is_empty() || time + GAP_MS + GRACE_MS >= observed {
            let (mut start, mut end, mut count) = (*time, *time, 1);
            for s in touching {
                let (e, c) = mine.remove(&s).expect("listed");
                (start, end, count) = (start.min(s), end.max(e), count + c);
            }
            mine.insert(start, (end, count));
        }
        // Closed sessions, in the order of their ends (then user, by length and bytes).
        let mut closing: Vec<(i64, usize, String, i64, u64)> = Vec::new();
        for (user, mine) in &open {
            for (start, (end, count)) in mine {
                if end + GAP_MS + GRACE_MS < observed {
                    closing.push((*end, user.len(), user.clone(), *start, *count));
                }
            }
        }
        closing.sort();
        for (end, _, user, start, count) in closing {
            open.get_mut(&user).expect("listed").remove(&start);
            lines.push(format!("{user} {count} [{start}, {})", end + 1));
        }
    }
    lines
}

fn enriched(clicks: &[Row], changes: &[Row]) -> Vec<String> {
    let (mut plans, mut lines) = (BTreeMap::new(), Vec::new());
    let (mut c, mut u) = (0, 0);
    while c < clicks.len() {
        if u < changes.len() && changes[u].2 < clicks[c].2 {
            plans.insert(changes[u].0.clone(), changes[u].1.clone());
            u += 1;
            continue;
        }
        let (user, page, _) = &clicks[c];
        let plan = plans.get(user).map_or("unknown", String::as_str);
        lines.push(format!("{user} {plan} {page}"));
        c += 1;
    }
    lines
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_else(|| "./windows-data".to_owned());
    let clicks: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let name = args
        .next()
        .or_else(|| std::env::var("CLICKS_TOPOLOGY").ok())
        .unwrap_or_else(|| "per-minute".to_owned());
    let (topology, output) = topology(&name)?;
    let guarantee = Guarantee::from_env()?;
    let log = chronik::connect_with(
        &target,
        Options { durability: Durability::Sync, ..Options::default() },
    )?;
    for topic in [
        "clicks",
        "users",
        "clicks-per-minute",
        "late-clicks",
        "sessions",
        "clicks-enriched",
        "clicks-per-page",
    ] {
        log.ensure_topic(topic, PARTITIONS)?;
    }
    produce(&log, clicks)?;
    print!("{}", topology.describe());
    let started = Instant::now();
    let stats = log.run_topology(&topology, guarantee, Until::CaughtUp)?;
    let elapsed = started.elapsed();
    println!(
        "{name}: {} records in {elapsed:.2?} ({:.0}/s), {} results, {} late clicks",
        stats.records,
        stats.records as f64 / elapsed.as_secs_f64().max(1e-9),
        stats.emitted,
        stats.late_records
    );
    if name == "pages" {
        return last_counts(&log, output, clicks);
    }
    // At least once, a result a crash made a stage write again is written again: the same
    // line for the same user and window. Exactly once, none is.
    let repeats_allowed = guarantee == Guarantee::AtLeastOnce && name != "enriched";
    let mut repeated = 0;
    let expected = expected(&name, clicks);
    let mut results = 0;
    for partition in 0..PARTITIONS {
        let mut found: Vec<String> = log.records(output, partition)?.iter().map(line).collect();
        if repeats_allowed {
            let mut seen = std::collections::BTreeSet::new();
            let before = found.len();
            found.retain(|line| seen.insert(line.clone()));
            repeated += before - found.len();
        }
        let wanted: Vec<String> = expected
            .get(&partition)
            .into_iter()
            .flatten()
            .filter(|line| !line.ends_with(" late"))
            .cloned()
            .collect();
        if found != wanted {
            let at = found.iter().zip(&wanted).position(|(a, b)| a != b);
            return Err(format!(
                "MISMATCH in {output} partition {partition}: {} records, expected {}; first \
                 difference at {at:?}: {:?} vs {:?}",
                found.len(),
                wanted.len(),
                at.and_then(|i| found.get(i)),
                at.and_then(|i| wanted.get(i)),
            )
            .into());
        }
        results += found.len();
    }
    if name == "per-minute" {
        repeated += late_clicks(&log, &topology, &expected, repeats_allowed)?;
    }
    if repeated > 0 {
        println!("repeated: {repeated} results written again (at least once), dropped above");
    }
    println!("exact: {results} {name} results, each once, as worked out from the clicks");
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("clicks_windows: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
