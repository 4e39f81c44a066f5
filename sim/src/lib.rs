//! Deterministic simulator for the Chronik engine.
//!
//! Empty on purpose: the simulator issue fills this crate with a simulated disk and clock that
//! implement [`chronik_engine::io::Io`] and [`chronik_engine::Clock`], seeded workloads, a reference
//! model and the checkers. The engine was shaped for it: every file operation goes through the I/O
//! trait and the clock is injected.
