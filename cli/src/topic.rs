//! `chronik topic ...`

use chronik::{Durability, TopicConfig};
use clap::Subcommand;
use std::path::Path;

#[derive(Subcommand, Debug)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Roll a segment when it would grow past this many bytes.
        #[arg(long)]
        segment_bytes: Option<u64>,
        /// Roll a segment when its first record is older than this many milliseconds.
        #[arg(long)]
        segment_ms: Option<i64>,
    },
    /// List topics.
    List,
    /// Show a topic's config and its partitions' offsets and sizes.
    Describe { name: String },
    /// Delete a topic and all its data.
    Delete { name: String },
}

pub fn run(data: &Path, command: TopicCommand) -> anyhow::Result<()> {
    let chronik = match command {
        // Inspecting works beside a running producer; changes need the directory to itself.
        TopicCommand::List | TopicCommand::Describe { .. } => crate::open_for_reading(data)?,
        TopicCommand::Create { .. } | TopicCommand::Delete { .. } => {
            crate::open(data, Durability::Sync)?
        }
    };
    match command {
        TopicCommand::Create { name, partitions, segment_bytes, segment_ms } => {
            let defaults = TopicConfig::default();
            let config = TopicConfig {
                partitions,
                segment_bytes: segment_bytes.unwrap_or(defaults.segment_bytes),
                segment_ms: segment_ms.unwrap_or(defaults.segment_ms),
                ..defaults
            };
            chronik.create_topic(&name, config).map_err(chronik::Error::from)?;
            println!("created topic {name} with {partitions} partitions");
        }
        TopicCommand::List => {
            for name in chronik.list_topics() {
                println!("{name}");
            }
        }
        TopicCommand::Describe { name } => {
            let description = chronik.describe_topic(&name).map_err(chronik::Error::from)?;
            let config = description.config;
            println!(
                "topic {} partitions={} segment_bytes={} segment_ms={} index_interval_bytes={}",
                description.name,
                config.partitions,
                config.segment_bytes,
                config.segment_ms,
                config.index_interval_bytes
            );
            println!("partition  start_offset  end_offset  high_watermark  segments  bytes");
            for p in description.partitions {
                println!(
                    "{:>9}  {:>12}  {:>10}  {:>14}  {:>8}  {}",
                    p.partition,
                    p.log_start_offset,
                    p.log_end_offset,
                    p.high_watermark,
                    p.segment_count,
                    p.size_bytes
                );
            }
        }
        TopicCommand::Delete { name } => {
            chronik.delete_topic(&name).map_err(chronik::Error::from)?;
            println!("deleted topic {name}");
        }
    }
    Ok(())
}
