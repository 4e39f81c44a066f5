//! The simulated clock: time moves only when the simulator says so.

use chronik_engine::Clock;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A fixed, arbitrary start (2024-01-01T00:00:00Z), so runs do not depend on the real date.
pub const EPOCH_MS: i64 = 1_704_067_200_000;

/// A [`Clock`] advanced explicitly. Cheap to clone; clones share the same time, so the
/// simulator keeps one and hands another to the engine.
///
/// ```
/// use chronik_engine::Clock;
/// use chronik_simdisk::clock::{SimClock, EPOCH_MS};
///
/// let clock = SimClock::new(EPOCH_MS);
/// let engine_side = clock.clone();
/// clock.advance(250);
/// assert_eq!(engine_side.now_ms(), EPOCH_MS + 250);
/// ```
#[derive(Clone, Debug)]
pub struct SimClock {
    now_ms: Arc<AtomicI64>,
}

impl SimClock {
    pub fn new(now_ms: i64) -> SimClock {
        SimClock { now_ms: Arc::new(AtomicI64::new(now_ms)) }
    }

    /// Move time forward by `ms`. Time never goes backwards.
    pub fn advance(&self, ms: u64) {
        let ms = i64::try_from(ms).expect("advance by at most i64::MAX ms");
        let before = self.now_ms.fetch_add(ms, Ordering::SeqCst);
        assert!(before.checked_add(ms).is_some(), "simulated time overflowed");
    }

    /// The same clock as an `Arc<dyn Clock>`, the form [`chronik_engine::Engine::open`] takes.
    pub fn shared(&self) -> Arc<dyn Clock> {
        Arc::new(self.clone())
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_moves_only_when_advanced_and_clones_share_it() {
        let clock = SimClock::new(EPOCH_MS);
        let shared = clock.shared();
        assert_eq!(shared.now_ms(), EPOCH_MS);
        assert_eq!(shared.now_ms(), EPOCH_MS);
        clock.advance(10);
        clock.advance(0);
        assert_eq!(shared.now_ms(), EPOCH_MS + 10);
    }
}
