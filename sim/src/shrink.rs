//! Shrinking: reduce a failing run to a shorter operation list and a smaller fault schedule
//! that still fails the same oracle, and say how to replay it.
//!
//! A reduction never changes the seed. It works through [`RunOptions`]: a smaller `ops`
//! budget, `without` (kinds of faults and events that are drawn but not acted on) and `skip`
//! (workload steps that are drawn but not run). Because every draw still happens, the rest of
//! the run keeps the values it had, and a reduced case is usually the same failure with less
//! around it. Each candidate is run; it is kept only when it fails with the same oracle.
//!
//! The passes, in order: the smallest `ops` budget that still fails (a binary search, then
//! checked); each [`Feature`] left out in turn; then runs of steps skipped, halving the run
//! length down to single steps (the "ddmin" idea). The whole search is bounded by a number of
//! runs.

use crate::run::{Feature, RunOptions, RunOutcome, run};

/// Runs a shrink may spend unless told otherwise.
pub const RUNS_MAX_DEFAULT: u64 = 2000;

/// The result of shrinking a failing seed.
#[derive(Debug)]
pub struct Shrunk {
    /// The run as first given.
    pub original: RunOutcome,
    /// The reduced options and the failing run they give.
    pub options: RunOptions,
    pub outcome: RunOutcome,
    /// Runs spent, the original included.
    pub runs: u64,
}

impl Shrunk {
    /// Steps the reduced run actually ran: its budget minus the steps it skipped.
    pub fn steps_run(&self) -> u64 {
        let skipped: u64 = self
            .options
            .skip
            .iter()
            .map(|&(start, end)| end.min(self.outcome.ops).saturating_sub(start))
            .sum();
        self.outcome.ops.saturating_sub(skipped)
    }
}

struct Search {
    seed: u64,
    oracle: &'static str,
    runs: u64,
    runs_max: u64,
}

impl Search {
    /// Run `options`; the outcome if it fails with the oracle being shrunk.
    fn fails(&mut self, options: &RunOptions) -> Option<RunOutcome> {
        if self.runs >= self.runs_max {
            return None;
        }
        self.runs += 1;
        let outcome = run(self.seed, options);
        let same = outcome.violation.as_ref().is_some_and(|v| v.oracle == self.oracle);
        same.then_some(outcome)
    }
}

/// Shrink `seed` run with `options`; `None` if it does not fail.
pub fn shrink(seed: u64, options: &RunOptions, runs_max: u64) -> Option<Shrunk> {
    let original = run(seed, options);
    let oracle = original.violation.as_ref()?.oracle;
    let mut search = Search { seed, oracle, runs: 1, runs_max };
    let mut best = options.clone();
    let mut outcome = original.clone();

    // The budget: the failing step is at or before `original.ops`.
    let (mut low, mut high) = (1, best.ops);
    while low < high {
        let middle = low + (high - low) / 2;
        let candidate = RunOptions { ops: middle, ..best.clone() };
        if let Some(found) = search.fails(&candidate) {
            high = middle;
            best = candidate;
            outcome = found;
        } else {
            low = middle + 1;
        }
    }

    for feature in Feature::ALL {
        if best.without.contains(&feature) {
            continue;
        }
        let mut candidate = best.clone();
        candidate.without.insert(feature);
        if let Some(found) = search.fails(&candidate) {
            best = candidate;
            outcome = found;
        }
    }

    let mut chunk = best.ops.div_ceil(2).max(1);
    loop {
        let mut start = 0;
        while start < best.ops {
            let end = (start + chunk).min(best.ops);
            if !covered(&best.skip, start, end) {
                let mut candidate = best.clone();
                candidate.skip = merged(&candidate.skip, (start, end));
                if let Some(found) = search.fails(&candidate) {
                    best = candidate;
                    outcome = found;
                }
            }
            start = end;
        }
        if chunk == 1 {
            break;
        }
        chunk = chunk.div_ceil(2);
    }
    Some(Shrunk { original, options: best, outcome, runs: search.runs })
}

/// Whether `[start, end)` lies inside the union of `ranges`.
fn covered(ranges: &[(u64, u64)], start: u64, end: u64) -> bool {
    (start..end).all(|step| ranges.iter().any(|&(a, b)| (a..b).contains(&step)))
}

/// `ranges` with `extra` added, sorted, overlapping and touching ranges merged.
fn merged(ranges: &[(u64, u64)], extra: (u64, u64)) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = ranges.iter().copied().chain([extra]).collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (start, end) in all {
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_cover() {
        assert_eq!(merged(&[(0, 2), (5, 6)], (2, 4)), [(0, 4), (5, 6)]);
        assert_eq!(merged(&[(3, 9)], (4, 5)), [(3, 9)]);
        assert!(covered(&[(0, 4), (5, 6)], 1, 4));
        assert!(!covered(&[(0, 4), (5, 6)], 3, 6));
    }
}
