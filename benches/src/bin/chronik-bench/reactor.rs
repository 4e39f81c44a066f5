//! The second design's write path, measured before the engine runs on it: one thread drives
//! a reactor over `partitions` partition logs in `sync` mode, keeping `depth` batches of
//! `batch` 100 B records queued per partition, so every turn submits each partition's
//! coalesced write linked to its fdatasync, all partitions in one `submit_linked`. What this
//! shows is what the reactor and the ring can do; the engine's own figures stay those of the
//! `append ... sync` scenarios until its partitions run on the reactor.

use super::{ChronikIo, Measure, TOPIC, open, system_name};
use chronik::engine::checkpoint::CheckpointWriter;
use chronik::engine::format;
use chronik::engine::io::{OpenMode, SystemIo};
use chronik::engine::log::{Acked, Batch, Config, PartitionLog, Recovered, Ticket};
use chronik::engine::reactor::{IndexHost, Reactor, partition_directory};
use chronik::engine::segment::{self, LOG_SUFFIX, SegmentFile};
use chronik::{Durability, Offset, Record, TopicConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The scenario's name in the table and the ratios.
pub fn scenario(partitions: u32, batch: usize, depth: usize) -> String {
    format!("reactor: append 100 B, sync, {partitions} partitions, {depth} x {batch} in flight")
}

pub fn append_sync(
    dir: &Path,
    io: ChronikIo,
    partitions: u32,
    batch: usize,
    depth: usize,
    seconds: f64,
) -> anyhow::Result<Measure> {
    let segment_bytes = 1 << 30;
    {
        let chronik = open(dir, io, Durability::Sync)?;
        let config = TopicConfig { partitions, segment_bytes, ..TopicConfig::default() };
        chronik.create_topic(TOPIC, config)?;
    }
    let system = Arc::new(SystemIo::new(io.backend)?);
    let mut reactor = Reactor::new(Arc::clone(&system));
    let root = dir.to_path_buf();
    let mut ids = Vec::new();
    for partition in 0..partitions {
        let directory = partition_directory(&root, TOPIC, partition);
        let path = directory.join(segment::file_name(Offset::ZERO, LOG_SUFFIX));
        let mode = OpenMode::ReadWrite.with_direct(io.direct);
        let active = SegmentFile::open(&system, path, mode)?;
        let checkpoint = CheckpointWriter::open(&system, &directory, None)?;
        let config = Config {
            durability: Durability::Sync,
            segment_bytes,
            segment_ms: i64::MAX,
            direct: io.direct,
        };
        let recovered = Recovered {
            base_offset: Offset::ZERO,
            size: 0,
            next_offset: Offset::ZERO,
            created_ms: 0,
            tail: Vec::new(),
        };
        let log = PartitionLog::new(config, recovered, 0);
        let host = IndexHost::new(Offset::ZERO, 4096);
        ids.push(reactor.add(directory, log, Arc::new(active), checkpoint, host));
    }
    let value = [0x5a_u8; 100];
    let records: Vec<Record<'_>> = (0..batch).map(|_| Record::new(None, &value)).collect();
    let mut template = Vec::new();
    let info = format::encode_batch(&mut template, Offset::ZERO, &records, 0, Offset::ZERO)?;
    let mut in_flight = vec![0usize; partitions as usize];
    let (mut ticket, mut acknowledged) = (0u64, 0u64);
    let mut acks = Vec::new();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        for (partition, count) in in_flight.iter_mut().enumerate() {
            while *count < depth {
                ticket += 1;
                let batch = Batch { bytes: template.clone(), info };
                reactor
                    .log_mut(ids[partition])
                    .expect("driven")
                    .append(Ticket(ticket), batch)
                    .map_err(|refusal| anyhow::anyhow!("append refused: {refusal:?}"))?;
                *count += 1;
            }
        }
        reactor.turn(0, &mut acks);
        for (id, ack) in acks.drain(..) {
            let partition = ids.iter().position(|&i| i == id).expect("one of ours");
            match ack.result {
                Ok(Acked::Appended { base_offset, next_offset }) => {
                    acknowledged += next_offset.get() - base_offset.get();
                    in_flight[partition] -= 1;
                }
                other => anyhow::bail!("partition {partition}: {other:?}"),
            }
        }
    }
    let elapsed = start.elapsed();
    let name = scenario(partitions, batch, depth);
    Ok(Measure::new(&name, &system_name(io), acknowledged, acknowledged * 100, elapsed))
}
