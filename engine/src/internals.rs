//! The engine's internals, for the `chronik` CLI, the simulator, benches and the engine's own
//! integration tests: file formats, the write path's state machine and reactor. Built only
//! with the cargo feature `internals`; no stability promise.

pub mod checkpoint {
    pub use crate::checkpoint::*;
}
pub mod format {
    pub use crate::format::*;
}
pub mod groups {
    pub use crate::groups::*;
}
pub mod index {
    pub use crate::index::*;
}
pub mod layout {
    pub use crate::layout::*;
}
pub mod log {
    pub use crate::log::*;
}
pub mod log_start {
    pub use crate::log_start::*;
}
pub mod reactor {
    pub use crate::reactor::*;
}
pub mod segment {
    pub use crate::segment::*;
}
pub mod topic {
    pub use crate::topic::*;
}
pub mod write_path {
    pub use crate::write_path::*;
}

/// What tests and the simulator call on an engine beyond its public methods.
pub trait EngineInternals {
    /// The engine's write shards (none when read-only).
    fn write_shards(&self) -> usize;
    /// The count of requests handed to the write path so far, for tests that line
    /// appenders up behind a turn.
    fn write_requests_counter(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64>;
    /// The retention and compaction half of [`crate::Engine::tick`].
    fn maintain(&self) -> Result<(), crate::AppendError>;
    /// Poison the engine, as a failed write would.
    fn poison(&self, reason: String);
}

impl<I: crate::io::Io> EngineInternals for crate::Engine<I> {
    fn write_shards(&self) -> usize {
        crate::Engine::write_shards(self)
    }
    fn write_requests_counter(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        crate::Engine::write_requests_counter(self)
    }
    fn maintain(&self) -> Result<(), crate::AppendError> {
        crate::Engine::maintain(self)
    }
    fn poison(&self, reason: String) {
        crate::Engine::poison(self, reason);
    }
}
