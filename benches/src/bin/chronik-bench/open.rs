//! Opening a data directory: `Engine::open` timed after a clean close and after SIGKILL. The
//! writer runs in a process of its own (`chronik-open-work`), so the directory is left exactly
//! as a closed or a crashed writer leaves it; the open runs here, on the default backend, with
//! the page cache warm (the writer has just written every byte; `sync` wrote them back).
//!
//! After a clean close the recovery points cover every active segment and the clean-shutdown
//! mark is there: the open should read and fsync nothing, however much the segments hold. After
//! SIGKILL it reads only what is past each partition's recovery point (one every 32 MiB or 5 s
//! of durable bytes): active segments 16 times larger should not cost 16 times the open. Many
//! small partitions show what the open costs per partition.

use super::{Measure, Ratio, Sizes, divide, fresh, settle, system_name};
use anyhow::{Context as _, bail};
use chronik::{Backend, Durability, Options};
use chronik_engine::{Engine, RecoveryReport, runtime::SystemClock};
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The topic `chronik-open-work` fills.
const WORK_TOPIC: &str = "open";
/// Partitions of the scenarios over large active segments.
const PARTITIONS: u32 = 4;
/// What each partition of the many-partitions scenario holds.
const SMALL_PARTITION_BYTES: u64 = 64 << 10;

/// How the writer left the directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    Clean,
    Kill,
}

impl Shutdown {
    fn name(self) -> &'static str {
        match self {
            Shutdown::Clean => "clean close",
            Shutdown::Kill => "SIGKILL",
        }
    }
}

/// The scenario's name; `bytes` is named for the scenarios over large active segments.
pub fn scenario(shutdown: Shutdown, partitions: u32, bytes: Option<u64>) -> String {
    let size = bytes.map_or_else(String::new, |b| format!(", {}", decimal(b)));
    format!("open after {}, {partitions} partitions{size}", shutdown.name())
}

/// Bytes in decimal units, as the scenarios are named: `100 MB`, `1.6 GB`.
fn decimal(bytes: u64) -> String {
    if bytes >= 1_000_000_000 {
        format!("{:.1} GB", bytes as f64 / 1e9)
    } else {
        format!("{} MB", bytes / 1_000_000)
    }
}

/// One directory to fill and open: `partitions` holding `bytes` in all.
struct Shape {
    partitions: u32,
    bytes: u64,
    /// Whether the size is part of the name.
    named: bool,
}

/// Every open scenario, each on a fresh directory removed after it.
pub fn open_scenarios(base: &Path, backend: Backend, sizes: Sizes) -> anyhow::Result<Vec<Measure>> {
    let many = sizes.open_partitions;
    let shapes = [
        Shape { partitions: PARTITIONS, bytes: sizes.open_small_bytes, named: true },
        Shape { partitions: PARTITIONS, bytes: sizes.open_large_bytes, named: true },
        Shape { partitions: 64, bytes: 64 * SMALL_PARTITION_BYTES, named: false },
        Shape { partitions: many, bytes: u64::from(many) * SMALL_PARTITION_BYTES, named: false },
    ];
    let mut out = Vec::new();
    for shape in &shapes {
        for shutdown in [Shutdown::Clean, Shutdown::Kill] {
            let name = scenario(shutdown, shape.partitions, shape.named.then_some(shape.bytes));
            let dir = fresh(base, "open")?;
            fill(&dir, shape, shutdown, backend).with_context(|| name.clone())?;
            settle();
            let (elapsed, report) = timed_open(&dir, backend)?;
            out.push(measure(&name, backend, elapsed, &report));
            std::fs::remove_dir_all(&dir)?;
        }
    }
    Ok(out)
}

/// Run `chronik-open-work` on `dir`; check that it closed or died as asked, having had every
/// byte acknowledged.
fn fill(dir: &Path, shape: &Shape, shutdown: Shutdown, backend: Backend) -> anyhow::Result<()> {
    let binary = std::env::current_exe()?.with_file_name("chronik-open-work");
    let mut command = Command::new(&binary);
    command.arg(dir).args(["--partitions", &shape.partitions.to_string()]);
    command.args(["--bytes", &shape.bytes.to_string(), "--backend", backend.name()]);
    if shutdown == Shutdown::Kill {
        command.arg("--kill");
    }
    let output = command
        .output()
        .with_context(|| format!("{} (built by scripts/bench)", binary.display()))?;
    let killed = output.status.signal() == Some(libc::SIGKILL);
    let as_asked = if shutdown == Shutdown::Kill { killed } else { output.status.success() };
    if !as_asked {
        bail!("chronik-open-work: {}: {}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().last().context("chronik-open-work printed nothing")?;
    let json: serde_json::Value = serde_json::from_str(line)?;
    let acknowledged = json["bytes"].as_u64().unwrap_or(0);
    if acknowledged < shape.bytes {
        bail!("chronik-open-work: {acknowledged} bytes acknowledged of {}", shape.bytes);
    }
    Ok(())
}

/// `Engine::open` alone, timed (the I/O set up before, the close after).
fn timed_open(dir: &Path, backend: Backend) -> anyhow::Result<(Duration, RecoveryReport)> {
    let io = chronik::SystemIo::new(backend)?;
    // As `Chronik::open` sets it: partitions recover on one thread per core.
    let open_threads = std::thread::available_parallelism().map_or(1, usize::from);
    let options = Options {
        durability: Durability::Sync,
        io_backend: backend,
        open_threads,
        ..Options::default()
    };
    let start = Instant::now();
    let (engine, report) = Engine::open(io, Arc::new(SystemClock), dir, options)?;
    let elapsed = start.elapsed();
    engine.close()?;
    Ok((elapsed, report))
}

/// The open's time, and the bytes it scanned per second (none after a clean close).
fn measure(name: &str, backend: Backend, elapsed: Duration, report: &RecoveryReport) -> Measure {
    let scanned = report.scanned_bytes();
    let mut measure = Measure::new(name, &system_name(backend), 0, scanned, elapsed);
    measure.seconds = Some(elapsed.as_secs_f64());
    let partitions: Vec<_> = report.partitions.iter().filter(|p| p.topic == WORK_TOPIC).collect();
    let clean = partitions.iter().filter(|p| p.opened_clean).count();
    let mut note = format!(
        "open {:.1} ms (page cache warm), scanned {:.1} MB, {clean} of {} partitions opened \
         clean, clean-shutdown mark {}",
        elapsed.as_secs_f64() * 1e3,
        scanned as f64 / 1e6,
        partitions.len(),
        if report.clean_shutdown { "found" } else { "absent" },
    );
    let truncated = report.truncated_bytes();
    if truncated > 0 {
        let _ = write!(note, ", {truncated} bytes truncated");
    }
    measure.note = Some(note);
    measure
}

/// Open time with the larger active segments beside the smaller: the target is at most twice
/// the time for 16 times the bytes. Ratios here read higher-is-better, so each is the smaller
/// segments' time over the larger's, against 0.5.
pub fn open_ratios(measures: &[Measure], sizes: Sizes) -> Vec<Ratio> {
    let seconds = |shutdown, bytes| {
        let name = scenario(shutdown, PARTITIONS, Some(bytes));
        measures.iter().find(|m| m.scenario == name && m.skipped.is_none()).and_then(|m| m.seconds)
    };
    let (small, large) = (sizes.open_small_bytes, sizes.open_large_bytes);
    [Shutdown::Clean, Shutdown::Kill]
        .into_iter()
        .map(|shutdown| Ratio {
            what: format!(
                "open time after {}: {} over {} active segments ({2} at most 2x)",
                shutdown.name(),
                decimal(small),
                decimal(large)
            ),
            value: divide(seconds(shutdown, small), seconds(shutdown, large)),
            target: Some(0.5),
            unit: "x",
        })
        .collect()
}
