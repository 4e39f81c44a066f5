//! The fuzz targets' checks can fail: with an engine canary (a deliberate bug) switched on,
//! a committed seed makes the target panic. One test in its own binary: canaries are
//! process-global.

use chronik_engine::canary::Canary;
use chronik_sim::canaries::arm;
use chronik_sim::fuzz::{self, seeds};
use std::panic::{AssertUnwindSafe, catch_unwind};

fn seed(target: &str, name: &str) -> Vec<u8> {
    seeds()
        .into_iter()
        .find(|s| s.0 == target && s.1 == name)
        .unwrap_or_else(|| panic!("no seed {target}/{name}"))
        .2
}

#[test]
fn each_target_catches_its_canary() {
    let cases: [(Canary, &str, &str, fuzz::Target); 5] = [
        (Canary::IndexLookupOverruns, "index_files", "intact", fuzz::index_files),
        (Canary::IndexLookupOverruns, "segment_recovery", "sealed-splice", fuzz::segment_recovery),
        (Canary::RecoveryCutsPastSynced, "checkpoint", "intact", fuzz::checkpoint),
        (Canary::AppendReportsWrongOffset, "engine_model", "appends-and-reads", fuzz::engine_model),
        (Canary::FetchNextOffsetOverruns, "engine_model", "appends-and-reads", fuzz::engine_model),
    ];
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut missed = Vec::new();
    for (canary, target, name, body) in cases {
        let input = seed(target, name);
        // Without the canary the seed passes; with it the target panics.
        let clean = catch_unwind(AssertUnwindSafe(|| body(&input))).is_ok();
        let caught = {
            let _armed = arm(Some(canary));
            catch_unwind(AssertUnwindSafe(|| body(&input))).is_err()
        };
        if !(clean && caught) {
            missed.push(format!("{canary:?} on {target}/{name}: clean {clean}, caught {caught}"));
        }
    }
    std::panic::set_hook(quiet);
    assert!(missed.is_empty(), "{}", missed.join("\n"));
}
