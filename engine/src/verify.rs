//! `verify`: a read-only check of a whole data directory, for operators (`chronik verify`).
//!
//! It reads every file the engine keeps and checks what can be checked without opening the
//! engine (so it never cuts, rebuilds or removes anything, and runs beside a writer): the data
//! directory and topic metadata decode; every batch of every segment decodes with a valid
//! checksum and continues the offsets of the one before it; segments follow each other with
//! no gap or overlap from the log start; sealed segments' index files decode, cover exactly
//! their segment and point only at batch starts holding the offsets they name; sync
//! checkpoints decode and name a segment that exists. (The consumer offsets topic is a topic
//! like any other here. The processors' disk stores under `state/` are the SDK's files, not
//! the engine's: `chronik verify` checks them with `chronik::store::check_directory`.)
//!
//! Findings are of two kinds. **Damage**: bytes that were durable and are now wrong (a checksum
//! mismatch in a sealed segment or inside synced data of the active one, an offset gap, synced
//! bytes missing from the end, an unreadable metadata file). **Notice**: something the next open
//! repairs by itself without losing an acknowledged record (a torn unsynced tail, an index file
//! to rebuild, a leftover temporary file or staging directory). `chronik verify` exits 3 on
//! damage, 0 otherwise.
//!
//! Where a segment's scan stops, and what the bytes there are, is decided by the same code
//! recovery runs at open (`tail.rs`: the sync checkpoint, the synced-offset hints of the
//! valid batches after a damaged one, direct-I/O block padding, a file shorter than the
//! checkpoint, a checkpoint naming a lost later segment). So a tail verify calls a torn unsynced
//! tail is exactly the one the next open cuts (the notice gives the same bytes and records), and
//! damage verify reports there is exactly what the next open keeps and reports as corruption.
//! The zeros a direct write pads the active segment's last block with are not reported at all,
//! as recovery does not report them. One difference remains by design: verify scans every
//! sealed segment, while an open trusts a sealed segment's intact index files and finds damage
//! inside it only when a read reaches it.

use crate::Offset;
use crate::checkpoint::{CHECKPOINT_FILE, Checkpoint};
use crate::error::IoError;
use crate::format::meta::{DATA_DIRECTORY_VERSION, DataDirectoryMeta, MetaFile};
use crate::index::{IndexFileHeader, SegmentIndex};
use crate::io::{Io, OpenMode};
use crate::layout::{self, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::log_start::{self, LOG_START_FILE};
use crate::segment::{self, SegmentFile};
use crate::tail::{self, ActiveVerdict, Tail};
use crate::topic::{TOPIC_META_FILE, TopicConfig};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zerocopy::FromBytes as _;

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Repaired by the next open with nothing acknowledged lost.
    Notice,
    /// Durable data or metadata that is wrong.
    Damage,
}

/// One thing `verify` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub file: PathBuf,
    /// Byte position in `file`, where it applies.
    pub position: Option<u64>,
    pub what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Notice => "notice",
            Severity::Damage => "DAMAGE",
        };
        write!(f, "{severity}: {}", self.file.display())?;
        if let Some(position) = self.position {
            write!(f, " at byte {position}")?;
        }
        write!(f, ": {}", self.what)
    }
}

/// What one partition holds, as verified.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionSummary {
    pub topic: String,
    pub partition: u32,
    pub segments: u32,
    pub batches: u64,
    pub records: u64,
    pub bytes: u64,
    pub log_start: u64,
    /// The offset after the last valid batch.
    pub log_end: u64,
}

/// The result of [`verify`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub partitions: Vec<PartitionSummary>,
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    /// Whether any finding is damage.
    pub fn has_damage(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Damage)
    }

    fn add(&mut self, severity: Severity, file: &Path, position: Option<u64>, what: String) {
        let file = file.to_path_buf();
        self.findings.push(Finding { severity, file, position, what });
    }
}

/// Check the data directory at `root` without changing anything. `Err` only when it cannot
/// be read at all (missing, not a directory, permissions); everything else is a finding.
pub fn verify<I: Io>(io: &Arc<I>, root: &Path) -> Result<VerifyReport, IoError> {
    let mut report = VerifyReport::default();
    let meta_path = root.join(crate::layout::META_FILE);
    match segment::read_small_file(&**io, &meta_path)? {
        None => report.add(
            Severity::Damage,
            &meta_path,
            None,
            "missing: not a Chronik data directory, or its metadata was lost".to_owned(),
        ),
        Some(bytes) => match DataDirectoryMeta::decode(&bytes) {
            Err(kind) => report.add(Severity::Damage, &meta_path, Some(0), kind.to_string()),
            Ok(meta) if meta.version() != DATA_DIRECTORY_VERSION => {
                let what = format!(
                    "format version {}; this build reads version {DATA_DIRECTORY_VERSION}",
                    meta.version()
                );
                report.add(Severity::Damage, &meta_path, Some(0), what);
            }
            Ok(_) => {}
        },
    }
    let topics_dir = root.join(crate::layout::TOPICS_DIRECTORY);
    let mut names: Vec<String> = match io.list(&topics_dir) {
        Ok(entries) => entries.into_iter().map(|e| e.name).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(IoError::new("list", &topics_dir, e)),
    };
    names.sort();
    for name in names {
        let path = topics_dir.join(&name);
        if name.starts_with('.') {
            let what = "a topic create or delete a crash interrupted (removed at the next open)";
            report.add(Severity::Notice, &path, None, what.to_owned());
            continue;
        }
        verify_topic(io, &path, &name, &mut report)?;
    }
    Ok(report)
}

fn verify_topic<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    name: &str,
    report: &mut VerifyReport,
) -> Result<(), IoError> {
    let meta_path = directory.join(TOPIC_META_FILE);
    let config = match segment::read_small_file(&**io, &meta_path)? {
        None => {
            report.add(Severity::Damage, &meta_path, None, "missing".to_owned());
            return Ok(());
        }
        Some(bytes) => match TopicConfig::decode(&bytes) {
            Ok(config) => config,
            Err(kind) => {
                report.add(Severity::Damage, &meta_path, Some(0), kind.to_string());
                return Ok(());
            }
        },
    };
    for partition in 0..config.partitions {
        let path = directory.join(partition.to_string());
        verify_partition(io, &path, name, partition, &config, report)?;
    }
    Ok(())
}

#[allow(clippy::too_many_lines)]
fn verify_partition<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    topic: &str,
    partition: u32,
    config: &TopicConfig,
    report: &mut VerifyReport,
) -> Result<(), IoError> {
    let mut summary =
        PartitionSummary { topic: topic.to_owned(), partition, ..PartitionSummary::default() };
    // Read before listing, as recovery does: a writer beside us may roll in between, and the
    // checkpoint must never name a segment the listing has not seen.
    let checkpoint_path = directory.join(CHECKPOINT_FILE);
    let checkpoint = match segment::read_small_file(&**io, &checkpoint_path)? {
        None => None,
        Some(bytes) => {
            let newest = Checkpoint::newest(&bytes);
            if newest.is_none() && !bytes.is_empty() {
                let what = "no valid slot (a hint only: recovery then treats the active \
                            segment's damage as a torn tail only where later batches agree)";
                report.add(Severity::Notice, &checkpoint_path, Some(0), what.to_owned());
            }
            newest
        }
    };
    let entries = match io.list(directory) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            report.add(Severity::Damage, directory, None, "partition directory missing".into());
            report.partitions.push(summary);
            return Ok(());
        }
        Err(e) => return Err(IoError::new("list", directory, e)),
    };
    let mut bases: Vec<Offset> = Vec::new();
    for entry in &entries {
        if let Some(base) = layout::parse_log_file_name(&entry.name) {
            bases.push(base);
        } else if entry.name.ends_with(layout::TEMPORARY_SUFFIX)
            || entry.name.ends_with(crate::swap::CLEANED_SUFFIX)
            || entry.name.ends_with(crate::swap::SWAP_SUFFIX)
        {
            let what =
                "a file left by an interrupted write or compaction (settled at the next open)";
            report.add(Severity::Notice, &directory.join(&entry.name), None, what.to_owned());
        }
    }
    bases.sort();
    let log_start = match segment::read_small_file(&**io, &directory.join(LOG_START_FILE))? {
        None => Offset::ZERO,
        Some(bytes) => log_start::decode(&bytes).unwrap_or_else(|kind| {
            report.add(
                Severity::Damage,
                &directory.join(LOG_START_FILE),
                Some(0),
                kind.to_string(),
            );
            Offset::ZERO
        }),
    };
    summary.log_start = log_start.get();
    // Segments wholly below the log start are leftovers of a retention a crash interrupted.
    while bases.len() > 1 && bases[1] <= log_start {
        let leftover = directory.join(layout::file_name(bases.remove(0), LOG_SUFFIX));
        let what = "a segment below the log start (removed at the next open)";
        report.add(Severity::Notice, &leftover, None, what.to_owned());
    }
    if bases.is_empty() {
        report.add(Severity::Damage, directory, None, "no segment files".to_owned());
        report.partitions.push(summary);
        return Ok(());
    }
    if bases[0] > log_start {
        let file = directory.join(layout::file_name(bases[0], LOG_SUFFIX));
        let what = format!("the log starts at {log_start} but the first segment at {}", bases[0]);
        report.add(Severity::Damage, &file, Some(0), what);
    }
    let mut expected: Option<Offset> = None;
    // Whether the segment before was damaged: its scan stopped early, so the offsets it held
    // past the damage are unknown and a next segment starting above `expected` is no second
    // finding (one damaged segment, one finding). Starting below it still is: an overlap.
    let mut damaged_before = false;
    for (i, &base) in bases.iter().enumerate() {
        let active = i + 1 == bases.len();
        let path = directory.join(layout::file_name(base, LOG_SUFFIX));
        if let Some(expected) = expected
            && expected != base
            && !(damaged_before && expected < base)
        {
            let what =
                format!("segment starts at offset {base}, the one before ends at {expected}");
            report.add(Severity::Damage, &path, Some(0), what);
        }
        let file = match SegmentFile::open(io, path.clone(), OpenMode::Read) {
            Ok(file) => file,
            Err(e) => {
                report.add(Severity::Damage, &path, None, format!("cannot open: {e}"));
                return Ok(());
            }
        };
        let size = file.size()?;
        let mut index = SegmentIndex::new(base, config.index_interval_bytes);
        let mut starts: Vec<(u64, Offset, Offset)> = Vec::new();
        let scanned = tail::scan(&file, base, size, |position, batch| {
            let info = batch.info();
            let position32 = u32::try_from(position).unwrap_or(u32::MAX);
            index.on_batch(position32, info.base_offset, info.max_timestamp, info.length);
            starts.push((position, batch.base_offset(), batch.next_offset()));
            summary.batches += 1;
            summary.records += u64::from(batch.record_count());
        })?;
        let next = scanned.next_offset;
        summary.segments += 1;
        summary.bytes += size;
        damaged_before = false;
        if active {
            let interval = config.index_interval_bytes;
            let point = tail::read_recovery_point(&**io, directory, base, size, interval)?;
            let (covered, end) = match point {
                Some(Ok((_, covered, end))) => (covered, end),
                None | Some(Err(_)) => (0, base),
            };
            let evidence = tail::with_recovery_point(checkpoint, base, covered, end);
            let verdict = tail::classify_active(&file, base, &scanned, evidence, &checkpoint_path)?;
            report_active(&verdict, checkpoint, report);
        } else if let Tail::SyncedDamage(c) = tail::classify_sealed(&path, &scanned) {
            report.add(Severity::Damage, &c.file, Some(c.position), c.kind.to_string());
            damaged_before = true;
        } else {
            let scanned = Sealed { base, size, next, index: &index, starts: &starts };
            damaged_before = verify_indexes(io, directory, &scanned, config, report)?;
        }
        expected = Some(next);
    }
    summary.log_end = expected.map_or(0, Offset::get);
    report.partitions.push(summary);
    Ok(())
}

/// Report the active segment's verdict, the one the next open acts on.
fn report_active(
    verdict: &ActiveVerdict,
    checkpoint: Option<Checkpoint>,
    report: &mut VerifyReport,
) {
    match &verdict.tail {
        // Nor are the zeros a direct write pads its last block with: the next open cuts them
        // and reports nothing.
        Tail::Clean | Tail::BlockPadding { .. } => {}
        Tail::SyncedDamage(c) => {
            let what = format!("{} (in synced data: the next open keeps and reports it)", c.kind);
            report.add(Severity::Damage, &c.file, Some(c.position), what);
        }
        Tail::SyncedBytesMissing(c) => {
            let what = format!("{}: the file ends below the sync checkpoint's position", c.kind);
            report.add(Severity::Damage, &c.file, Some(c.position), what);
        }
        Tail::Torn { why, bytes, records } => {
            let what = format!(
                "{}: an unsynced tail of {bytes} bytes, {records} records (cut at the next open; \
                 it holds nothing acknowledged under sync durability)",
                why.kind
            );
            report.add(Severity::Notice, &why.file, Some(why.position), what);
        }
    }
    if let Some(c) = &verdict.missing_segment {
        let named = checkpoint.map_or(0, |c| c.segment_base.get());
        let what = format!("names segment {named}, which does not exist: {}", c.kind);
        report.add(Severity::Damage, &c.file, None, what);
    }
}

/// A sealed segment as its scan found it, for the check of its index files.
struct Sealed<'a> {
    base: Offset,
    size: u64,
    /// The offset after its last batch.
    next: Offset,
    /// The indexes the engine would build from its batches.
    index: &'a SegmentIndex,
    /// Each batch's position, base offset and next offset, in order.
    starts: &'a [(u64, Offset, Offset)],
}

/// A sealed segment's index files against its batches. Each finding names the file that is
/// wrong: the offset index (`.index`), the time index (`.timeindex`), or both. Returns whether
/// the index files show the segment itself damaged: cut at a batch boundary (its batches all
/// valid), shorter than when it was sealed.
fn verify_indexes<I: Io>(
    io: &Arc<I>,
    directory: &Path,
    segment: &Sealed<'_>,
    config: &TopicConfig,
    report: &mut VerifyReport,
) -> Result<bool, IoError> {
    let Sealed { base, size, next, index: scanned, starts } = *segment;
    let offsets_path = directory.join(layout::file_name(base, INDEX_SUFFIX));
    let times_path = directory.join(layout::file_name(base, TIME_INDEX_SUFFIX));
    let offsets = segment::read_small_file(&**io, &offsets_path)?;
    let times = segment::read_small_file(&**io, &times_path)?;
    let (offsets, times) = match (offsets, times) {
        (Some(offsets), Some(times)) => (offsets, times),
        (offsets, times) => {
            let (path, what) = match (offsets, times) {
                (None, None) => (&offsets_path, "index files missing"),
                (None, Some(_)) => (&offsets_path, "offset index missing"),
                (Some(_), _) => (&times_path, "time index missing"),
            };
            let what = format!("{what} (rebuilt from the segment at the next open)");
            report.add(Severity::Notice, path, None, what);
            return Ok(false);
        }
    };
    let interval = config.index_interval_bytes;
    if let Some((sealed, indexed_next)) = lost_tail(&offsets, &times, segment, interval) {
        // One finding for the segment, not an index notice and a gap at the next segment.
        let path = directory.join(layout::file_name(base, LOG_SUFFIX));
        let what = format!(
            "truncated: {size} bytes, {sealed} when it was sealed (its intact index files say \
             so); the offsets {next}..{indexed_next} are lost"
        );
        report.add(Severity::Damage, &path, Some(size), what);
        return Ok(true);
    }
    let decoded = SegmentIndex::decode(&offsets, &times, base, size, interval);
    let (index, indexed_next) = match decoded {
        Ok(decoded) => decoded,
        Err(reason) => {
            // Which file is unusable: each is decoded beside the file the engine would write
            // in place of the other (built from the batches, so right by construction).
            let (built_offsets, built_times) = scanned.encode(size, next);
            let alone = |offsets: &[u8], times: &[u8]| {
                SegmentIndex::decode(offsets, times, base, size, interval).err()
            };
            let offsets_reason = alone(&offsets, &built_times);
            let times_reason = alone(&built_offsets, &times);
            let (path, what, reason) = match (offsets_reason, times_reason) {
                (Some(reason), None) => (&offsets_path, "offset index", reason),
                (None, Some(reason)) => (&times_path, "time index", reason),
                (Some(reason), Some(_)) => (&offsets_path, "offset and time indexes", reason),
                (None, None) => (&offsets_path, "index files", reason),
            };
            let what = format!("unusable {what} ({reason}; rebuilt at the next open)");
            report.add(Severity::Notice, path, None, what);
            return Ok(false);
        }
    };
    if indexed_next != next {
        let what =
            format!("the index says the segment ends at {indexed_next}, its batches at {next}");
        report.add(Severity::Notice, &offsets_path, None, what);
    }
    for &(relative, position) in index.offset_entries() {
        let offset = base.get() + u64::from(relative);
        let at = starts.binary_search_by_key(&u64::from(position), |s| s.0);
        let holds = at.is_ok_and(|i| starts[i].1.get() <= offset && offset < starts[i].2.get());
        if !holds {
            let what = format!(
                "entry for offset {offset} points at byte {position}, which is not the start of \
                 the batch holding it (the engine would read from the wrong place)"
            );
            report.add(Severity::Damage, &offsets_path, None, what);
            return Ok(false);
        }
    }
    Ok(false)
}

/// When a sealed segment's index files are intact but cover more bytes than the segment has,
/// and more offsets than its batches hold: the segment lost its tail at a batch boundary
/// (every batch left is valid). Returns the length and next offset the index files give.
/// (Index files that cover more bytes but no more offsets are merely stale: a notice.)
fn lost_tail(
    offsets: &[u8],
    times: &[u8],
    segment: &Sealed<'_>,
    interval: u32,
) -> Option<(u64, Offset)> {
    let (header, _) = IndexFileHeader::read_from_prefix(offsets).ok()?;
    let sealed = header.covered_length.get();
    if sealed <= segment.size {
        return None;
    }
    // Decoded against the length they claim: checksums, kinds and base offsets all hold.
    let (_, indexed_next) =
        SegmentIndex::decode(offsets, times, segment.base, sealed, interval).ok()?;
    (indexed_next > segment.next).then_some((sealed, indexed_next))
}
