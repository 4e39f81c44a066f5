//! Streams as operators: `map`, `filter`, `flat_map`, `group_by`, `count`, `reduce` and
//! `aggregate`, over tumbling, hopping, sliding and session windows on event time, and joins
//! of a stream with a table or with another stream in a window, built into a [`Topology`] and
//! run by the processor runtime ([`crate::processor`]), so every operator keeps exactly-once
//! outputs and changelog-backed state.
//!
//! ```
//! use chronik::dsl::{Topology, Windows};
//!
//! let topology = Topology::new("clicks-per-user");
//! topology
//!     .stream("clicks")
//!     .filter(|click| !click.value.is_empty())
//!     .group_by_key()
//!     .window(Windows::tumbling(60_000).grace(5_000))
//!     .emit_final()
//!     .count()
//!     .to("clicks-per-minute");
//! assert!(topology.describe().contains("count"));
//! ```
//!
//! A topology is cut into **stages** where records change partition: `group_by` (and
//! `group_by_key` after an operator that changed keys) writes to an internal repartition topic
//! `<application>-repartition-<n>`, which the next stage reads. Each stage is one
//! processor application of the runtime (tasks per partition, commits, restores); all stages
//! commit their input positions in the consumer group named after the application, and each
//! stateful operator has a store with its changelog `<application>-<store>-changelog`.
//!
//! **Time.** Windows are on event time, the records' timestamps. Each windowed operator keeps
//! its *observed time*, the largest timestamp it has seen, in its store (so a restart goes on
//! from it). A window closes when the observed time reaches its end plus the grace period; a
//! record arriving for windows that are all closed is *late*: it is counted (see
//! [`TopologyRunner::late_records`]), sent to the operator's `late_to` topic if it has one,
//! and otherwise dropped. A closed window's state is deleted then (a tombstone in the
//! changelog): stores hold open windows only.
//!
//! **Layers.** Each file imports only files below it, never one above: `runner` → `task` →
//! `aggregate`, `join` → `bookkeeping` → `layout` → `graph` → `window`; `runner` → `builder`
//! → `plan` → `graph`; `task` → `plan`. (`builder`: the fluent API; `graph`: the nodes;
//! `plan`: stages and `describe`; `task`, `aggregate`, `join`: the operators run.)

mod aggregate;
mod bookkeeping;
mod builder;
mod graph;
mod join;
mod layout;
mod plan;
mod runner;
mod task;
mod window;

pub use builder::{Grouped, Stream, Table, Topology, Windowed};
pub use graph::{Emit, Event, default_repartition_config, parse_count};
pub use runner::TopologyRunner;
pub use window::{JoinWindows, Window, Windows};
#[cfg(feature = "kafka")]
pub(crate) use {plan::Prepared, task::StageTask};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_repeats;
