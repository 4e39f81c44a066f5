//! The fuzz targets' bodies, on stable Rust: `fuzz/` (cargo-fuzz, libFuzzer) calls them on
//! generated inputs, and `sim/tests/fuzz_corpus.rs` replays the committed corpus
//! (`fuzz/corpus/<target>/`) through them in the normal test command.
//!
//! Each target builds a small data directory on a [`SimDisk`] (in memory: no fsync costs a
//! millisecond), damages one file with the input's bytes, opens the real engine on it and checks
//! that nothing panics, every failure is a typed error, and nothing that the damaged file does
//! not hold is lost. A target panics (the finding) only when such a check fails.

use crate::{Rng, SimClock, SimDisk};
use chronik_engine::internals::format::parse_batch;
use chronik_engine::io::Namespace;
use chronik_engine::io::{Io, OpenMode, Operation};
use chronik_engine::{Durability, Engine, Offset, Options, Record, TopicConfig};
use std::path::{Path, PathBuf};

/// A target's body: panics on a finding, returns otherwise.
pub type Target = fn(&[u8]);

/// A record read back: offset, key, value, timestamp.
type Read = (u64, Vec<u8>, Vec<u8>, i64);

/// Every target, by the name cargo-fuzz and the corpus directory use.
pub const TARGETS: &[(&str, Target)] = &[
    ("batch_decode", batch_decode),
    ("segment_recovery", segment_recovery),
    ("index_files", index_files),
    ("topic_metadata", topic_metadata),
    ("checkpoint", checkpoint),
    ("engine_model", engine_model),
];

const ROOT: &str = "/data";
const TOPIC: &str = "t";
const EPOCH_MS: i64 = 1_700_000_000_000;
/// What the set-up appends: three segments of 4 KiB, index entries every 256 B.
const SETUP_RECORDS: u64 = 60;

/// A record of the set-up, by offset: key `k<i % 7>`, value `v<i>` padded, timestamp
/// increasing by 10 ms.
fn setup_record(i: u64) -> (Vec<u8>, Vec<u8>, i64) {
    let key = format!("k{}", i % 7).into_bytes();
    let value =
        format!("v{i:04}-{}", "x".repeat(100 + usize::try_from(i % 13).unwrap_or(0))).into_bytes();
    (key, value, EPOCH_MS + i64::try_from(i).unwrap_or(0) * 10)
}

struct Fixture {
    disk: SimDisk,
    clock: SimClock,
}

impl Fixture {
    /// A data directory holding topic `t` (one partition, 4 KiB segments) with the set-up's
    /// records, synced and closed cleanly.
    fn new() -> Fixture {
        let fixture = Fixture { disk: SimDisk::new(Rng::new(0)), clock: SimClock::new(EPOCH_MS) };
        let engine = fixture.open().expect("a fresh directory opens");
        let config = TopicConfig {
            partitions: 1,
            segment_bytes: 4096,
            index_interval_bytes: 256,
            ..TopicConfig::default()
        };
        engine.create_topic(TOPIC, config).expect("the topic is created");
        for i in 0..SETUP_RECORDS {
            let (key, value, timestamp) = setup_record(i);
            let record = Record::new(Some(&key), &value).with_timestamp(timestamp);
            engine.append(TOPIC, 0, &[record]).expect("the set-up appends");
        }
        drop(engine);
        fixture
    }

    fn open(&self) -> Result<Engine<SimDisk>, chronik_engine::OpenError> {
        let options = Options { durability: Durability::Sync, ..Options::default() };
        Engine::open(self.disk.clone(), self.clock.shared(), Path::new(ROOT), options).map(|o| o.0)
    }

    fn partition_dir() -> PathBuf {
        Path::new(ROOT).join("topics").join(TOPIC).join("0")
    }

    /// The partition's segment logs, in offset order.
    fn segments(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .disk
            .list(&Self::partition_dir())
            .expect("the partition directory lists")
            .into_iter()
            .map(|e| e.name)
            .filter(|n| Path::new(n).extension().is_some_and(|e| e == "log"))
            .collect();
        names.sort();
        names
    }

    fn read_file(&self, path: &Path) -> Vec<u8> {
        let file = self.disk.open(path, OpenMode::Read).expect("the file exists");
        let size = self.disk.file_size(file).expect("its size");
        let buffer = vec![0; usize::try_from(size).expect("small")];
        let out = self.submit(Operation::Read { file, position: 0, buffer });
        self.disk.close(file);
        out
    }

    /// Replace the content of `path` (created if missing) with `bytes`, durably.
    fn write_file(&self, path: &Path, bytes: &[u8]) {
        let file = match self.disk.open(path, OpenMode::ReadWrite) {
            Ok(file) => file,
            Err(_) => self.disk.open(path, OpenMode::CreateNew).expect("the file is created"),
        };
        self.submit(Operation::Truncate { file, length: 0 });
        self.submit(Operation::Write { file, position: 0, buffer: bytes.to_vec() });
        self.submit(Operation::Fsync { file });
        self.disk.close(file);
    }

    fn submit(&self, operation: Operation) -> Vec<u8> {
        let completion = self.disk.submit(vec![operation]).pop().expect("one completion");
        completion.result.expect("the simulated disk has no faults here");
        completion.buffer
    }
}

/// Every record readable from `from` to the high watermark, or the first typed error.
fn read_all(engine: &Engine<SimDisk>, from: Offset) -> Result<Vec<Read>, String> {
    let end = engine.high_watermark(TOPIC, 0).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut at = from;
    // Bounded: each fetch moves forward or the loop ends.
    for _ in 0..10_000 {
        if at >= end {
            return Ok(out);
        }
        let fetch = engine.read(TOPIC, 0, at, 4096).map_err(|e| e.to_string())?;
        if fetch.is_empty() {
            return Ok(out);
        }
        for record in fetch.records() {
            let key = record.key().unwrap_or_default().to_vec();
            out.push((record.offset().get(), key, record.value().to_vec(), record.timestamp()));
        }
        assert!(fetch.next_offset() > at, "a non-empty fetch moves forward");
        at = fetch.next_offset();
    }
    panic!("reading {end} records took more than 10,000 fetches");
}

fn expected_from(from: u64) -> Vec<Read> {
    (from..SETUP_RECORDS)
        .map(|i| {
            let (key, value, timestamp) = setup_record(i);
            (i, key, value, timestamp)
        })
        .collect()
}

/// Batch decoding on arbitrary bytes: never panics, and a batch that parses iterates to
/// exactly its record count, each record's headers included.
pub fn batch_decode(data: &[u8]) {
    if let Ok(batch) = parse_batch(data) {
        let mut count = 0_usize;
        for record in batch.records() {
            // Walk every header too: their lengths come from the bytes.
            let _ = record.headers().count();
            count += 1;
        }
        assert_eq!(count, batch.record_count() as usize);
    }
}

/// One segment log replaced (the input's first byte picks which, and whether the bytes are
/// spliced over the original at a position or replace it whole): the open succeeds or fails
/// with a typed error; when it succeeds, reads return records or typed errors, every record
/// of the segments before the damaged one reads back unchanged, and an append either works or
/// fails with a typed error.
pub fn segment_recovery(data: &[u8]) {
    let Some((&choice, bytes)) = data.split_first() else { return };
    let fixture = Fixture::new();
    let segments = fixture.segments();
    let which = usize::from(choice & 0x0f) % segments.len();
    let path = Fixture::partition_dir().join(&segments[which]);
    let original = fixture.read_file(&path);
    let damaged = if choice & 0x10 == 0 {
        bytes.to_vec()
    } else {
        // Splice: keep the original around the input, so most batches stay valid.
        let position = usize::from(choice >> 5) * original.len() / 8;
        let mut out = original.clone();
        let end = (position + bytes.len()).min(out.len());
        out[position..end].copy_from_slice(&bytes[..end - position]);
        out.extend_from_slice(&bytes[end - position..]);
        out
    };
    fixture.write_file(&path, &damaged);
    let intact_below: u64 = segments[which].trim_end_matches(".log").parse().expect("a base");
    let Ok(engine) = fixture.open() else { return };
    // Reads of the damaged part give records or typed errors; what matters is no panic.
    let _ = read_all(&engine, Offset::ZERO);
    // The segments before the damaged one are untouched: each of their records reads.
    for i in 0..intact_below {
        let fetch = engine.read(TOPIC, 0, Offset::new(i), 64).expect("an intact segment reads");
        let record = fetch.records().find(|r| r.offset().get() >= i).expect("its record");
        assert_eq!(record.offset().get(), i, "the record at {i}");
        assert_eq!(record.value(), setup_record(i).1.as_slice(), "the record at {i}");
    }
    let _ = engine.append(TOPIC, 0, &[Record::new(None, b"after")]);
}

/// A sealed segment's offset and time index replaced by the input (split at its first byte):
/// indexes are derived data, so every read and every timestamp lookup gives exactly what the
/// intact directory gives.
pub fn index_files(data: &[u8]) {
    let Some((&split, bytes)) = data.split_first() else { return };
    let split = usize::from(split).min(bytes.len());
    let fixture = Fixture::new();
    let segments = fixture.segments();
    let stem = segments[0].trim_end_matches(".log").to_owned();
    let dir = Fixture::partition_dir();
    fixture.write_file(&dir.join(format!("{stem}.index")), &bytes[..split]);
    fixture.write_file(&dir.join(format!("{stem}.timeindex")), &bytes[split..]);
    let engine = fixture.open().expect("damaged indexes never stop an open");
    for from in [0, 1, 5, 17, 29, SETUP_RECORDS - 1] {
        let records =
            read_all(&engine, Offset::new(from)).expect("damaged indexes never fail a read");
        let first = records.iter().position(|r| r.0 >= from).unwrap_or(records.len());
        assert_eq!(records[first..], expected_from(from)[..], "reading from {from}");
    }
    for i in [0, 3, 11, 30, SETUP_RECORDS - 1] {
        let timestamp = setup_record(i).2;
        let found = engine.offset_for_timestamp(TOPIC, 0, timestamp).expect("a lookup");
        assert_eq!(found.map(Offset::get), Some(i), "the offset for timestamp {timestamp}");
    }
}

/// The topic's metadata file replaced by the input: the open fails with a typed error, or
/// succeeds with a topic that describes and reads (records or typed errors).
pub fn topic_metadata(data: &[u8]) {
    let fixture = Fixture::new();
    let path = Path::new(ROOT).join("topics").join(TOPIC).join("topic.meta");
    fixture.write_file(&path, data);
    let Ok(engine) = fixture.open() else { return };
    if engine.describe_topic(TOPIC).is_ok() {
        let _ = read_all(&engine, Offset::ZERO);
    }
}

/// The partition's sync checkpoint replaced by the input: the checkpoint only tells recovery
/// what was synced, and the log here is whole, so every record reads back unchanged.
pub fn checkpoint(data: &[u8]) {
    let fixture = Fixture::new();
    fixture.write_file(&Fixture::partition_dir().join("synced.checkpoint"), data);
    let engine = fixture.open().expect("a damaged checkpoint never stops an open");
    let records = read_all(&engine, Offset::ZERO).expect("a whole log reads");
    assert_eq!(records, expected_from(0), "a damaged checkpoint lost or changed records");
}

/// Operations decoded from the input, run on the engine and on a model (a list of values per
/// partition), with crashes: `sync` durability acknowledges only what is durable, so after
/// every operation the engine holds exactly the model's records.
pub fn engine_model(data: &[u8]) {
    let disk = SimDisk::new(Rng::new(u64::from(data.first().copied().unwrap_or(0))));
    let clock = SimClock::new(EPOCH_MS);
    let open = || {
        let options = Options { durability: Durability::Sync, ..Options::default() };
        Engine::open(disk.clone(), clock.shared(), Path::new(ROOT), options)
            .expect("a directory with no damage opens")
            .0
    };
    let mut engine = open();
    let config = TopicConfig {
        partitions: 2,
        segment_bytes: 4096,
        index_interval_bytes: 256,
        ..TopicConfig::default()
    };
    engine.create_topic(TOPIC, config).expect("the topic is created");
    let mut model: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    let mut crash_rng = Rng::new(7);
    for op in data.chunks(3).take(200) {
        let (kind, a, b) =
            (op[0], op.get(1).copied().unwrap_or(0), op.get(2).copied().unwrap_or(0));
        let partition = usize::from(a & 1);
        match kind % 6 {
            0 | 1 => {
                // Append a batch of 1 to 8 records of 0 to 255 bytes.
                let count = usize::from(a >> 5) + 1;
                let values: Vec<Vec<u8>> =
                    (0..count).map(|i| vec![b.wrapping_add(i as u8); usize::from(b) + i]).collect();
                let records: Vec<Record<'_>> =
                    values.iter().map(|v| Record::new(None, v)).collect();
                let appended = engine.append(TOPIC, partition as u32, &records).expect("an append");
                assert_eq!(appended.base_offset.get(), model[partition].len() as u64);
                model[partition].extend(values);
            }
            2 => {
                // Read from an offset.
                let len = model[partition].len() as u64;
                let from = if len == 0 { 0 } else { u64::from(b) % (len + 1) };
                check_partition(&engine, partition, from, &model[partition]);
            }
            3 => {
                drop(engine);
                engine = open();
            }
            4 => {
                // Crash: unsynced state is dropped in any way the disk model allows.
                drop(engine);
                disk.crash(&mut crash_rng);
                engine = open();
            }
            _ => {
                clock.advance(u64::from(b) * 100);
                engine.tick().expect("a tick");
            }
        }
    }
    for (partition, values) in model.iter().enumerate() {
        check_partition(&engine, partition, 0, values);
    }
}

fn check_partition(engine: &Engine<SimDisk>, partition: usize, from: u64, model: &[Vec<u8>]) {
    let p = u32::try_from(partition).expect("small");
    let end = engine.high_watermark(TOPIC, p).expect("a high watermark").get();
    assert_eq!(end, model.len() as u64, "partition {partition}: the high watermark");
    let mut at = from;
    while at < end {
        let fetch = engine.read(TOPIC, p, Offset::new(at), 2048).expect("a read");
        assert!(!fetch.is_empty(), "an empty fetch below the high watermark");
        let mut next = at;
        for record in fetch.records().filter(|r| r.offset().get() >= at) {
            let offset = record.offset().get();
            assert_eq!(offset, next, "partition {partition}: offsets are contiguous");
            let expected = &model[usize::try_from(offset).expect("small")];
            assert_eq!(
                record.value(),
                expected.as_slice(),
                "partition {partition} offset {offset}"
            );
            next += 1;
        }
        assert_eq!(
            fetch.next_offset().get(),
            next,
            "partition {partition}: the fetch's next offset"
        );
        at = fetch.next_offset().get();
    }
}

/// The seed corpus (`chronik-sim fuzz-seeds DIR` writes it): for each target, inputs that
/// reach past its first checks, taken from a real set-up directory.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let fixture = Fixture::new();
    let dir = Fixture::partition_dir();
    let segments = fixture.segments();
    let log = |i: usize| fixture.read_file(&dir.join(&segments[i]));
    let stem = segments[0].trim_end_matches(".log");
    let index = fixture.read_file(&dir.join(format!("{stem}.index")));
    let times = fixture.read_file(&dir.join(format!("{stem}.timeindex")));
    let meta = fixture.read_file(&Path::new(ROOT).join("topics").join(TOPIC).join("topic.meta"));
    let checkpoint = fixture.read_file(&dir.join("synced.checkpoint"));
    let with = |first: u8, rest: &[u8]| [&[first][..], rest].concat();
    let mut out = vec![
        ("batch_decode", "segment-0".to_owned(), log(0)),
        ("batch_decode", "last-segment".to_owned(), log(segments.len() - 1)),
        ("segment_recovery", "sealed-whole".to_owned(), with(0x00, &log(0))),
        ("segment_recovery", "active-whole".to_owned(), with(0x0f, &log(segments.len() - 1))),
        ("segment_recovery", "sealed-splice".to_owned(), with(0x71, &[0xff; 6])),
        ("segment_recovery", "active-splice".to_owned(), with(0xbf, &[0; 12])),
        ("topic_metadata", "intact".to_owned(), meta.clone()),
        ("checkpoint", "intact".to_owned(), checkpoint),
        (
            "engine_model",
            "appends-and-reads".to_owned(),
            vec![0, 0x21, 40, 2, 0, 3, 1, 0xe1, 90, 2, 1, 2],
        ),
        (
            "engine_model",
            "crash-and-reopen".to_owned(),
            vec![0, 0xff, 200, 4, 0, 0, 1, 1, 7, 3, 0, 0, 2, 1, 1],
        ),
        ("engine_model", "rolls".to_owned(), [0u8, 0xe0, 250].repeat(12)),
    ];
    if let Ok(split) = u8::try_from(index.len()) {
        out.push(("index_files", "intact".to_owned(), [&[split][..], &index, &times].concat()));
    }
    let mut version = meta;
    if let Some(byte) = version.get_mut(4) {
        *byte ^= 0x01;
    }
    out.push(("topic_metadata", "flipped-byte".to_owned(), version));
    out
}
