//! The run's event trace: a bounded ring of the last events, for failure reports, and a hash
//! of every event, for determinism checks.

use std::collections::VecDeque;

/// Most events kept for a failure report; older ones are only in the hash.
pub const TRACE_EVENTS_MAX: usize = 64;

/// FNV-1a offset basis, the hash of nothing.
const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01B3;

/// Fold `bytes` into an FNV-1a hash.
pub fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// The model's side of the trace.
#[derive(Clone, Debug)]
pub struct Trace {
    ring: VecDeque<(u64, String)>,
    capacity: usize,
    hash: u64,
    events: u64,
    /// Print every event to stderr as it happens (`chronik-sim run --trace`).
    echo: bool,
}

impl Trace {
    pub fn new(capacity: usize, echo: bool) -> Trace {
        assert!(capacity > 0, "a trace keeps at least one event");
        Trace {
            ring: VecDeque::with_capacity(capacity),
            capacity,
            hash: FNV_OFFSET,
            events: 0,
            echo,
        }
    }

    /// Record one event.
    pub fn event(&mut self, text: String) {
        self.hash = fnv1a(self.hash, text.as_bytes());
        self.hash = fnv1a(self.hash, b"\n");
        self.events += 1;
        if self.echo {
            eprintln!("[{}] {text}", self.events);
        }
        if self.ring.len() == self.capacity {
            self.ring.pop_front();
        }
        self.ring.push_back((self.events, text));
        assert!(self.ring.len() <= self.capacity);
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    /// The last events, oldest first.
    pub fn last(&self) -> Vec<String> {
        self.ring.iter().map(|(number, text)| format!("#{number} {text}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_is_bounded_and_the_hash_covers_everything() {
        let mut a = Trace::new(2, false);
        let mut b = Trace::new(2, false);
        for i in 0..5 {
            a.event(format!("e{i}"));
            b.event(format!("e{}", if i == 0 { 9 } else { i }));
        }
        assert_eq!(a.last(), ["#4 e3", "#5 e4"]);
        assert_eq!(a.last(), b.last());
        assert_ne!(a.hash(), b.hash(), "evicted events still count");
        assert_eq!(a.events(), 5);
    }
}
