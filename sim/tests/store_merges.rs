//! Disk stores merge in slices of later flushes, so the simulator's power cuts land while
//! merges are under way: over a few hundred seeds of a counting processor on disk stores with
//! tiny caches, merges are installed and half-built runs (flushed runs and merge outputs no
//! manifest named yet) are found and removed at a later open, while every seed's state and
//! outputs still equal the fault-free run's. (`store::tests` shows, on the store alone, cuts
//! that land in flushes with merges under way.)

use chronik::processor::{ProcessorConfig, StoreKind};
use chronik::testing::{CountByKey, InputRecord, Simulation};

#[test]
fn crashes_land_inside_disk_store_merges_and_the_state_stays_exact() {
    // 60 keys over 2 partitions, each counted many times: runs of updates to merge.
    let input = (0..900_u32)
        .map(|i| {
            InputRecord::new(i % 2, Some(format!("k{:02}", (i * 7) % 60).into_bytes()), vec![])
        })
        .collect();
    let simulation = Simulation {
        config: ProcessorConfig::new("merging", "events").store_with("counts", StoreKind::disk()),
        input_partitions: 2,
        outputs: Vec::new(),
        input,
        seeds: 0..200,
        crashes_max: 4,
    };
    let report =
        simulation.run(|_| CountByKey::new("counts")).unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("{report:?}");
    assert!(report.crashes > 100, "{report:?}");
    assert!(report.store_merges > 1000, "merges ran: {report:?}");
    assert!(report.store_files_removed > 10, "crashes cut runs short: {report:?}");
}
