//! Pipelined appends in `sync` mode: one thread keeps `depth` appends of `batch` 100 B
//! records in flight (`Producer::send_async_to`), waiting for the oldest whenever the window is
//! full, so the engine's write path always has the next turn's work queued. Every append's
//! acknowledgement latency (queued to answered) is recorded. The same, round robin over many
//! partitions with a few appends in flight in each: many small fdatasyncs at once.

use super::{ChronikIo, Measure, TOPIC, open, system_name, topic_config};
use chronik::{Durability, PendingAppend, Record};
use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

/// The scenario's name in the table and the ratios.
pub fn scenario(batch: usize, depth: usize) -> String {
    format!("append 100 B, sync, pipelined, batch {batch}, {depth} in flight")
}

/// The run, and the acknowledgement latencies (p50, p99) in microseconds.
pub fn append_sync_pipelined(
    dir: &Path,
    io: ChronikIo,
    batch: usize,
    depth: usize,
    seconds: f64,
) -> anyhow::Result<(Measure, u64, u64)> {
    let chronik = open(dir, io, Durability::Sync)?;
    chronik.create_topic(TOPIC, topic_config())?;
    let mut producer = chronik.producer(TOPIC);
    let value = [0x5a_u8; 100];
    let records: Vec<Record<'_>> = (0..batch).map(|_| Record::new(None, &value)).collect();
    let mut window = VecDeque::with_capacity(depth);
    let mut latencies_us: Vec<u64> = Vec::new();
    let mut acknowledged = 0u64;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    loop {
        let now = Instant::now();
        if window.len() < depth && now < deadline {
            window.push_back((producer.send_async_to(0, &records)?, now));
            continue;
        }
        let Some((pending, queued)) = window.pop_front() else { break };
        let appended = pending.wait()?;
        latencies_us.push(u64::try_from(queued.elapsed().as_micros()).unwrap_or(u64::MAX));
        acknowledged += appended.last_offset.get() + 1 - appended.base_offset.get();
    }
    let elapsed = start.elapsed();
    latencies_us.sort_unstable();
    // The p-th percentile, p in hundredths.
    let at = |p: usize| latencies_us[(latencies_us.len() - 1) * p / 100];
    let (p50, p99) = (at(50), at(99));
    let name = scenario(batch, depth);
    let measure = Measure::new(&name, &system_name(io), acknowledged, acknowledged * 100, elapsed);
    Ok((measure, p50, p99))
}

/// The name of the many-partitions scenario.
pub fn partitions_scenario(partitions: u32, depth: usize) -> String {
    format!("append 100 B, sync, {partitions} partitions, batch 1, {depth} in flight each")
}

/// One producer thread over `partitions` partitions, round robin, each partition keeping
/// `depth` appends of one 100 B record in flight (waiting for its oldest when its window is
/// full). Small fdatasyncs of many files at once: what a submission queue does better than one
/// system call at a time. The run, and the acknowledgement latencies (p50, p99) in
/// microseconds, queued to collected: a partition's oldest is collected when its turn comes.
pub fn append_sync_partitions(
    dir: &Path,
    io: ChronikIo,
    partitions: u32,
    depth: usize,
    seconds: f64,
) -> anyhow::Result<(Measure, u64, u64)> {
    let chronik = open(dir, io, Durability::Sync)?;
    chronik.create_topic(TOPIC, topic_config().with_partitions(partitions))?;
    let mut producer = chronik.producer(TOPIC);
    let value = [0x5a_u8; 100];
    let record = [Record::new(None, &value)];
    let mut windows: Vec<VecDeque<(PendingAppend, Instant)>> =
        (0..partitions).map(|_| VecDeque::with_capacity(depth)).collect();
    let mut latencies_us: Vec<u64> = Vec::new();
    let mut wait = |(pending, queued): (PendingAppend, Instant)| -> anyhow::Result<()> {
        pending.wait()?;
        latencies_us.push(u64::try_from(queued.elapsed().as_micros()).unwrap_or(u64::MAX));
        Ok(())
    };
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    for partition in (0..partitions).cycle() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let window = &mut windows[partition as usize];
        if window.len() == depth
            && let Some(oldest) = window.pop_front()
        {
            wait(oldest)?;
        }
        window.push_back((producer.send_async_to(partition, &record)?, now));
    }
    for pending in windows.into_iter().flatten() {
        wait(pending)?;
    }
    let elapsed = start.elapsed();
    let (p50, p99) = percentiles(&mut latencies_us);
    let acknowledged = latencies_us.len() as u64;
    let name = partitions_scenario(partitions, depth);
    let measure = Measure::new(&name, &system_name(io), acknowledged, acknowledged * 100, elapsed);
    Ok((measure, p50, p99))
}

/// The 50th and 99th percentiles (sorting `values`).
fn percentiles(values: &mut [u64]) -> (u64, u64) {
    values.sort_unstable();
    let at = |p: usize| values.get((values.len().saturating_sub(1)) * p / 100).copied();
    (at(50).unwrap_or(0), at(99).unwrap_or(0))
}

/// The name of the pipelined `os` scenario.
pub fn os_scenario(value_bytes: usize, batch: usize, depth: usize) -> String {
    format!("append {}, batch {batch}, os, {depth} in flight", super::size_name(value_bytes))
}

/// `records` records of `value_bytes` in batches of `batch`, `os` durability, one producer
/// keeping `depth` appends in flight: the write path coalesces what is queued into writes of
/// up to 1 MiB (several of them in flight on a direct file, linked), while the producer
/// encodes the next batches.
pub fn append_os_pipelined(
    dir: &Path,
    io: ChronikIo,
    value_bytes: usize,
    batch: usize,
    depth: usize,
    records: u64,
) -> anyhow::Result<Measure> {
    let chronik = open(dir, io, Durability::Os)?;
    chronik.create_topic(TOPIC, topic_config())?;
    let mut producer = chronik.producer(TOPIC);
    let value = vec![0x5a_u8; value_bytes];
    let views: Vec<Record<'_>> = (0..batch).map(|_| Record::new(None, &value)).collect();
    let batches = records.div_ceil(batch as u64);
    let mut window = VecDeque::with_capacity(depth);
    let start = Instant::now();
    for _ in 0..batches {
        if window.len() == depth {
            let oldest: chronik::PendingAppend = window.pop_front().expect("the window is full");
            oldest.wait()?;
        }
        window.push_back(producer.send_async_to(0, &views)?);
    }
    for pending in window {
        pending.wait()?;
    }
    chronik.flush()?;
    let elapsed = start.elapsed();
    let total = batches * batch as u64;
    let name = os_scenario(value_bytes, batch, depth);
    Ok(Measure::new(&name, &system_name(io), total, total * value_bytes as u64, elapsed))
}
