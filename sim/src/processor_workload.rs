//! The kinds of processor workload a seed draws ([`crate::processors::draw`]): shared by the
//! processor runs (`processors`) and the topology models (`windows`), which both name it and
//! so keep it below them, with the import between them going one way (`processors` ->
//! `windows`).

/// The workload a seed draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Counting,
    Join,
    /// A topology: counts per key in tumbling or hopping windows with grace, late events
    /// aside.
    Windows,
    /// A topology: counts per key in session windows with grace.
    Sessions,
    /// A topology: clicks left-joined with a users table.
    TableJoin,
    /// A topology: the events joined with a second stream in a window (inner, left or outer).
    StreamJoin,
}
