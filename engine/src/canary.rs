//! Mutation canaries: deliberate bugs the simulator switches on one at a time to prove that
//! its oracles catch them (see `chronik-sim canaries`).
//!
//! Without the `canaries` feature (the default, and every real build) [`active`] is a
//! constant `false`, so every canary branch in the engine is removed by the optimizer and the
//! engine behaves exactly as if the branches were not there.
//!
//! With the feature, the active canary is a process-global: a global is tolerable only
//! because it exists solely under this test-only feature. No canary is active until `set`
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
    /// An offset index lookup answers with the entry after the right one, when there is one.
    IndexLookupOverruns = 7,
    /// A timestamp lookup answers with the first offset of the batch instead of the record's.
    TimestampLookupTakesBatchStart = 8,
    /// Recovery rebuilds every sealed segment's index files, even valid ones: not idempotent.
    RecoveryRebuildsIndexes = 9,
    /// `Durability::Os` appends are not published to readers until a sync.
    OsAppendsNotPublished = 10,
    /// `Engine::flush` reports success on a poisoned engine.
    FlushIgnoresPoison = 11,
    /// A failed write is returned without poisoning the engine.
    WriteErrorNotPoisoned = 12,
    /// The recovery scan parses batches without comparing checksums, so torn tails are kept.
    RecoveryTrustsTornTail = 13,
    /// A topic create returns before the rename of its directory into place is fsynced.
    TopicCreateNotDurable = 14,
    /// Closing the engine leaves the data directory's lock handle open.
    CloseLeaksLockHandle = 15,
    /// An append panics on a record with an empty value.
    AppendPanicsOnEmptyValue = 16,
    /// An append acknowledges its records one offset too low.
    AppendReportsWrongOffset = 17,
    /// A fetch says the next offset is one past where it really is.
    FetchNextOffsetOverruns = 18,
    /// A direct write pads the front of its first block with zeros instead of the bytes
    /// already there (the tail kept in memory).
    DirectWriteDropsTail = 19,
    /// Sealing a direct segment keeps the zeros padding its last block.
    SealKeepsDirectPadding = 20,
    /// Retention removes segment files without first making the new log start durable.
    RetentionSkipsLogStart = 21,
    /// Retention removes one sealed segment more than its settings allow.
    RetentionRemovesOneTooMany = 22,
    /// A consumer-offset commit in `os` or `interval` mode returns before it is fsynced.
    CommitNotDurable = 23,
    /// Compaction also drops the latest record of a key (it compares offsets with `>=`).
    CompactionDropsLatest = 24,
    /// Compaction drops tombstones at once, ignoring `delete_retention_ms`.
    CompactionDropsTombstoneEarly = 25,
    /// Compaction takes the active segment as cleanable too.
    CompactionTouchesActiveSegment = 26,
    /// Committing a compaction swap renames `.cleaned` to `.swap` without fsyncing the
    /// directory before the sources are removed.
    SwapWithoutDirectoryFsync = 27,
    /// Finishing a swap renames `.swap` to `.log` without first fsyncing the directory after
    /// removing the sources, so a crash may keep the rename and lose a removal.
    SwapRenameBeforeRemovalsSynced = 28,
    /// A transaction writes its commit record before its batches are fdatasynced (and syncs
    /// them after).
    TransactionCommittedBeforeDataSynced = 29,
    /// Recovery keeps a transactional batch at the end of a partition without looking for
    /// its commit record.
    RecoveryKeepsUncommittedTransaction = 30,
    /// Stream processors (the `chronik` crate): a commit writes the input position first, in a
    /// commit of its own, then the outputs and changelog.
    InputCommittedBeforeOutputs = 31,
    /// Stream processors: a restore ignores tombstones, so deleted keys come back.
    RestoreSkipsTombstone = 32,
    /// Stream processors: a store snapshot is written before the commit, holding uncommitted
    /// state, with the changelog end as it was before the commit.
    SnapshotAheadOfChangelog = 33,
    /// Stream processors: store changes are appended to the changelog on their own, before
    /// the transaction with the outputs and the input position (state applied, durably,
    /// before its commit).
    StateAppliedBeforeCommit = 34,
    /// The second design's partition log (`log.rs`): a `sync` append is acknowledged when its
    /// write completes, before any fdatasync covers it.
    LogAckOnWrite = 35,
    /// The second design's reactor submits a log's writes and their fdatasync unlinked, so
    /// the fdatasync may run before the writes it is taken to cover.
    ReactorUnlinkedSync = 36,
    /// The second design's partition log publishes the watermark when a write completes, in
    /// `sync` and `interval` modes too (readers see what a crash can take).
    LogWatermarkBeforeSync = 37,
    /// The second design's partition log sends two direct writes that share a block in one
    /// submission without linking them, so either may land last.
    DirectWritesUnlinked = 38,
    /// Stream processors' disk stores take a commit's changes (a flush with the changelog end
    /// before the commit) before the transaction commits.
    StoreAppliedBeforeCommit = 39,
    /// A disk store's flush records its new changelog offset in the manifest before the run
    /// holding the data of that offset is named there.
    StoreOffsetAheadOfData = 40,
    /// A disk store's restore ignores the offset the store reflects and reads the whole
    /// changelog (the state is still right; only the tail oracle sees it).
    StoreOffsetNotRead = 41,
    /// Disk store reads do not compare checksums, so rotted store bytes are believed.
    StoreTrustsDamage = 42,
    /// Windowed aggregations emitting final results close a window when stream time reaches
    /// its end, not its end plus the grace period.
    WindowFinalBeforeGrace = 43,
    /// Windowed aggregations fold a record into its window even after the window closed.
    LateRecordFolded = 44,
    /// Windowed aggregations never delete a closed window's state.
    WindowStateNotExpired = 45,
    /// A task with several inputs drains its later inputs (tables) before the first, whatever
    /// their timestamps, so a join reads the table ahead of the stream's time.
    JoinTableAheadOfStream = 46,
    /// `Engine::delete_records` removes one segment more than every record below the offset
    /// asked for (when one more sealed segment is there).
    DeleteRecordsOneTooMany = 47,
    /// Topologies purge a repartition topic up to where its stage has processed, not up to
    /// the position the stage committed.
    RepartitionPurgedPastCommit = 48,
    /// The SDK's readers (the `chronik` crate's shared cursor) take a fetch that holds no
    /// record at or past their position (batches emptied by compaction) for "caught up".
    ReaderStopsAtEmptyFetch = 49,
    /// A partition's recovery point is made for written bytes, before an fdatasync covered
    /// them.
    RecoveryPointBeforeSync = 50,
    /// A recovery point's index files keep the entries of batches past it, and the open
    /// trusts them.
    RecoveryPointIndexPastPoint = 51,
    /// The engine's close writes the clean-shutdown mark before its partitions' last fsyncs.
    CleanMarkBeforeLastSync = 52,
    /// A writable open leaves the clean-shutdown mark in place, so a crash of this writer
    /// is taken for a clean close by the next open.
    CleanMarkKeptAtOpen = 53,
    /// A completed fdatasync is taken to cover every write completed by then, also those
    /// that completed while it was in flight (it covers only those completed before its
    /// submission).
    SyncCoversLaterWrites = 54,
    /// A disk store's merge keeps the oldest run's entry of a key that several runs hold (the
    /// newest must win).
    StoreMergeKeepsOlder = 55,
    /// A disk store's manifest names a run before the run is durable: neither its data
    /// (fdatasync) nor its directory entry is synced first.
    StoreRunNamedBeforeDurable = 56,
}

impl Canary {
    /// Every canary, in catalogue order.
    pub const ALL: [Canary; 56] = [
        Canary::AckBeforeFsync,
        Canary::RetryFsyncAfterFailure,
        Canary::SkipDirectoryFsyncOnRoll,
        Canary::RecoveryCutsPastSynced,
        Canary::SkipChecksumOnRead,
        Canary::IndexBeforeData,
        Canary::IndexLookupOverruns,
        Canary::TimestampLookupTakesBatchStart,
        Canary::RecoveryRebuildsIndexes,
        Canary::OsAppendsNotPublished,
        Canary::FlushIgnoresPoison,
        Canary::WriteErrorNotPoisoned,
        Canary::RecoveryTrustsTornTail,
        Canary::TopicCreateNotDurable,
        Canary::CloseLeaksLockHandle,
        Canary::AppendPanicsOnEmptyValue,
        Canary::AppendReportsWrongOffset,
        Canary::FetchNextOffsetOverruns,
        Canary::DirectWriteDropsTail,
        Canary::SealKeepsDirectPadding,
        Canary::RetentionSkipsLogStart,
        Canary::RetentionRemovesOneTooMany,
        Canary::CommitNotDurable,
        Canary::CompactionDropsLatest,
        Canary::CompactionDropsTombstoneEarly,
        Canary::CompactionTouchesActiveSegment,
        Canary::SwapWithoutDirectoryFsync,
        Canary::SwapRenameBeforeRemovalsSynced,
        Canary::TransactionCommittedBeforeDataSynced,
        Canary::RecoveryKeepsUncommittedTransaction,
        Canary::InputCommittedBeforeOutputs,
        Canary::RestoreSkipsTombstone,
        Canary::SnapshotAheadOfChangelog,
        Canary::StateAppliedBeforeCommit,
        Canary::LogAckOnWrite,
        Canary::ReactorUnlinkedSync,
        Canary::LogWatermarkBeforeSync,
        Canary::DirectWritesUnlinked,
        Canary::StoreAppliedBeforeCommit,
        Canary::StoreOffsetAheadOfData,
        Canary::StoreOffsetNotRead,
        Canary::StoreTrustsDamage,
        Canary::WindowFinalBeforeGrace,
        Canary::LateRecordFolded,
        Canary::WindowStateNotExpired,
        Canary::JoinTableAheadOfStream,
        Canary::DeleteRecordsOneTooMany,
        Canary::RepartitionPurgedPastCommit,
        Canary::ReaderStopsAtEmptyFetch,
        Canary::RecoveryPointBeforeSync,
        Canary::RecoveryPointIndexPastPoint,
        Canary::CleanMarkBeforeLastSync,
        Canary::CleanMarkKeptAtOpen,
        Canary::SyncCoversLaterWrites,
        Canary::StoreMergeKeepsOlder,
        Canary::StoreRunNamedBeforeDurable,
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
