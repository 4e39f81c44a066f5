//! `chronik stats`: per topic and partition, sizes, offsets, the append rate over the last
//! minute and ten minutes (from the records' own timestamps), and the compactor's state.
//! Read beside a running writer too (read-only, no lock).

use crate::consume::Format;
use chronik::{Chronik, Offset};
use clap::Args;
use std::io::Write;
use std::path::Path;

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Only this topic.
    pub topic: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// Records per second over the last `window_ms`: the records whose timestamp falls in it.
fn rate(chronik: &Chronik, topic: &str, partition: u32, end: Offset, window_ms: i64) -> f64 {
    let since = chronik.engine().now_ms().saturating_sub(window_ms);
    let first = match chronik.offset_for_timestamp(topic, partition, since) {
        Ok(Some(offset)) => offset,
        _ => end,
    };
    #[allow(clippy::cast_precision_loss)]
    let per_second = end.get().saturating_sub(first.get()) as f64 * 1000.0 / window_ms as f64;
    per_second
}

pub fn run(data: &Path, args: &StatsArgs) -> anyhow::Result<()> {
    let chronik = crate::open_for_reading(data)?;
    let topics = match &args.topic {
        Some(topic) => vec![topic.clone()],
        None => chronik.list_topics(),
    };
    let mut out = std::io::stdout().lock();
    let mut rows = Vec::new();
    for topic in &topics {
        let description = chronik.describe_topic(topic).map_err(chronik::Error::from)?;
        let compacted = description.config.cleanup.compacts();
        for p in &description.partitions {
            let end = p.high_watermark;
            let records = end.get().saturating_sub(p.log_start_offset.get());
            #[allow(clippy::cast_precision_loss)]
            let dirty_ratio =
                if p.size_bytes == 0 { 0.0 } else { p.dirty_bytes as f64 / p.size_bytes as f64 };
            rows.push(serde_json::json!({
                "topic": topic, "partition": p.partition,
                "log_start": p.log_start_offset.get(), "high_watermark": end.get(),
                "records": records, "segments": p.segment_count, "bytes": p.size_bytes,
                "rate_1m": rate(&chronik, topic, p.partition, end, 60_000),
                "rate_10m": rate(&chronik, topic, p.partition, end, 600_000),
                "compacted": compacted,
                "cleaned_offset": p.cleaned_offset.get(), "dirty_ratio": dirty_ratio,
                "compaction_passes": p.compaction_passes,
                "compaction_failures": p.compaction_failures,
                "compaction_blocked": p.compaction_blocked,
            }));
        }
    }
    match args.format {
        Format::Json => {
            for row in &rows {
                writeln!(out, "{row}")?;
            }
        }
        Format::Text => {
            writeln!(
                out,
                "{:<24} {:>4} {:>12} {:>12} {:>5} {:>12} {:>10} {:>10}  compaction",
                "topic", "part", "offsets from", "to", "segs", "bytes", "rec/s 1m", "rec/s 10m"
            )?;
            for r in &rows {
                let n = |key: &str| r[key].as_u64().unwrap_or(0);
                let compaction = if r["compacted"] == true {
                    format!(
                        "cleaned to {}, dirty {:.0}%, {} passes, {} failures{}",
                        n("cleaned_offset"),
                        r["dirty_ratio"].as_f64().unwrap_or(0.0) * 100.0,
                        n("compaction_passes"),
                        n("compaction_failures"),
                        if r["compaction_blocked"] == true { ", BLOCKED by damage" } else { "" }
                    )
                } else {
                    "-".to_owned()
                };
                writeln!(
                    out,
                    "{:<24} {:>4} {:>12} {:>12} {:>5} {:>12} {:>10.1} {:>10.1}  {compaction}",
                    r["topic"].as_str().unwrap_or_default(),
                    n("partition"),
                    n("log_start"),
                    n("high_watermark"),
                    n("segments"),
                    n("bytes"),
                    r["rate_1m"].as_f64().unwrap_or(0.0),
                    r["rate_10m"].as_f64().unwrap_or(0.0),
                )?;
            }
            let total: u64 = rows.iter().filter_map(|r| r["bytes"].as_u64()).sum();
            writeln!(out, "{} topics, {} partitions, {total} bytes", topics.len(), rows.len())?;
        }
    }
    Ok(())
}
