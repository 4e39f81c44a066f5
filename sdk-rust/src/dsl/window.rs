//! Windows on event time: how events are cut into windows, and how far apart the events a
//! stream-stream join pairs may be.

use std::fmt;

/// A window `[start, end)` in milliseconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Fixed windows of `size` advancing by `advance` (tumbling: advance = size), aligned to
    /// the epoch.
    Time { size: i64, advance: i64 },
    /// For each event, the window of `size` ending at it: `(t - size, t]`.
    Sliding { size: i64 },
    /// Events of a key at most `gap` apart, in one window.
    Session { gap: i64 },
}

/// Hopping windows an event may fall in at most (size / advance).
pub const WINDOWS_PER_EVENT_MAX: i64 = 10_000;

/// How events are cut into windows, and how long a window waits for late events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub(crate) kind: Kind,
    pub(crate) grace: i64,
}

impl Windows {
    /// Back-to-back windows of `size_ms`, aligned to the epoch.
    pub fn tumbling(size_ms: i64) -> Windows {
        Windows { kind: Kind::Time { size: size_ms, advance: size_ms }, grace: 0 }
    }

    /// Windows of `size_ms` starting every `advance_ms` (overlapping when the advance is
    /// smaller): an event falls in `size / advance` of them.
    pub fn hopping(size_ms: i64, advance_ms: i64) -> Windows {
        Windows { kind: Kind::Time { size: size_ms, advance: advance_ms }, grace: 0 }
    }

    /// For each event, the window of `size_ms` that ends at it, `(t - size, t]`, holding the
    /// key's events in it (an event arriving out of order updates the windows of the later
    /// events it falls in).
    pub fn sliding(size_ms: i64) -> Windows {
        Windows { kind: Kind::Sliding { size: size_ms }, grace: 0 }
    }

    /// Sessions: a key's events at most `gap_ms` apart are one window, from the first to
    /// the last; an event between two sessions merges them.
    pub fn session(gap_ms: i64) -> Windows {
        Windows { kind: Kind::Session { gap: gap_ms }, grace: 0 }
    }

    /// How long after a window's end it still takes late events (default 0).
    #[must_use]
    pub fn grace(mut self, grace_ms: i64) -> Windows {
        self.grace = grace_ms;
        self
    }

    /// Whether the sizes are usable: positive, an advance no larger than the size, a grace
    /// not negative.
    pub fn check(&self) -> Result<(), String> {
        let ok = match self.kind {
            Kind::Time { size, advance } => {
                size > 0
                    && advance > 0
                    && advance <= size
                    && size / advance <= WINDOWS_PER_EVENT_MAX
            }
            Kind::Sliding { size } => size > 0,
            Kind::Session { gap } => gap > 0,
        };
        if ok && self.grace >= 0 {
            Ok(())
        } else {
            Err(format!(
                "{self}: sizes must be positive, an advance at most the size (and at least \
                 1/{WINDOWS_PER_EVENT_MAX} of it: an event falls in size / advance windows), \
                 and the grace not negative"
            ))
        }
    }

    /// The time windows holding `t`, earliest first (`size` and `advance` positive). Windows
    /// whose bounds do not fit an `i64` (times at the ends of its range) are left out.
    pub(crate) fn time_windows(size: i64, advance: i64, t: i64) -> impl Iterator<Item = Window> {
        let (size, advance, t) = (i128::from(size), i128::from(advance), i128::from(t));
        let last = t - t.rem_euclid(advance);
        let first = last - (size - 1) / advance * advance;
        (0..)
            .map(move |i| first + i * advance)
            .take_while(move |&start| start <= last)
            .filter(move |&start| start + size > t)
            .filter_map(move |start| {
                let start = i64::try_from(start).ok()?;
                let end = i64::try_from(i128::from(start) + size).ok()?;
                Some(Window { start, end })
            })
    }
}

impl fmt::Display for Windows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Time { size, advance } if size == advance => {
                write!(f, "tumbling windows of {size} ms")?;
            }
            Kind::Time { size, advance } => {
                write!(f, "hopping windows of {size} ms every {advance} ms")?;
            }
            Kind::Sliding { size } => write!(f, "sliding windows of {size} ms")?,
            Kind::Session { gap } => write!(f, "session windows with a {gap} ms gap")?,
        }
        write!(f, ", grace {} ms", self.grace)
    }
}

/// How far apart in time two events of a stream-stream join may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinWindows {
    pub(crate) size: i64,
    pub(crate) grace: i64,
}

impl JoinWindows {
    /// Events at most `size_ms` apart, either way, are joined.
    pub fn of(size_ms: i64) -> JoinWindows {
        JoinWindows { size: size_ms, grace: 0 }
    }

    /// How long events wait for late partners after the window (default 0).
    #[must_use]
    pub fn grace(mut self, grace_ms: i64) -> JoinWindows {
        self.grace = grace_ms;
        self
    }
}

impl fmt::Display for JoinWindows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms either way, grace {} ms", self.size, self.grace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_windows_hold_the_time() {
        let windows: Vec<Window> = Windows::time_windows(10, 10, 25).collect();
        assert_eq!(windows, vec![Window { start: 20, end: 30 }]);
        let windows: Vec<Window> = Windows::time_windows(10, 5, 25).collect();
        assert_eq!(windows, vec![Window { start: 20, end: 30 }, Window { start: 25, end: 35 }]);
        let windows: Vec<Window> = Windows::time_windows(10, 3, -1).collect();
        assert!(windows.iter().all(|w| w.start <= -1 && w.end > -1), "{windows:?}");
        assert_eq!(windows.len(), 3, "{windows:?}");
        for t in -50..50 {
            for (size, advance) in [(10, 10), (10, 3), (7, 7), (12, 5), (1, 1)] {
                let found: Vec<Window> = Windows::time_windows(size, advance, t).collect();
                let expected: Vec<Window> = (-100..100)
                    .filter(|s: &i64| s.rem_euclid(advance) == 0 && *s <= t && s + size > t)
                    .map(|start| Window { start, end: start + size })
                    .collect();
                assert_eq!(found, expected, "t {t} size {size} advance {advance}");
            }
        }
    }
}
