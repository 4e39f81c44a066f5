//! The deterministic pieces the simulator (`chronik-sim`) and `chronik::testing` share:
//!
//! - [`rng`]: a hand-written seeded PRNG (splitmix64 seeding, xoshiro256**), with forks for
//!   independent streams. No thread-local or operating-system randomness anywhere.
//! - [`clock`]: [`clock::SimClock`], time that moves only when advanced.
//! - [`disk`]: [`disk::SimDisk`], an in-memory [`chronik_engine::io::Io`] with durable and
//!   current state per file and per directory, a crash that keeps, tears or drops each sector
//!   of unsynced writes in any order and keeps all, none, a prefix or any subset of a
//!   directory's unsynced entry changes, fault injection (EIO, fsync failure with Linux
//!   semantics, disk full, power cuts), a snapshot of every file and a hash of every call for
//!   determinism checks.
//!
//! It depends on the engine only for the `Io` and `Clock` traits, and never turns on the
//! engine's `canaries` feature, so a user's test build of `chronik` stays a real build.

pub mod clock;
pub mod disk;
pub mod rng;

pub use clock::SimClock;
pub use disk::{Faults, SimDisk};
pub use rng::Rng;
