//! Operator tools that read the files themselves, never through an open engine (so they change
//! nothing, take no lock, and run beside a writer or on a copy of a damaged directory):
//!
//! - `chronik verify`: every checksum, offsets, indexes against data, metadata
//!   (`chronik_engine::verify`); a report, and exit code 3 when something durable is damaged;
//! - `chronik dump`: the batches of segment files in the style of Kafka's dump-log tool, with
//!   `--records` every record, as text or one JSON object per line.

use crate::UsageError;
use crate::consume::Format;
use anyhow::Context as _;
use chronik_engine::internals::format::BatchView;
use chronik_engine::internals::layout;
use chronik_engine::internals::segment::{self, SegmentFile};
use chronik_engine::io::OpenMode;
use chronik_engine::verify::{Finding, Severity, VerifyReport, verify};
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    /// Segment files (`.log`) to dump; or give --topic (with --data).
    pub files: Vec<PathBuf>,
    /// Dump every segment of this topic's partitions.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this partition of --topic.
    #[arg(long)]
    pub partition: Option<u32>,
    /// Every record of each batch too.
    #[arg(long)]
    pub records: bool,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// Damage found: exit code 3, like every other command that meets corrupted data.
#[derive(Debug)]
pub struct DamageFound(pub usize);

impl std::fmt::Display for DamageFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} damaged structures found", self.0)
    }
}

impl std::error::Error for DamageFound {}

fn io() -> anyhow::Result<Arc<chronik::SystemIo>> {
    let options = crate::default_options();
    Ok(Arc::new(chronik::SystemIo::new(options.io_backend)?))
}

pub fn run_verify(data: &Path, args: &VerifyArgs) -> anyhow::Result<()> {
    if !data.is_dir() {
        return Err(UsageError(format!("{} is not a directory", data.display())).into());
    }
    let io = io()?;
    let mut report = verify(&io, data)?;
    let stores = verify_stores(&io, data, &mut report)?;
    let damage = report.findings.iter().filter(|f| f.severity == Severity::Damage).count();
    let notices = report.findings.len() - damage;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Text => {
            for p in &report.partitions {
                writeln!(
                    out,
                    "{}/{}: offsets {}..{}, {} segments, {} batches, {} records, {} bytes",
                    p.topic,
                    p.partition,
                    p.log_start,
                    p.log_end,
                    p.segments,
                    p.batches,
                    p.records,
                    p.bytes
                )?;
            }
            for (directory, runs) in &stores {
                writeln!(out, "{}: disk store, {runs} runs", directory.display())?;
            }
            for finding in &report.findings {
                writeln!(out, "{finding}")?;
            }
            let verdict = if damage > 0 { "DAMAGED" } else { "ok" };
            writeln!(
                out,
                "verify: {verdict}: {} partitions, {damage} damaged, {notices} notices",
                report.partitions.len()
            )?;
        }
        Format::Json => {
            let partitions: Vec<serde_json::Value> = report
                .partitions
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "topic": p.topic, "partition": p.partition, "log_start": p.log_start,
                        "log_end": p.log_end, "segments": p.segments, "batches": p.batches,
                        "records": p.records, "bytes": p.bytes,
                    })
                })
                .collect();
            let findings: Vec<serde_json::Value> = report
                .findings
                .iter()
                .map(|f| {
                    let severity = if f.severity == Severity::Damage { "damage" } else { "notice" };
                    serde_json::json!({
                        "severity": severity, "file": f.file.display().to_string(),
                        "position": f.position, "what": f.what,
                    })
                })
                .collect();
            let stores: Vec<serde_json::Value> = stores
                .iter()
                .map(|(directory, runs)| {
                    serde_json::json!({ "store": directory.display().to_string(), "runs": runs })
                })
                .collect();
            let object = serde_json::json!({
                "ok": damage == 0, "partitions": partitions, "stores": stores,
                "findings": findings,
            });
            writeln!(out, "{object}")?;
        }
    }
    out.flush()?;
    if damage > 0 {
        return Err(DamageFound(damage).into());
    }
    Ok(())
}

/// Check the processors' disk stores under `state/` (`chronik::store::check_directory`),
/// adding what is wrong to `report`: a damaged manifest or run is damage (bytes that were
/// durable are wrong; the processor's next run finds it too and rebuilds the store from its
/// changelog). Returns each intact store's directory and runs.
fn verify_stores(
    io: &Arc<chronik::SystemIo>,
    data: &Path,
    report: &mut VerifyReport,
) -> anyhow::Result<Vec<(PathBuf, usize)>> {
    let state = data.join(layout::STATE_DIRECTORY);
    let entries = match std::fs::read_dir(&state) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("list {}", state.display()))),
    };
    let mut directories = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("list {}", state.display()))?;
        // A disk store is a directory (`<application>-<store>-<partition>.store`); the files
        // beside them are memory stores' snapshots. Any directory is checked: one without a
        // manifest holds no store state and yields nothing.
        if entry.file_type().with_context(|| format!("list {}", state.display()))?.is_dir() {
            directories.push(entry.path());
        }
    }
    directories.sort();
    let mut stores = Vec::new();
    for directory in directories {
        let check = || {
            let shared: Arc<dyn chronik::Io> = Arc::clone(io) as Arc<dyn chronik::Io>;
            chronik::store::check_directory(shared, directory.clone())
        };
        // A processor running beside verify may replace its manifest and remove the runs the
        // old one named between two reads of this check: damage is believed only when a second
        // check, of the manifest as it is then, finds it too.
        let checked = match check() {
            Err(chronik::store::StoreError::Damaged(_)) => check(),
            checked => checked,
        };
        match checked {
            Ok(Some(runs)) => stores.push((directory, runs)),
            Ok(None) => {}
            Err(chronik::store::StoreError::Damaged(damage)) => {
                let what = format!(
                    "damaged disk store file: {} (the processor's next run rebuilds the store \
                     from its changelog)",
                    damage.detail
                );
                let finding = Finding {
                    severity: Severity::Damage,
                    file: directory.join(&damage.file),
                    position: None,
                    what,
                };
                report.findings.push(finding);
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(stores)
}

pub fn run_dump(data: Option<&Path>, args: &DumpArgs) -> anyhow::Result<()> {
    let mut files = args.files.clone();
    if let Some(topic) = &args.topic {
        let data = data.ok_or_else(|| UsageError("--topic needs --data DIR".to_owned()))?;
        // A name with `/` or `..` would read a directory outside the data directory's topics.
        chronik_engine::internals::topic::validate_name(topic)
            .map_err(|error| UsageError(error.to_string()))?;
        let topic_dir = data.join("topics").join(topic);
        if !topic_dir.is_dir() {
            return Err(UsageError(format!("no topic {topic} in {}", data.display())).into());
        }
        let mut partitions: Vec<u32> = std::fs::read_dir(&topic_dir)?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|p| args.partition.is_none_or(|only| only == *p))
            .collect();
        partitions.sort_unstable();
        if let (Some(only), []) = (args.partition, partitions.as_slice()) {
            return Err(UsageError(format!("topic {topic} has no partition {only}")).into());
        }
        for partition in partitions {
            let dir = topic_dir.join(partition.to_string());
            let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)?
                .filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| layout::parse_log_file_name(n).is_some())
                })
                .collect();
            logs.sort();
            files.extend(logs);
        }
    }
    if files.is_empty() {
        return Err(UsageError("give segment files, or --topic NAME with --data".into()).into());
    }
    let io = io()?;
    // Every file is checked before anything is printed: a wrong file among several is named
    // alone, not after pages of the others.
    for path in &files {
        check_segment_file(&io, path)?;
    }
    let mut out = std::io::stdout().lock();
    let mut damaged = 0;
    for path in files {
        damaged += usize::from(dump_file(&io, &path, args, &mut out)?);
    }
    out.flush()?;
    if damaged > 0 {
        return Err(DamageFound(damaged).into());
    }
    Ok(())
}

/// Refuse a file that is not a segment (a text file, an index, random bytes), as a usage
/// error: its bytes would be shown as "damage at position 0", as if a segment were damaged.
/// A file is taken as a segment when its first bytes are a valid batch (a copy of a segment
/// under any name), or when it is named like one (`<20-digit base offset>.log`): then
/// whatever is wrong at its start is damage, as `verify` reports it.
fn check_segment_file(io: &Arc<chronik::SystemIo>, path: &Path) -> anyhow::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if path.is_dir() {
        return Err(UsageError(format!(
            "{} is a directory, not a segment file (give its .log files, or --topic with --data)",
            path.display()
        ))
        .into());
    }
    if layout::parse_log_file_name(name).is_some() {
        return Ok(());
    }
    let file = SegmentFile::open(io, path.to_path_buf(), OpenMode::Read)?;
    let size = file.size()?;
    // One batch is enough to tell: stop after it.
    let end = segment::scan(&file, 0, size, |_, _| false)?;
    let why = match end.corruption(path) {
        None if size > 0 => return Ok(()),
        None => "it is empty".to_owned(),
        Some(damage) => format!("its first bytes are not a batch: {}", damage.kind),
    };
    let kind = match what_file(name) {
        Some(kind) => format!("{kind}, not a segment file"),
        None => "not a segment file".to_owned(),
    };
    Err(UsageError(format!(
        "{} is {kind}: {why} (a segment is named <20-digit base offset>.log)",
        path.display()
    ))
    .into())
}

/// What a file of a data directory is, by its name, for the files that are not segments.
fn what_file(name: &str) -> Option<&'static str> {
    use chronik_engine::internals::{checkpoint, log_start, topic};
    let kinds: [(&str, &str); 10] = [
        (layout::INDEX_SUFFIX, "an offset index"),
        (layout::TIME_INDEX_SUFFIX, "a time index"),
        (".run", "a run of a processor's disk store"),
        (".snapshot", "a processor's store snapshot"),
        ("MANIFEST", "a disk store's manifest"),
        (layout::META_FILE, "the data directory's metadata"),
        (topic::TOPIC_META_FILE, "a topic's metadata"),
        (checkpoint::CHECKPOINT_FILE, "a partition's sync checkpoint"),
        (log_start::LOG_START_FILE, "a partition's log start"),
        (log_start::CLEANER_OFFSET_FILE, "a partition's compaction position"),
    ];
    kinds.iter().find(|(suffix, _)| name.ends_with(suffix)).map(|&(_, kind)| kind)
}

/// Dump one segment file; whether it ended in damage.
fn dump_file(
    io: &Arc<chronik::SystemIo>,
    path: &Path,
    args: &DumpArgs,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let file = SegmentFile::open(io, path.to_path_buf(), OpenMode::Read)?;
    let size = file.size()?;
    let json = args.format == Format::Json;
    if !json {
        writeln!(out, "Dumping {} ({size} bytes)", path.display())?;
    }
    let mut failed: Option<std::io::Error> = None;
    let end = segment::scan(&file, 0, size, |position, batch| {
        match print_batch(out, path, position, batch, args) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })?;
    drop(file);
    if let Some(e) = failed {
        return Err(e.into());
    }
    let Some(damage) = end.corruption(path) else { return Ok(false) };
    if json {
        let object = serde_json::json!({
            "file": path.display().to_string(), "position": damage.position,
            "damage": damage.kind.to_string(), "bytes_after": size - damage.position,
        });
        writeln!(out, "{object}")?;
    } else {
        writeln!(
            out,
            "damage at position {}: {} ({} bytes from here to the end not shown)",
            damage.position,
            damage.kind,
            size - damage.position
        )?;
    }
    Ok(true)
}

fn print_batch(
    out: &mut impl Write,
    path: &Path,
    position: u64,
    batch: &BatchView<'_>,
    args: &DumpArgs,
) -> std::io::Result<()> {
    let header = batch.header();
    if args.format == Format::Json {
        let mut object = serde_json::json!({
            "file": path.display().to_string(), "position": position,
            "base_offset": batch.base_offset().get(), "last_offset": batch.last_offset().get(),
            "count": batch.record_count(), "size": batch.len(),
            "first_timestamp": header.first_timestamp.get(),
            "max_timestamp": header.max_timestamp.get(),
            "transactional": batch.is_transactional(), "compacted": batch.is_compacted(),
            "synced_offset_hint": batch.synced_offset_hint().get(),
            "checksum": format!("{:#018x}", header.checksum.get()),
        });
        if args.records {
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            let records: Vec<serde_json::Value> = batch
                .records()
                .map(|r| {
                    serde_json::json!({
                        "offset": r.offset().get(), "timestamp": r.timestamp(),
                        "key": r.key().map(text), "value": text(r.value()),
                        "headers": r.headers().count(),
                    })
                })
                .collect();
            object["records"] = records.into();
        }
        return writeln!(out, "{object}");
    }
    writeln!(
        out,
        "baseOffset: {} lastOffset: {} count: {} position: {position} size: {} \
         firstTimestamp: {} maxTimestamp: {} transactional: {} compacted: {} \
         syncedOffsetHint: {} checksum: {:#018x} (valid)",
        batch.base_offset(),
        batch.last_offset(),
        batch.record_count(),
        batch.len(),
        header.first_timestamp.get(),
        header.max_timestamp.get(),
        batch.is_transactional(),
        batch.is_compacted(),
        batch.synced_offset_hint(),
        header.checksum.get(),
    )?;
    if args.records {
        for r in batch.records() {
            writeln!(
                out,
                "| offset: {} timestamp: {} keySize: {} valueSize: {} headers: {} key: {} value: {}",
                r.offset(),
                r.timestamp(),
                r.key().map_or(-1, |k| i64::try_from(k.len()).unwrap_or(i64::MAX)),
                r.value().len(),
                r.headers().count(),
                r.key().map_or_else(|| "null".to_owned(), escape),
                escape(r.value()),
            )?;
        }
    }
    Ok(())
}

/// Printable ASCII as is, anything else as `\xNN`; long values cut at 64 bytes.
fn escape(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    const SHOWN: usize = 64;
    let mut out = String::new();
    for &b in bytes.iter().take(SHOWN) {
        if b.is_ascii_graphic() || b == b' ' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if bytes.len() > SHOWN {
        let _ = write!(out, "... ({} bytes)", bytes.len());
    }
    out
}
