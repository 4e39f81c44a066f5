//! `chronik compact TOPIC`: compact every partition of a compacted topic now.

use crate::UsageError;
use chronik_engine::CompactionReport;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;

#[derive(Args, Debug)]
pub struct CompactArgs {
    pub topic: String,
}

pub fn run(data: &Path, args: &CompactArgs) -> anyhow::Result<()> {
    // No background maintainer: its pass at the open would compact beside this command, so
    // "before" could be measured after it and the counts would leave out what it did.
    let engine = crate::open_without_maintenance(data)?;
    let description = engine.describe_topic(&args.topic).map_err(chronik::Error::from)?;
    if !description.config.cleanup.compacts() {
        return Err(UsageError(format!(
            "topic {} is not compacted (cleanup={}); set it with `chronik topic config {} \
             cleanup=compact`",
            args.topic,
            description.config.cleanup.name(),
            args.topic
        ))
        .into());
    }
    let before: u64 = description.partitions.iter().map(|p| p.size_bytes).sum();
    let passes_before: u64 = description.partitions.iter().map(|p| p.compaction_passes).sum();
    let count = description.partitions.len() as u64;
    let bar = ProgressBar::new(count).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} partitions {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut total = CompactionReport::default();
    let mut passes = 0u64;
    for partition in 0..count as u32 {
        bar.set_message(format!("compacting partition {partition}"));
        let report =
            engine.compact_partition(&args.topic, partition).map_err(chronik::Error::from)?;
        if let Some(r) = report {
            passes += 1;
            total.segments_in += r.segments_in;
            total.segments_out += r.segments_out;
            total.bytes_in += r.bytes_in;
            total.bytes_out += r.bytes_out;
            total.records_in += r.records_in;
            total.records_kept += r.records_kept;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let described = engine.describe_topic(&args.topic).map_err(chronik::Error::from)?;
    let after: u64 = described.partitions.iter().map(|p| p.size_bytes).sum();
    let passes_after: u64 = described.partitions.iter().map(|p| p.compaction_passes).sum();
    // Only this command compacts in this process, so the sizes differ by its passes alone.
    assert_eq!(passes_after - passes_before, passes, "a compaction pass ran beside the command");
    if passes == 0 {
        println!(
            "compacted {}: {before} bytes -> {after} bytes; nothing was cleanable (no sealed \
             segment, or every record younger than min_compaction_lag_ms; the active segments \
             are never compacted)",
            args.topic
        );
        return Ok(());
    }
    println!(
        "compacted {}: {} bytes -> {} bytes; cleaned {} segments into {}, kept {} of {} records \
         (the active segments are never compacted)",
        args.topic,
        before,
        after,
        total.segments_in,
        total.segments_out,
        total.records_kept,
        total.records_in
    );
    Ok(())
}
