//! State stores: a counting processor over many distinct keys with a memory store and with a
//! disk store, each in a process of its own (`chronik-store-work`) so that its peak RSS is its
//! own; then each killed with SIGKILL mid-run and restarted: the disk store opens and reads the
//! changelog after its offset, the memory store restores from its whole changelog.

use super::{Measure, Ratio, divide, find};
use anyhow::{Context as _, bail};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const SYSTEM: &str = "chronik";
/// Kills land after this share of the extra input.
const EXTRA_SHARE: u64 = 10;

pub fn count_scenario(kind: &str, keys: u64) -> String {
    format!("count 100 B records over {}M distinct keys, {kind} store", keys as f64 / 1e6)
}

pub fn restart_scenario(kind: &str) -> String {
    match kind {
        "disk" => "restart after SIGKILL: disk store + changelog tail".into(),
        _ => "restart after SIGKILL: full restore from the changelog".into(),
    }
}

/// One `chronik-store-work count` result.
struct Counted {
    records: u64,
    entries: u64,
    open_seconds: f64,
    first_record_seconds: f64,
    process_seconds: f64,
    peak_rss_mib: f64,
    restored: u64,
    /// Commit latency (us): p99 with the store at 1-2 M keys and at its last 1-2 M, the
    /// whole run's p50 and max; merges installed and flushes that waited for one.
    commit_early_p99: u64,
    commit_late_p50: u64,
    commit_late_p99: u64,
    commit_max: u64,
    commits: u64,
    merges: u64,
    stalls: u64,
}

fn work(args: &[&str]) -> anyhow::Result<Option<Counted>> {
    let binary = std::env::current_exe()?.with_file_name("chronik-store-work");
    let output = Command::new(&binary)
        .args(args)
        .output()
        .with_context(|| format!("{} (built by scripts/bench)", binary.display()))?;
    let killed = std::os::unix::process::ExitStatusExt::signal(&output.status) == Some(9);
    if killed {
        return Ok(None);
    }
    if !output.status.success() {
        bail!("chronik-store-work {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let Some(line) = text.lines().last().filter(|l| l.starts_with('{')) else {
        return Ok(None);
    };
    let json: serde_json::Value = serde_json::from_str(line)?;
    let number = |field: &str| json[field].as_f64().unwrap_or(0.0);
    let whole = |field: &str| json[field].as_u64().unwrap_or(0);
    Ok(Some(Counted {
        records: whole("records"),
        entries: whole("entries"),
        open_seconds: number("open_seconds"),
        first_record_seconds: number("first_record_seconds"),
        process_seconds: number("process_seconds"),
        peak_rss_mib: number("peak_rss_kib") / 1024.0,
        restored: whole("restored"),
        commit_early_p99: whole("commit_early_p99_us"),
        commit_late_p50: whole("commit_late_p50_us"),
        commit_late_p99: whole("commit_late_p99_us"),
        commit_max: whole("commit_max_us"),
        commits: whole("commits"),
        merges: whole("merges"),
        stalls: whole("stalls"),
    }))
}

fn count(dir: &str, kind: &str, extra: &[&str]) -> anyhow::Result<Option<Counted>> {
    let mut args = vec!["count", dir, "--application", kind, "--store", kind];
    args.extend_from_slice(extra);
    work(&args)
}

/// The state-store scenarios over `keys` distinct keys.
pub fn stores(dir: &Path, keys: u64) -> anyhow::Result<Vec<Measure>> {
    let dir = dir.to_str().context("a UTF-8 bench directory")?;
    work(&["produce", dir, "--records", &keys.to_string()])?;
    super::settle();
    let mut out = Vec::new();
    for kind in ["memory", "disk"] {
        let counted = count(dir, kind, &[])?.context("the count was killed")?;
        if counted.records != keys || counted.entries != keys {
            bail!(
                "{kind}: {} records counted, {} keys stored, of {keys}",
                counted.records,
                counted.entries
            );
        }
        let elapsed = Duration::from_secs_f64(counted.process_seconds);
        let mut measure =
            Measure::new(&count_scenario(kind, keys), SYSTEM, keys, keys * 100, elapsed);
        let ms = |us: u64| us as f64 / 1000.0;
        measure.note = Some(format!(
            "peak RSS {:.0} MiB; {} commits, p99 at 1-2 M keys <= {:.1} ms, at the last 1-2 M \
             p50 <= {:.1} ms, p99 <= {:.1} ms (histogram bounds, within 2x), max {:.1} ms; {} \
             merges, {} stalls",
            counted.peak_rss_mib,
            counted.commits,
            ms(counted.commit_early_p99),
            ms(counted.commit_late_p50),
            ms(counted.commit_late_p99),
            ms(counted.commit_max),
            counted.merges,
            counted.stalls
        ));
        if kind == "disk" {
            let latency = |us: u64| Some(us as f64).filter(|&us| us > 0.0);
            measure.commit_p99_flat =
                divide(latency(counted.commit_early_p99), latency(counted.commit_late_p99));
            measure.commit_max_over_p50 =
                divide(latency(counted.commit_max), latency(counted.commit_late_p50));
        }
        out.push(measure);
        super::settle();
    }
    // More input; each application is killed part way through it, then restarted.
    let extra = (keys / 10).max(1000);
    let (start, extra_text) = (keys.to_string(), extra.to_string());
    work(&["produce", dir, "--records", &extra_text, "--start", &start])?;
    super::settle();
    for kind in ["memory", "disk"] {
        let kill_after = (extra / EXTRA_SHARE * 5).to_string();
        if count(dir, kind, &["--kill-after", &kill_after])?.is_some() {
            bail!("{kind}: the run meant to be killed finished");
        }
        super::settle();
        let restart: &[&str] = if kind == "memory" { &["--full-restore"] } else { &[] };
        let counted = count(dir, kind, restart)?.context("the restart was killed")?;
        if counted.entries != keys + extra {
            bail!("{kind} restart: {} keys stored, {} expected", counted.entries, keys + extra);
        }
        // Measured in time, not records/s.
        let elapsed = Duration::from_secs_f64(counted.first_record_seconds);
        let mut measure = Measure::new(&restart_scenario(kind), SYSTEM, 0, 0, elapsed);
        measure.note = Some(format!(
            "first record {:.3} s after start (engine open {:.3} s, then the restore read {} \
             changelog records); restore alone {:.3} s",
            counted.first_record_seconds,
            counted.open_seconds,
            counted.restored,
            counted.first_record_seconds - counted.open_seconds,
        ));
        measure.seconds = Some(counted.first_record_seconds);
        measure.restore_seconds = Some(counted.first_record_seconds - counted.open_seconds);
        out.push(measure);
    }
    Ok(out)
}

/// The targets: the disk store's throughput beside the memory store's, its peak RSS,
/// and its restart beside a full restore.
pub fn store_ratios(measures: &[Measure]) -> Vec<Ratio> {
    let counted = |kind: &str| {
        let suffix = format!(", {kind} store");
        measures.iter().find(|m| {
            m.system == SYSTEM
                && m.skipped.is_none()
                && m.scenario.starts_with("count 100 B records over")
                && m.scenario.ends_with(&suffix)
        })
    };
    let rate = |kind| counted(kind).and_then(|m| m.records_per_second);
    let rss = counted("disk")
        .and_then(|m| m.note.as_deref())
        .and_then(|n| n.strip_prefix("peak RSS ")?.split(" MiB").next()?.parse::<f64>().ok());
    let restart = |kind, whole: bool| {
        find(measures, &restart_scenario(kind), SYSTEM)
            .and_then(|m| if whole { m.seconds } else { m.restore_seconds })
    };
    vec![
        Ratio {
            what: "disk store over memory store, counting distinct keys".into(),
            value: divide(rate("disk"), rate("memory")),
            target: Some(0.9),
            unit: "x",
        },
        Ratio {
            what: "disk store commit p99 with 1-2 M keys over p99 with the last 1-2 M (flat: 1)"
                .into(),
            value: counted("disk").and_then(|m| m.commit_p99_flat),
            target: Some(0.5),
            unit: "x",
        },
        Ratio {
            what: "disk store largest commit over the p50 at the last 1-2 M keys".into(),
            value: counted("disk").and_then(|m| m.commit_max_over_p50),
            target: None,
            unit: "x",
        },
        Ratio {
            what: "1 GiB over the disk store's peak RSS".into(),
            value: rss.map(|mib| 1024.0 / mib),
            target: Some(1.0),
            unit: "x",
        },
        Ratio {
            what: "restart after SIGKILL, start to first record: full restore over disk store"
                .into(),
            value: divide(restart("memory", true), restart("disk", true)),
            target: Some(20.0),
            unit: "x",
        },
        Ratio {
            what: "the same, the restore alone (engine open excluded)".into(),
            value: divide(restart("memory", false), restart("disk", false)),
            target: None,
            unit: "x",
        },
    ]
}
