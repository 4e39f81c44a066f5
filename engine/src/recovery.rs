//! Recovery of a partition's segments when the engine opens.
//!
//! Sealed segments (every segment but the last) were fsynced before the next one was created,
//! so anything wrong in them is corruption: it is reported, never cut. Their index files are
//! loaded, or rebuilt by a scan when missing or stale. The last (active) segment is loaded from
//! its recovery point (its index files, written for a prefix of it that was durable) and scanned
//! past it only; without a usable one, from its start. After a clean close the recovery point
//! covers the whole segment and the clean-shutdown mark lets the open skip the fsyncs too.
//! Where the scan stops early, the bytes are either a torn tail of unsynced writes,
//! which is cut and reported, or damage inside data that was already synced, which is kept and
//! reported as corruption. Two kinds of evidence separate them: the partition's sync checkpoint
//! (a position below which every byte was fsynced), and the `synced_offset_hint` of the chain of
//! valid batches that starts where the damaged batch's own header says it ends: if one of them
//! says the damaged batch's offset was already durable when it was written, the damage is inside
//! synced data. The classification itself is `tail.rs`'s (shared with `chronik verify`),
//! so the two cannot disagree; this module acts on it. See docs/format.md.
//!
//! Recovery is idempotent: it only ever truncates at the first damaged position and rewrites
//! derived files (indexes), so running it again finds a clean log and changes nothing.

use crate::Offset;
use crate::canary::{self, Canary};
use crate::checkpoint::{CHECKPOINT_FILE, Checkpoint};
use crate::context::PartitionContext;
use crate::error::{Corruption, CorruptionKind, IoError, OpenError};
use crate::format;
use crate::index::SegmentIndex;
use crate::io::{self, Io, OpenMode, Operation};
use crate::layout::{self, INDEX_SUFFIX, LOG_SUFFIX, TEMPORARY_SUFFIX, TIME_INDEX_SUFFIX};
use crate::limits::SCAN_CHUNK_BYTES;
use crate::log_start;
use crate::segment::{self, Segment, SegmentFile};
use crate::swap::{self, CLEANED_SUFFIX, SWAP_SUFFIX, remove_segment_files};
use crate::tail::{self, RecoveryPoint, Scanned, Tail};
use crate::topic::TopicConfig;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use zerocopy::FromBytes;

/// What recovery did to one partition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionRecovery {
    pub topic: String,
    pub partition: u32,
    /// Bytes of torn, unsynced tail cut from the active segment.
    pub truncated_bytes: u64,
    /// Records in the cut tail whose batch headers could still be read.
    pub truncated_records: u64,
    /// Index files rebuilt because they were missing, stale or damaged.
    pub rebuilt_indexes: u32,
    /// Leftover temporary files removed.
    pub removed_temporary_files: u32,
    /// Segments below the recorded log start whose removal a crash interrupted, removed now
    /// (housekeeping: the partition is still clean).
    pub removed_segments_below_log_start: u32,
    /// Compaction swaps committed before a crash and finished now (housekeeping too).
    pub finished_compaction_swaps: u32,
    /// Records of a transaction whose commit record never became durable, removed from the
    /// end of the log (they were never shown to readers).
    pub rolled_back_records: u64,
    /// Damage found in synced data, kept in place and reported on reads.
    pub damage: Vec<Corruption>,
    /// Opened read-only: nothing was cut or rewritten; a tail that does not parse was only
    /// left unread (a writer may be appending to it).
    pub read_only: bool,
    /// Bytes of the active segment read at open: those past its recovery point.
    pub scanned_bytes: u64,
    /// Where the active segment's recovery point was (bytes it covers), if it had one.
    pub recovery_point: Option<u64>,
    /// Why the active segment's recovery point could not be used: it was scanned from its
    /// start instead.
    pub recovery_point_unusable: Option<&'static str>,
    /// Opened on the clean-shutdown mark: nothing scanned, rewritten or fsynced.
    pub opened_clean: bool,
    /// The clean-shutdown mark was there but this partition's files disagree with it (its
    /// active segment is not exactly covered by its recovery point): recovered as after a
    /// crash.
    pub mark_contradicted: bool,
}

impl PartitionRecovery {
    pub fn is_clean(&self) -> bool {
        self.truncated_bytes == 0
            && self.rebuilt_indexes == 0
            && self.rolled_back_records == 0
            && self.damage.is_empty()
            && self.recovery_point_unusable.is_none()
            && !self.mark_contradicted
    }
}

impl fmt::Display for PartitionRecovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:", self.topic, self.partition)?;
        if self.truncated_bytes > 0 {
            let verb =
                if self.read_only { "left unread an unsynced tail" } else { "cut a torn tail" };
            write!(
                f,
                " {verb} of {} bytes ({} records);",
                self.truncated_bytes, self.truncated_records
            )?;
        }
        if self.rebuilt_indexes > 0 {
            write!(f, " rebuilt {} index files;", self.rebuilt_indexes)?;
        }
        if self.rolled_back_records > 0 {
            let records = self.rolled_back_records;
            write!(f, " rolled back {records} records of an uncommitted transaction;")?;
        }
        if self.removed_segments_below_log_start > 0 {
            let removed = self.removed_segments_below_log_start;
            write!(f, " finished removing {removed} segments below the log start;")?;
        }
        if let Some(why) = self.recovery_point_unusable {
            let bytes = self.scanned_bytes;
            write!(f, " recovery point unusable ({why}): scanned {bytes} bytes from the start;")?;
        }
        if self.mark_contradicted {
            write!(
                f,
                " the clean-shutdown mark disagrees with the files: recovered as after a crash;"
            )?;
        }
        for damage in &self.damage {
            write!(f, " {damage};")?;
        }
        if self.is_clean() {
            write!(f, " clean")?;
        }
        Ok(())
    }
}

/// A topic the open could not take up because its files are damaged (its `topic.meta`
/// damaged or missing, or a file of one of its partitions that recovery cannot read past).
/// The topic's files are left as they are, the other topics open, and every operation on
/// this one fails with the same `Corruption` until it is repaired: the file put back and the
/// directory reopened, `topic.meta` rewritten by [`Engine::alter_topic_config`], or the topic
/// discarded by [`Engine::delete_topic`].
///
/// [`Engine::alter_topic_config`]: crate::Engine::alter_topic_config
/// [`Engine::delete_topic`]: crate::Engine::delete_topic
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedTopic {
    pub name: String,
    pub damage: Corruption,
}

impl fmt::Display for DamagedTopic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "topic {} is damaged and was not opened: {}", self.name, self.damage)
    }
}

/// What recovery did to a whole data directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub partitions: Vec<PartitionRecovery>,
    /// Topics whose creation or deletion a crash interrupted, removed at open.
    pub removed_incomplete_topics: Vec<String>,
    /// Topics left closed because their files are damaged (see [`DamagedTopic`]).
    pub damaged_topics: Vec<DamagedTopic>,
    /// Damage that hid commit records of `__consumer_offsets` (its segments, or the topic
    /// itself among `damaged_topics`): as [`Engine::committed_offsets_damage`] says.
    ///
    /// [`Engine::committed_offsets_damage`]: crate::Engine::committed_offsets_damage
    pub committed_offsets_damage: Option<Corruption>,
    /// The clean-shutdown mark of the last close was found (and removed: this open's writes
    /// begin after it).
    pub clean_shutdown: bool,
    /// The mark was there but unreadable: every partition recovered as after a crash.
    pub clean_shutdown_unreadable: bool,
}

impl RecoveryReport {
    pub fn is_clean(&self) -> bool {
        self.partitions.iter().all(PartitionRecovery::is_clean)
            && self.removed_incomplete_topics.is_empty()
            && self.damaged_topics.is_empty()
            && self.committed_offsets_damage.is_none()
            && !self.clean_shutdown_unreadable
    }

    /// Bytes of active segments read at open (past their recovery points).
    pub fn scanned_bytes(&self) -> u64 {
        self.partitions.iter().map(|p| p.scanned_bytes).sum()
    }

    pub fn truncated_bytes(&self) -> u64 {
        self.partitions.iter().map(|p| p.truncated_bytes).sum()
    }

    pub fn truncated_records(&self) -> u64 {
        self.partitions.iter().map(|p| p.truncated_records).sum()
    }

    /// One line per partition that was not clean, per removed topic directory, per damaged
    /// topic, and for damage in the consumer offsets.
    pub fn lines(&self) -> Vec<String> {
        let partitions = self.partitions.iter().filter(|p| !p.is_clean()).map(ToString::to_string);
        let topics = self.removed_incomplete_topics.iter().map(|name| {
            format!("removed the leftovers of an interrupted create or delete: {name}")
        });
        let damaged = self.damaged_topics.iter().map(ToString::to_string);
        let offsets = self.committed_offsets_damage.iter().map(|damage| {
            format!(
                "consumer offsets: commit records after {damage} are unknown (committed \
                 offsets may be older than the last commits; no transaction was rolled back)"
            )
        });
        let mark = self.clean_shutdown_unreadable.then(|| {
            "the clean-shutdown mark is unreadable: recovered as after a crash".to_owned()
        });
        partitions.chain(topics).chain(damaged).chain(offsets).chain(mark).collect()
    }
}

/// The first offset of damaged synced data at the end of a log, and the evidence.
pub(crate) type Damaged = (Offset, Corruption);

/// A partition's recovered segments.
#[derive(Debug)]
pub(crate) struct Recovered<I: Io> {
    pub segments: Vec<Segment<I>>,
    /// The first offset of damaged synced data at the end of the log, if any.
    pub damaged: Option<(Offset, Corruption)>,
    /// The newest valid sync checkpoint, if any.
    pub checkpoint: Option<Checkpoint>,
    /// The position of the active segment's durable recovery point (0 without one).
    pub recovery_point: u64,
    pub report: PartitionRecovery,
}

pub(crate) fn recover_partition<I: Io>(
    context: &PartitionContext<I>,
    directory: &Path,
    topic: &str,
    partition: u32,
    config: &TopicConfig,
    now_ms: i64,
    transaction_end: Offset,
) -> Result<Recovered<I>, OpenError> {
    let (io, read_only, direct) = (&context.io, context.read_only, context.direct);
    let mut report =
        PartitionRecovery { topic: topic.to_owned(), partition, read_only, ..Default::default() };
    // Read before listing: a writer beside a read-only open may roll in between, and the
    // checkpoint must never name a segment the listing has not seen.
    let checkpoint_path = directory.join(CHECKPOINT_FILE);
    let checkpoint = segment::read_small_file(&**io, &checkpoint_path)?
        .and_then(|bytes| Checkpoint::newest(&bytes));
    let entries = io.list(directory).map_err(|e| IoError::new("list", directory, e))?;
    let mut bases = Vec::new();
    let mut swaps = Vec::new();
    for entry in &entries {
        let path = directory.join(&entry.name);
        if entry.name.ends_with(TEMPORARY_SUFFIX) || entry.name.ends_with(CLEANED_SUFFIX) {
            // Half-written replacements, and cleaned segments never committed.
            if read_only {
                continue;
            }
            io.remove_file(&path).map_err(|e| IoError::new("remove", &path, e))?;
            report.removed_temporary_files += 1;
        } else if let Some(base) = layout::parse_log_file_name(&entry.name) {
            bases.push(base);
        } else if let Some(base) = entry
            .name
            .strip_suffix(SWAP_SUFFIX)
            .and_then(layout::parse_log_file_name)
            .filter(|_| !read_only)
        {
            swaps.push(base);
        }
    }
    for base in swaps {
        finish_committed_swap(io, directory, base, &mut bases)?;
        report.finished_compaction_swaps += 1;
    }
    bases.sort();
    if !read_only {
        remove_orphan_indexes(io, directory, &entries, &bases, &mut report)?;
    }
    let mut lost_segments = None;
    if bases.is_empty() {
        // Topic creation always makes a first segment: its absence means lost files. Start
        // again, but say so.
        let corruption = Corruption {
            file: directory.to_path_buf(),
            position: 0,
            kind: CorruptionKind::Malformed { reason: "partition has no segment files" },
        };
        if read_only {
            return Err(corruption.into());
        }
        report.damage.push(corruption.clone());
        // An empty first segment keeps the partition readable; appends stay refused, so no
        // acknowledged offset is ever given out again.
        lost_segments = Some(corruption);
        let path = directory.join(layout::file_name(Offset::ZERO, LOG_SUFFIX));
        SegmentFile::open(io, path, OpenMode::CreateNew)?;
        bases.push(Offset::ZERO);
    }
    // Retention records the new log start durably before it removes a segment file: segments
    // wholly below it (every one before the segment starting there) were removed on purpose,
    // and a crash may have left some of their files. Finish the job; a reader skips them.
    let log_start = log_start::read(&**io, directory)?;
    while bases.len() > 1 && bases[1] <= log_start {
        let base = bases.remove(0);
        if !read_only {
            remove_segment_files(&**io, directory, base)?;
            report.removed_segments_below_log_start += 1;
        }
    }
    if bases[0] > log_start {
        // The first segments past the log start are lost.
        let kind =
            CorruptionKind::OffsetMismatch { expected: log_start.get(), found: bases[0].get() };
        let file = directory.join(layout::file_name(bases[0], LOG_SUFFIX));
        report.damage.push(Corruption { file, position: 0, kind });
    }
    let mut segments = Vec::with_capacity(bases.len());
    let (active_base, sealed_bases) = bases.split_last().expect("at least one segment");
    for (i, &base) in sealed_bases.iter().enumerate() {
        let next_base = bases[i + 1];
        let sealed = SealedSegment { base, next_base, read_only };
        let segment = recover_sealed(io, directory, &sealed, config, &mut report)?;
        if segment.next_offset < next_base {
            // A gap between two segments: a segment in between is lost.
            let kind = CorruptionKind::OffsetMismatch {
                expected: segment.next_offset.get(),
                found: next_base.get(),
            };
            let file = directory.join(layout::file_name(next_base, LOG_SUFFIX));
            report.damage.push(Corruption { file, position: 0, kind });
        }
        segments.push(segment);
    }
    let active = ActiveSegment {
        base: *active_base,
        checkpoint,
        now_ms,
        read_only,
        direct,
        transaction_end,
        clean_shutdown: context.clean_shutdown,
    };
    let (active, damaged, recovery_point) =
        recover_active(io, directory, &active, config, &mut report)?;
    let damaged = damaged.or(lost_segments.map(|corruption| (active.next_offset, corruption)));
    segments.push(active);
    // Always, not only when this open changed the directory: a process killed (or failed)
    // between creating a file and fsyncing the directory leaves an entry that looks present
    // but that a power loss can still take, and appends are about to land in it. Not after a
    // clean close, whose last fsyncs came after every change of the directory.
    if !read_only && !report.opened_clean {
        io::sync_directory(&**io, directory).map_err(|e| IoError::new("fsync", directory, e))?;
    }
    Ok(Recovered { segments, damaged, checkpoint, recovery_point, report })
}

/// Load a sealed segment from its index files, or rebuild them by a scan.
fn recover_sealed<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    sealed: &SealedSegment,
    config: &TopicConfig,
    report: &mut PartitionRecovery,
) -> Result<Segment<I>, OpenError> {
    let SealedSegment { base, next_base, read_only } = *sealed;
    let path = directory.join(layout::file_name(base, LOG_SUFFIX));
    let file = SegmentFile::open(io, path, OpenMode::Read)?;
    let size = file.size()?;
    let offsets =
        segment::read_small_file(&**io, &directory.join(layout::file_name(base, INDEX_SUFFIX)))?;
    let times = segment::read_small_file(
        &**io,
        &directory.join(layout::file_name(base, TIME_INDEX_SUFFIX)),
    )?;
    let offsets = offsets.filter(|_| !canary::active(Canary::RecoveryRebuildsIndexes));
    if let (Some(offsets), Some(times)) = (offsets, times) {
        let interval = config.index_interval_bytes;
        let decoded = SegmentIndex::decode(&offsets, &times, base, size, interval);
        if let Some((index, next_offset)) = decoded.ok().filter(|(_, next)| *next <= next_base) {
            let file = Arc::new(file);
            // Sealed segments never roll again; their age does not matter.
            let created_ms = i64::MIN;
            let segment = Segment {
                base_offset: base,
                file,
                size,
                next_offset,
                created_ms,
                index,
                tail: Vec::new(),
            };
            return Ok(segment);
        }
    }
    let (mut segment, scanned) = load_by_scan(file, base, size, config, i64::MIN)?;
    if let Tail::SyncedDamage(corruption) = tail::classify_sealed(&segment.file.path, &scanned) {
        report.damage.push(corruption);
        // Keep the damaged bytes inside the segment, so a read or lookup that reaches them
        // reports the corruption instead of ending early with an empty fetch.
        segment.size = size;
        segment.next_offset = next_base;
        return Ok(segment);
    }
    if segment.next_offset > next_base {
        let kind = CorruptionKind::OffsetMismatch {
            expected: next_base.get(),
            found: segment.next_offset.get(),
        };
        report.damage.push(Corruption { file: segment.file.path.clone(), position: size, kind });
        return Ok(segment);
    }
    if read_only {
        // Rebuilt in memory only.
        return Ok(segment);
    }
    segment.write_index_files()?;
    report.rebuilt_indexes += 2;
    Ok(segment)
}

/// The active segment to recover and what is known of it.
struct ActiveSegment {
    /// Where the last committed transaction on this partition ended: a transactional batch
    /// at the end of the log reaching past it was never committed.
    transaction_end: Offset,
    base: Offset,
    checkpoint: Option<Checkpoint>,
    now_ms: i64,
    read_only: bool,
    /// Open it for direct writes ([`crate::Options::direct_io`]).
    direct: bool,
    /// The engine found the clean-shutdown mark of the last close.
    clean_shutdown: bool,
}

/// A sealed segment to recover: every segment but the last.
struct SealedSegment {
    base: Offset,
    /// The base offset of the segment after it.
    next_base: Offset,
    read_only: bool,
}

/// A committed compaction swap `<base>.log.swap`: it replaces every segment whose base lies in
/// its offset range. Remove those, rename it into place, and put its base in `bases`.
fn finish_committed_swap<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    base: Offset,
    bases: &mut Vec<Offset>,
) -> Result<(), OpenError> {
    let swap_path = swap::path_with(directory, base, SWAP_SUFFIX);
    let file = SegmentFile::open(io, swap_path.clone(), OpenMode::Read)?;
    let size = file.size()?;
    let mut end = base;
    let scanned = segment::scan(&file, 0, size, |_, batch| {
        end = batch.next_offset();
        true
    })?;
    drop(file);
    if scanned.damage.is_some() || end == base {
        // Fsynced before it was committed, so it is whole unless the disk damaged it.
        let kind = CorruptionKind::Malformed { reason: "a committed compaction swap is damaged" };
        return Err(Corruption { file: swap_path, position: scanned.position, kind }.into());
    }
    let replaced: Vec<Offset> = bases.iter().copied().filter(|&b| b >= base && b < end).collect();
    swap::finish_swap(&**io, directory, base, &replaced)?;
    bases.retain(|b| !replaced.contains(b));
    bases.push(base);
    Ok(())
}

/// Index files whose segment log is gone (a crash kept a removal of the log but not of its
/// indexes): they would describe whatever log a later swap puts under that name.
fn remove_orphan_indexes<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    entries: &[crate::io::DirectoryEntry],
    bases: &[Offset],
    report: &mut PartitionRecovery,
) -> Result<(), IoError> {
    for entry in entries {
        let base = [INDEX_SUFFIX, TIME_INDEX_SUFFIX].iter().find_map(|suffix| {
            let stem = entry.name.strip_suffix(suffix)?;
            layout::parse_log_file_name(&format!("{stem}{LOG_SUFFIX}"))
        });
        if base.is_some_and(|base| bases.binary_search(&base).is_err()) {
            let path = directory.join(&entry.name);
            match io.remove_file(&path) {
                Ok(()) => report.removed_temporary_files += 1,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(IoError::new("remove", &path, error)),
            }
        }
    }
    Ok(())
}

/// Remove the active segment's index files (its recovery point): they are unusable, or about
/// to claim more than the segment will hold.
fn remove_recovery_point<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    active: Offset,
) -> Result<(), IoError> {
    for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
        io::remove_if_present(&**io, &directory.join(layout::file_name(active, suffix)))?;
    }
    Ok(())
}

/// Read the active segment's recovery point, if it has a usable one (why not goes to
/// `report`; a writable open removes unusable files, so the next open does not say it again).
fn read_recovery_point<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    active: &ActiveSegment,
    size: u64,
    config: &TopicConfig,
    report: &mut PartitionRecovery,
) -> Result<Option<RecoveryPoint>, OpenError> {
    let interval = config.index_interval_bytes;
    match tail::read_recovery_point(&**io, directory, active.base, size, interval)? {
        None => Ok(None),
        Some(Ok(point)) => Ok(Some(point)),
        Some(Err(why)) => {
            report.recovery_point_unusable = Some(why);
            if !active.read_only {
                remove_recovery_point(io, directory, active.base)?;
            }
            Ok(None)
        }
    }
}

/// Load the active segment from its recovery point, then scan the bytes past it; cut a torn
/// tail there, or keep and report damage in synced data. Returns the segment, the damage, and
/// the position of the recovery point that still holds (0 for none).
fn recover_active<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    active: &ActiveSegment,
    config: &TopicConfig,
    report: &mut PartitionRecovery,
) -> Result<(Segment<I>, Option<Damaged>, u64), OpenError> {
    let path = directory.join(layout::file_name(active.base, LOG_SUFFIX));
    let mode = if active.read_only { OpenMode::Read } else { OpenMode::ReadWrite };
    let file = SegmentFile::open(io, path, mode)?;
    let mut size = file.size()?;
    if canary::active(Canary::RecoveryCutsPastSynced) && !active.read_only {
        size = last_batch_start(&file, 0, size)?;
        file.run(Operation::Truncate { file: file.handle, length: size })?;
    }
    let point = read_recovery_point(io, directory, active, size, config, report)?;
    let (mut covered, point_end) = point.as_ref().map_or((0, active.base), |p| (p.1, p.2));
    let (mut segment, scanned) = match point {
        Some(point) => load_from_point(file, active.base, size, point, active.now_ms)?,
        None => load_by_scan(file, active.base, size, config, active.now_ms)?,
    };
    report.recovery_point = (covered > 0).then_some(covered);
    report.scanned_bytes = size - covered;
    let checkpoint_path = directory.join(CHECKPOINT_FILE);
    let evidence = tail::with_recovery_point(active.checkpoint, active.base, covered, point_end);
    let verdict =
        tail::classify_active(&segment.file, active.base, &scanned, evidence, &checkpoint_path)?;
    let checkpointed = verdict.checkpointed;
    // The mark says the last close fsynced everything and left the recovery point at the end:
    // believed only where the files agree, and then nothing is rewritten or fsynced.
    let mut clean = active.clean_shutdown
        && !active.read_only
        && covered == size
        && verdict.tail == Tail::Clean
        && verdict.missing_segment.is_none();
    report.mark_contradicted = active.clean_shutdown && !active.read_only && !clean;
    let mut damaged = None;
    match verdict.tail {
        Tail::SyncedDamage(corruption) => {
            // Keep every byte; reads report it.
            report.damage.push(corruption.clone());
            damaged = Some((segment.next_offset, corruption));
            segment.size = size;
        }
        Tail::SyncedBytesMissing(corruption) => {
            report.damage.push(corruption.clone());
            damaged = Some((segment.next_offset, corruption));
        }
        Tail::Torn { why, bytes, records } => {
            // The cut itself is made below, with the rest of the tail's durability.
            report.truncated_bytes += bytes;
            report.truncated_records += records;
            assert_eq!(segment.size, why.position, "the scan stops at the damaged batch");
        }
        // Padding is not a torn tail, and nothing is lost: cut below all the same.
        Tail::BlockPadding { .. } | Tail::Clean => {}
    }
    if let Some(corruption) = verdict.missing_segment {
        report.damage.push(corruption.clone());
        damaged = damaged.or(Some((segment.next_offset, corruption)));
    }
    // Whatever survived is made durable now, so a process that was killed (not a machine that
    // lost power) does not leave acknowledged-looking data that a later crash could still take.
    // An fdatasync alone is not enough: after a failed fsync Linux drops the dirty pages from
    // the write-back queue but keeps them readable, so the bytes past the checkpoint may read
    // fine, be clean in the page cache, and never reach the disk. Writing them again re-dirties
    // them, so the fdatasync below really makes them durable.
    //
    // The length likewise: a truncate is a pending change like a write, and a failed fsync of
    // an earlier open may have dropped the cut of a torn tail from write-back while the page
    // cache shows the file already short. Nothing here would then redo it, the disk would keep
    // the old tail past the new end, and batches appended over part of it would leave the rest,
    // with its synced-offset hints, looking like evidence of synced data after the next crash
    // (found by the simulator: a faulty open's fsync failed after its cut). So the length is
    // set again on every writable open, and an fsync (not an fdatasync) makes it durable.
    let rollback = !canary::active(Canary::RecoveryKeepsUncommittedTransaction);
    if damaged.is_none() && !active.read_only && segment.size > 0 && rollback {
        // After any torn tail is cut: a transaction writes one batch per partition and holds
        // the partition until its commit record is durable, so only the last whole batch can
        // be uncommitted. The checkpoint never covers it. The search for the last batch starts
        // at the last index entry, so it reads at most an index interval and a batch.
        let from = segment.index.offset_entries().last().map_or(0, |&(_, p)| u64::from(p));
        let start = last_batch_start(&segment.file, from.min(segment.size), segment.size)?;
        let bytes = segment.file.read(start, (segment.size - start) as usize)?;
        let batch = format::parse_batch(&bytes).ok();
        if let Some(batch) = batch.filter(format::BatchView::is_transactional)
            && batch.last_offset() >= active.transaction_end
        {
            report.rolled_back_records += u64::from(batch.header().record_count.get());
            if covered > start {
                // The recovery point covers the batch about to go: it would claim bytes the
                // segment no longer holds. Gone durably before the cut.
                remove_recovery_point(io, directory, active.base)?;
                io::sync_directory(&**io, directory)
                    .map_err(|e| IoError::new("fsync", directory, e))?;
                covered = 0;
            }
            clean = false;
            let file = Arc::try_unwrap(segment.file).map_err(|_| ()).expect("recovery's own");
            let (kept, scanned) = load_by_scan(file, active.base, start, config, active.now_ms)?;
            assert!(scanned.damage.is_none(), "the batches before a clean last batch scan clean");
            segment = kept;
        }
    }
    report.opened_clean = clean;
    if !active.read_only && !clean {
        let kept = segment.size;
        rewrite(&segment.file, checkpointed.min(kept), kept)?;
        let file = &segment.file;
        file.run(Operation::Truncate { file: file.handle, length: kept })?;
        file.run(Operation::Fsync { file: file.handle })?;
    }
    if !active.read_only && active.direct {
        // Recovered through ordinary writes, which need no padding: a crash in the middle
        // leaves exactly what the buffered path leaves. Appends from here are direct.
        let path = segment.file.path.clone();
        segment.file = Arc::new(SegmentFile::open(io, path, OpenMode::ReadWriteDirect)?);
        segment.load_tail()?;
    }
    let covered = covered.min(segment.size);
    Ok((segment, damaged, covered))
}

/// Where the last valid batch of `file` starts (`size` if there is none), scanning from
/// `from`, which must be a batch boundary.
fn last_batch_start<I: Io>(file: &SegmentFile<I>, from: u64, size: u64) -> Result<u64, IoError> {
    let mut last = size;
    segment::scan(file, from, size, |position, _| {
        last = position;
        true
    })?;
    Ok(last)
}

/// Write bytes `from..to` of a file again, in bounded chunks, with what it reads back.
fn rewrite<I: Io>(file: &SegmentFile<I>, from: u64, to: u64) -> Result<(), IoError> {
    let mut position = from;
    while position < to {
        let length = (to - position).min(SCAN_CHUNK_BYTES as u64) as usize;
        let bytes = file.read(position, length)?;
        if bytes.is_empty() {
            break;
        }
        let written = bytes.len() as u64;
        file.write(position, bytes)?;
        position += written;
    }
    Ok(())
}

/// Build the active segment's in-memory state from its recovery point, then scan the batches
/// past it. Only the first batch's header is read below it (the segment's age).
fn load_from_point<I: Io>(
    file: SegmentFile<I>,
    base: Offset,
    size: u64,
    point: RecoveryPoint,
    now_ms: i64,
) -> Result<(Segment<I>, Scanned), IoError> {
    let (index, covered, next_offset) = point;
    let mut created_ms = now_ms;
    if covered > 0 {
        let header = file.read(0, format::BATCH_HEADER_BYTES)?;
        if let Ok(header) = format::BatchHeader::read_from_bytes(&header)
            && header.magic.get() == format::BATCH_MAGIC
        {
            created_ms = created_ms.min(header.first_timestamp.get());
        }
    }
    let file = Arc::new(file);
    let mut segment = Segment {
        base_offset: base,
        file: Arc::clone(&file),
        size: covered,
        next_offset,
        created_ms,
        index,
        tail: Vec::new(),
    };
    let scanned = tail::scan_from(&file, covered, next_offset, size, |_, batch| {
        segment.on_batch(batch.info());
    })?;
    drop(file);
    assert_eq!(segment.next_offset, scanned.next_offset, "the scan and the segment agree");
    if scanned.damage.is_none() {
        assert_eq!(segment.size, size, "a clean scan covers the whole file");
    }
    Ok((segment, scanned))
}

/// Build a segment's in-memory state by scanning its batches from the start.
///
/// The segment's age counts from `now_ms`, or from its first record if that is older.
fn load_by_scan<I: Io>(
    file: SegmentFile<I>,
    base: Offset,
    size: u64,
    config: &TopicConfig,
    now_ms: i64,
) -> Result<(Segment<I>, Scanned), IoError> {
    let mut segment = Segment::empty(base, file, config.index_interval_bytes, now_ms);
    let file = Arc::clone(&segment.file);
    let scanned = tail::scan(&file, base, size, |_, batch| {
        if segment.size == 0 {
            segment.created_ms = segment.created_ms.min(batch.info().first_timestamp);
        }
        segment.on_batch(batch.info());
    })?;
    assert_eq!(segment.next_offset, scanned.next_offset, "the scan and the segment agree");
    if scanned.damage.is_none() {
        assert_eq!(segment.size, size, "a clean scan covers the whole file");
    }
    Ok((segment, scanned))
}
