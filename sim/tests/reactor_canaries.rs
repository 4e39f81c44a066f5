//! Each canary of the second design's write path (partition log and reactor) is caught by the
//! [`chronik_sim::reactor`] workload within the bound `chronik-sim canaries` uses, by the
//! oracle meant for it. One test in its own process: the active canary is process-global.

use chronik_engine::canary::Canary;
use chronik_sim::canaries::{MAX_SEEDS_DEFAULT, REACTOR_CANARIES, arm};
use chronik_sim::reactor::run_seed;

#[test]
fn each_write_path_canary_is_caught() {
    for canary in REACTOR_CANARIES {
        let _armed = arm(Some(canary));
        let caught =
            (0..MAX_SEEDS_DEFAULT).find_map(|seed| run_seed(seed).err().map(|v| (seed, v)));
        let (seed, violation) = caught.unwrap_or_else(|| panic!("{canary:?} never caught"));
        let expected = match canary {
            Canary::LogWatermarkBeforeSync => "watermark_durable",
            // The simulated disk's contract (concurrent writes never overlap), and the log's
            // own assertion: with completions deferred, the unlinked fdatasync completes
            // before the writes it was taken to cover, past what `os` mode shows.
            Canary::DirectWritesUnlinked | Canary::ReactorUnlinkedSync => "no_panic",
            _ => "acknowledged_survive",
        };
        assert_eq!(violation.oracle, expected, "{canary:?} at seed {seed}: {violation}");
        eprintln!("{canary:?}: caught at seed {seed} by {}", violation.oracle);
    }
}
