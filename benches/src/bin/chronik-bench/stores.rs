//! State stores: a counting processor over many distinct keys with a memory store and with a
//! disk store, each in a process of its own (`chronik-store-work`) so that its peak RSS is its
//! own; then each killed with SIGKILL mid-run and restarted: the disk store opens and reads the
//! changelog after its offset, the memory store restores from its whole changelog. Then the
//! same over a twentieth of the keys (each updated 20 times); fjall doing the same gets and
//! puts (`chronik-fjall-work`, built by a full `scripts/bench`); and the peak RSS of an
//! application of 32 partitions x 3 disk stores in the default memory budget, beside the same
//! with 3 small budgets (what the rest of the process takes).

use super::{Measure, Ratio, divide, find};
use anyhow::{Context as _, bail};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const SYSTEM: &str = "chronik";
const FJALL: &str = "fjall 3.1.8 (gets and puts only)";
/// Updates per key in the updates scenario.
const UPDATES: u64 = 20;
/// The RSS scenario's application: partitions, disk stores, and the small budgets (MiB per
/// store) it is compared with.
const RSS_PARTITIONS: u32 = 32;
const RSS_STORES: usize = 3;
const RSS_SMALL_MIB: u64 = 16;
const DEFAULT_BUDGET_MIB: u64 = 256;
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

pub fn updates_scenario(kind: &str, keys: u64) -> String {
    format!("count over {}M keys x {UPDATES} updates, {kind} store", keys as f64 / 1e6)
}

pub fn rss_scenario(budget: &str) -> String {
    format!("{RSS_PARTITIONS} partitions x {RSS_STORES} disk stores, {budget}")
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
    /// The most the disk stores' shared budget accounted for.
    budget_peak_mib: f64,
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
        budget_peak_mib: number("budget_peak_kib") / 1024.0,
    }))
}

/// `chronik-fjall-work count` over `records` records cycling over `keys` keys: its records
/// per second and peak RSS (MiB), or why there is none.
fn fjall(dir: &str, records: u64, keys: u64) -> anyhow::Result<Result<(f64, f64), String>> {
    let binary = std::env::current_exe()?.with_file_name("chronik-fjall-work");
    if !binary.exists() {
        return Ok(Err("chronik-fjall-work is built by a full scripts/bench".into()));
    }
    let db = format!("{dir}/fjall");
    let mut child = Command::new(&binary)
        .args(["count", &db, "--records", &records.to_string(), "--keys", &keys.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    // fjall 3.1 can deadlock under write load: every worker blocks sending to the bounded
    // queue it reads from (fjall-rs/fjall#323). Ten times its usual time, then it is killed
    // and reported, never waited for.
    let limit = Duration::from_secs(60 + records / 40_000);
    let started = std::time::Instant::now();
    while child.try_wait()?.is_none() {
        if started.elapsed() > limit {
            child.kill()?;
            child.wait()?;
            let _ = std::fs::remove_dir_all(&db);
            return Ok(Err(format!(
                "fjall 3.1.8 hung (its workers all blocked on their own full queue, \
                 fjall-rs/fjall#323): killed after {} s",
                limit.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let output = child.wait_with_output()?;
    let _ = std::fs::remove_dir_all(&db);
    if !output.status.success() {
        bail!("chronik-fjall-work: {}", String::from_utf8_lossy(&output.stderr));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().last().context("chronik-fjall-work printed nothing")?;
    let json: serde_json::Value = serde_json::from_str(line)?;
    let number = |field: &str| json[field].as_f64().unwrap_or(0.0);
    if json["entries"].as_u64() != Some(keys.min(records)) {
        bail!("fjall: {} keys stored, of {}", json["entries"], keys.min(records));
    }
    Ok(Ok((records as f64 / number("process_seconds"), number("peak_rss_kib") / 1024.0)))
}

fn fjall_measure(dir: &str, scenario: &str, records: u64, keys: u64) -> anyhow::Result<Measure> {
    Ok(match fjall(dir, records, keys)? {
        Ok((rate, rss)) => {
            let elapsed = Duration::from_secs_f64(records as f64 / rate);
            let mut measure = Measure::new(scenario, FJALL, records, records * 100, elapsed);
            measure.note = Some(format!(
                "peak RSS {rss:.0} MiB; same cache and memtable sizes, no input log read, no \
                 changelog written"
            ));
            measure
        }
        Err(why) => Measure::skipped(scenario, FJALL, why),
    })
}

fn count(dir: &str, kind: &str, extra: &[&str]) -> anyhow::Result<Option<Counted>> {
    let mut args = vec!["count", dir, "--application", kind, "--store", kind];
    args.extend_from_slice(extra);
    work(&args)
}

/// The state-store scenarios over `keys` distinct keys.
pub fn stores(base: &Path, keys: u64) -> anyhow::Result<Vec<Measure>> {
    let base = base.to_str().context("a UTF-8 bench directory")?;
    let dir = &format!("{base}/distinct");
    work(&["produce", dir, "--records", &keys.to_string()])?;
    super::settle();
    let mut out = vec![fjall_measure(base, &count_scenario("disk", keys), keys, keys)?];
    super::settle();
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
    std::fs::remove_dir_all(dir)?;
    out.extend(updates(base, keys)?);
    out.extend(rss(base, keys)?);
    Ok(out)
}

/// `records` records over a twentieth as many keys: memory store, disk store, fjall.
fn updates(base: &str, records: u64) -> anyhow::Result<Vec<Measure>> {
    let (dir, keys) = (&format!("{base}/updates"), (records / UPDATES).max(1));
    work(&["produce", dir, "--records", &records.to_string(), "--keys", &keys.to_string()])?;
    super::settle();
    let mut out = vec![fjall_measure(base, &updates_scenario("disk", keys), records, keys)?];
    super::settle();
    for kind in ["memory", "disk"] {
        let counted = count(dir, kind, &[])?.context("the count was killed")?;
        if counted.records != records || counted.entries != keys {
            bail!(
                "{kind} updates: {} records, {} keys, of {keys}",
                counted.records,
                counted.entries
            );
        }
        let elapsed = Duration::from_secs_f64(counted.process_seconds);
        let scenario = updates_scenario(kind, keys);
        let mut measure = Measure::new(&scenario, SYSTEM, records, records * 100, elapsed);
        measure.note = Some(format!(
            "peak RSS {:.0} MiB; commit max {:.1} ms; {} merges, {} stalls",
            counted.peak_rss_mib,
            counted.commit_max as f64 / 1000.0,
            counted.merges,
            counted.stalls
        ));
        out.push(measure);
        super::settle();
    }
    std::fs::remove_dir_all(dir)?;
    Ok(out)
}

/// Peak RSS of 32 partitions x 3 disk stores in the default budget and in 3 small ones, over
/// 3/10 as many records as `keys`, each key twice (so the second reads fill the cache).
fn rss(base: &str, keys: u64) -> anyhow::Result<Vec<Measure>> {
    let dir = &format!("{base}/rss");
    let records = (keys * 3 / 10).max(1000);
    let (partitions, stores) = (RSS_PARTITIONS.to_string(), RSS_STORES.to_string());
    let distinct = (records / 2).to_string();
    work(&[
        "produce",
        dir,
        "--records",
        &records.to_string(),
        "--keys",
        &distinct,
        "--partitions",
        &partitions,
    ])?;
    super::settle();
    let small = format!("disk:{RSS_SMALL_MIB}");
    let mut out = Vec::new();
    for (kind, budget) in [
        ("disk", format!("the default {DEFAULT_BUDGET_MIB} MiB budget")),
        (small.as_str(), format!("{RSS_STORES} budgets of {RSS_SMALL_MIB} MiB")),
    ] {
        let application = if kind == "disk" { "rss-default" } else { "rss-small" };
        let args =
            ["count", dir, "--application", application, "--store", kind, "--stores", &stores];
        let counted = work(&args)?.context("the count was killed")?;
        let elapsed = Duration::from_secs_f64(counted.process_seconds);
        let mut measure =
            Measure::new(&rss_scenario(&budget), SYSTEM, records, records * 100, elapsed);
        measure.note = Some(format!(
            "peak RSS {:.0} MiB; the process's budget accounted for {:.0} MiB at most; {} \
             merges, {} stalls",
            counted.peak_rss_mib, counted.budget_peak_mib, counted.merges, counted.stalls
        ));
        out.push(measure);
        super::settle();
    }
    std::fs::remove_dir_all(dir)?;
    Ok(out)
}

/// The peak RSS a `note` starts with.
fn peak_rss(m: &Measure) -> Option<f64> {
    let note = m.note.as_deref()?;
    note.strip_prefix("peak RSS ")?.split(" MiB").next()?.parse::<f64>().ok()
}

/// A count over distinct keys by `system` with a store of `kind`.
fn counted<'m>(measures: &'m [Measure], kind: &str, system: &str) -> Option<&'m Measure> {
    let suffix = format!(", {kind} store");
    measures.iter().find(|m| {
        m.system == system
            && m.skipped.is_none()
            && m.scenario.starts_with("count 100 B records over")
            && m.scenario.ends_with(&suffix)
    })
}

/// The targets: the disk store's throughput beside the memory store's, its peak RSS,
/// and its restart beside a full restore; then beside fjall, over updated keys, and in one
/// memory budget.
pub fn store_ratios(measures: &[Measure]) -> Vec<Ratio> {
    let rate = |kind| counted(measures, kind, SYSTEM).and_then(|m| m.records_per_second);
    let disk = counted(measures, "disk", SYSTEM);
    let restart = |kind, whole: bool| {
        find(measures, &restart_scenario(kind), SYSTEM)
            .and_then(|m| if whole { m.seconds } else { m.restore_seconds })
    };
    let mut ratios = vec![
        Ratio {
            what: "disk store over memory store, counting distinct keys".into(),
            value: divide(rate("disk"), rate("memory")),
            target: Some(0.9),
            unit: "x",
        },
        Ratio {
            what: "disk store commit p99 with 1-2 M keys over p99 with the last 1-2 M (flat: 1)"
                .into(),
            value: disk.and_then(|m| m.commit_p99_flat),
            target: Some(0.5),
            unit: "x",
        },
        Ratio {
            what: "disk store largest commit over the p50 at the last 1-2 M keys".into(),
            value: disk.and_then(|m| m.commit_max_over_p50),
            target: None,
            unit: "x",
        },
        Ratio {
            what: "1 GiB over the disk store's peak RSS".into(),
            value: disk.and_then(peak_rss).map(|mib| 1024.0 / mib),
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
    ];
    ratios.extend(peer_and_budget_ratios(measures));
    ratios
}

/// Updated keys beside the memory store, the disk store beside fjall, and the RSS of one
/// budget for 32 partitions x 3 stores.
fn peer_and_budget_ratios(measures: &[Measure]) -> Vec<Ratio> {
    let exact = |scenario: &str, system: &str| {
        measures
            .iter()
            .find(|m| m.scenario == scenario && m.system == system && m.skipped.is_none())
    };
    let updated = |kind: &str, system: &str| {
        let suffix = format!(" updates, {kind} store");
        measures
            .iter()
            .find(|m| m.system == system && m.skipped.is_none() && m.scenario.ends_with(&suffix))
            .and_then(|m| m.records_per_second)
    };
    let distinct = |system| counted(measures, "disk", system).and_then(|m| m.records_per_second);
    let rss = |budget: String| exact(&rss_scenario(&budget), SYSTEM).and_then(peak_rss);
    let rss_default = rss(format!("the default {DEFAULT_BUDGET_MIB} MiB budget"));
    let rss_small = rss(format!("{RSS_STORES} budgets of {RSS_SMALL_MIB} MiB"));
    // The rest of the process: its peak RSS with small budgets, less those budgets.
    let small_budgets = (RSS_STORES as u64 * RSS_SMALL_MIB) as f64;
    let within = match (rss_default, rss_small) {
        (Some(default), Some(small)) => {
            Some((DEFAULT_BUDGET_MIB as f64 + (small - small_budgets).max(0.0)) / default)
        }
        _ => None,
    };
    vec![
        Ratio {
            what: format!("disk store over memory store, keys updated {UPDATES} times"),
            value: divide(updated("disk", SYSTEM), updated("memory", SYSTEM)),
            target: Some(0.9),
            unit: "x",
        },
        Ratio {
            what: "disk store (whole processor) over fjall (gets and puts), distinct keys".into(),
            value: divide(distinct(SYSTEM), distinct(FJALL)),
            target: None,
            unit: "x",
        },
        Ratio {
            what: format!("the same, keys updated {UPDATES} times"),
            value: divide(updated("disk", SYSTEM), updated("disk", FJALL)),
            target: None,
            unit: "x",
        },
        Ratio {
            what: format!(
                "{RSS_PARTITIONS} partitions x {RSS_STORES} disk stores: default budget plus the \
                 rest of the process (peak RSS with {RSS_STORES} x {RSS_SMALL_MIB} MiB budgets, \
                 less them) over peak RSS"
            ),
            value: within,
            target: Some(1.0),
            unit: "x",
        },
    ]
}
