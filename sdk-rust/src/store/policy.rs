//! When a disk store merges, apart from how ([`super::merge`]): pure functions of the runs'
//! levels, tested against a model.
//!
//! A level holding [`FANOUT`] runs merges its oldest [`FANOUT`] into one run of the next
//! level, at most one merge per level at a time. A merge whose inputs include the store's
//! oldest run drops deletions (nothing older is left for them to hide). A level that reaches
//! [`LEVEL_RUNS_MAX`] runs is behind: the next flush waits for its merge (backpressure).

use std::ops::Range;

/// Runs of one level that merge into one of the next.
pub const FANOUT: usize = 4;
/// Runs of one level at which a flush waits for the level's merge to finish. A merge given
/// at least its inputs' bytes over the `FANOUT^(k+1)` flushes until the next one of its level
/// is due never reaches it.
pub const LEVEL_RUNS_MAX: usize = 2 * FANOUT;

/// A merge to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The runs merged: indexes into the runs, newest first.
    pub runs: Range<usize>,
    /// Whether no run is older than these, so deletions may go.
    pub drop_deletions: bool,
}

/// The next merge to start, given each run's level (newest first, never decreasing) and the
/// levels already merging: the oldest [`FANOUT`] runs of the lowest level that holds
/// [`FANOUT`] or more and is not merging.
pub fn choose(levels: &[u8], busy: &[u8]) -> Option<Choice> {
    assert!(levels.windows(2).all(|p| p[0] <= p[1]), "levels never decrease from newest");
    let mut start = 0;
    let choice = loop {
        let &level = levels.get(start)?;
        let end = start + levels[start..].iter().take_while(|&&l| l == level).count();
        if end - start >= FANOUT && !busy.contains(&level) {
            break Choice { runs: end - FANOUT..end, drop_deletions: end == levels.len() };
        }
        start = end;
    };
    // A choice is FANOUT runs of one level, free, the oldest of theirs.
    assert_eq!(choice.runs.len(), FANOUT, "a merge takes FANOUT runs");
    assert!(
        levels[choice.runs.clone()].iter().all(|&l| l == levels[choice.runs.start])
            && levels.get(choice.runs.end).is_none_or(|&l| l > levels[choice.runs.start]),
        "a merge takes the oldest runs of one level"
    );
    Some(choice)
}

/// A level holding [`LEVEL_RUNS_MAX`] runs or more, the lowest: its merge must finish first.
pub fn overfull(levels: &[u8]) -> Option<u8> {
    let mut start = 0;
    while let Some(&level) = levels.get(start) {
        let runs = levels[start..].iter().take_while(|&&l| l == level).count();
        if runs >= LEVEL_RUNS_MAX {
            return Some(level);
        }
        start += runs;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use chronik_simdisk::Rng;

    /// A model store: flushes add level-0 runs; a merge takes a random number of flushes up
    /// to `slowness` times what a slice of twice the input rate needs, and merges install in
    /// any order; a level overfull after a flush has its merge finished at once (a stall).
    /// Returns the stalls.
    fn model(seed: u64, slowness: u64) -> u64 {
        let mut rng = Rng::new(seed);
        // Each run: (level, id); each merge: (level, input ids, flushes left, drops deletions).
        let mut runs: Vec<(u8, u64)> = Vec::new();
        let mut merges: Vec<(u8, Vec<u64>, u64, bool)> = Vec::new();
        let (mut next_id, mut installed, mut stalls) = (0, 0, 0);
        for _flush in 0..600 {
            runs.insert(0, (0, next_id));
            next_id += 1;
            for merge in &mut merges {
                merge.2 = merge.2.saturating_sub(1);
            }
            loop {
                let levels: Vec<u8> = runs.iter().map(|r| r.0).collect();
                if let Some(level) = overfull(&levels) {
                    let merge = merges.iter_mut().find(|m| m.0 == level);
                    merge.expect("an overfull level is merging").2 = 0;
                    stalls += 1;
                }
                // Finished merges install in any order.
                let Some(i) = merges.iter().position(|m| m.2 == 0) else { break };
                let (level, inputs, _, drops) = merges.swap_remove(i);
                let at = runs.iter().position(|r| r.1 == inputs[0]).unwrap();
                let ids: Vec<u64> = runs[at..at + FANOUT].iter().map(|r| r.1).collect();
                assert_eq!(ids, inputs, "seed {seed}: a merge's inputs stay contiguous");
                assert_eq!(drops, at + FANOUT == runs.len(), "seed {seed}: still the oldest");
                runs.splice(at..at + FANOUT, [(level + 1, next_id)]);
                next_id += 1;
                installed += 1;
            }
            let levels: Vec<u8> = runs.iter().map(|r| r.0).collect();
            assert!(levels.windows(2).all(|p| p[0] <= p[1]), "seed {seed}: {levels:?}");
            loop {
                let levels: Vec<u8> = runs.iter().map(|r| r.0).collect();
                let busy: Vec<u8> = merges.iter().map(|m| m.0).collect();
                assert_eq!(overfull(&levels), None, "seed {seed}: {levels:?}");
                let Some(choice) = choose(&levels, &busy) else { break };
                let level = levels[choice.runs.start];
                assert!(!busy.contains(&level), "seed {seed}: one merge per level");
                let inputs = runs[choice.runs.clone()].iter().map(|r| r.1).collect();
                // Its inputs are FANOUT^(level+1) flushes' worth; a slice takes two flushes'.
                let flushes = (FANOUT as u64).pow(u32::from(level) + 1) / 2;
                merges.push((
                    level,
                    inputs,
                    rng.between(1, flushes * slowness),
                    choice.drop_deletions,
                ));
            }
        }
        assert!(installed > 100, "seed {seed}: merges ran ({installed})");
        assert!(runs.len() < LEVEL_RUNS_MAX * 5, "seed {seed}: runs stay few ({})", runs.len());
        stalls
    }

    #[test]
    fn merges_that_keep_pace_never_stall_and_slow_ones_stall_without_overflowing() {
        for seed in 0..200 {
            assert_eq!(model(seed, 1), 0, "seed {seed}");
        }
        let stalls: u64 = (0..200).map(|seed| model(seed, 8)).sum();
        assert!(stalls > 0, "slow merges stall");
    }

    #[test]
    fn a_level_behind_is_overfull_and_a_busy_level_is_not_chosen() {
        let levels = [0; LEVEL_RUNS_MAX];
        assert_eq!(overfull(&levels), Some(0));
        assert_eq!(overfull(&levels[1..]), None);
        assert_eq!(choose(&levels, &[0]), None);
        let choice = choose(&[0, 0, 0, 0, 0, 1, 1, 1, 1], &[]).unwrap();
        assert_eq!(choice, Choice { runs: 1..5, drop_deletions: false });
        let choice = choose(&[0, 0, 0, 0, 0, 1, 1, 1, 1], &[0]).unwrap();
        assert_eq!(choice, Choice { runs: 5..9, drop_deletions: true });
    }
}
