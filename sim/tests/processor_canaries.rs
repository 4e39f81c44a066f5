//! The stream-processor canaries, each caught by `chronik::testing` with processors that use
//! every part of the runtime: stores with puts and deletes (tombstones in the changelog),
//! outputs to two topics, and snapshots. Without a canary the same simulations pass.
//!
//! One test function only: the active canary is process-global.

use chronik::RecordView;
use chronik::processor::{Context, ProcessError, Processor, ProcessorConfig};
use chronik::testing::{InputRecord, Simulation};
use chronik_engine::canary::Canary;
use chronik_sim::canaries::arm;

/// Sessions: counts records per key; at the third, emits the session and deletes the key.
struct Sessions;

impl Processor for Sessions {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        let key = record.key().unwrap_or_default();
        let store = ctx.store("open")?;
        let count = store.get(key)?.map_or(0, |v| v[0]) + 1;
        if count == 3 {
            store.delete(key);
            ctx.emit("sessions", Some(key), b"closed");
        } else {
            store.put(key, &[count]);
        }
        let total = ctx.store("totals")?;
        let seen =
            total.get(b"all")?.map_or(0, |v| u64::from_le_bytes((*v).try_into().unwrap())) + 1;
        total.put(b"all", &seen.to_le_bytes());
        ctx.emit("audit", None, &seen.to_le_bytes());
        Ok(())
    }
}

fn simulation() -> Simulation {
    let input = (0..240_u32)
        .map(|i| InputRecord::new(i % 2, Some(format!("k{}", (i * 7) % 13).into_bytes()), vec![]))
        .collect();
    Simulation {
        config: ProcessorConfig::new("sessions", "events").store("open").store("totals"),
        input_partitions: 2,
        outputs: vec![("sessions".to_owned(), 2), ("audit".to_owned(), 1)],
        input,
        seeds: 0..150,
        crashes_max: 5,
    }
}

#[test]
fn every_processor_canary_is_caught_and_the_runtime_passes_without_them() {
    let report = simulation().run(|_| Sessions).unwrap_or_else(|failure| panic!("{failure}"));
    assert!(report.crashes > 100, "{report:?}");
    for canary in [
        Canary::InputCommittedBeforeOutputs,
        Canary::RestoreSkipsTombstone,
        Canary::SnapshotAheadOfChangelog,
        Canary::StateAppliedBeforeCommit,
        Canary::StoreAppliedBeforeCommit,
        Canary::StoreOffsetAheadOfData,
        Canary::StoreOffsetNotRead,
        Canary::StoreTrustsDamage,
        Canary::StoreMergeKeepsOlder,
        Canary::StoreRunNamedBeforeDurable,
    ] {
        let _armed = arm(Some(canary));
        // Rot lands in a value read later in only some seeds: more of them for that canary.
        let seeds = if canary == Canary::StoreTrustsDamage { 0..1500 } else { 0..150 };
        let simulation = Simulation { seeds, ..simulation() };
        let failure = simulation.run(|_| Sessions).expect_err(&format!("{canary:?} caught"));
        eprintln!("{canary:?}: caught at seed {}: {}", failure.seed, failure.detail);
    }
}
