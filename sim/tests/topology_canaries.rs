//! Each canary of the topology operators (windows, late events, expiry, table joins,
//! repartition purging) is caught
//! by the processor workloads' model oracle within the bound `chronik-sim canaries` uses; the
//! same seeds pass without it. One test in its own process: the active canary is
//! process-global.

use chronik_engine::canary::Canary;
use chronik_sim::canaries::{MAX_SEEDS_DEFAULT, arm};
use chronik_sim::processors::{Workload, draw, run_seed};

#[test]
fn each_topology_canary_is_caught_by_the_model() {
    let topology_seeds: Vec<u64> = (0..200)
        .filter(|&seed| {
            matches!(
                draw(seed).workload,
                Workload::Windows | Workload::Sessions | Workload::TableJoin | Workload::StreamJoin
            )
        })
        .take(40)
        .collect();
    for &seed in &topology_seeds {
        if let Err(violation) = run_seed(seed) {
            panic!("seed {seed} fails without a canary: {violation}");
        }
    }
    for canary in [
        Canary::WindowFinalBeforeGrace,
        Canary::LateRecordFolded,
        Canary::WindowStateNotExpired,
        Canary::JoinTableAheadOfStream,
        Canary::RepartitionPurgedPastCommit,
    ] {
        let _armed = arm(Some(canary));
        let caught =
            (0..MAX_SEEDS_DEFAULT).find_map(|seed| run_seed(seed).err().map(|v| (seed, v)));
        let (seed, violation) = caught.unwrap_or_else(|| panic!("{canary:?} never caught"));
        assert_eq!(violation.oracle, "topology_model", "{canary:?} at seed {seed}: {violation}");
        eprintln!("{canary:?}: caught at seed {seed}: {violation}");
    }
}
