//! Maintenance under the partition's `maintenance` lock: retention and compaction passes,
//! their reports and back-off.

use super::Partition;
use crate::Offset;
use crate::canary::{self, Canary};
use crate::compaction::{self, CleanError, KEY_MAP_ENTRIES_MAX, Source};
use crate::error::{AppendError, IoError};
use crate::io::{self, Io, OpenMode};
use crate::layout::{self, LOG_SUFFIX};
use crate::log_start;
use crate::metrics::Metrics;
use crate::segment::{Segment, SegmentFile};
use crate::swap;
use crate::topic::TopicConfig;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What one compaction pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    pub segments_in: u64,
    pub segments_out: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub records_in: u64,
    pub records_kept: u64,
    /// Distinct keys in the pass's key map.
    pub keys: u64,
    /// Writing the new segments' index files or `cleaner.offset` failed (derived data: the
    /// pass stands, and the next open rebuilds the indexes or cleans from further back).
    pub derived_files_failed: bool,
}

/// A compaction pass abandoned on an I/O error before it committed anything.
#[derive(Clone, Debug)]
pub struct CompactionFailure {
    /// The error, as its `Display` wrote it (operation, file and cause).
    pub message: String,
    pub kind: std::io::ErrorKind,
    /// Failures in a row, for the back-off.
    pub streak: u32,
    /// Engine clock time before which the tick does not try this partition again.
    pub retry_at_ms: i64,
}

/// First back-off after an abandoned compaction pass; it doubles per failure in a row.
const COMPACTION_BACKOFF_MS: i64 = 1_000;

/// Longest back-off between compaction attempts after failures.
const COMPACTION_BACKOFF_MAX_MS: i64 = 60_000;

impl<I: Io> Partition<I> {
    /// The last abandoned compaction pass, while no pass has succeeded since.
    pub fn compaction_failure(&self) -> Option<CompactionFailure> {
        self.compaction_failure.lock().clone()
    }

    /// A finished compaction pass, in the metrics and the trace.
    fn count_compaction(&self, report: &CompactionReport) {
        let m = &self.metrics;
        Metrics::add(&m.compaction_passes, 1);
        Metrics::add(&m.compaction_bytes_in, report.bytes_in);
        Metrics::add(&m.compaction_bytes_out, report.bytes_out);
        Metrics::add(&m.compaction_records_in, report.records_in);
        Metrics::add(&m.compaction_records_kept, report.records_kept);
        let (records_in, records_kept) = (report.records_in, report.records_kept);
        tracing::info!(records_in, records_kept, bytes_out = report.bytes_out, "compacted");
    }

    /// Retention: remove the oldest sealed segments the topic's settings no longer keep, a
    /// prefix of the log, never the active segment. A sealed segment goes when its newest
    /// record is older than `retention_ms` on the engine clock, or while the partition without
    /// it is still at least `retention_bytes` long. Returns how many segments went.
    ///
    /// Crash-safe in this order: the new log start (the base of the first segment kept) is
    /// made durable in `log.start`; the segments leave the partition's list, so new reads
    /// below the log start are out of range (reads in flight keep their open files); then
    /// their files are removed and the directory fsynced. A crash after the first step is
    /// finished by recovery, which removes whatever files are left below the log start.
    pub fn apply_retention(&self, now: i64) -> Result<usize, AppendError> {
        if self.writer.is_none() {
            return Ok(0);
        }
        let _maintenance = self.maintenance.lock();
        self.poison.check()?;
        let (count, log_start) = {
            let state = self.state.lock();
            let config = state.config;
            if state.deleted || !config.cleanup.deletes() {
                return Ok(0);
            }
            let mut total: u64 = state.segments.iter().map(|s| s.size).sum();
            let sealed = &state.segments[..state.segments.len() - 1];
            let mut count = 0;
            for segment in sealed {
                let newest = segment.index.max_timestamp();
                let too_old = config
                    .retention_ms
                    .is_some_and(|ms| newest != i64::MIN && now.saturating_sub(newest) > ms);
                let too_big =
                    config.retention_bytes.is_some_and(|limit| total - segment.size >= limit);
                if !(too_old || too_big) {
                    break;
                }
                total -= segment.size;
                count += 1;
            }
            if canary::active(Canary::RetentionRemovesOneTooMany)
                && count > 0
                && count < sealed.len()
            {
                count += 1;
            }
            if count == 0 {
                return Ok(0);
            }
            (count, state.segments[count].base_offset)
        };
        self.remove_front(count, log_start)
    }

    /// Delete records: remove the sealed segments every record of which lies below `before`
    /// (and below the high watermark), a prefix of the log, never the active segment. The
    /// log start becomes the base of the first segment kept, never past `before` by this call
    /// (records of that segment below `before` stay readable until a later call removes it)
    /// and never back. Works on any cleanup policy, in the same crash-safe order as
    /// [`Partition::apply_retention`]. Returns the log start after the call.
    pub fn delete_before(&self, before: Offset) -> Result<Offset, AppendError> {
        if self.writer.is_none() {
            return Err(AppendError::ReadOnly);
        }
        let _maintenance = self.maintenance.lock();
        self.poison.check()?;
        let (count, log_start) = {
            let state = self.state.lock();
            let first = state.segments[0].base_offset;
            if state.deleted {
                return Ok(first);
            }
            let limit = before.min(self.high_watermark());
            // Segment `i` holds offsets below the base of segment `i + 1`.
            let mut count =
                state.segments.windows(2).take_while(|w| w[1].base_offset <= limit).count();
            if canary::active(Canary::DeleteRecordsOneTooMany)
                && count > 0
                && count + 1 < state.segments.len()
            {
                count += 1;
            }
            if count == 0 {
                return Ok(first);
            }
            (count, state.segments[count].base_offset)
        };
        self.remove_front(count, log_start)?;
        Ok(log_start)
    }

    /// Remove the first `count` segments, `log_start` being the base of the next: the log
    /// start made durable first, then the segments out of the list, then their files.
    fn remove_front(&self, count: usize, log_start: Offset) -> Result<usize, AppendError> {
        let removed = (|| {
            if !canary::active(Canary::RetentionSkipsLogStart) {
                log_start::write(&*self.io, &self.directory, log_start)?;
            }
            let removed: Vec<Segment<I>> = {
                let mut state = self.state.lock();
                // Only retention and deletes, serialised by `maintenance`, take segments from
                // the front.
                assert_eq!(state.segments[count].base_offset, log_start);
                state.segments.drain(..count).collect()
            };
            for segment in &removed {
                swap::remove_segment_files(&*self.io, &self.directory, segment.base_offset)?;
            }
            io::sync_directory(&*self.io, &self.directory)
                .map_err(|e| IoError::new("fsync", &self.directory, e))?;
            Ok(removed.len())
        })();
        removed.inspect_err(|e: &IoError| self.poison_with(e)).map_err(AppendError::from)
    }

    /// One compaction pass (see [`crate::compaction`]) if the topic is compacted and due: its
    /// dirty ratio reached `min_cleanable_dirty_ratio`, a dirty segment is older than
    /// `max_compaction_lag_ms`, or `force`. Returns what it did, or `None` if nothing was due.
    ///
    /// An I/O error before a group's swap is committed abandons the pass (groups swapped
    /// before it stay swapped; the failing group is left as it was): the error is returned
    /// without poisoning and kept for [`Partition::
    /// compaction_failure`], and passes that are not forced wait for a back-off. An I/O error
    /// at or after a commit poisons the engine; the next open finishes the swap in flight.
    pub fn compact(&self, now: i64, force: bool) -> Result<Option<CompactionReport>, AppendError> {
        if self.writer.is_none() {
            return Ok(None);
        }
        let _maintenance = self.maintenance.lock();
        self.poison.check()?;
        if self.compaction_blocked.lock().is_some() {
            return Ok(None);
        }
        let backing_off =
            self.compaction_failure.lock().as_ref().is_some_and(|f| now < f.retry_at_ms);
        if backing_off && !force {
            return Ok(None);
        }
        let (sources, config) = {
            let state = self.state.lock();
            let config = state.config;
            if state.deleted || !config.cleanup.compacts() {
                return Ok(None);
            }
            // Sealed segments only, and none holding a record younger than the lag: the active
            // segment and what is above the high watermark are never touched.
            let horizon = now.saturating_sub(config.min_compaction_lag_ms);
            let cleanable = if canary::active(Canary::CompactionTouchesActiveSegment) {
                state.segments.len()
            } else {
                state.segments.len() - 1
            };
            let sealed = &state.segments[..cleanable];
            let sources: Vec<Source<I>> = sealed
                .iter()
                .take_while(|s| s.index.max_timestamp() <= horizon)
                .filter(|s| s.next_offset <= self.high_watermark())
                .map(|s| Source {
                    base: s.base_offset,
                    next_offset: s.next_offset,
                    size: s.size,
                    max_timestamp: s.index.max_timestamp(),
                    file: Arc::clone(&s.file),
                })
                .collect();
            (sources, config)
        };
        let first_dirty = *self.first_dirty.lock();
        let total: u64 = sources.iter().map(|s| s.size).sum();
        let dirty: Vec<&Source<I>> =
            sources.iter().filter(|s| s.next_offset > first_dirty).collect();
        // Forced, a pass runs even with nothing dirty: tombstones may have expired since.
        if (dirty.is_empty() && !force) || total == 0 {
            return Ok(None);
        }
        let ratio = dirty.iter().map(|s| s.size).sum::<u64>() as f64 / total as f64;
        let overdue = config
            .max_compaction_lag_ms
            .is_some_and(|lag| dirty.iter().any(|s| now.saturating_sub(s.max_timestamp) > lag));
        if !force && ratio < config.min_cleanable_dirty_ratio && !overdue {
            return Ok(None);
        }
        let (topic, segments) = (self.topic.as_str(), sources.len());
        let _span =
            tracing::info_span!("compaction", topic, partition = self.id, segments).entered();
        match self.clean(&sources, first_dirty, now, &config) {
            Ok(report) => {
                tracing::info!(
                    records_in = report.records_in,
                    records_kept = report.records_kept,
                    bytes_out = report.bytes_out,
                    "compacted"
                );
                *self.compaction_failure.lock() = None;
                self.count_compaction(&report);
                Ok(Some(report))
            }
            Err(CleanError::Aborted(error)) => {
                tracing::warn!(%error, "compaction pass abandoned");
                self.compaction_failures.fetch_add(1, Ordering::Relaxed);
                let mut failure = self.compaction_failure.lock();
                let streak = failure.as_ref().map_or(0, |f| f.streak).saturating_add(1);
                let backoff = COMPACTION_BACKOFF_MS
                    .saturating_mul(1 << streak.min(16).saturating_sub(1))
                    .min(COMPACTION_BACKOFF_MAX_MS);
                let retry_at_ms = now.saturating_add(backoff);
                let (message, kind) = (error.to_string(), error.source.kind());
                *failure = Some(CompactionFailure { message, kind, streak, retry_at_ms });
                Err(error.into())
            }
            Err(CleanError::Io(error)) => {
                self.poison_with(&error);
                Err(error.into())
            }
            Err(CleanError::Damaged(corruption)) => {
                // This partition stays as it is; the others go on being compacted.
                *self.compaction_blocked.lock() = Some(corruption);
                Ok(None)
            }
        }
    }

    fn clean(
        &self,
        sources: &[Source<I>],
        first_dirty: Offset,
        now: i64,
        config: &TopicConfig,
    ) -> Result<CompactionReport, CleanError> {
        let (map, map_end) = compaction::build_key_map(sources, first_dirty, KEY_MAP_ENTRIES_MAX)
            .map_err(CleanError::before_commit)?;
        let cleanable: Vec<&Source<I>> = sources.iter().filter(|s| s.base < map_end).collect();
        let mut report = CompactionReport { keys: map.len() as u64, ..CompactionReport::default() };
        let owned: Vec<Source<I>> =
            cleanable.iter().map(|s| Source { file: Arc::clone(&s.file), ..**s }).collect();
        for range in compaction::groups(&owned, config.segment_bytes) {
            let group = &owned[range];
            let base = group[0].base;
            let bases: Vec<Offset> = group.iter().map(|s| s.base).collect();
            let cleaned = compaction::clean_group(
                &self.io,
                &self.directory,
                group,
                &map,
                map_end,
                now,
                config,
            )
            .map_err(|e| {
                // Best effort: the next pass and the next open remove it too.
                let _ = self.io.remove_file(&swap::path_with(
                    &self.directory,
                    base,
                    swap::CLEANED_SUFFIX,
                ));
                e.before_commit()
            })?;
            swap::commit_swap(&*self.io, &self.directory, base)?;
            swap::finish_swap(&*self.io, &self.directory, base, &bases)?;
            let mut segment = cleaned.segment;
            let log = self.directory.join(layout::file_name(base, LOG_SUFFIX));
            segment.file = Arc::new(SegmentFile::open(&self.io, log, OpenMode::Read)?);
            // Index files are derived: the swap is complete without them, the in-memory index
            // serves, and the next open rebuilds what is missing or half written. A disk that
            // fills here costs this partition nothing but a rebuild.
            let indexed = segment.write_index_files().and_then(|()| {
                io::sync_directory(&*self.io, &self.directory)
                    .map_err(|e| IoError::new("fsync", &self.directory, e))
            });
            report.derived_files_failed |= indexed.is_err();
            report.segments_in += group.len() as u64;
            report.segments_out += 1;
            report.bytes_in += group.iter().map(|s| s.size).sum::<u64>();
            report.bytes_out += segment.size;
            report.records_in += cleaned.records_in;
            report.records_kept += cleaned.records_kept;
            let mut state = self.state.lock();
            let at = state
                .segments
                .iter()
                .position(|s| s.base_offset == base)
                .expect("only the cleaner, retention and deletes remove sealed segments, under `maintenance`");
            let replaced: Vec<Offset> =
                state.segments[at..at + group.len()].iter().map(|s| s.base_offset).collect();
            assert_eq!(replaced, bases, "the segments cleaned are still in place");
            #[cfg(loom)]
            if crate::sync::bugs::active(crate::sync::bugs::Bug::SplitSwap) {
                state.segments.drain(at..at + group.len());
                drop(state);
                self.state.lock().segments.insert(at, segment);
                continue;
            }
            state.segments.splice(at..at + group.len(), [segment]);
        }
        // Advisory too: absent or stale, the next open cleans from an earlier offset again.
        let recorded = log_start::write_cleaner_offset(&*self.io, &self.directory, map_end);
        report.derived_files_failed |= recorded.is_err();
        *self.first_dirty.lock() = map_end;
        self.compaction_passes.fetch_add(1, Ordering::Relaxed);
        Ok(report)
    }
}
