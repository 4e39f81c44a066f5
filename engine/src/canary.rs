//! Mutation canaries: deliberate bugs the simulator switches on one at a time to prove that
//! its oracles catch them (see `chronik-sim canaries`).
//!
//! Without the `canaries` feature (the default, and every real build) [`active`] is a
//! constant `false`, so every canary branch in the engine is removed by the optimizer and the
//! engine behaves exactly as if the branches were not there.
//!
//! With the feature, the active canary is a process-global: a global is tolerable only
//! because it exists solely under this test-only feature. No canary is active until [`set`]
//! is called, so a build with the feature on (for example through workspace feature
//! unification in `cargo test --workspace`) still behaves normally.

/// One deliberate bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Canary {
    /// `Durability::Sync` appends return, visible, without an fdatasync.
    AckBeforeFsync = 1,
    /// A failed fdatasync is retried once, and a success is believed (no poison).
    RetryFsyncAfterFailure = 2,
    /// A roll creates the new segment file without fsyncing the directory.
    SkipDirectoryFsyncOnRoll = 3,
    /// Recovery of the active segment cuts its last batch even when the scan is clean.
    RecoveryCutsPastSynced = 4,
    /// Reads parse batches without comparing their checksums, so rotted bytes are served.
    SkipChecksumOnRead = 5,
    /// A roll makes the sealed segment's index files durable and takes that for the data's:
    /// the segment itself is never fdatasynced before the next one is created.
    IndexBeforeData = 6,
}

impl Canary {
    /// Every canary, in catalogue order.
    pub const ALL: [Canary; 6] = [
        Canary::AckBeforeFsync,
        Canary::RetryFsyncAfterFailure,
        Canary::SkipDirectoryFsyncOnRoll,
        Canary::RecoveryCutsPastSynced,
        Canary::SkipChecksumOnRead,
        Canary::IndexBeforeData,
    ];
}

#[cfg(feature = "canaries")]
static ACTIVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether `canary` is switched on. Always `false` without the `canaries` feature.
#[cfg(not(feature = "canaries"))]
#[inline]
pub const fn active(_canary: Canary) -> bool {
    false
}

/// Whether `canary` is switched on.
#[cfg(feature = "canaries")]
#[inline]
pub fn active(canary: Canary) -> bool {
    ACTIVE.load(std::sync::atomic::Ordering::Relaxed) == canary as u8
}

/// Switch one canary on for the whole process, or all off with `None`.
#[cfg(feature = "canaries")]
pub fn set(canary: Option<Canary>) {
    ACTIVE.store(canary.map_or(0, |c| c as u8), std::sync::atomic::Ordering::Relaxed);
}
