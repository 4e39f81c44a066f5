//! Shrinking a failing seed: with a mutation canary on (the only way to get a failing run
//! without a real bug), `shrink` must return a smaller case that fails the same oracle when
//! replayed from its options alone, and that passes once the canary is off again.
//!
//! The active canary is process-global, so this binary holds one engine test only.

use chronik_engine::canary::Canary;
use chronik_sim::canaries;
use chronik_sim::run::{Feature, RunOptions, format_ranges, parse_ranges, run};
use chronik_sim::shrink::shrink;

#[test]
fn a_canary_failure_shrinks_to_a_smaller_case_that_replays() {
    let armed = canaries::arm(Some(Canary::AckBeforeFsync));
    let options = RunOptions::default();
    // A failing run with steps to spare: one that fails at its first steps has nothing to cut.
    let seed = (0..100)
        .find(|&seed| {
            let outcome = run(seed, &options);
            outcome.violation.is_some() && outcome.ops >= 5
        })
        .expect("the canary is caught within 100 seeds, after a few steps");
    let shrunk = shrink(seed, &options, 300).expect("the seed fails");
    let oracle = shrunk.original.violation.as_ref().unwrap().oracle;
    assert_eq!(shrunk.outcome.violation.as_ref().unwrap().oracle, oracle);
    assert!(shrunk.runs <= 300);
    assert!(
        shrunk.steps_run() < shrunk.original.ops,
        "{} steps before, {} after",
        shrunk.original.ops,
        shrunk.steps_run()
    );
    assert!(!shrunk.options.skip.is_empty() || !shrunk.options.without.is_empty());
    let replayed = run(seed, &shrunk.options);
    assert_eq!(replayed.violation, shrunk.outcome.violation, "the reduced case replays");
    assert_eq!(replayed.trace_hash, shrunk.outcome.trace_hash);
    drop(armed);
    let honest = run(seed, &shrunk.options);
    assert_eq!(honest.violation, None, "without the canary the reduced case passes");
}

#[test]
fn replay_arguments_round_trip() {
    let ranges = vec![(0, 3), (5, 6), (9, 20)];
    assert_eq!(format_ranges(&ranges), "0-2,5,9-19");
    assert_eq!(parse_ranges("0-2,5,9-19").unwrap(), ranges);
    assert!(parse_ranges("4-2").is_err() && parse_ranges("x").is_err());
    for feature in Feature::ALL {
        assert_eq!(Feature::from_name(feature.name()), Some(feature));
    }
    let options = RunOptions {
        ops: 40,
        without: [Feature::BitFlips, Feature::PowerCuts].into_iter().collect(),
        skip: ranges,
        ..RunOptions::default()
    };
    assert_eq!(options.arguments(), "--ops 40 --without power-cuts,bit-flips --skip 0-2,5,9-19");
}
