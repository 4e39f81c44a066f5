//! Stateful stream processors: one task per input partition, each with named key-value stores
//! backed by compacted changelog topics, committing its outputs, its store changes and its
//! input position in one transaction ([`chronik_engine::Engine::commit_transaction`]), so that
//! after a crash at any moment the restored state and the outputs are exactly those of a run
//! without the crash.
//!
//! A task's loop: restore each store from its changelog (`<application>-<store>-changelog`,
//! partition = the input partition); start at the position the application's consumer group
//! committed; read a batch of input, call [`Processor::process`] per record; every
//! `commit_interval_ms` (and when caught up, and when the pending bytes grow large) commit.
//! Store writes apply at once (a task reads its own writes) and are coalesced per key until
//! the commit. A failed commit ends the run: the in-memory state is then ahead of what is
//! durable, and only a restart (restore) may continue.
//!
//! Code map: `api` (the trait, the context, guarantees, stats, run errors), `error` (what a
//! processor returns, and the JSON codec), `config`, `changelog` (its record format and
//! commit markers), `task_log` (what a task needs of its log, and the engine's answer),
//! `task` (steps and commits), `restore`, `snapshot` (the codec of store snapshots) and
//! `runner` (tasks over the engine, on threads). Tasks on a Kafka-protocol cluster are run by
//! `kafka::group`, which depends on this module; this module knows nothing of Kafka.

mod api;
mod changelog;
mod config;
pub(crate) mod error;
mod restore;
mod runner;
mod snapshot;
mod task;
mod task_log;

pub use crate::store::{DiskMerges, DiskOptions, Store, StoreError, StoreKind, StoreMemory, Typed};
pub use api::{
    BATCH_RECORDS_MAX, Context, Guarantee, Processor, ProcessorError, Punctuation, RunStats,
    UnknownGuarantee, Until,
};
pub use changelog::committed_state;
pub use config::{
    DEAD_LETTER_HEADERS, DecodeCheck, OnDecodeError, ProcessorConfig, RestoreListener,
    RestoreProgress,
};
pub use error::{ProcessError, decode};
pub use runner::Runner;

#[cfg(feature = "kafka")]
pub(crate) use changelog::{MARKER_HEADER, MARKER_KEY, MARKER_MAGIC, decode_change, decode_marker};
#[cfg(feature = "kafka")]
pub(crate) use restore::disk_budgets;
#[cfg(feature = "kafka")]
pub(crate) use task::Task;
#[cfg(feature = "kafka")]
pub(crate) use task_log::TaskLog;
