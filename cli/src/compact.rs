//! `chronik compact TOPIC`: compact every partition of a compacted topic now.

use crate::UsageError;
use chronik::{Durability, engine::CompactionReport};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;

#[derive(Args, Debug)]
pub struct CompactArgs {
    pub topic: String,
}

pub fn run(data: &Path, args: &CompactArgs) -> anyhow::Result<()> {
    let chronik = crate::open(data, Durability::Sync)?;
    let description = chronik.describe_topic(&args.topic).map_err(chronik::Error::from)?;
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
    let count = description.partitions.len() as u64;
    let bar = ProgressBar::new(count).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} partitions {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut total = CompactionReport::default();
    for partition in 0..count as u32 {
        bar.set_message(format!("compacting partition {partition}"));
        let report =
            chronik.compact_partition(&args.topic, partition).map_err(chronik::Error::from)?;
        if let Some(r) = report {
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
    let after: u64 = chronik
        .describe_topic(&args.topic)
        .map_err(chronik::Error::from)?
        .partitions
        .iter()
        .map(|p| p.size_bytes)
        .sum();
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
