//! The seeded workload: per-seed (swarm) parameters, and the steps of a round drawn from them.
//!
//! Swarm testing: instead of one fixed mix, every seed draws its own shape (partition count,
//! record sizes, key space, step weights, fault probabilities, latencies), so some seeds hammer
//! one corner with everything else switched off.

use crate::disk::Faults;
use crate::model::ModelRecord;
use crate::rng::{PER_MILLION, Rng};
use chronik_engine::{Cleanup, Durability, TopicConfig};

/// The topic the workload writes.
pub const TOPIC: &str = "events";
/// The topic the workload creates and deletes, again and again.
pub const SCRATCH: &str = "scratch";
/// Most partitions a seed may use.
pub const PARTITIONS_MAX: u32 = 4;
/// Most records per batch.
pub const BATCH_RECORDS_MAX: u64 = 8;
/// Largest value.
pub const VALUE_BYTES_MAX: u64 = 2000;
/// Distinct keys unless a seed draws more: small, so that compaction sees overwrites.
pub const KEYS_MAX: u64 = 16;

/// Simulated cost of each kind of disk call, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latency {
    pub read_us: u64,
    pub write_us: u64,
    pub sync_us: u64,
    /// Chance that one call is slow (a hundred times its cost): slow I/O.
    pub slow_per_million: u32,
}

/// Everything about a seed's run that is drawn once, before the first step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Swarm {
    pub topic: TopicConfig,
    pub value_bytes_max: u64,
    pub batch_records_max: u64,
    pub key_per_million: u32,
    /// Records given an explicit timestamp (possibly in the past) instead of the clock's.
    pub explicit_timestamp_per_million: u32,
    /// Step weights: append, read, tick, flush, idle.
    pub weights: [u64; 5],
    /// Most steps in a round before it ends in a crash or a restart.
    pub round_steps_max: u64,
    /// Crash outcome weights, used at every crash.
    pub crash_faults: Faults,
    /// I/O faults switched on in rounds that have faults.
    pub io_faults: Faults,
    /// Chance that a round runs with `io_faults`.
    pub faulty_round_per_million: u32,
    /// Chance that a round arms a power cut.
    pub power_cut_per_million: u32,
    pub latency: Latency,
    /// Durability modes the rounds pick from.
    pub durabilities: Vec<Durability>,
    /// Chance that a round rots one bit of synced data; the run then checks that the damage
    /// is reported and never served, and ends.
    pub bit_flip_per_million: u32,
    /// Chance that an open first runs under I/O faults or a power cut (faults in recovery).
    pub faulty_open_per_million: u32,
    /// Weight of tailing-consumer steps (beside the five of `weights`).
    pub tail_weight: u64,
    /// Weight of steps that create the scratch topic, or delete it when it exists.
    pub scratch_weight: u64,
    pub scratch: TopicConfig,
    /// Weight of steps that commit a consumer position.
    pub commit_weight: u64,
    /// Weight of forced compaction steps (compacted topics only).
    pub compact_weight: u64,
    /// Weight of transaction steps.
    pub transaction_weight: u64,
    /// Distinct keys the workload writes.
    pub keys: u64,
    /// Weight of pipelined steps: several appends queued before any is waited for.
    pub pipelined_weight: u64,
    /// Weight of `Engine::delete_records` steps.
    pub delete_weight: u64,
    /// The disk defers completions: the write path's operations complete in later turns.
    pub deferred_completions: bool,
}

fn maybe(rng: &mut Rng, low: u64, high: u64) -> u32 {
    if rng.chance(PER_MILLION / 2) { rng.between(low, high) as u32 } else { 0 }
}

impl Swarm {
    pub fn draw(rng: &mut Rng) -> Swarm {
        let topic = TopicConfig {
            partitions: rng.between(1, u64::from(PARTITIONS_MAX)) as u32,
            segment_bytes: rng.between(4096, 32 * 1024),
            segment_ms: rng.between(50, 60_000).cast_signed(),
            index_interval_bytes: rng.between(64, 2048) as u32,
            ..TopicConfig::default()
        };
        let kept = rng.below(u64::from(PER_MILLION) + 1) as u32;
        let crash_faults = Faults {
            sector_kept_per_million: kept,
            sector_torn_per_million: rng.below(u64::from(PER_MILLION - kept) + 1) as u32,
            resize_kept_per_million: rng.below(u64::from(PER_MILLION) + 1) as u32,
            directory_kept_per_million: if rng.chance(PER_MILLION / 2) { 200_000 } else { 0 },
            directory_prefix_per_million: if rng.chance(PER_MILLION / 2) { 200_000 } else { 0 },
            directory_subset_per_million: if rng.chance(PER_MILLION / 2) { 500_000 } else { 0 },
            ..Faults::NONE
        };
        let io_faults = Faults {
            read_error_per_million: maybe(rng, 500, 10_000),
            write_error_per_million: maybe(rng, 500, 10_000),
            sync_error_per_million: maybe(rng, 500, 10_000),
            capacity_bytes: rng.chance(200_000).then(|| rng.between(16 * 1024, 256 * 1024)),
            ..crash_faults
        };
        let interval = Durability::Interval { ms: rng.between(1, 200) };
        let mut durabilities = vec![Durability::Sync, Durability::Os, interval];
        // Some seeds stay in one mode the whole run.
        if rng.chance(PER_MILLION / 3) {
            let only = durabilities[rng.index(durabilities.len())];
            durabilities = vec![only];
        }
        let mut swarm = Swarm {
            topic,
            value_bytes_max: rng.between(0, VALUE_BYTES_MAX),
            batch_records_max: rng.between(1, BATCH_RECORDS_MAX),
            key_per_million: rng.below(u64::from(PER_MILLION) + 1) as u32,
            explicit_timestamp_per_million: maybe(rng, 10_000, 300_000),
            weights: [
                rng.between(20, 100),
                rng.between(0, 30),
                rng.between(0, 30),
                rng.between(0, 10),
                rng.between(0, 20),
            ],
            round_steps_max: rng.between(5, 80),
            crash_faults,
            io_faults,
            faulty_round_per_million: rng.below(u64::from(PER_MILLION) + 1) as u32,
            power_cut_per_million: rng.below(u64::from(PER_MILLION) + 1) as u32,
            latency: Latency {
                read_us: rng.between(5, 200),
                write_us: rng.between(5, 200),
                sync_us: rng.between(50, 20_000),
                slow_per_million: maybe(rng, 1_000, 50_000),
            },
            durabilities,
            // Drawn last, so the draws above stay what they were before these existed.
            bit_flip_per_million: if rng.chance(PER_MILLION / 4) {
                rng.between(20_000, 300_000) as u32
            } else {
                0
            },
            faulty_open_per_million: maybe(rng, 50_000, 500_000),
            tail_weight: rng.between(0, 30),
            scratch_weight: rng.between(0, 8),
            scratch: TopicConfig {
                partitions: rng.between(1, 3) as u32,
                segment_bytes: 4096,
                ..TopicConfig::default()
            },
            commit_weight: 0,
            compact_weight: 0,
            transaction_weight: 0,
            keys: KEYS_MAX,
            pipelined_weight: 0,
            delete_weight: 0,
            deferred_completions: false,
        };
        // Drawn last, so the draws above stay what they were before retention existed. A
        // third of the seeds keep records by age, a third by size, the rest forever.
        match rng.below(3) {
            0 => swarm.topic.retention_ms = Some(rng.between(50, 5_000).cast_signed()),
            1 => swarm.topic.retention_bytes = Some(rng.between(4096, 64 * 1024)),
            _ => {}
        }
        swarm.commit_weight = rng.between(0, 10);
        swarm.transaction_weight = if rng.chance(PER_MILLION / 2) { rng.between(1, 12) } else { 0 };
        // A third of the seeds compact their topic (a few of those also keep it by retention):
        // mostly keyed records, a random dirty ratio, tombstones kept 0 to 5 s.
        if rng.chance(PER_MILLION / 3) {
            swarm.topic.cleanup =
                if rng.chance(PER_MILLION / 4) { Cleanup::CompactDelete } else { Cleanup::Compact };
            swarm.topic.min_cleanable_dirty_ratio = rng.below(11) as f64 / 10.0;
            swarm.topic.delete_retention_ms = rng.between(0, 5_000).cast_signed();
            swarm.compact_weight = rng.between(4, 16);
            swarm.key_per_million =
                rng.between(u64::from(PER_MILLION) / 2, u64::from(PER_MILLION)) as u32;
            // Sometimes many keys, so that some keys' latest records sit in sealed segments.
            if rng.chance(PER_MILLION / 2) {
                swarm.keys = rng.between(KEYS_MAX, 400);
            }
        }
        // Drawn last, so the draws above stay what they were before pipelined appends.
        swarm.pipelined_weight = if rng.chance(PER_MILLION / 2) { rng.between(2, 20) } else { 0 };
        // Drawn last, so the draws above stay what they were before deletes.
        swarm.delete_weight = if rng.chance(PER_MILLION / 3) { rng.between(1, 6) } else { 0 };
        // Drawn last, so the draws above stay what they were before deferred completions.
        swarm.deferred_completions = rng.chance(PER_MILLION / 2);
        swarm
    }
}

/// One step of a round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Append one batch to a partition.
    Append { partition: u32, records: Vec<ModelRecord> },
    /// Read a partition from an offset (taken modulo what is visible) with a size limit.
    Read { partition: u32, from_per_million: u32, max_bytes: usize },
    /// One call of `Engine::tick`.
    Tick,
    /// One call of `Engine::flush`.
    Flush,
    /// Let simulated time pass with nothing happening.
    Idle { us: u64 },
    /// The partition's tailing consumer reads on from where it stopped.
    Tail { partition: u32, max_bytes: usize },
    /// Create the scratch topic, or delete it if it exists.
    Scratch,
    /// Commit a consumer position (taken modulo what is visible) for the group `sim`.
    Commit { partition: u32, offset_per_million: u32 },
    /// Compact a partition now, whatever its dirty ratio (`Engine::compact_partition`).
    Compact { partition: u32 },
    /// `Engine::append_nowait` of every batch, then the answers in the order queued: several
    /// batches, to one or more partitions, in each turn of the write path.
    Pipelined { appends: Vec<(u32, Vec<ModelRecord>)> },
    /// `Engine::commit_transaction`: one batch to each of some partitions, and a position of
    /// the group `sim` for `commit_partition` (taken modulo what is visible).
    Transaction {
        writes: Vec<(u32, Vec<ModelRecord>)>,
        commit_partition: u32,
        offset_per_million: u32,
    },
    /// `Engine::delete_records` below an offset (taken modulo what is visible).
    DeleteRecords { partition: u32, offset_per_million: u32 },
}

impl Swarm {
    /// Draw the next step. `now_ms` is the timestamp records get from the clock.
    pub fn step(&self, rng: &mut Rng, now_ms: i64) -> Step {
        let extra = [
            self.tail_weight,
            self.scratch_weight,
            self.commit_weight,
            self.compact_weight,
            self.transaction_weight,
            self.pipelined_weight,
            self.delete_weight,
        ];
        let weights = [self.weights.as_slice(), &extra].concat();
        let total: u64 = weights.iter().sum();
        let mut roll = rng.below(total.max(1));
        let mut kind = 0;
        for (i, &weight) in weights.iter().enumerate() {
            if roll < weight {
                kind = i;
                break;
            }
            roll -= weight;
        }
        let partition = rng.below(u64::from(self.topic.partitions)) as u32;
        match kind {
            0 => Step::Append { partition, records: self.batch(rng, now_ms) },
            1 => Step::Read {
                partition,
                from_per_million: rng.below(u64::from(PER_MILLION)) as u32,
                max_bytes: rng.between(1, 64 * 1024) as usize,
            },
            2 => Step::Tick,
            3 => Step::Flush,
            4 => Step::Idle { us: rng.between(1_000, 500_000) },
            5 => Step::Tail { partition, max_bytes: rng.between(1, 16 * 1024) as usize },
            6 => Step::Scratch,
            7 => Step::Commit {
                partition,
                offset_per_million: rng.between(0, u64::from(PER_MILLION)) as u32,
            },
            8 => Step::Compact { partition },
            10 => {
                let count = rng.between(2, 24);
                let appends = (0..count)
                    .map(|_| {
                        let partition = rng.below(u64::from(self.topic.partitions)) as u32;
                        (partition, self.batch(rng, now_ms))
                    })
                    .collect();
                Step::Pipelined { appends }
            }
            11 => Step::DeleteRecords {
                partition,
                offset_per_million: rng.between(0, u64::from(PER_MILLION)) as u32,
            },
            _ => {
                // Some of the partitions, each once, in a random order.
                let mut partitions: Vec<u32> = (0..self.topic.partitions).collect();
                rng.shuffle(&mut partitions);
                partitions.truncate(rng.between(1, u64::from(self.topic.partitions)) as usize);
                let writes = partitions.into_iter().map(|p| (p, self.batch(rng, now_ms))).collect();
                Step::Transaction {
                    writes,
                    commit_partition: partition,
                    offset_per_million: rng.between(0, u64::from(PER_MILLION)) as u32,
                }
            }
        }
    }

    fn batch(&self, rng: &mut Rng, now_ms: i64) -> Vec<ModelRecord> {
        let count = rng.between(1, self.batch_records_max);
        (0..count)
            .map(|_| {
                let key = rng
                    .chance(self.key_per_million)
                    .then(|| format!("key-{}", rng.below(self.keys)).into_bytes());
                let length = rng.between(0, self.value_bytes_max) as usize;
                let timestamp = if rng.chance(self.explicit_timestamp_per_million) {
                    now_ms - rng.below(10_000).cast_signed() + 500
                } else {
                    now_ms
                };
                ModelRecord { key, value: rng.bytes(length), timestamp }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_deterministic_and_valid() {
        for seed in 0..100 {
            let swarm = Swarm::draw(&mut Rng::new(seed));
            assert_eq!(swarm, Swarm::draw(&mut Rng::new(seed)));
            swarm.topic.validate().unwrap();
            let mut rng = Rng::new(seed);
            for _ in 0..20 {
                if let Step::Append { partition, records } = swarm.step(&mut rng, 1000) {
                    assert!(partition < swarm.topic.partitions && !records.is_empty());
                }
            }
        }
    }
}
