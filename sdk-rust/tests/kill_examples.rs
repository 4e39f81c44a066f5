//! The processor examples killed with SIGKILL in a loop at random moments (while producing,
//! restoring, counting or committing), then run to the end: every count exact and exactly one
//! output record per input record, never a double count or a lost one. The delays come from
//! a seed (`CHRONIK_KILL_SEED` to replay; the default is fixed).

mod common;

use chronik_simdisk::rng::splitmix64;
use common::example;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KILLS: u32 = 8;

/// Input records: the examples are built with the tests' profile, ten times slower in debug.
fn records() -> String {
    if cfg!(debug_assertions) { "200000" } else { "2000000" }.to_owned()
}

fn kill_loop(name: &str) {
    kill_loop_with(name, &[]);
}

/// As [`kill_loop`], with environment variables set for every run.
fn kill_loop_with(name: &str, envs: &[(&str, &str)]) {
    let binary = example(name);
    let command = || {
        let mut command = Command::new(&binary);
        command.envs(envs.iter().copied());
        command
    };
    // How long a whole run takes here: kills land within it.
    let scratch = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let timing = command().arg(scratch.path()).arg(records()).output().unwrap();
    assert!(timing.status.success(), "{}", String::from_utf8_lossy(&timing.stderr));
    let whole = started.elapsed().as_millis() as u64;
    let dir = tempfile::tempdir().unwrap();
    let mut seed: u64 =
        std::env::var("CHRONIK_KILL_SEED").map_or(20_261_203, |s| s.parse().unwrap());
    eprintln!("{name}: kill seed {seed}");
    let mut finished_early = 0;
    for kill in 0..KILLS {
        // Short enough that most runs die before the work is done: kills land in producing,
        // restoring, processing and committing alike.
        let delay = Duration::from_millis(whole / 50 + splitmix64(&mut seed) % (whole / 6).max(1));
        let mut child = command()
            .arg(dir.path())
            .arg(records())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while started.elapsed() < delay {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{name} failed on its own in run {kill}: {status}");
            finished_early += 1;
        } else {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
    assert!(finished_early <= KILLS / 2, "most runs must be killed: {finished_early} finished");
    let output = command().arg(dir.path()).arg(records()).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("exact:"),
        "{name} after {KILLS} kills ({finished_early} runs finished before their kill):\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_click_counter_killed_in_a_loop_never_double_counts_or_loses_a_count() {
    kill_loop("clicks_count");
}

/// The counts in a disk store with a small cache and a user per ten clicks: the store writes
/// runs and merges them while it is killed, and every restart opens it and reads only the
/// changelog after its offset; the final check reads the store itself.
#[test]
fn the_click_counter_on_a_disk_store_killed_in_a_loop_restarts_to_exact_counts() {
    let users = if cfg!(debug_assertions) { "20000" } else { "200000" };
    kill_loop_with("clicks_count", &[("CLICKS_STORE", "disk:2"), ("CLICKS_USERS", users)]);
}

#[test]
fn the_join_killed_in_a_loop_enriches_every_click_once_with_the_right_version() {
    kill_loop("clicks_join");
}

/// The three topologies (tumbling windows with final results and late clicks, sessions, a
/// stream-table join), each killed in a loop: every result once, equal to what the example
/// works out from the clicks.
#[test]
fn the_windowed_topologies_killed_in_a_loop_emit_every_result_exactly_once() {
    for topology in ["per-minute", "sessions", "enriched"] {
        kill_loop_with("clicks_windows", &[("CLICKS_TOPOLOGY", topology)]);
    }
}
