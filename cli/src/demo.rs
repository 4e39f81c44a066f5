//! `chronik demo`: a click stream in, read back out, with throughput figures.

use chronik::{Durability, Offset, Record, TopicConfig};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TOPIC: &str = "clicks";
const PAGES: [&str; 8] =
    ["/", "/search", "/product/42", "/product/7", "/product/1337", "/cart", "/checkout", "/help"];
const ACTIONS: [&str; 4] = ["view", "click", "add_to_cart", "purchase"];

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Events to produce.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,
    /// Distinct users (record keys).
    #[arg(long, default_value_t = 5_000)]
    pub users: u64,
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// Records per append (one batch, one group commit).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    #[arg(long, default_value = "sync", value_parser = crate::parse_durability)]
    pub durability: Durability,
}

/// A small deterministic generator (xorshift64*), so every demo run produces the same stream.
struct Generator(u64);

impl Generator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn run(data: &Path, args: &DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.events > 0 && args.users > 0 && args.batch > 0,
        "events, users and batch must be positive"
    );
    let chronik = crate::open(data, args.durability)?;
    if chronik.partition_count(TOPIC).is_some() {
        chronik.delete_topic(TOPIC).map_err(chronik::Error::from)?;
        println!("deleted the topic {TOPIC:?} left by an earlier demo");
    }
    chronik
        .create_topic(TOPIC, TopicConfig::default().with_partitions(args.partitions))
        .map_err(chronik::Error::from)?;
    println!(
        "producing {} click events from {} users into {TOPIC:?} ({} partitions, keyed by user, \
         durability {:?}, {} records per append, I/O {}{})",
        args.events,
        args.users,
        args.partitions,
        args.durability,
        args.batch,
        chronik.io_backend(),
        if chronik.engine().options().direct_io { ", direct" } else { "" }
    );
    let (produced_bytes, produce_time) = produce(&chronik, args)?;
    report("produced", args.events, produced_bytes, produce_time);
    let (scanned, scanned_bytes, scan_time) = scan(&chronik, args.partitions)?;
    report("read back (zero-copy scan)", scanned, scanned_bytes, scan_time);
    let (summary, consume_time) = consume(&chronik, args.partitions)?;
    report("consumed and aggregated", summary.records, summary.bytes, consume_time);
    anyhow::ensure!(scanned == args.events, "scanned {scanned} events, wrote {}", args.events);
    anyhow::ensure!(
        summary.records == args.events,
        "read {} events, wrote {}",
        summary.records,
        args.events
    );
    summary.print();
    let middle = chronik
        .offset_for_timestamp(TOPIC, 0, summary.middle_timestamp)
        .map_err(chronik::Error::from)?;
    if let Some(offset) = middle {
        println!(
            "time index: partition 0 reaches the stream's middle timestamp at offset {offset}"
        );
    }
    changelog(&chronik, args)?;
    println!("\nthe data is in {}; explore it with:", data.display());
    let data = data.display();
    println!("  chronik --data {data} topic describe {TOPIC}");
    println!("  chronik --data {data} consume {TOPIC} --partition 0 --max 5 --format json");
    println!(
        "  chronik --data {data} consume {TOPIC} --partition 1 --from 1000 --max 3 --print-key"
    );
    Ok(())
}

/// A changelog beside the stream: the topic `profiles` (compacted) takes every user's profile
/// again and again; compaction shrinks it, and a consumer reading it from offset 0 still
/// rebuilds the latest profile of every user.
fn changelog(chronik: &chronik::Chronik, args: &DemoArgs) -> anyhow::Result<()> {
    const PROFILES: &str = "profiles";
    if chronik.partition_count(PROFILES).is_some() {
        chronik.delete_topic(PROFILES).map_err(chronik::Error::from)?;
    }
    let config = TopicConfig {
        segment_bytes: 1 << 20,
        cleanup: chronik::Cleanup::Compact,
        // The demo compacts on demand below, not in the background meanwhile.
        min_cleanable_dirty_ratio: 1.0,
        ..TopicConfig::default()
    };
    chronik.create_topic(PROFILES, config).map_err(chronik::Error::from)?;
    let updates = (args.events / 10).max(args.users);
    let mut generator = Generator(0x2545_F491_4F6C_DD1D);
    let mut latest: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut producer = chronik.producer(PROFILES);
    let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for n in 0..updates {
        let user = if n < args.users { n } else { generator.below(args.users) };
        let key = format!("user-{user:05}").into_bytes();
        let page = PAGES[generator.below(PAGES.len() as u64) as usize];
        let value = format!("{{\"last_page\":\"{page}\",\"update\":{n}}}").into_bytes();
        latest.insert(key.clone(), value.clone());
        batch.push((key, value));
        if batch.len() == args.batch || n + 1 == updates {
            let records: Vec<Record<'_>> =
                batch.iter().map(|(k, v)| Record::new(Some(k), v)).collect();
            producer.send_to(0, &records).map_err(chronik::Error::from)?;
            batch.clear();
        }
    }
    chronik.flush().map_err(chronik::Error::from)?;
    let size = |c: &chronik::Chronik| -> anyhow::Result<u64> {
        let description = c.describe_topic(PROFILES).map_err(chronik::Error::from)?;
        Ok(description.partitions.iter().map(|p| p.size_bytes).sum())
    };
    let before = size(chronik)?;
    let started = Instant::now();
    chronik.compact_topic(PROFILES).map_err(chronik::Error::from)?;
    let took = started.elapsed();
    let after = size(chronik)?;
    let mut rebuilt: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut consumer = chronik.consumer(PROFILES, 0);
    let mut read = 0u64;
    for record in consumer.by_ref() {
        let record = record.map_err(chronik::Error::from)?;
        read += 1;
        if let Some(key) = record.key {
            rebuilt.insert(key, record.value);
        }
    }
    anyhow::ensure!(rebuilt == latest, "the compacted changelog lost a latest value");
    println!(
        "changelog {PROFILES:?} (compacted): {updates} updates of {} users, {:.1} MiB -> {:.1} \
         MiB after compaction in {:.2} s (the active segment is never compacted); a consumer \
         from offset 0 read {read} records and rebuilt the latest profile of all {} users",
        args.users,
        before as f64 / f64::from(1 << 20),
        after as f64 / f64::from(1 << 20),
        took.as_secs_f64(),
        rebuilt.len()
    );
    Ok(())
}

fn now_ms() -> i64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

fn progress(length: u64, message: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(length);
    let style = ProgressStyle::with_template("{msg:>9} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
        .expect("a valid template")
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(message);
    bar
}

/// Records waiting for a partition's next batch: key, value, timestamp.
type Pending = Vec<(Vec<u8>, Vec<u8>, i64)>;

/// Produce the stream; returns the payload bytes written and the time it took.
fn produce(chronik: &chronik::Chronik, args: &DemoArgs) -> anyhow::Result<(u64, Duration)> {
    let mut generator = Generator(0x9E37_79B9_7F4A_7C15);
    let start_ms = now_ms() - i64::try_from(args.events).unwrap_or(i64::MAX);
    let bar = progress(args.events, "produce");
    let mut producer = chronik.producer(TOPIC);
    let mut pending: Vec<Pending> = vec![Vec::new(); args.partitions as usize];
    let mut bytes = 0u64;
    let started = Instant::now();
    for n in 0..args.events {
        let user = generator.below(args.users);
        let key = format!("user-{user:05}").into_bytes();
        let page = PAGES[generator.below(PAGES.len() as u64) as usize];
        let action = match generator.below(100) {
            0..50 => ACTIONS[0],
            50..80 => ACTIONS[1],
            80..95 => ACTIONS[2],
            _ => ACTIONS[3],
        };
        let timestamp = start_ms + i64::try_from(n).unwrap_or(i64::MAX);
        let value =
            format!(r#"{{"user":{user},"page":"{page}","action":"{action}"}}"#).into_bytes();
        bytes += (key.len() + value.len()) as u64;
        let partition = chronik::partition_for_key(&key, args.partitions);
        let queue = &mut pending[partition as usize];
        queue.push((key, value, timestamp));
        if queue.len() >= args.batch {
            send(&mut producer, partition, queue)?;
            bar.inc(args.batch as u64);
        }
    }
    for (partition, queue) in pending.iter_mut().enumerate() {
        let count = queue.len() as u64;
        send(&mut producer, partition as u32, queue)?;
        bar.inc(count);
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    Ok((bytes, elapsed))
}

fn send(
    producer: &mut chronik::Producer,
    partition: u32,
    queue: &mut Pending,
) -> anyhow::Result<()> {
    if queue.is_empty() {
        return Ok(());
    }
    let records: Vec<Record<'_>> =
        queue.iter().map(|(k, v, t)| Record::new(Some(k), v).with_timestamp(*t)).collect();
    producer.send_to(partition, &records).map_err(chronik::Error::from)?;
    queue.clear();
    Ok(())
}

#[derive(Default)]
struct Summary {
    records: u64,
    bytes: u64,
    by_action: HashMap<String, u64>,
    by_page: HashMap<String, u64>,
    by_user: HashMap<Vec<u8>, u64>,
    middle_timestamp: i64,
    first_timestamp: Option<i64>,
    last_timestamp: i64,
}

impl Summary {
    fn add(&mut self, key: &[u8], value: &[u8], timestamp: i64) {
        self.records += 1;
        self.bytes += (key.len() + value.len()) as u64;
        *self.by_user.entry(key.to_vec()).or_default() += 1;
        let field = |name: &str| -> Option<String> {
            let text = std::str::from_utf8(value).ok()?;
            let start = text.find(&format!(r#""{name}":""#))? + name.len() + 4;
            Some(text[start..].split('"').next()?.to_owned())
        };
        if let Some(action) = field("action") {
            *self.by_action.entry(action).or_default() += 1;
        }
        if let Some(page) = field("page") {
            *self.by_page.entry(page).or_default() += 1;
        }
        self.first_timestamp = Some(self.first_timestamp.map_or(timestamp, |t| t.min(timestamp)));
        self.last_timestamp = self.last_timestamp.max(timestamp);
    }

    fn print(&self) {
        let mut actions: Vec<_> = self.by_action.iter().collect();
        actions.sort_by(|a, b| b.1.cmp(a.1));
        println!("\nevents by action:");
        for (action, count) in actions {
            println!("  {action:<12} {count:>9}");
        }
        let mut pages: Vec<_> = self.by_page.iter().collect();
        pages.sort_by(|a, b| b.1.cmp(a.1));
        println!("top pages:");
        for (page, count) in pages.iter().take(3) {
            println!("  {page:<14} {count:>9}");
        }
        if let Some((user, count)) =
            self.by_user.iter().max_by_key(|(user, count)| (**count, std::cmp::Reverse(*user)))
        {
            println!("most active user: {} with {count} events", String::from_utf8_lossy(user));
        }
        println!("distinct users seen: {}", self.by_user.len());
    }
}

/// Visit every record of every partition from the start; returns the time it took.
fn read_all(
    chronik: &chronik::Chronik,
    partitions: u32,
    mut visit: impl FnMut(&chronik::RecordView<'_>),
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for partition in 0..partitions {
        let mut consumer = chronik.consumer(TOPIC, partition);
        loop {
            let fetch = consumer.poll(4 * 1024 * 1024).map_err(chronik::Error::from)?;
            if fetch.is_empty() {
                break;
            }
            fetch.records().for_each(|record| visit(&record));
        }
    }
    Ok(started.elapsed())
}

/// Read everything, touching every key and value but copying nothing.
fn scan(chronik: &chronik::Chronik, partitions: u32) -> anyhow::Result<(u64, u64, Duration)> {
    let (mut records, mut bytes) = (0u64, 0u64);
    let elapsed = read_all(chronik, partitions, |record| {
        records += 1;
        bytes += (record.key().map_or(0, <[u8]>::len) + record.value().len()) as u64;
    })?;
    Ok((records, bytes, elapsed))
}

/// Read everything and aggregate the stream.
fn consume(chronik: &chronik::Chronik, partitions: u32) -> anyhow::Result<(Summary, Duration)> {
    let total: u64 = (0..partitions)
        .map(|p| chronik.high_watermark(TOPIC, p).map(Offset::get))
        .sum::<Result<u64, _>>()
        .map_err(chronik::Error::from)?;
    let bar = progress(total, "consume");
    let mut summary = Summary::default();
    let elapsed = read_all(chronik, partitions, |record| {
        summary.add(record.key().unwrap_or_default(), record.value(), record.timestamp());
        if summary.records % 65_536 == 0 {
            bar.set_position(summary.records);
        }
    })?;
    bar.finish_and_clear();
    let first = summary.first_timestamp.unwrap_or_default();
    summary.middle_timestamp = first + (summary.last_timestamp - first) / 2;
    Ok((summary, elapsed))
}

fn report(what: &str, records: u64, bytes: u64, elapsed: Duration) {
    let seconds = elapsed.as_secs_f64().max(1e-9);
    println!(
        "{what} {records} records ({:.1} MiB of keys and values) in {:.2} s: {:.0} records/s, {:.1} MiB/s",
        bytes as f64 / 1_048_576.0,
        seconds,
        records as f64 / seconds,
        bytes as f64 / 1_048_576.0 / seconds
    );
}
