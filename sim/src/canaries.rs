//! Mutation canaries: each deliberate bug of [`chronik_engine::canary`] switched on in
//! turn, with seeds run from zero until one reports a violation. A canary no seed catches is a hole
//! in the oracles (or in the workload and faults that reach the bug).
//!
//! The active canary is process-global, so the hunt runs seeds one after another on the
//! calling thread, and nothing else may run the engine in the process meanwhile.

use crate::run::{RunOptions, run};
use chronik_engine::canary::{self, Canary};

/// Seeds tried per canary unless told otherwise.
pub const MAX_SEEDS_DEFAULT: u64 = 2000;

/// How one canary fared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caught {
    pub canary: Canary,
    /// The first seed that failed, and the oracle that caught it; `None` if none did.
    pub by: Option<(u64, &'static str)>,
    /// What the oracle said.
    pub detail: String,
    /// Seeds run (the catching one included).
    pub seeds: u64,
}

/// The canary's name on the command line (`--canary skip-checksum-on-read`).
pub fn name(canary: Canary) -> &'static str {
    match canary {
        Canary::AckBeforeFsync => "ack-before-fsync",
        Canary::RetryFsyncAfterFailure => "retry-fsync-after-failure",
        Canary::SkipDirectoryFsyncOnRoll => "skip-directory-fsync-on-roll",
        Canary::RecoveryCutsPastSynced => "recovery-cuts-past-synced",
        Canary::SkipChecksumOnRead => "skip-checksum-on-read",
        Canary::IndexBeforeData => "index-before-data",
        Canary::IndexLookupOverruns => "index-lookup-overruns",
        Canary::TimestampLookupTakesBatchStart => "timestamp-lookup-takes-batch-start",
        Canary::RecoveryRebuildsIndexes => "recovery-rebuilds-indexes",
        Canary::OsAppendsNotPublished => "os-appends-not-published",
        Canary::FlushIgnoresPoison => "flush-ignores-poison",
        Canary::WriteErrorNotPoisoned => "write-error-not-poisoned",
        Canary::RecoveryTrustsTornTail => "recovery-trusts-torn-tail",
        Canary::TopicCreateNotDurable => "topic-create-not-durable",
        Canary::CloseLeaksLockHandle => "close-leaks-lock-handle",
        Canary::AppendPanicsOnEmptyValue => "append-panics-on-empty-value",
        Canary::AppendReportsWrongOffset => "append-reports-wrong-offset",
        Canary::FetchNextOffsetOverruns => "fetch-next-offset-overruns",
        Canary::DirectWriteDropsTail => "direct-write-drops-tail",
        Canary::SealKeepsDirectPadding => "seal-keeps-direct-padding",
        Canary::RetentionSkipsLogStart => "retention-skips-log-start",
        Canary::RetentionRemovesOneTooMany => "retention-removes-one-too-many",
        Canary::CommitNotDurable => "commit-not-durable",
        Canary::CompactionDropsLatest => "compaction-drops-latest",
        Canary::CompactionDropsTombstoneEarly => "compaction-drops-tombstone-early",
        Canary::CompactionTouchesActiveSegment => "compaction-touches-active-segment",
        Canary::SwapWithoutDirectoryFsync => "swap-without-directory-fsync",
        Canary::SwapRenameBeforeRemovalsSynced => "swap-rename-before-removals-synced",
        Canary::TransactionCommittedBeforeDataSynced => "transaction-committed-before-data-synced",
        Canary::RecoveryKeepsUncommittedTransaction => "recovery-keeps-uncommitted-transaction",
        Canary::InputCommittedBeforeOutputs => "input-committed-before-outputs",
        Canary::RestoreSkipsTombstone => "restore-skips-tombstone",
        Canary::SnapshotAheadOfChangelog => "snapshot-ahead-of-changelog",
        Canary::StateAppliedBeforeCommit => "state-applied-before-commit",
        Canary::LogAckOnWrite => "log-ack-on-write",
        Canary::ReactorUnlinkedSync => "reactor-unlinked-sync",
        Canary::LogWatermarkBeforeSync => "log-watermark-before-sync",
        Canary::DirectWritesUnlinked => "direct-writes-unlinked",
        Canary::StoreAppliedBeforeCommit => "store-applied-before-commit",
        Canary::StoreOffsetAheadOfData => "store-offset-ahead-of-data",
        Canary::StoreOffsetNotRead => "store-offset-not-read",
        Canary::StoreTrustsDamage => "store-trusts-damage",
        Canary::WindowFinalBeforeGrace => "window-final-before-grace",
        Canary::LateRecordFolded => "late-record-folded",
        Canary::WindowStateNotExpired => "window-state-not-expired",
        Canary::JoinTableAheadOfStream => "join-table-ahead-of-stream",
        Canary::DeleteRecordsOneTooMany => "delete-records-one-too-many",
        Canary::RepartitionPurgedPastCommit => "repartition-purged-past-commit",
        Canary::ReaderStopsAtEmptyFetch => "reader-stops-at-empty-fetch",
        Canary::RecoveryPointBeforeSync => "recovery-point-before-sync",
        Canary::RecoveryPointIndexPastPoint => "recovery-point-index-past-point",
        Canary::CleanMarkBeforeLastSync => "clean-mark-before-last-sync",
        Canary::CleanMarkKeptAtOpen => "clean-mark-kept-at-open",
        Canary::SyncCoversLaterWrites => "sync-covers-later-writes",
        Canary::StoreMergeKeepsOlder => "store-merge-keeps-older",
        Canary::StoreRunNamedBeforeDurable => "store-run-named-before-durable",
    }
}

/// The canary named `name`, as [`name`] spells it.
pub fn from_name(name: &str) -> Option<Canary> {
    Canary::ALL.into_iter().find(|&c| self::name(c) == name)
}

/// Switch `canary` on (or every canary off) until the guard is dropped. Process-global: runs
/// in other threads see it too.
pub fn arm(canary: Option<Canary>) -> Armed {
    canary::set(canary);
    Armed
}

/// Switches the canary off again when dropped, even if a run panics through.
#[derive(Debug)]
pub struct Armed;

impl Drop for Armed {
    fn drop(&mut self) {
        canary::set(None);
    }
}

/// Run seeds `0..max_seeds` with `canary` on until one fails.
pub fn hunt(canary: Canary, max_seeds: u64, options: &RunOptions) -> Caught {
    let _armed = arm(Some(canary));
    let processor = PROCESSOR_CANARIES.contains(&canary);
    let reactor = REACTOR_CANARIES.contains(&canary);
    for seed in 0..max_seeds {
        let violation = if processor {
            crate::processors::run_seed(seed).err()
        } else if reactor {
            crate::reactor::run_seed(seed).err()
        } else {
            run(seed, options).violation
        };
        if let Some(violation) = violation {
            let by = Some((seed, violation.oracle));
            return Caught { canary, by, detail: violation.detail, seeds: seed + 1 };
        }
    }
    Caught { canary, by: None, detail: String::new(), seeds: max_seeds }
}

/// Canaries whose bug the swarm reaches too rarely to hunt it within the bound, each with
/// the targeted test that builds its scenario on purpose and proves it caught.
pub const TARGETED: [(Canary, &str); 1] =
    [(Canary::SwapRenameBeforeRemovalsSynced, "sim/tests/compaction_swap.rs")];

/// Canaries of the stream-processor runtime, hunted with [`crate::processors`] workloads
/// instead of engine runs.
pub const PROCESSOR_CANARIES: [Canary; 15] = [
    Canary::InputCommittedBeforeOutputs,
    Canary::RestoreSkipsTombstone,
    Canary::SnapshotAheadOfChangelog,
    Canary::StateAppliedBeforeCommit,
    Canary::StoreAppliedBeforeCommit,
    Canary::StoreOffsetAheadOfData,
    Canary::StoreOffsetNotRead,
    Canary::StoreTrustsDamage,
    Canary::StoreMergeKeepsOlder,
    Canary::StoreRunNamedBeforeDurable,
    Canary::WindowFinalBeforeGrace,
    Canary::LateRecordFolded,
    Canary::WindowStateNotExpired,
    Canary::JoinTableAheadOfStream,
    Canary::RepartitionPurgedPastCommit,
];

/// Canaries of the write path's partition log and reactor, hunted with [`crate::reactor`]
/// workloads, which drive them with many partitions, small writes and power cuts between any
/// two completions.
pub const REACTOR_CANARIES: [Canary; 5] = [
    Canary::LogAckOnWrite,
    Canary::ReactorUnlinkedSync,
    Canary::LogWatermarkBeforeSync,
    Canary::DirectWritesUnlinked,
    Canary::SyncCoversLaterWrites,
];

/// The canaries the swarm hunts: the catalogue but the targeted ones.
pub fn hunted() -> impl Iterator<Item = Canary> {
    Canary::ALL.into_iter().filter(|c| TARGETED.iter().all(|(t, _)| t != c))
}

/// Hunt every canary of [`hunted`].
pub fn hunt_all(max_seeds: u64, options: &RunOptions) -> Vec<Caught> {
    hunted().map(|canary| hunt(canary, max_seeds, options)).collect()
}
