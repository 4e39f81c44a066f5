//! Processor workloads: stream processors run by the `chronik` crate's runtime on the
//! simulated disk through [`chronik::testing`], with power cuts, crash outcomes and I/O faults
//! from the seed, against a fault-free run of the same input.
//!
//! Each seed draws a workload and its input: **counting** (records counted per key in a store;
//! a key reaching its limit is emitted and deleted, so the changelog carries tombstones; a
//! second store counts everything and feeds an audit output) or a **stream-table join**
//! (clicks enriched from a users table read as a second, co-partitioned input; users deleted
//! now and then). The seed also draws partitions, key space, record counts and timestamps, and
//! `chronik::testing` draws the commit cadence, the snapshots and the faults from it.
//!
//! Half the counting and join seeds compact their input topics before the runs (every run
//! alike), so tasks read past batches compaction emptied.
//!
//! Oracles: `restore_equivalence` (every store's final entries equal the fault-free run's,
//! whatever mix of crashes, changelog restores and snapshot-plus-tail restores came between)
//! and `exactly_once_outputs` (every output partition holds exactly the fault-free run's
//! records, in order: nothing duplicated, lost or changed), `inputs_caught_up` (after every
//! run until caught up, each application's committed position in every input partition is
//! that partition's high watermark); `processor_runs` if a run failed without a fault to
//! blame.

use crate::oracle::Violation;
pub use crate::processor_workload::Workload;
use crate::rng::{PER_MILLION, Rng};
use crate::windows::{self, JoinKind, Shape};
use chronik::RecordView;
use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig};
use chronik::testing::{FailureKind, InputRecord, NOT_CAUGHT_UP, Simulation, SimulationReport};

/// Counts per key in "counts"; at `limit`, emits the key to "done" and deletes it. Counts
/// every record in "totals" and emits the running total to "audit".
struct Counting {
    limit: u8,
}

impl Processor for Counting {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let key = record.key().unwrap_or_default();
        let counts = ctx.store("counts")?;
        let count = counts.get(key)?.map_or(0, |v| v.first().copied().unwrap_or(0)) + 1;
        if count >= self.limit {
            counts.delete(key);
            ctx.emit("done", Some(key), record.value());
        } else {
            counts.put(key, &[count]);
        }
        let totals = ctx.store("totals")?;
        let seen = totals.get(b"all")?.map_or(Ok(0), |v| (*v).try_into().map(u64::from_le_bytes));
        let seen = seen.map_err(|_| ProcessError::new("a total is not 8 bytes"))? + 1;
        totals.put(b"all", &seen.to_le_bytes());
        ctx.emit("audit", None, &seen.to_le_bytes());
        Ok(())
    }
}

/// Users from the second input into "users" (an empty value deletes); each click emitted to
/// "enriched" with its user's current value.
struct Join;

impl Processor for Join {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let key = record.key().unwrap_or_default();
        let table = ctx.input() == "users";
        let users = ctx.store("users")?;
        if table {
            if record.value().is_empty() {
                users.delete(key);
            } else {
                users.put(key, record.value());
            }
            return Ok(());
        }
        let mut enriched = users.get(key)?.map_or_else(|| b"?".to_vec(), |v| v.to_vec());
        enriched.extend_from_slice(record.value());
        ctx.emit("enriched", Some(key), &enriched);
        Ok(())
    }
}

/// What a seed draws: its workload, the simulation, the counting limit, and the windows of
/// a topology workload.
#[derive(Debug)]
pub struct Drawn {
    pub workload: Workload,
    pub simulation: Simulation,
    pub limit: u8,
    pub shape: Shape,
    /// Counting and joins: the input topics are compacted before the runs, so tasks read past
    /// batches compaction emptied ([`Simulation::run_on_compacted_input`]).
    pub compacted_input: bool,
}

/// The simulation a seed draws, and its workload.
pub fn draw(seed: u64) -> Drawn {
    let mut rng = Rng::new(seed ^ 0x7072_6f63_6573_736f);
    let workload = match rng.below(5) {
        0 => Workload::Counting,
        1 => Workload::Join,
        2 => Workload::Windows,
        3 => Workload::Sessions,
        _ => Workload::TableJoin,
    };
    let partitions = rng.between(1, 4) as u32;
    let keys = rng.between(1, 40);
    let records = rng.between(20, 400);
    let limit = rng.between(2, 6) as u8;
    let shape = Shape::draw(&mut rng, workload == Workload::Sessions);
    let mut input = Vec::with_capacity(records as usize);
    let mut time = 1_704_067_200_000_i64;
    for i in 0..records {
        let key = format!("k{}", rng.below(keys));
        let partition = chronik::partition_for_key(key.as_bytes(), partitions);
        time += rng.below(5).cast_signed();
        // Windowed workloads: some events out of order, some of them beyond grace.
        let late = matches!(workload, Workload::Windows | Workload::Sessions)
            && rng.chance(PER_MILLION / 6);
        let timestamp = if late { time - rng.below(shape.reach()).cast_signed() } else { time };
        let value = format!("v{i}").into_bytes();
        let table_update =
            matches!(workload, Workload::Join | Workload::TableJoin) && rng.chance(PER_MILLION / 4);
        let record = if table_update {
            let value = if rng.chance(PER_MILLION / 5) { Vec::new() } else { value };
            InputRecord::new(partition, Some(key.into_bytes()), value).on(1)
        } else {
            InputRecord::new(partition, Some(key.into_bytes()), value)
        };
        input.push(record.at(timestamp));
    }
    let (config, outputs) = match workload {
        Workload::Counting => (
            ProcessorConfig::new("counting", "events").store("counts").store("totals"),
            vec![("done".to_owned(), partitions), ("audit".to_owned(), 1)],
        ),
        Workload::Join => (
            ProcessorConfig::new("join", "clicks").input("users").store("users"),
            vec![("enriched".to_owned(), partitions)],
        ),
        Workload::Windows | Workload::Sessions | Workload::TableJoin | Workload::StreamJoin => {
            let outputs = windows::outputs(partitions, &mut rng);
            (ProcessorConfig::new("topology", "events"), outputs)
        }
    };
    let simulation = Simulation {
        config,
        input_partitions: partitions,
        outputs,
        input,
        seeds: seed..seed + 1,
        crashes_max: rng.between(1, 6) as u32,
    };
    // Drawn last, so the draws above stay what they were before stream joins: half the
    // table joins join the second input as a stream instead.
    let mut shape = shape;
    let workload = if workload == Workload::TableJoin && rng.chance(PER_MILLION / 2) {
        shape.join = match rng.below(3) {
            0 => JoinKind::Inner,
            1 => JoinKind::Left,
            _ => JoinKind::Outer,
        };
        Workload::StreamJoin
    } else {
        workload
    };
    // Drawn last, so the draws above stay what they were before compacted inputs.
    let compacted_input =
        rng.chance(PER_MILLION / 2) && matches!(workload, Workload::Counting | Workload::Join);
    Drawn { workload, simulation, limit, shape, compacted_input }
}

/// Run one seed's processor workload; the oracle that failed, if any.
pub fn run_seed(seed: u64) -> Result<SimulationReport, Violation> {
    let Drawn { workload, simulation, limit, shape, compacted_input } = draw(seed);
    let result = match workload {
        Workload::Counting if compacted_input => {
            simulation.run_on_compacted_input(|_| Counting { limit })
        }
        Workload::Counting => simulation.run(|_| Counting { limit }),
        Workload::Join if compacted_input => simulation.run_on_compacted_input(|_| Join),
        Workload::Join => simulation.run(|_| Join),
        Workload::Windows | Workload::Sessions | Workload::TableJoin | Workload::StreamJoin => {
            windows::run(workload, &simulation, shape)
        }
    };
    result.map_err(|failure| {
        let oracle = match failure.kind {
            FailureKind::State => "restore_equivalence",
            FailureKind::Outputs => "exactly_once_outputs",
            FailureKind::Run if failure.detail.starts_with(NOT_CAUGHT_UP) => "inputs_caught_up",
            FailureKind::Run => "processor_runs",
            FailureKind::Tail => "restore_reads_tail",
            FailureKind::Damage => "store_damaged_without_rot",
            FailureKind::Model => "topology_model",
        };
        Violation::new(oracle, format!("{workload:?}: {}", failure.detail))
    })
}
