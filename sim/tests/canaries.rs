//! Every mutation canary is caught within a small number of seeds, for `cargo test`.
//! `./scripts/test` skips it: it runs the same hunt and replay in release first
//! (`chronik-sim canaries --max-seeds 500`), in seconds instead of minutes.
//!
//! One test function only: the active canary is process-global, and tests in one binary run
//! on parallel threads.

use chronik_engine::canary::Canary;
use chronik_sim::canaries::{TARGETED, hunt_all};
use chronik_sim::run::{RunOptions, run};

/// Seeds per canary in this (debug) test.
const MAX_SEEDS: u64 = 500;

#[test]
fn every_canary_is_caught_and_none_is_active_afterwards() {
    let caught = hunt_all(MAX_SEEDS, &RunOptions::default());
    assert_eq!(caught.len(), Canary::ALL.len() - TARGETED.len());
    for caught in &caught {
        assert!(caught.by.is_some(), "{:?} not caught within {MAX_SEEDS} seeds", caught.canary);
    }
    // With every canary off again, the seeds that caught them pass.
    for caught in &caught {
        let (seed, _) = caught.by.expect("caught");
        let outcome = run(seed, &RunOptions::default());
        assert_eq!(outcome.violation, None, "seed {seed} fails without {:?}", caught.canary);
    }
}
