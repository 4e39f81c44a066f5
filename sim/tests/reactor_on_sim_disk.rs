//! The second design's write path (partition logs driven by the reactor) on the simulated
//! disk, through the library's [`chronik_sim::reactor`] workload: every oracle holds over the
//! seeds, and a seed replays to the same run (the canaries: `reactor_canaries.rs`, a process
//! of its own since the active canary is process-global).

use chronik_engine::Durability;
use chronik_sim::canaries::arm;
use chronik_sim::reactor::{Report, draw, run_seed};

const SEEDS: u64 = 300;

#[test]
fn every_oracle_holds_on_every_seed() {
    let _off = arm(None);
    let mut total = Report::default();
    let (mut faulted, mut clean, mut modes) = (0, 0, [0; 3]);
    for seed in 0..SEEDS {
        let report = run_seed(seed).unwrap_or_else(|violation| {
            panic!("seed {seed}: {violation}\nreplay: chronik-sim reactor --start {seed} --seeds 1")
        });
        total.acknowledged += report.acknowledged;
        total.refused += report.refused;
        total.flushes += report.flushes;
        total.kept_unacknowledged += report.kept_unacknowledged;
        if report.faults_met {
            faulted += 1;
        } else {
            clean += 1;
        }
        modes[match draw(seed).durability {
            Durability::Sync => 0,
            Durability::Interval { .. } => 1,
            Durability::Os => 2,
        }] += 1;
    }
    eprintln!("{total:?} faulted={faulted} clean={clean} modes={modes:?}");
    // The seeds reached both sides of the faults and every mode, or they prove little.
    assert!(total.acknowledged > 1000 && total.refused > 0 && total.flushes > 0, "{total:?}");
    assert!(faulted > 10 && clean > 10 && modes.iter().all(|&m| m > 10));
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let _off = arm(None);
    for seed in [0, 5, 77] {
        assert_eq!(run_seed(seed).unwrap(), run_seed(seed).unwrap(), "seed {seed}");
    }
    assert_ne!(run_seed(1).unwrap().trace_hash, run_seed(2).unwrap().trace_hash);
}
