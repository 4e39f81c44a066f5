//! The processor example on a Kafka-protocol broker (tansu, started here on 127.0.0.1): the
//! same final state as on the embedded engine, with one process and with two processes in
//! one consumer group, one of them killed mid-run (the survivor takes its partitions over
//! and restores their counts from the changelog). Built with `--features kafka`; run by
//! `scripts/kafka-test`, which installs the broker.
#![cfg(feature = "kafka")]

mod common;

use chronik::kafka::TestBroker;
use common::example;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CLICKS: &str = "40000";

fn run(target: &str, step: &str, guarantee: &str) -> Output {
    Command::new(example("clicks_count"))
        .args([target, CLICKS, step])
        .env("CHRONIK_GUARANTEE", guarantee)
        .output()
        .unwrap()
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

    fn finish(mut self) -> (std::process::ExitStatus, String) {
        use std::io::Read;
        let status = self.child.wait().unwrap();
        self.seen.extend(self.lines.iter());
        let mut stderr = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        (status, format!("{}\n{stderr}", self.seen.join("\n")))
    }
}

/// Clicks of the run with a kill: enough that counting outlasts the group's rebalances.
const CLICKS_KILLED: &str = "200000";

#[test]
fn two_processes_share_the_partitions_and_a_killed_ones_partitions_are_restored_elsewhere() {
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
    victim.child.kill().unwrap();
    let (_, victim_says) = victim.finish();
    // A replacement joins (tansu 0.6 leaves a killed member's partitions unassigned when only
    // one member is left: see docs/kafka.md); it restores the victim's partitions from the
    // changelog and goes on from their last commit.
    let replacement = Counter::spawn(&target);
    let (status, replacement_says) = replacement.finish();
    let (other_status, other_says) = other.finish();
    let all =
        format!("replacement:\n{replacement_says}\nother:\n{other_says}\nvictim:\n{victim_says}");
    assert!(status.success() && other_status.success(), "{all}");
    let restored_counts = |says: &str| {
        says.lines()
            .filter(|l| l.contains("restored store counts") && !l.contains(": 0 records"))
            .count()
    };
    assert!(restored_counts(&replacement_says) >= 1, "nothing committed was restored: {all}");
    let verified = Command::new(example("clicks_count"))
        .args([target.as_str(), CLICKS_KILLED, "verify"])
        .env("CHRONIK_GUARANTEE", "at-least-once")
        .output()
        .unwrap();
    assert_eq!(embedded, final_state(&verified), "{all}");
}
