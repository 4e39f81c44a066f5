//! Deterministic simulator for the Chronik engine.
//!
//! The engine was shaped for it: every file operation goes through the I/O trait
//! [`chronik_engine::io::Io`] and the clock is injected ([`chronik_engine::Clock`]), so the
//! simulator runs the unmodified engine on a simulated disk and clock, driven by one seed.
//!
//! Code map:
//! - [`rng`]: a hand-written seeded PRNG (splitmix64 seeding, xoshiro256**), with forks for
//!   independent streams. No thread-local or operating-system randomness anywhere.
//! - [`clock`]: [`clock::SimClock`], time that moves only when advanced.
//! - [`disk`]: [`disk::SimDisk`], an in-memory [`chronik_engine::io::Io`] with durable and
//!   current state per file and per directory, a crash that keeps, tears or drops each sector
//!   of unsynced writes in any order and reverts unsynced directory entries and size changes,
//!   fault injection (EIO, fsync failure with Linux semantics, disk full, power cut), a
//!   snapshot of every file and a hash of every call for determinism checks.
//! - [`workload`]: per-seed swarm parameters and the steps drawn from them.
//! - [`model`]: the reference model, what each partition may and must hold.
//! - [`oracle`]: the checks of the engine against the model, behind the [`oracle::Oracle`]
//!   trait; [`oracle::standard`] is the list every run uses.
//! - [`run`](mod@run): [`run::run`], one seed from start to finish, returning a [`run::RunOutcome`].
//! - [`trace`]: a bounded ring of the last events and a hash of all of them.
//! - [`canaries`]: the mutation canaries of [`chronik_engine::canary`], each hunted by seeds
//!   until an oracle catches it.
//! - [`shrink`]: reduce a failing run to fewer steps and fewer kinds of faults.
//! - `src/main.rs`: the `chronik-sim` binary (`run`, `swarm`, `check-determinism`,
//!   `shrink`, `canaries`).
//!
//! Still to come (later issues): seeded workloads over processors and compaction, with their
//! oracles added to [`oracle::standard`].

pub mod canaries;
pub mod clock;
pub mod disk;
pub mod model;
pub mod oracle;
pub mod rng;
pub mod run;
pub mod shrink;
pub mod trace;
pub mod workload;

pub use clock::SimClock;
pub use disk::{Faults, SimDisk};
pub use oracle::{Oracle, Violation};
pub use rng::Rng;
pub use run::{RunOptions, RunOutcome, run};
