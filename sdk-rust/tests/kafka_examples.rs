//! The processor examples on a Kafka-protocol broker (tansu, started here on 127.0.0.1): the
//! same final state as on the embedded engine, for the click count and the click join; and
//! for the count also with two processes in one consumer group, one of them killed mid-run
//! (the survivor takes its partitions over and restores their counts from the changelog);
//! the windows example's topologies (two stages, a repartition topic between them) giving the
//! results worked out in plain Rust; and the count over mutual TLS, configured by environment
//! variables only.
//! Built with `--features kafka`; run by `scripts/kafka-test`, which installs the broker.
#![cfg(feature = "kafka")]

mod common;

use chronik::Log;
use chronik::testing::{TestBroker, TestCertificates};
use common::example;
use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CLICKS: &str = "40000";

fn run(target: &str, step: &str, guarantee: &str) -> Output {
    run_example("clicks_count", &[target, CLICKS, step], guarantee)
}

fn run_example(name: &str, args: &[&str], guarantee: &str) -> Output {
    Command::new(example(name)).args(args).env("CHRONIK_GUARANTEE", guarantee).output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The `final state: ... digest ...` line of a successful verify.
fn final_state(output: &Output) -> String {
    let all = text(output);
    assert!(output.status.success() && all.contains("exact:"), "{all}");
    all.lines().find(|l| l.starts_with("final state:")).expect("a final state line").to_owned()
}

/// Held by the click join and by the count over TLS, so that they never run at once: the
/// join's timestamp merge waits at most 500 ms for an input that has nothing buffered (as
/// Kafka Streams' `max.task.idle.ms`), and the TLS terminator's CPU beside it can starve a
/// fetch past that (seen once in CI: 5,080 of 20,000 clicks joined with a later version).
static NOT_BESIDE_THE_JOIN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn broker() -> TestBroker {
    TestBroker::start().expect("start tansu (scripts/kafka-broker install; CHRONIK_TANSU)")
}

#[test]
fn exactly_once_is_refused_with_a_clear_error_on_a_broker_without_transactions() {
    let broker = broker();
    let output = run(&broker.target(), "all", "exactly-once");
    let all = text(&output);
    assert!(!output.status.success(), "{all}");
    assert!(all.contains("exactly-once processing refused"), "{all}");
    assert!(all.contains("EndTxn"), "names what the broker lacks: {all}");
    assert!(all.contains("AtLeastOnce"), "says what to do instead: {all}");
    assert!(!all.contains("counted"), "nothing was processed: {all}");
}

#[test]
fn the_click_counter_ends_in_the_same_state_embedded_and_on_the_broker() {
    let directory = tempfile::tempdir().unwrap();
    let embedded = final_state(&run(directory.path().to_str().unwrap(), "all", "exactly-once"));
    let broker = broker();
    let on_broker = final_state(&run(&broker.target(), "all", "at-least-once"));
    assert_eq!(embedded, on_broker);
}

#[test]
fn the_windowed_topologies_on_the_broker_give_the_results_worked_out_from_the_clicks() {
    // Final results in windows and sessions (every one and every late click once), and the
    // two stages of `pages` with the repartition topic made on the broker between them.
    let broker = broker();
    let target = broker.target();
    for topology in ["per-minute", "sessions", "pages"] {
        let output = run_example("clicks_windows", &[&target, "100000", topology], "at-least-once");
        let all = text(&output);
        assert!(output.status.success() && all.contains("exact:"), "{topology}: {all}");
        assert!(!all.contains("repeated:"), "no kill, so nothing written twice: {all}");
    }
}

#[test]
fn a_topology_killed_while_repartitioning_ends_with_exact_counts() {
    // `pages` repartitions the clicks by page. Killed while its first stage writes them, it
    // writes again, when started again, what it wrote after its last commit; the second stage
    // drops those by their marks, so every count is exact (as checked against plain Rust), and
    // the repartition topic shows that records were written twice.
    let broker = broker();
    let target = broker.target();
    let log = chronik::connect(&target).unwrap();
    let repartitioned = || -> u64 {
        (0..4).map(|p| log.end_offset(REPARTITION, p).map_or(0, chronik::Offset::get)).sum()
    };
    for kill_at in [20_000, 45_000, 70_000] {
        let mut child = Command::new(example("clicks_windows"))
            .args([target.as_str(), PAGES_CLICKS, "pages"])
            .env("CHRONIK_GUARANTEE", "at-least-once")
            .env("CHRONIK_KAFKA_SESSION_TIMEOUT_MS", SESSION_MS.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + FINISH_WAIT;
        while repartitioned() < kill_at && child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "{REPARTITION} never reached {kill_at}");
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // tansu 0.6 lets a member that joins beside a dead one wait for it for good (Kafka
        // ends that rebalance when the dead member's session expires): start again once the
        // session is over, as the dead member is then dropped when the next one joins.
        std::thread::sleep(Duration::from_millis(SESSION_MS + 1_000));
    }
    let output = run_example("clicks_windows", &[&target, PAGES_CLICKS, "pages"], "at-least-once");
    let all = text(&output);
    assert!(output.status.success() && all.contains("exact:"), "{all}");
    let written = repartitioned();
    assert!(written > 100_000, "the kills made the first stage write some clicks twice: {written}");
}

/// The group session of the processes killed in the test above.
const SESSION_MS: u64 = 6_000;

/// The repartition topic of the `pages` topology, and its clicks.
const REPARTITION: &str = "pages-repartition-0001";
const PAGES_CLICKS: &str = "100000";

#[test]
fn the_click_join_ends_in_the_same_state_embedded_and_on_the_broker() {
    // Two co-partitioned inputs merged by timestamp: every click must meet the version of its
    // user current at the click's time, on the broker as on the engine.
    let _alone = NOT_BESIDE_THE_JOIN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let directory = tempfile::tempdir().unwrap();
    let dir = directory.path().to_str().unwrap();
    let embedded = final_state(&run_example("clicks_join", &[dir, "20000"], "exactly-once"));
    let broker = broker();
    let target = broker.target();
    let on_broker = final_state(&run_example("clicks_join", &[&target, "20000"], "at-least-once"));
    assert_eq!(embedded, on_broker);
}

#[test]
fn the_click_counter_runs_unchanged_over_mutual_tls_given_properties_in_the_environment() {
    // The example's code has no TLS in it: `chronik::connect("kafka://...")` reads the
    // properties from CHRONIK_KAFKA_* variables, here a CA and a client certificate whose key
    // has a passphrase (which nothing may print).
    let _alone = NOT_BESIDE_THE_JOIN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let directory = tempfile::tempdir().unwrap();
    let embedded = final_state(&run(directory.path().to_str().unwrap(), "all", "exactly-once"));
    let tls = directory.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    let certificates = TestCertificates::make(&tls).unwrap();
    let broker = TestBroker::start_tls(&certificates, true).expect("start tansu behind TLS");
    let output = Command::new(example("clicks_count"))
        .args([&broker.target(), CLICKS, "all"])
        .env("CHRONIK_GUARANTEE", "at-least-once")
        .env("CHRONIK_KAFKA_SECURITY_PROTOCOL", "SSL")
        .env("CHRONIK_KAFKA_SSL_CA_LOCATION", &certificates.ca)
        .env("CHRONIK_KAFKA_SSL_CERTIFICATE_LOCATION", &certificates.client_cert)
        .env("CHRONIK_KAFKA_SSL_KEY_LOCATION", &certificates.client_key)
        .env("CHRONIK_KAFKA_SSL_KEY_PASSWORD", TestCertificates::KEY_PASSWORD)
        .output()
        .unwrap();
    assert!(!text(&output).contains(TestCertificates::KEY_PASSWORD), "{}", text(&output));
    assert_eq!(embedded, final_state(&output));
}

/// A `count` process whose standard output lines arrive on a channel as they are printed.
struct Counter {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Counter {
    fn spawn(target: &str) -> Counter {
        let mut child = Command::new(example("clicks_count"))
            .args([target, CLICKS_KILLED, "count"])
            .env("CHRONIK_GUARANTEE", "at-least-once")
            .env("CLICKS_PACE", "20000")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        Counter { child, lines, seen: Vec::new() }
    }

    /// Wait until `count` lines restoring a partition were printed.
    fn wait_for_restores(&mut self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.seen.iter().filter(|l| l.contains("restored store counts")).count() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left);
            self.seen.push(
                line.unwrap_or_else(|e| panic!("no {count} restores ({e}): {:?}", self.seen)),
            );
        }
    }

    /// Lines printed so far, without waiting.
    fn drain(&mut self) -> usize {
        self.seen.extend(self.lines.try_iter());
        self.seen.len()
    }

    /// Wait for the process to end (killing it after `FINISH_WAIT`): its status and all it
    /// printed.
    fn finish(mut self) -> (Option<std::process::ExitStatus>, String) {
        use std::io::Read;
        let deadline = Instant::now() + FINISH_WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() >= deadline {
                self.child.kill().unwrap();
                self.child.wait().unwrap();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        self.seen.extend(self.lines.iter());
        let mut stderr = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        (status, format!("{}\n{stderr}", self.seen.join("\n")))
    }
}

/// How long a counter may take to finish before the test gives up on it.
const FINISH_WAIT: Duration = Duration::from_secs(300);

/// Clicks of the run with a kill: enough that counting outlasts the group's rebalances.
const CLICKS_KILLED: &str = "200000";

/// Restores of a partition that had committed counts (a fresh partition restores 0 records).
fn restored_counts(says: &str) -> usize {
    says.lines()
        .filter(|l| l.contains("restored store counts") && !l.contains(": 0 records"))
        .count()
}

#[test]
fn two_processes_share_the_partitions_and_the_survivor_of_a_kill_takes_the_others_over() {
    let directory = tempfile::tempdir().unwrap();
    let embedded = Command::new(example("clicks_count"))
        .args([directory.path().to_str().unwrap(), CLICKS_KILLED, "all"])
        .output()
        .unwrap();
    let embedded = final_state(&embedded);
    let broker = broker();
    let target = broker.target();
    let produce = Command::new(example("clicks_count"))
        .args([target.as_str(), CLICKS_KILLED, "produce"])
        .output()
        .unwrap();
    assert!(produce.status.success(), "{}", text(&produce));
    // Two processes in one group, the partitions spread over both, both counting (paced, so
    // that the kill lands mid-run); then one is killed.
    let mut victim = Counter::spawn(&target);
    victim.wait_for_restores(4);
    let mut other = Counter::spawn(&target);
    other.wait_for_restores(2);
    victim.wait_for_restores(6);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(victim.child.try_wait().unwrap().is_none(), "the victim ended before its kill");
    let killed_at = other.drain();
    victim.child.kill().unwrap();
    let (_, victim_says) = victim.finish();
    // The survivor alone: once the victim's session expires, the group rebalances, the
    // survivor is given the victim's partitions, restores their counts from the changelog and
    // goes on from their last commit to the end.
    let restores_before_kill = restored_counts(&other.seen[..killed_at].join("\n"));
    let (status, other_says) = other.finish();
    let all = format!("survivor:\n{other_says}\nvictim:\n{victim_says}");
    assert!(status.is_some_and(|s| s.success()), "the survivor did not finish: {all}");
    assert!(
        restored_counts(&other_says) > restores_before_kill,
        "the survivor restored nothing committed after the kill: {all}"
    );
    let verified = Command::new(example("clicks_count"))
        .args([target.as_str(), CLICKS_KILLED, "verify"])
        .env("CHRONIK_GUARANTEE", "at-least-once")
        .output()
        .unwrap();
    assert_eq!(embedded, final_state(&verified), "{all}");
}

/// The counts' changelog of `clicks_count`.
const CHANGELOG: &str = "click-counter-counts-changelog";

/// The counter with its counts in a disk store (`state.dir` from `CHRONIK_KAFKA_STATE_DIR`).
fn disk_counter(target: &str, clicks: &str, step: &str, state: &std::path::Path) -> Command {
    let mut command = Command::new(example("clicks_count"));
    command
        .args([target, clicks, step])
        .env("CHRONIK_GUARANTEE", "at-least-once")
        .env("CHRONIK_KAFKA_STATE_DIR", state)
        .env("CLICKS_STORE", "disk:4")
        .env("CLICKS_USERS", "20000")
        .env("CHRONIK_KAFKA_SESSION_TIMEOUT_MS", SESSION_MS.to_string());
    command
}

/// Per partition: (records restored, the store's offset it started from), from the restore
/// lines `restored store counts partition P: N records from a store or snapshot at O + ...`.
fn restores_from_a_store(says: &str) -> BTreeMap<u32, (u64, Option<u64>)> {
    let mut restores = BTreeMap::new();
    for line in says.lines().filter(|l| l.contains("restored store counts partition")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| words[i].trim_end_matches(':').parse::<u64>().unwrap();
        let from = line.split(" at ").nth(1).map(|o| o.split(' ').next().unwrap().parse().unwrap());
        // The first: a later rebalance may restore a partition again, past the run's own writes.
        restores.entry(number(4) as u32).or_insert((number(5), from));
    }
    restores
}

#[test]
fn a_disk_store_counter_restarted_after_a_kill_reads_only_the_changelog_tail() {
    let state = tempfile::tempdir().unwrap();
    let half = (CLICKS_KILLED.parse::<u64>().unwrap() / 2).to_string();
    let broker = broker();
    let target = broker.target();
    // Half the clicks counted to the end (a clean stop flushes the stores), the other half
    // produced, then a paced count killed mid-run.
    let produce = |clicks| disk_counter(&target, clicks, "produce", state.path()).output().unwrap();
    assert!(produce(&half).status.success());
    let counted = disk_counter(&target, &half, "count", state.path()).output().unwrap();
    assert!(counted.status.success(), "{}", text(&counted));
    assert!(produce(CLICKS_KILLED).status.success());
    let log = chronik::connect(&target).unwrap();
    let written = || -> u64 {
        (0..4).map(|p| log.end_offset(CHANGELOG, p).map_or(0, chronik::Offset::get)).sum()
    };
    let before = written();
    let mut victim = disk_counter(&target, CLICKS_KILLED, "count", state.path())
        .env("CLICKS_PACE", "20000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once it has committed counts (some thousands of changelog records).
    let deadline = Instant::now() + FINISH_WAIT;
    while written() < before + 5_000 {
        assert!(victim.try_wait().unwrap().is_none(), "the count ended before its kill");
        assert!(Instant::now() < deadline, "the count committed nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
    // What each changelog partition holds now, beside the markers: the restart's restore
    // must read exactly the part after its store's offset.
    let changelogs: Vec<Vec<chronik::OwnedRecord>> =
        (0..4).map(|p| log.records("click-counter-counts-changelog", p).unwrap()).collect();
    // The group's session of the killed process runs out first (tansu keeps a member that
    // joins beside a live-looking dead one waiting: docs/kafka.md).
    std::thread::sleep(Duration::from_millis(SESSION_MS + 1_000));
    let restarted = disk_counter(&target, CLICKS_KILLED, "count", state.path()).output().unwrap();
    let says = text(&restarted);
    assert!(restarted.status.success(), "{says}");
    let restores = restores_from_a_store(&says);
    assert_eq!(restores.len(), 4, "a restore per partition: {says}");
    let (mut read, mut whole) = (0, 0);
    for (partition, (restored, from)) in &restores {
        let from = from.unwrap_or_else(|| panic!("partition {partition} rebuilt: {says}"));
        let changes = |r: &&chronik::OwnedRecord| r.headers.is_empty();
        let records = &changelogs[*partition as usize];
        let tail = records.iter().filter(|r| r.offset.get() >= from).filter(changes).count();
        assert_eq!(*restored, tail as u64, "partition {partition}: the tail after {from}");
        read += restored;
        whole += records.iter().filter(changes).count() as u64;
    }
    println!("restart after the kill: {read} of {whole} changelog records read");
    assert!(read > 0, "the killed run left a tail to read: {says}");
    assert!(read * 2 < whole, "{read} of {whole}: not only the tail: {says}");
    // Every count exact (worked out from the clicks), one output per click at least.
    let verified = disk_counter(&target, CLICKS_KILLED, "verify", state.path()).output().unwrap();
    final_state(&verified);
}

/// Clicks of the two-process topology run: enough that counting outlasts the rebalances.
const WINDOWS_CLICKS: &str = "300000";

#[test]
fn two_processes_run_the_windows_and_the_survivor_of_a_kill_completes_every_result() {
    // `per-minute` in disk stores, two processes in its group; the first is SIGKILLed once
    // both count. The survivor takes its partitions over (rebuilding their stores from the
    // changelogs: its own state.dir has no files for them) and ends with every final result.
    let (victim_state, survivor_state) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let broker = broker();
    let target = broker.target();
    let spawn = |state: &std::path::Path| {
        Command::new(example("clicks_windows"))
            .args([target.as_str(), WINDOWS_CLICKS, "per-minute"])
            .env("CHRONIK_GUARANTEE", "at-least-once")
            .env("CHRONIK_KAFKA_SESSION_TIMEOUT_MS", SESSION_MS.to_string())
            .env("CHRONIK_KAFKA_STATE_DIR", state)
            .env("CLICKS_STORE", "disk:8")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut victim = spawn(victim_state.path());
    // Its first line comes once the clicks are produced: the second process produces none.
    let stdout = victim.stdout.take().unwrap();
    let (send, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    lines.recv_timeout(FINISH_WAIT).expect("the first process printed nothing");
    let log = chronik::connect(&target).unwrap();
    let results = || -> u64 {
        (0..4).map(|p| log.end_offset("clicks-per-minute", p).map_or(0, chronik::Offset::get)).sum()
    };
    let deadline = Instant::now() + FINISH_WAIT;
    while results() == 0 {
        assert!(Instant::now() < deadline, "no result from the first process");
        std::thread::sleep(Duration::from_millis(50));
    }
    let survivor = spawn(survivor_state.path());
    std::thread::sleep(Duration::from_secs(3));
    assert!(victim.try_wait().unwrap().is_none(), "the first process ended before its kill");
    let before_kill = results();
    victim.kill().unwrap();
    victim.wait().unwrap();
    let output = survivor.wait_with_output().unwrap();
    let all = text(&output);
    assert!(output.status.success() && all.contains("exact:"), "{all}");
    println!("results before the kill: {before_kill}; survivor: {all}");
}
