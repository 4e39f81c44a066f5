//! `chronik delete-records TOPIC --before OFFSET [--partition P]`: delete the records below an
//! offset, a whole sealed segment at a time (`Engine::delete_records`).

use crate::UsageError;
use chronik::{Durability, Offset};
use clap::Args;
use std::path::Path;

#[derive(Args, Debug)]
pub struct DeleteRecordsArgs {
    pub topic: String,
    /// Delete the records below this offset (as far as whole segments allow).
    #[arg(long, value_name = "OFFSET")]
    pub before: u64,
    /// Only this partition (every partition when absent).
    #[arg(long, value_name = "P")]
    pub partition: Option<u32>,
}

pub fn run(data: &Path, args: &DeleteRecordsArgs) -> anyhow::Result<()> {
    let chronik = crate::open_existing(data, Durability::Sync)?;
    let description = chronik.describe_topic(&args.topic).map_err(chronik::Error::from)?;
    let count = description.partitions.len() as u32;
    let partitions = match args.partition {
        Some(p) if p >= count => {
            return Err(UsageError(format!(
                "topic {} has {count} partitions; there is no partition {p}",
                args.topic
            ))
            .into());
        }
        Some(p) => p..p + 1,
        None => 0..count,
    };
    for partition in partitions {
        let old = description.partitions[partition as usize].log_start_offset;
        let start = chronik
            .delete_records(&args.topic, partition, Offset::new(args.before))
            .map_err(chronik::Error::from)?;
        println!(
            "{}/{partition}: log start {} -> {}{}",
            args.topic,
            old.get(),
            start.get(),
            if start.get() < args.before {
                " (the segment holding the rest is kept until it is sealed and wholly below)"
            } else {
                ""
            }
        );
    }
    Ok(())
}
