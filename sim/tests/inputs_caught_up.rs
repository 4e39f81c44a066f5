//! The processor oracle `inputs_caught_up` can fail: a compacted input whose first megabyte
//! and more is batches compaction emptied (thousands of overwrites of one key, then a few
//! live keys) makes a task's first steps fetch no record at all. With
//! `ReaderStopsAtEmptyFetch` on, `Runner::run_until_caught_up` takes such a step for the end
//! and commits a position far below the high watermark, which `chronik::testing` reports;
//! without it, the runs read past the emptied batches and pass.
//!
//! The processor workloads' own inputs (a few hundred records) never hold a megabyte of
//! emptied batches, a step's fetch size, so they cannot reach this bug; the swarm's
//! `sdk_readers` oracle hunts the canary instead. One test function only: the active canary
//! is process-global.

use chronik::RecordView;
use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig};
use chronik::testing::{FailureKind, InputRecord, NOT_CAUGHT_UP, Simulation};
use chronik_engine::canary::Canary;
use chronik_sim::canaries::arm;

/// Overwrites of one key: with a 64-byte header per emptied batch, more than the 1 MiB a
/// task's step fetches.
const OVERWRITES: u32 = 17_000;

/// The latest value per key in a store, every record emitted.
struct Latest;

impl Processor for Latest {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        ctx.store("latest")?.put(record.key().unwrap_or_default(), record.value());
        ctx.emit("seen", record.key(), record.value());
        Ok(())
    }
}

fn simulation() -> Simulation {
    let overwrites = (0..=OVERWRITES)
        .map(|i| InputRecord::new(0, Some(b"old".to_vec()), i.to_string().into_bytes()));
    let live = (0..20).map(|i| InputRecord::new(0, Some(format!("k{i}").into_bytes()), vec![1]));
    Simulation {
        config: ProcessorConfig::new("latest", "events").store("latest"),
        input_partitions: 1,
        outputs: vec![("seen".to_owned(), 1)],
        input: overwrites.chain(live).collect(),
        seeds: 0..1,
        crashes_max: 1,
    }
}

#[test]
fn a_runner_stopping_at_a_fetch_without_records_is_caught() {
    let report = simulation().run_on_compacted_input(|_| Latest);
    report.unwrap_or_else(|failure| panic!("without the canary: {failure}"));
    let _armed = arm(Some(Canary::ReaderStopsAtEmptyFetch));
    let failure = simulation().run_on_compacted_input(|_| Latest).expect_err("caught");
    assert_eq!(failure.kind, FailureKind::Run, "{failure}");
    assert!(failure.detail.starts_with(NOT_CAUGHT_UP), "{failure}");
}
