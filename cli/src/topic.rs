//! `chronik topic ...`

use crate::UsageError;
use chronik::{Durability, TopicConfig, TopicError};
use clap::Subcommand;
use std::fmt::Write as _;
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
        /// Any setting as KEY=VALUE, repeatable: segment_bytes, segment_ms,
        /// index_interval_bytes, cleanup (delete, compact, compact+delete), retention_ms,
        /// retention_bytes, delete_retention_ms, min_compaction_lag_ms, max_compaction_lag_ms,
        /// min_cleanable_dirty_ratio; -1 means no limit.
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
    },
    /// Change settings of an existing topic (all but partitions), durably.
    Config {
        name: String,
        /// KEY=VALUE pairs, as for `topic create --config`.
        #[arg(value_name = "KEY=VALUE", required = true)]
        settings: Vec<String>,
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
        // Only a create may make the data directory: the others have nothing to act on.
        TopicCommand::List | TopicCommand::Describe { .. } => crate::open_for_reading(data)?,
        TopicCommand::Create { .. } => crate::open(data, Durability::Sync)?,
        TopicCommand::Config { .. } | TopicCommand::Delete { .. } => {
            crate::open_existing(data, Durability::Sync)?
        }
    };
    match command {
        TopicCommand::Create { name, partitions, segment_bytes, segment_ms, config } => {
            let defaults = TopicConfig::default();
            let mut topic = TopicConfig {
                partitions,
                segment_bytes: segment_bytes.unwrap_or(defaults.segment_bytes),
                segment_ms: segment_ms.unwrap_or(defaults.segment_ms),
                ..defaults
            };
            apply_settings(&mut topic, &config)?;
            chronik.create_topic(&name, topic).map_err(usage_if_invalid)?;
            println!("created topic {name} with {} partitions", topic.partitions);
        }
        TopicCommand::Config { name, settings } => {
            let description = chronik.describe_topic(&name).map_err(chronik::Error::from)?;
            let mut config = description.config;
            apply_settings(&mut config, &settings)?;
            chronik.alter_topic_config(&name, config).map_err(usage_if_invalid)?;
            println!("topic {name}: {}", settings_line(&config));
        }
        TopicCommand::List => {
            for name in chronik.list_topics() {
                println!("{name}");
            }
        }
        TopicCommand::Describe { name } => {
            let description = chronik.describe_topic(&name).map_err(chronik::Error::from)?;
            println!("topic {} {}", description.name, settings_line(&description.config));
            let compacted = description.config.cleanup.compacts();
            let extra = if compacted { "  cleaned_to  dirty_ratio" } else { "" };
            println!("partition  start_offset  end_offset  high_watermark  segments  bytes{extra}");
            for p in description.partitions {
                let mut line = format!(
                    "{:>9}  {:>12}  {:>10}  {:>14}  {:>8}  {}",
                    p.partition,
                    p.log_start_offset,
                    p.log_end_offset,
                    p.high_watermark,
                    p.segment_count,
                    p.size_bytes
                );
                if compacted {
                    let ratio = if p.size_bytes == 0 {
                        0.0
                    } else {
                        p.dirty_bytes as f64 / p.size_bytes as f64
                    };
                    let blocked =
                        if p.compaction_blocked { "  (compaction stopped: damage)" } else { "" };
                    let _ = write!(line, "  {:>10}  {ratio:>11.2}{blocked}", p.cleaned_offset);
                }
                println!("{line}");
            }
        }
        TopicCommand::Delete { name } => {
            chronik.delete_topic(&name).map_err(usage_if_invalid)?;
            println!("deleted topic {name}");
        }
    }
    Ok(())
}

/// Apply `KEY=VALUE` settings in order.
fn apply_settings(config: &mut TopicConfig, settings: &[String]) -> anyhow::Result<()> {
    for setting in settings {
        let Some((key, value)) = setting.split_once('=') else {
            return Err(UsageError(format!("setting {setting:?} is not KEY=VALUE")).into());
        };
        config.set(key.trim(), value).map_err(usage_if_invalid)?;
    }
    Ok(())
}

/// A bad setting or topic name is a usage error (exit code 2); anything else fails as usual.
pub fn usage_if_invalid(error: TopicError) -> anyhow::Error {
    match error {
        TopicError::InvalidConfig { reason } => {
            UsageError(format!("invalid topic config: {reason}")).into()
        }
        invalid @ TopicError::InvalidName { .. } => UsageError(invalid.to_string()).into(),
        other => chronik::Error::from(other).into(),
    }
}

/// Every setting as `key=value`, space-separated.
fn settings_line(config: &TopicConfig) -> String {
    config
        .entries()
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(" ")
}
