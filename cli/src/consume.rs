//! `chronik consume`: print records of one or all partitions.

use crate::UsageError;
use anyhow::Context as _;
use chronik::{Offset, RecordView};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const FETCH_BYTES: usize = 1024 * 1024;
const FOLLOW_WAIT: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// The value, one record per line (with --print-key / --print-offset, tab-separated).
    Text,
    /// One JSON object per line with every field.
    Json,
}

#[derive(Args, Debug)]
#[allow(clippy::struct_excessive_bools)] // command-line flags
pub struct ConsumeArgs {
    pub topic: String,
    /// Read only this partition (default: every partition, one after the other).
    #[arg(long)]
    pub partition: Option<u32>,
    /// First offset to read, in every partition read (default: 0, or with --group where the
    /// group committed).
    #[arg(long)]
    pub from: Option<u64>,
    /// Consume as consumer group NAME: start where it committed last, and commit what was
    /// printed (at the end, and after each round with --follow). Needs the data directory to
    /// itself (no running producer).
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// Stop after this many records.
    #[arg(long)]
    pub max: Option<u64>,
    /// Keep waiting for new records instead of stopping at the end; on a terminal, shows the
    /// records read, the rate and the lag on standard error.
    #[arg(long)]
    pub follow: bool,
    /// With --follow, no live rate display.
    #[arg(long)]
    pub no_progress: bool,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Text format: print the key before the value.
    #[arg(long)]
    pub print_key: bool,
    /// Text format: print PARTITION:OFFSET before the value.
    #[arg(long)]
    pub print_offset: bool,
}

pub fn run(data: &Path, args: &ConsumeArgs) -> anyhow::Result<()> {
    if let Some(group) = &args.group {
        // Before anything is printed: a bad name would fail only at the commit, at the end.
        chronik_engine::internals::groups::validate_group(group)
            .map_err(|error| UsageError(error.to_string()))?;
    }
    let chronik = if args.group.is_some() {
        let chronik = open_to_commit(data)?;
        check_committed_offsets(&chronik)?;
        chronik
    } else {
        crate::open_for_reading(data)?
    };
    // A topic kept closed by damage is reported as damage (exit 3), not as missing.
    let count = chronik.engine().topic_partitions(&args.topic).map_err(chronik::Error::from)?;
    let partitions: Vec<u32> = match args.partition {
        Some(p) if p >= count => {
            return Err(
                UsageError(format!("topic {} has {count} partitions, no {p}", args.topic)).into()
            );
        }
        Some(p) => vec![p],
        None => (0..count).collect(),
    };
    let mut consumers: Vec<_> = partitions
        .iter()
        .map(|&p| {
            let mut consumer = match &args.group {
                Some(group) => chronik.group_consumer(group, &args.topic, p),
                None => chronik.consumer(&args.topic, p),
            };
            if let Some(from) = args.from {
                consumer.seek(Offset::new(from));
            }
            consumer
        })
        .collect();
    // Per partition, the offset after the last record printed: what a group commits.
    let mut printed: Vec<Offset> = consumers.iter().map(chronik::Consumer::position).collect();
    let commit = |printed: &[Offset]| -> anyhow::Result<()> {
        let Some(group) = &args.group else { return Ok(()) };
        let offsets: Vec<(&str, u32, Offset)> =
            partitions.iter().zip(printed).map(|(&p, &o)| (args.topic.as_str(), p, o)).collect();
        chronik.engine().commit_offsets(group, &offsets).map_err(chronik::Error::from)?;
        Ok(())
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut remaining = args.max.unwrap_or(u64::MAX);
    let mut done = vec![false; consumers.len()];
    let progress = Progress::new(args);
    while remaining > 0 && done.iter().any(|d| !d) {
        let mut progressed = false;
        for (i, consumer) in consumers.iter_mut().enumerate() {
            if done[i] || remaining == 0 {
                continue;
            }
            let fetch = consumer.poll(FETCH_BYTES);
            let fetch = match fetch {
                Ok(fetch) => fetch,
                Err(error) => {
                    out.flush()?;
                    return Err(chronik::Error::from(error).into());
                }
            };
            if fetch.is_empty() {
                // Sequential mode: finish a partition before starting the next one.
                done[i] = !args.follow;
                continue;
            }
            progressed = true;
            for record in fetch.records().take(usize::try_from(remaining).unwrap_or(usize::MAX)) {
                print_record(&mut out, partitions[i], &record, args)?;
                printed[i] = record.offset().plus(1);
                remaining -= 1;
                progress.inc();
            }
            if !args.follow {
                break;
            }
        }
        out.flush()?;
        if args.follow && progressed {
            commit(&printed)?;
        }
        progress.show_lag(&chronik, &args.topic, &partitions, &consumers);
        if args.follow && !progressed {
            // Caught up everywhere: wait for the first partition to grow (or a short while),
            // then look at all of them again.
            let (partition, position) = (partitions[0], consumers[0].position());
            chronik
                .engine()
                .wait_for(&args.topic, partition, position, FOLLOW_WAIT)
                .map_err(chronik::Error::from)?;
            chronik.engine().refresh().map_err(chronik::Error::from)?;
        }
    }
    out.flush()?;
    progress.finish();
    commit(&printed)?;
    Ok(())
}

/// Open the data directory to consume in a group, which commits what it printed. That needs
/// the directory to itself: beside a writer only a read-only open is possible, and it cannot
/// commit, so the records would be printed and then the commit refused (and printed again by
/// the next run). Refused before anything is printed instead.
fn open_to_commit(data: &Path) -> anyhow::Result<chronik::Chronik> {
    crate::require_existing(data)?;
    match chronik::Chronik::open(data, crate::default_options()) {
        Err(chronik::Error::Open(chronik::OpenError::Locked { .. })) => Err(anyhow::anyhow!(
            "{} is open in another process: --group commits the group's offsets, which needs \
             the data directory to itself (without --group, consume reads beside the other \
             process)",
            data.display()
        )),
        opened => crate::report(opened, data),
    }
}

/// Damage in the consumer offsets topic hides commits (the open reads what it can and goes
/// on, and keeps the damage), so a group's position is unknown: refuse before printing, rather
/// than print from an older position and fail at the commit.
fn check_committed_offsets(chronik: &chronik::Chronik) -> anyhow::Result<()> {
    match chronik.engine().committed_offsets_damage() {
        None => Ok(()),
        Some(corruption) => Err(anyhow::Error::from(corruption)).context(
            "the consumer groups' committed offsets are damaged, so the group's position is unknown",
        ),
    }
}

/// The live display of `--follow`: records read, their rate, and the lag behind the high
/// watermarks, on standard error (drawn only when it is a terminal).
struct Progress(Option<ProgressBar>);

impl Progress {
    fn new(args: &ConsumeArgs) -> Progress {
        Progress((args.follow && !args.no_progress).then(|| {
            let style =
                ProgressStyle::with_template("{spinner} {pos} records read, {per_sec}, {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner());
            let bar =
                ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(style);
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        }))
    }

    fn inc(&self) {
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
    }

    fn show_lag(
        &self,
        chronik: &chronik::Chronik,
        topic: &str,
        partitions: &[u32],
        consumers: &[chronik::Consumer],
    ) {
        let Some(bar) = &self.0 else { return };
        let lag: u64 = partitions
            .iter()
            .zip(consumers)
            .map(|(&p, c)| {
                let end = chronik.high_watermark(topic, p).map_or(0, Offset::get);
                end.saturating_sub(c.position().get())
            })
            .sum();
        bar.set_message(format!("lag {lag}"));
    }

    fn finish(self) {
        if let Some(bar) = self.0 {
            bar.finish_and_clear();
        }
    }
}

fn print_record(
    out: &mut impl Write,
    partition: u32,
    record: &RecordView<'_>,
    args: &ConsumeArgs,
) -> std::io::Result<()> {
    match args.format {
        Format::Text => {
            if args.print_offset {
                write!(out, "{partition}:{}\t", record.offset())?;
            }
            if args.print_key {
                out.write_all(record.key().unwrap_or_default())?;
                out.write_all(b"\t")?;
            }
            out.write_all(record.value())?;
            out.write_all(b"\n")
        }
        Format::Json => {
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            let headers: serde_json::Map<String, serde_json::Value> =
                record.headers().map(|h| (text(h.key), text(h.value).into())).collect();
            let object = serde_json::json!({
                "partition": partition,
                "offset": record.offset().get(),
                "timestamp": record.timestamp(),
                "key": record.key().map(text),
                "value": text(record.value()),
                "headers": headers,
            });
            writeln!(out, "{object}")
        }
    }
}
