//! A small seeded pseudo-random number generator, written here so that a seed means the same
//! run on every machine and every version of every dependency.
//!
//! The state is seeded with splitmix64 and advanced with xoshiro256** (Blackman and Vigna).
//! Nothing in the simulator may use thread-local or operating-system randomness: every random
//! choice comes from an [`Rng`] derived from the run's seed, usually through [`Rng::fork`] so that
//! adding a draw in one component does not shift the stream of another.

/// One part per million: the unit of every probability in the simulator.
pub const PER_MILLION: u32 = 1_000_000;

/// A deterministic xoshiro256** generator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: [u64; 4],
}

/// One step of splitmix64: advances `state` and returns the next output. It seeds [`Rng`];
/// tests that want a few numbers from a seed and no generator call it directly, so that the
/// workspace has one implementation of it.
///
/// ```
/// use chronik_simdisk::rng::splitmix64;
/// let mut state = 1;
/// assert_ne!(splitmix64(&mut state), splitmix64(&mut state));
/// ```
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut mix = seed;
        let state = [
            splitmix64(&mut mix),
            splitmix64(&mut mix),
            splitmix64(&mut mix),
            splitmix64(&mut mix),
        ];
        // splitmix64 is a bijection of a counter, so four consecutive outputs are never all
        // zero, the one state xoshiro cannot leave.
        assert!(state.iter().any(|&word| word != 0), "xoshiro state must not be all zero");
        Rng { state }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = &mut self.state;
        let result = s1.wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = *s1 << 17;
        *s2 ^= *s0;
        *s3 ^= *s1;
        *s1 ^= *s2;
        *s0 ^= *s3;
        *s2 ^= t;
        *s3 = s3.rotate_left(45);
        result
    }

    /// A uniform value in `0..n`, without modulo bias. `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0) has no value to return");
        // Reject the top partial copy of 0..n so every value is equally likely.
        let zone = u64::MAX - (u64::MAX - n + 1) % n;
        loop {
            let value = self.next_u64();
            if value <= zone {
                let result = value % n;
                assert!(result < n);
                return result;
            }
        }
    }

    /// A uniform value in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "empty range {low}..={high}");
        match (high - low).checked_add(1) {
            Some(span) => low + self.below(span),
            None => self.next_u64(),
        }
    }

    /// True with probability `p_per_million` / 1,000,000.
    pub fn chance(&mut self, p_per_million: u32) -> bool {
        assert!(p_per_million <= PER_MILLION, "probability {p_per_million} above one million");
        self.below(u64::from(PER_MILLION)) < u64::from(p_per_million)
    }

    /// A uniform index into a non-empty collection of `length` items.
    pub fn index(&mut self, length: usize) -> usize {
        self.below(length as u64) as usize
    }

    /// Shuffle `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }

    /// `length` random bytes.
    pub fn bytes(&mut self, length: usize) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(length);
        while bytes.len() < length {
            let word = self.next_u64().to_le_bytes();
            let take = (length - bytes.len()).min(word.len());
            bytes.extend_from_slice(&word[..take]);
        }
        assert_eq!(bytes.len(), length);
        bytes
    }

    /// An independent generator seeded from this one's next output: components that each take
    /// a fork keep their streams apart.
    #[must_use]
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let a: Vec<u64> = (0..1000).map(|_| a.next_u64()).collect();
        let b: Vec<u64> = (0..1000).map(|_| b.next_u64()).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn different_seeds_give_different_streams() {
        let mut a = Rng::new(1);
        let mut b = Rng::new(2);
        assert_ne!(
            (0..8).map(|_| a.next_u64()).collect::<Vec<_>>(),
            (0..8).map(|_| b.next_u64()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_stream_is_pinned() {
        // A change to the generator changes every seed's run: it must be deliberate.
        let mut rng = Rng::new(0);
        let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        let mut again = Rng::new(0);
        assert_eq!(first, (0..3).map(|_| again.next_u64()).collect::<Vec<_>>());
        assert_eq!(Rng::new(0).state[0], 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn forks_are_deterministic_and_independent() {
        let mut parent_a = Rng::new(7);
        let mut parent_b = Rng::new(7);
        let mut fork_a = parent_a.fork();
        let mut fork_b = parent_b.fork();
        assert_eq!(fork_a.next_u64(), fork_b.next_u64());
        assert_eq!(parent_a.next_u64(), parent_b.next_u64());
        assert_ne!(fork_a.next_u64(), parent_a.next_u64());
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut rng = Rng::new(3);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let value = rng.below(7);
            assert!(value < 7);
            seen[value as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(rng.below(1), 0);
        let _ = rng.below(u64::MAX);
        assert_eq!(rng.between(5, 5), 5);
        let _ = rng.between(0, u64::MAX);
    }

    #[test]
    fn chance_respects_the_extremes_and_roughly_the_middle() {
        let mut rng = Rng::new(4);
        assert!((0..1000).all(|_| !rng.chance(0)));
        assert!((0..1000).all(|_| rng.chance(PER_MILLION)));
        let hits = (0..10_000).filter(|_| rng.chance(PER_MILLION / 2)).count();
        assert!((4000..6000).contains(&hits), "{hits}");
    }

    #[test]
    fn shuffle_permutes_and_bytes_have_the_length_asked() {
        let mut rng = Rng::new(5);
        let mut items: Vec<u32> = (0..50).collect();
        rng.shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(items, sorted);
        assert_eq!(rng.bytes(13).len(), 13);
        assert!(rng.bytes(0).is_empty());
    }
}
