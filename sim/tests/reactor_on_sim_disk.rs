//! The second design's write path (partition logs driven by the reactor) on the simulated
//! disk, which runs unlinked operations in a seeded order: seeded appends to two partitions,
//! a power cut after a seeded number of operations, a crash, and a reopen by the engine's own
//! recovery. Each partition must then hold a prefix of what was submitted, in submission
//! order, with every acknowledged record in it. A reactor that submits writes and their
//! fdatasync unlinked fails this on some seed.

use chronik_engine::checkpoint::CheckpointWriter;
use chronik_engine::index::SegmentIndex;
use chronik_engine::log::{Acked, Batch, Config, PartitionLog, Recovered, Ticket};
use chronik_engine::reactor::{PartitionId, Reactor, ReactorBug, partition_directory};
use chronik_engine::segment::{self, LOG_SUFFIX, SegmentFile};
use chronik_engine::{Durability, Engine, Offset, Options, Record, TopicConfig, format};
use chronik_sim::clock::EPOCH_MS;
use chronik_sim::{Rng, SimClock, SimDisk};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

const TOPIC: &str = "events";
const PARTITIONS: u32 = 2;
const SEGMENT_BYTES: u64 = 4096;
const INDEX_INTERVAL_BYTES: u32 = 512;

fn open_engine(disk: &SimDisk, clock: &SimClock) -> Engine<SimDisk> {
    let options = Options { durability: Durability::Sync, ..Options::default() };
    Engine::open(disk.clone(), clock.shared(), Path::new("/data"), options).unwrap().0
}

fn reactor(disk: &SimDisk, bug: Option<ReactorBug>) -> Reactor<SimDisk> {
    let io = Arc::new(disk.clone());
    let mut reactor = Reactor::new(Arc::clone(&io));
    reactor.bug = bug;
    for partition in 0..PARTITIONS {
        let directory = partition_directory(Path::new("/data"), TOPIC, partition);
        let path = directory.join(segment::file_name(Offset::ZERO, LOG_SUFFIX));
        let active = SegmentFile::open(&io, path, chronik_engine::io::OpenMode::ReadWrite).unwrap();
        let checkpoint = CheckpointWriter::open(&io, &directory, None).unwrap();
        let config = Config {
            durability: Durability::Sync,
            segment_bytes: SEGMENT_BYTES,
            segment_ms: i64::MAX,
            index_interval_bytes: INDEX_INTERVAL_BYTES,
            direct: false,
        };
        let recovered = Recovered {
            base_offset: Offset::ZERO,
            size: 0,
            next_offset: Offset::ZERO,
            created_ms: EPOCH_MS,
            index: SegmentIndex::new(Offset::ZERO, INDEX_INTERVAL_BYTES),
            tail: Vec::new(),
        };
        let log = PartitionLog::new(config, recovered, EPOCH_MS);
        let id = reactor.add(directory, log, active, checkpoint);
        assert_eq!(id, PartitionId(partition as usize));
    }
    reactor
}

/// What one seed did, for the totals.
#[derive(Debug, Default)]
struct Outcome {
    acknowledged: u64,
    refused: u64,
    kept_unacknowledged: u64,
}

/// Run one seed; `Err` names the first broken promise.
fn run_seed(seed: u64, bug: Option<ReactorBug>) -> Result<Outcome, String> {
    let mut rng = Rng::new(seed);
    let disk = SimDisk::new(rng.fork());
    let clock = SimClock::new(EPOCH_MS);
    let engine = open_engine(&disk, &clock);
    let config = TopicConfig {
        partitions: PARTITIONS,
        segment_bytes: SEGMENT_BYTES,
        index_interval_bytes: INDEX_INTERVAL_BYTES,
        ..TopicConfig::default()
    };
    engine.create_topic(TOPIC, config).unwrap();
    drop(engine);

    let mut reactor = reactor(&disk, bug);
    disk.cut_power_after(rng.between(10, 600));
    // Per partition, the values submitted in order, and per ticket what it carried.
    let mut submitted: Vec<Vec<Vec<u8>>> = vec![Vec::new(); PARTITIONS as usize];
    let mut tickets: BTreeMap<u64, (usize, std::ops::Range<usize>)> = BTreeMap::new();
    let mut outcome = Outcome::default();
    let mut acks = Vec::new();
    for step in 0..rng.between(20, 200) {
        for _ in 0..rng.below(4) {
            let partition = rng.index(PARTITIONS as usize);
            let count = 1 + rng.index(3);
            let values: Vec<Vec<u8>> = (0..count)
                .map(|i| {
                    let mut value = format!("s{seed}-p{partition}-{step}-{i}-").into_bytes();
                    let padding = rng.index(400);
                    value.extend(rng.bytes(padding));
                    value
                })
                .collect();
            let records: Vec<Record<'_>> = values.iter().map(|v| Record::new(None, v)).collect();
            let mut bytes = Vec::new();
            let info =
                format::encode_batch(&mut bytes, Offset::ZERO, &records, EPOCH_MS, Offset::ZERO)
                    .unwrap();
            let ticket = tickets.len() as u64;
            let log = reactor.log_mut(PartitionId(partition));
            if log.append(Ticket(ticket), Batch { bytes, info }).is_err() {
                continue; // Poisoned: refused at once, nothing queued.
            }
            let start = submitted[partition].len();
            submitted[partition].extend(values);
            tickets.insert(ticket, (partition, start..submitted[partition].len()));
        }
        for _ in 0..rng.below(3) {
            reactor.turn(EPOCH_MS, &mut acks);
        }
    }
    // Let everything queued finish (or fail on the cut power).
    while reactor.turn(EPOCH_MS, &mut acks) > 0 {}
    let mut acknowledged: Vec<usize> = vec![0; PARTITIONS as usize];
    for (_, ack) in acks.drain(..) {
        let (partition, range) = tickets[&ack.ticket.0].clone();
        match ack.result {
            Ok(Acked::Appended { base_offset, next_offset }) => {
                let base = usize::try_from(base_offset.get()).unwrap();
                let next = usize::try_from(next_offset.get()).unwrap();
                if (base..next) != range {
                    return Err(format!(
                        "ticket {}: offsets {base}..{next}, not {range:?}",
                        ack.ticket.0
                    ));
                }
                acknowledged[partition] = acknowledged[partition].max(next);
                outcome.acknowledged += 1;
            }
            Ok(other) => return Err(format!("unexpected acknowledgement {other:?}")),
            Err(_) => outcome.refused += 1,
        }
    }
    drop(reactor);
    disk.crash(&mut rng);
    disk.restore_power();
    let engine = open_engine(&disk, &clock);
    for partition in 0..PARTITIONS {
        let kept = read_all(&engine, partition)?;
        let expected = &submitted[partition as usize];
        if kept.len() > expected.len() || kept[..] != expected[..kept.len()] {
            return Err(format!("partition {partition}: not a prefix of what was submitted"));
        }
        if kept.len() < acknowledged[partition as usize] {
            return Err(format!(
                "partition {partition}: {} records kept, {} acknowledged",
                kept.len(),
                acknowledged[partition as usize]
            ));
        }
        outcome.kept_unacknowledged += (kept.len() - acknowledged[partition as usize]) as u64;
    }
    Ok(outcome)
}

fn read_all(engine: &Engine<SimDisk>, partition: u32) -> Result<Vec<Vec<u8>>, String> {
    let mut values = Vec::new();
    let mut next = Offset::ZERO;
    loop {
        let fetch = engine.read(TOPIC, partition, next, 1 << 20).map_err(|e| e.to_string())?;
        let before = values.len();
        for record in fetch.records() {
            if record.offset() != Offset::new(values.len() as u64) {
                return Err(format!("partition {partition}: a hole before {:?}", record.offset()));
            }
            values.push(record.value().to_vec());
        }
        if values.len() == before {
            return Ok(values);
        }
        next = Offset::new(values.len() as u64);
    }
}

#[test]
fn acknowledged_records_survive_a_crash_and_the_log_is_a_prefix() {
    let mut totals = Outcome::default();
    for seed in 0..150 {
        let outcome = run_seed(seed, None).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        totals.acknowledged += outcome.acknowledged;
        totals.refused += outcome.refused;
        totals.kept_unacknowledged += outcome.kept_unacknowledged;
    }
    eprintln!("{totals:?}");
    // The seeds reached both sides of the cut, or they prove little.
    assert!(totals.acknowledged > 1000 && totals.refused > 0, "{totals:?}");
}

#[test]
fn a_reactor_that_submits_the_fdatasync_unlinked_is_caught() {
    let caught = (0..300).find(|&seed| {
        run_seed(seed, Some(ReactorBug::UnlinkedSync))
            .inspect_err(|e| eprintln!("seed {seed}: {e}"))
            .is_err()
    });
    assert!(caught.is_some(), "no seed of 300 caught an unlinked fdatasync");
    eprintln!("caught at seed {caught:?}");
}
