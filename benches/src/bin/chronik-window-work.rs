//! The Rust side of the windowing benchmark (`scripts/bench-windows`): the tumbling-window
//! count per user of `benches/python/window_events.py`, as a topology with no function of
//! its own, over events another process already appended to topic `events` of DIR.
//!
//!     chronik-window-work DIR --application A --output TOPIC
//!
//! Counts per key in one-minute tumbling windows with 5 s of grace, final results only, to
//! TOPIC (which must exist), exactly once with durability `sync`. Prints one JSON line: the
//! records processed and the seconds the run took (restore and commits included).

use chronik::dsl::{Topology, Windows};
use chronik::{Chronik, Durability, Options};
use clap::Parser;
use std::time::Instant;

#[derive(Parser)]
struct Cli {
    dir: String,
    #[arg(long)]
    application: String,
    #[arg(long)]
    output: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let chronik =
        Chronik::open(&cli.dir, Options { durability: Durability::Sync, ..Options::default() })?;
    let topology = Topology::new(&cli.application);
    topology
        .stream("events")
        .group_by_key()
        .window(Windows::tumbling(60_000).grace(5_000))
        .emit_final()
        .count()
        .to(&cli.output);
    let started = Instant::now();
    let stats = topology.runner(chronik.engine())?.run_until_caught_up()?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({ "records": stats.records, "seconds": seconds, "results": stats.emitted })
    );
    Ok(())
}
