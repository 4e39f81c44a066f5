//! `chronik-sim`: run the deterministic simulator from the command line.
//!
//! ```text
//! chronik-sim run --seed 42 [--ops 200] [--trace] [--without power-cuts,...] [--skip 3-7,9]
//! chronik-sim shrink --seed 42 [--ops 200] [--max-runs 2000]
//! chronik-sim swarm --seeds 1000 [--start 0] [--jobs 2]
//! chronik-sim swarm --duration 60 [--jobs 2]
//! chronik-sim check-determinism --seed 0 [--count 100]
//! chronik-sim canaries [--max-seeds 2000]
//! chronik-sim reactor --seeds 2000 [--start 0]
//! ```
//!
//! `run` and `shrink` also take `--canary NAME` to switch on one mutation canary (a deliberate
//! engine bug), which is how to see a failure, its replay and its shrinking without a real bug.
//! Every command exits with status 1 when it finds a violation or a difference, printing the
//! exact command that replays the failing seed, and 2 on a usage error.

use anyhow::{Context as _, bail};
use chronik_engine::canary::Canary;
use chronik_sim::canaries::{self, MAX_SEEDS_DEFAULT};
use chronik_sim::run::{
    Counters, Feature, OPS_DEFAULT, OPS_MAX, RunOptions, RunOutcome, parse_ranges, run,
};
use chronik_sim::shrink::{self, RUNS_MAX_DEFAULT};
use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Most worker threads `swarm` starts.
const JOBS_MAX: usize = 256;

#[derive(Debug, Parser)]
#[command(name = "chronik-sim", about = "Deterministic simulator for the Chronik engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one seed and print its summary line.
    Run {
        #[arg(long)]
        seed: u64,
        /// Workload steps over the whole run.
        #[arg(long, default_value_t = OPS_DEFAULT)]
        ops: u64,
        /// Print every trace event to stderr as it happens.
        #[arg(long)]
        trace: bool,
        #[command(flatten)]
        reduction: Reduction,
    },
    /// Reduce a failing seed to fewer steps and fewer kinds of faults that still fail the same
    /// oracle, and print the command that replays the reduced case.
    Shrink {
        #[arg(long)]
        seed: u64,
        #[arg(long, default_value_t = OPS_DEFAULT)]
        ops: u64,
        /// Runs the search may spend.
        #[arg(long, default_value_t = RUNS_MAX_DEFAULT)]
        max_runs: u64,
        #[command(flatten)]
        reduction: Reduction,
    },
    /// Run many seeds on worker threads and summarise.
    Swarm {
        /// Number of seeds to run.
        #[arg(long, conflicts_with = "duration", required_unless_present = "duration")]
        seeds: Option<u64>,
        /// Keep starting seeds for this many seconds.
        #[arg(long)]
        duration: Option<u64>,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        start: u64,
        /// Worker threads.
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        #[arg(long, default_value_t = OPS_DEFAULT)]
        ops: u64,
    },
    /// Run each seed twice and compare the trace hash and every file's bytes.
    CheckDeterminism {
        #[arg(long)]
        seed: u64,
        #[arg(long, default_value_t = 1)]
        count: u64,
        #[arg(long, default_value_t = OPS_DEFAULT)]
        ops: u64,
    },
    /// Stream-processor workloads (counting, a stream-table join) under crashes, each seed
    /// against a fault-free run: restored stores and outputs must be equal.
    Processors {
        #[arg(long, default_value_t = 1000)]
        seeds: u64,
        #[arg(long, default_value_t = 0)]
        start: u64,
    },
    /// The second design's write path (partition logs driven by the reactor) under seeded
    /// chain orders, I/O errors, power cuts and crashes (`chronik_sim::reactor`); each seed
    /// is run twice and must give the same run.
    Reactor {
        #[arg(long, default_value_t = 2000)]
        seeds: u64,
        #[arg(long, default_value_t = 0)]
        start: u64,
    },
    /// Switch each mutation canary on in turn and count the seeds until one is caught.
    Canaries {
        /// Seeds tried per canary before it counts as not caught.
        #[arg(long, default_value_t = MAX_SEEDS_DEFAULT)]
        max_seeds: u64,
        #[arg(long, default_value_t = OPS_DEFAULT)]
        ops: u64,
        /// Hunt only these canaries (comma-separated names); all of them when absent.
        #[arg(long, value_delimiter = ',', value_parser = parse_canary)]
        only: Vec<Canary>,
    },
    /// Write the fuzz targets' seed corpus (`fuzz/corpus/<target>/seed-<name>`) under DIR.
    FuzzSeeds { dir: std::path::PathBuf },
}

/// What a replay leaves out, and an optional canary.
#[derive(Debug, clap::Args)]
struct Reduction {
    /// Faults and events drawn but not acted on, comma-separated: power-cuts, io-faults,
    /// faulty-opens, bit-flips, double-opens, live-crashes.
    #[arg(long, value_delimiter = ',', value_parser = parse_feature)]
    without: Vec<Feature>,
    /// Workload steps drawn but not run, such as `3-7,9`.
    #[arg(long, value_parser = parse_skip)]
    skip: Option<StepRanges>,
    /// Switch on one mutation canary, by the name `canaries` prints (such as
    /// ack-before-fsync or swap-without-directory-fsync).
    #[arg(long, value_parser = parse_canary)]
    canary: Option<Canary>,
}

impl Reduction {
    fn options(&self, ops: u64, trace: bool) -> RunOptions {
        RunOptions {
            ops,
            echo_trace: trace,
            without: self.without.iter().copied().collect(),
            skip: self.skip.clone().map(|s| s.0).unwrap_or_default(),
            ..RunOptions::default()
        }
    }
}

/// The value of `--skip`: half-open ranges of step numbers.
#[derive(Clone, Debug)]
struct StepRanges(Vec<(u64, u64)>);

fn parse_skip(text: &str) -> Result<StepRanges, String> {
    parse_ranges(text).map(StepRanges)
}

fn parse_feature(name: &str) -> Result<Feature, String> {
    Feature::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Feature::ALL.iter().map(|f| f.name()).collect();
        format!("unknown feature {name:?}; one of {}", names.join(", "))
    })
}

fn parse_canary(name: &str) -> Result<Canary, String> {
    canaries::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = Canary::ALL.iter().map(|&c| canaries::name(c)).collect();
        format!("unknown canary {name:?}; one of {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    match execute(&Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Run a command; `Ok(false)` when it found a violation or a difference.
fn execute(cli: &Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Run { seed, ops, trace, ref reduction } => {
            check_ops(ops)?;
            let options = reduction.options(ops, trace);
            let _armed = canaries::arm(reduction.canary);
            let outcome = run(seed, &options);
            if outcome.violation.is_some() {
                report_violation(&outcome, reduction.canary);
            }
            println!("{}", outcome.summary_line());
            Ok(outcome.violation.is_none())
        }
        Command::Shrink { seed, ops, max_runs, ref reduction } => {
            check_ops(ops)?;
            let options = reduction.options(ops, false);
            let _armed = canaries::arm(reduction.canary);
            Ok(run_shrink(seed, &options, max_runs, reduction.canary))
        }
        Command::Swarm { seeds, duration, start, jobs, ops } => {
            if jobs == 0 || jobs > JOBS_MAX {
                bail!("--jobs must be between 1 and {JOBS_MAX}");
            }
            let limit = match (seeds, duration) {
                (Some(count), _) => {
                    Limit::Seeds(start.checked_add(count).context("seed overflow")?)
                }
                (None, Some(seconds)) => {
                    Limit::Until(Instant::now() + Duration::from_secs(seconds))
                }
                (None, None) => bail!("give --seeds or --duration"),
            };
            Ok(swarm(start, limit, jobs, ops))
        }
        Command::CheckDeterminism { seed, count, ops } => check_determinism(seed, count, ops),
        Command::Canaries { max_seeds, ops, ref only } => Ok(run_canaries(max_seeds, ops, only)),
        Command::Processors { seeds, start } => Ok(run_processors(start, seeds)),
        Command::Reactor { seeds, start } => Ok(run_reactor(start, seeds)),
        Command::FuzzSeeds { ref dir } => {
            for (target, name, bytes) in chronik_sim::fuzz::seeds() {
                let target_dir = dir.join(target);
                std::fs::create_dir_all(&target_dir)
                    .with_context(|| format!("create {}", target_dir.display()))?;
                let path = target_dir.join(format!("seed-{name}"));
                std::fs::write(&path, bytes)
                    .with_context(|| format!("write {}", path.display()))?;
            }
            Ok(true)
        }
    }
}

fn check_ops(ops: u64) -> anyhow::Result<()> {
    if ops == 0 || ops > OPS_MAX {
        bail!("--ops must be between 1 and {OPS_MAX}");
    }
    Ok(())
}

/// The replay command, with the canary that was on.
fn replay(outcome: &RunOutcome, canary: Option<Canary>) -> String {
    match canary {
        None => outcome.replay_command(),
        Some(c) => format!("{} --canary {}", outcome.replay_command(), canaries::name(c)),
    }
}

fn report_violation(outcome: &RunOutcome, canary: Option<Canary>) {
    let Some(violation) = &outcome.violation else { return };
    eprintln!("VIOLATION in seed {}: {violation}", outcome.seed);
    eprintln!("last trace events:");
    for event in &outcome.trace {
        eprintln!("  {event}");
    }
    eprintln!("replay: {}", replay(outcome, canary));
}

fn run_shrink(seed: u64, options: &RunOptions, max_runs: u64, canary: Option<Canary>) -> bool {
    let Some(shrunk) = shrink::shrink(seed, options, max_runs) else {
        println!("seed {seed} passes with {}: nothing to shrink", options.arguments());
        return true;
    };
    let violation = shrunk.outcome.violation.as_ref().expect("a shrunk run fails");
    println!("seed {seed} fails oracle {}", violation.oracle);
    println!(
        "before: {} steps, after: {} steps run of a budget of {}",
        shrunk.original.ops,
        shrunk.steps_run(),
        shrunk.options.ops
    );
    let without: Vec<&str> = shrunk.options.without.iter().map(|f| f.name()).collect();
    println!("left out: {}", if without.is_empty() { "-".to_owned() } else { without.join(", ") });
    println!("runs: {}", shrunk.runs);
    report_violation(&shrunk.outcome, canary);
    println!("reduced: {}", shrunk.outcome.summary_line());
    println!("replay the reduced case: {}", replay(&shrunk.outcome, canary));
    false
}

/// When a swarm stops starting seeds.
#[derive(Clone, Copy, Debug)]
enum Limit {
    /// Before this seed.
    Seeds(u64),
    /// At this instant.
    Until(Instant),
}

/// What the workers of a swarm collect.
#[derive(Debug, Default)]
struct Totals {
    seeds: u64,
    ops: u64,
    sim_time_us: u64,
    speedups: Vec<f64>,
    /// The failing run with the lowest seed.
    first_failure: Option<RunOutcome>,
    failures: u64,
    counters: Counters,
    crashes: u64,
}

fn swarm(start: u64, limit: Limit, jobs: usize, ops: u64) -> bool {
    let next = AtomicU64::new(start);
    let totals = Mutex::new(Totals::default());
    let began = Instant::now();
    let options = RunOptions { ops, ..RunOptions::default() };
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    let more = match limit {
                        Limit::Seeds(end) => seed < end,
                        Limit::Until(deadline) => Instant::now() < deadline,
                    };
                    if !more {
                        return;
                    }
                    let outcome = run(seed, &options);
                    let mut totals = totals.lock().expect("no worker panics holding the lock");
                    totals.seeds += 1;
                    totals.ops += outcome.ops;
                    totals.sim_time_us += outcome.sim_time_us;
                    totals.speedups.push(outcome.speedup());
                    totals.counters.add(&outcome.counters);
                    totals.crashes += outcome.crashes;
                    if let Some(violation) = &outcome.violation {
                        totals.failures += 1;
                        eprintln!("seed {seed}: {violation}");
                        if totals.first_failure.as_ref().is_none_or(|f| f.seed > seed) {
                            totals.first_failure = Some(outcome);
                        }
                    }
                }
            });
        }
    });
    let wall = began.elapsed().as_secs_f64().max(1e-9);
    let mut totals = totals.into_inner().expect("workers finished");
    totals.speedups.sort_by(f64::total_cmp);
    let median = totals.speedups.get(totals.speedups.len() / 2).copied().unwrap_or(0.0);
    println!(
        "seeds={} seeds/s={:.1} ops/s={:.0} median_speedup={median:.0}x sim_time={}s \
         wall={wall:.1}s jobs={jobs} failures={}",
        totals.seeds,
        totals.seeds as f64 / wall,
        totals.ops as f64 / wall,
        totals.sim_time_us / 1_000_000,
        totals.failures
    );
    let c = &totals.counters;
    println!(
        "exercised: crashes={} power_cuts={} acknowledged_batches={} failed_appends={} \
         faulty_opens={} direct_opens={} sharded_opens={} deferred_seeds={} failed_opens={} \
         bit_flips={} \
         rot_reported={} tail_reads={} \
         liveness_checks={} topic_changes={} retention_moves={} deletes={} delete_moves={} commits={} compaction_passes={} \
         compactions_abandoned={} transactions={} failed_transactions={} pipelined_appends={} \
         group_consumer_records={} group_consumer_commits={} compacted_away={} oracle_checks={}",
        totals.crashes,
        c.power_cuts_reached,
        c.acknowledged_batches,
        c.failed_appends,
        c.faulty_opens,
        c.direct_opens,
        c.sharded_opens,
        c.deferred_seeds,
        c.failed_opens,
        c.bit_flips,
        c.rot_reported,
        c.tail_reads,
        c.liveness_checks,
        c.topic_changes,
        c.retention_moves,
        c.deletes,
        c.delete_moves,
        c.commits,
        c.compaction_passes,
        c.compactions_abandoned,
        c.transactions,
        c.failed_transactions,
        c.pipelined_appends,
        c.group_consumer_records,
        c.group_consumer_commits,
        c.compacted_away,
        c.oracle_checks
    );
    match &totals.first_failure {
        None => true,
        Some(outcome) => {
            report_violation(outcome, None);
            println!("first failing seed {}: {}", outcome.seed, outcome.replay_command());
            false
        }
    }
}

fn check_determinism(first: u64, count: u64, ops: u64) -> anyhow::Result<bool> {
    let options = RunOptions { ops, keep_snapshot: true, ..RunOptions::default() };
    let end = first.checked_add(count).context("seed overflow")?;
    let mut differences = 0;
    for seed in first..end {
        let a = run(seed, &options);
        let b = run(seed, &options);
        let mut problems = Vec::new();
        if a.trace_hash != b.trace_hash {
            problems.push(format!("trace hash {:016x} != {:016x}", a.trace_hash, b.trace_hash));
        }
        if a.violation != b.violation {
            problems.push(format!("violations {:?} != {:?}", a.violation, b.violation));
        }
        let (files_a, files_b) = (a.snapshot.unwrap_or_default(), b.snapshot.unwrap_or_default());
        for path in files_a.keys().chain(files_b.keys()) {
            if files_a.get(path) != files_b.get(path) {
                problems.push(format!("file {} differs", path.display()));
            }
        }
        if problems.is_empty() {
            continue;
        }
        differences += 1;
        problems.dedup();
        eprintln!("seed {seed} is not deterministic: {}", problems.join("; "));
        eprintln!("replay: chronik-sim check-determinism --seed {seed} --ops {ops}");
    }
    println!("check-determinism: seeds {first}..{end}, {differences} not deterministic");
    Ok(differences == 0)
}

/// Hunt every canary (single-threaded: the active canary is process-global) and print a table.
fn run_processors(start: u64, seeds: u64) -> bool {
    let started = Instant::now();
    let mut crashes = 0;
    let mut workloads: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let (mut compacted, mut compacted_away) = (0, 0);
    for seed in start..start.saturating_add(seeds) {
        let drawn = chronik_sim::processors::draw(seed);
        *workloads.entry(format!("{:?}", drawn.workload).to_lowercase()).or_default() += 1;
        compacted += u64::from(drawn.compacted_input);
        match chronik_sim::processors::run_seed(seed) {
            Ok(report) => {
                crashes += report.crashes;
                compacted_away += report.input_records_compacted;
            }
            Err(violation) => {
                eprintln!("VIOLATION in seed {seed}: {violation}");
                eprintln!("replay: chronik-sim processors --start {seed} --seeds 1");
                return false;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mix: Vec<String> = workloads.iter().map(|(name, n)| format!("{name} {n}")).collect();
    println!(
        "processors: seeds={seeds} from {start} ({}; compacted inputs {compacted}, \
         {compacted_away} input records compacted away) crashes={crashes} seeds/s={:.1} \
         failures=0",
        mix.join(", "),
        seeds as f64 / elapsed.max(1e-9)
    );
    true
}

fn run_reactor(start: u64, seeds: u64) -> bool {
    let started = Instant::now();
    let (mut acknowledged, mut faulted, mut operations, mut hash) = (0, 0, 0, 0u64);
    let mut turns_in_flight = 0;
    for seed in start..start.saturating_add(seeds) {
        let replay = format!("chronik-sim reactor --start {seed} --seeds 1");
        let report = match chronik_sim::reactor::run_seed(seed) {
            Ok(report) => report,
            Err(violation) => {
                eprintln!("VIOLATION in seed {seed}: {violation}");
                eprintln!("replay: {replay}");
                return false;
            }
        };
        if chronik_sim::reactor::run_seed(seed).ok().as_ref() != Some(&report) {
            eprintln!("seed {seed} is not deterministic: a second run differs");
            eprintln!("replay: {replay}");
            return false;
        }
        acknowledged += report.acknowledged;
        operations += report.operations;
        turns_in_flight += report.turns_in_flight;
        faulted += u64::from(report.faults_met);
        hash = hash.rotate_left(5) ^ report.trace_hash;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "reactor: seeds={seeds} acknowledged={acknowledged} operations={operations} \
         turns_in_flight={turns_in_flight} faulted={faulted} seeds/s={:.1} trace_hash={hash:016x} failures=0",
        2.0 * seeds as f64 / elapsed.max(1e-9)
    );
    true
}

fn run_canaries(max_seeds: u64, ops: u64, only: &[Canary]) -> bool {
    let options = RunOptions { ops, ..RunOptions::default() };
    // A canary that panics on purpose is reported as a `no_panic` violation in the table; the
    // default hook would print its backtrace as if the simulator had crashed.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    println!("{:<38} | {:<15} | oracle", "canary", "seeds to catch");
    println!("{:-<38}-|-{:-<15}-|-{:-<24}", "", "", "");
    let mut all_caught = true;
    let chosen: Vec<Canary> =
        if only.is_empty() { canaries::hunted().collect() } else { only.to_vec() };
    for caught in chosen.iter().map(|&canary| canaries::hunt(canary, max_seeds, &options)) {
        let (seeds, oracle) = if let Some((seed, oracle)) = caught.by {
            // The catch counts only if the same seed passes with every canary off again.
            let replay = run(seed, &options);
            if let Some(violation) = replay.violation {
                all_caught = false;
                eprintln!("  seed {seed} fails with no canary on: {violation}");
                (format!("{} (seed {seed})", caught.seeds), "FALSE ALARM")
            } else {
                (format!("{} (seed {seed})", caught.seeds), oracle)
            }
        } else {
            all_caught = false;
            (format!("> {max_seeds}"), "NOT CAUGHT")
        };
        println!("{:<38} | {seeds:<15} | {oracle}", format!("{:?}", caught.canary));
        if !caught.detail.is_empty() {
            eprintln!("  {:?}: {}", caught.canary, caught.detail);
        }
    }
    if only.is_empty() {
        for (canary, test) in canaries::TARGETED {
            println!("{:<38} | {:<15} | targeted test {test}", format!("{canary:?}"), "-");
        }
    }
    std::panic::set_hook(default_hook);
    all_caught
}
