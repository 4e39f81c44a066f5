//! Deterministic simulator for the Chronik engine.
//!
//! The engine was shaped for it: every file operation goes through the I/O trait
//! [`chronik_engine::io::Io`] and the clock is injected ([`chronik_engine::Clock`]), so the
//! simulator runs the unmodified engine on a simulated disk and clock, driven by one seed.
//!
//! Code map:
//! - [`rng`], [`clock`], [`disk`]: the seeded PRNG, the simulated clock and the simulated
//!   disk, from the `chronik-simdisk` crate (shared with `chronik::testing`), re-exported.
//! - [`workload`]: per-seed swarm parameters and the steps drawn from them.
//! - [`model`]: the reference model, what each partition may and must hold.
//! - [`oracle`]: the checks of the engine against the model, behind the [`oracle::Oracle`]
//!   trait; [`oracle::standard`] is the list every run uses.
//! - [`run`](mod@run): [`run::run`], one seed from start to finish, returning a
//!   [`run::RunOutcome`].
//! - [`trace`]: a bounded ring of the last events and a hash of all of them.
//! - [`canaries`]: the mutation canaries of [`chronik_engine::canary`], each hunted by
//!   seeds until an oracle catches it.
//! - [`shrink`]: reduce a failing run to fewer steps and fewer kinds of faults.
//! - [`processors`]: stream-processor workloads (counting, a stream-table join) run by the
//!   `chronik` crate's runtime under crashes, with the restore-equivalence and exactly-once
//!   output oracles; [`processors::Workload`], the kinds of workload, is shared with
//!   [`windows`] from a module below both.
//! - [`windows`]: the topology workloads (windows, sessions, joins) and their models.
//! - `src/main.rs`: the `chronik-sim` binary (`run`, `swarm`, `check-determinism`,
//!   `shrink`, `canaries`).
//!

pub mod canaries;
pub mod fuzz;
pub mod model;
pub mod oracle;
mod processor_workload;
pub mod processors;
pub mod reactor;
pub mod run;
pub mod shrink;
pub mod trace;
pub mod windows;
pub mod workload;

pub use chronik_simdisk::Rng;
pub use chronik_simdisk::{Faults, SimClock, SimDisk, clock, disk, rng};
pub use oracle::{Oracle, Violation};
pub use run::{RunOptions, RunOutcome, run};
