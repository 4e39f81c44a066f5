//! SIGKILL during `chronik topic create` and `chronik topic delete`, at moments found by
//! watching the files (the temporary `.NAME.creating` / `.NAME.deleting` directory appears, half
//! its partitions are there or gone), then reopen: the topic is wholly there (every partition,
//! every record) or wholly gone (a new topic of that name is empty), the records of the other
//! topic are all there, and `verify` finds no damage. SIGKILL during `chronik compact`, when
//! its first cleaned segment appears, when a swap is half done and at a few moments in
//! between: every key keeps its latest value at its offset, offsets only increase, and the
//! next pass finishes the job.

mod common;

use common::{chronik, text};
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PARTITIONS: usize = 64;

/// When to kill, and what that moment is.
type Moment<'a> = (&'a str, Box<dyn Fn() -> bool + 'a>);

/// Entries of `topics/NAME_DIR`, or `None` if it does not exist.
fn entries(data: &Path, name: &str) -> Option<usize> {
    std::fs::read_dir(data.join("topics").join(name)).ok().map(Iterator::count)
}

/// Run `chronik ARGS`, SIGKILL it once `moment` holds (or it ended); whether it was killed.
fn kill_when(data: &Path, args: &[&str], moment: &dyn Fn() -> bool) -> bool {
    let mut child = Command::new(env!("CARGO_BIN_EXE_chronik"))
        .arg("--data")
        .arg(data)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if moment() || Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Reopen and check: `big` wholly there (with `records` in partition 0) or wholly gone.
fn check(data: &Path, records: &str) -> bool {
    let listed = chronik(data, &["topic", "list"], None);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let present = text(&listed.stdout).lines().any(|l| l == "big");
    let leftovers: Vec<_> = std::fs::read_dir(data.join("topics"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "left after the reopen: {leftovers:?}");
    if present {
        let described = chronik(data, &["topic", "describe", "big"], None);
        assert_eq!(text(&described.stdout).lines().count(), 2 + PARTITIONS, "a partial topic");
        let read = chronik(data, &["consume", "big", "--partition", "0"], None);
        assert_eq!(text(&read.stdout), records, "{}", text(&read.stderr));
    } else {
        assert!(entries(data, "big").is_none());
    }
    let other = chronik(data, &["consume", "t"], None);
    assert_eq!(text(&other.stdout), "kept\n", "{}", text(&other.stderr));
    let verified = chronik(data, &["verify"], None);
    assert!(verified.status.success(), "{}", text(&verified.stdout));
    present
}

#[test]
fn a_killed_topic_create_or_delete_leaves_the_topic_whole_or_gone() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let produced = chronik(&data, &["produce", "t"], Some("kept\n"));
    assert!(produced.status.success(), "{}", text(&produced.stderr));
    let partitions = PARTITIONS.to_string();
    let create = ["topic", "create", "big", "--partitions", partitions.as_str()];
    let moments: [Moment<'_>; 2] = [
        ("temporary directory appears", Box::new(|| entries(&data, ".big.creating").is_some())),
        (
            "half the partitions made",
            Box::new(|| entries(&data, ".big.creating").is_some_and(|n| n > PARTITIONS / 2)),
        ),
    ];
    for (moment, when) in &moments {
        let killed = kill_when(&data, &create, when.as_ref());
        let present = check(&data, "");
        println!("create killed ({killed}) when {moment}: topic present {present}");
        if present {
            assert!(chronik(&data, &["topic", "delete", "big"], None).status.success());
        }
    }
    let moments: [Moment<'_>; 2] = [
        ("renamed away", Box::new(|| entries(&data, ".big.deleting").is_some())),
        (
            "half the partitions removed",
            Box::new(|| entries(&data, ".big.deleting").is_some_and(|n| n < PARTITIONS / 2)),
        ),
    ];
    for (moment, when) in &moments {
        let created = chronik(&data, &create, None);
        assert!(created.status.success(), "{}", text(&created.stderr));
        let produced = chronik(&data, &["produce", "big", "--partition", "0"], Some("old\n"));
        assert!(produced.status.success(), "{}", text(&produced.stderr));
        let killed = kill_when(&data, &["topic", "delete", "big"], when.as_ref());
        let present = check(&data, "old\n");
        println!("delete killed ({killed}) when {moment}: topic present {present}");
        if present {
            assert!(chronik(&data, &["topic", "delete", "big"], None).status.success());
        } else {
            // Gone for good: a new topic of the name holds none of the old records.
            assert!(chronik(&data, &create, None).status.success());
            assert!(check(&data, ""));
            assert!(chronik(&data, &["topic", "delete", "big"], None).status.success());
        }
    }
}

/// `partition:offset`, key and value of every record of `k`, in offset order.
fn compacted_records(data: &Path) -> Vec<(u64, String, String)> {
    let read = chronik(data, &["consume", "k", "--print-key", "--print-offset"], None);
    assert!(read.status.success(), "{}", text(&read.stderr));
    text(&read.stdout)
        .lines()
        .map(|line| {
            let mut fields = line.split('\t');
            let offset = fields.next().unwrap().trim_start_matches("0:").parse().unwrap();
            let key = fields.next().unwrap().to_owned();
            (offset, key, fields.next().unwrap().to_owned())
        })
        .collect()
}

/// Files of partition 0 of `k` whose names end with `suffix`.
fn files_ending(data: &Path, suffix: &str) -> usize {
    let directory = data.join("topics/k/0");
    std::fs::read_dir(directory).map_or(0, |entries| {
        entries
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(suffix))
            .count()
    })
}

/// The latest value of each key is there at the offset it was written at; offsets increase.
fn check_compacted(data: &Path, latest: &std::collections::BTreeMap<String, (u64, String)>) {
    let records = compacted_records(data);
    assert!(records.windows(2).all(|w| w[0].0 < w[1].0), "offsets increase");
    let mut seen = std::collections::BTreeMap::new();
    for (offset, key, value) in records {
        seen.insert(key, (offset, value));
    }
    assert_eq!(&seen, latest, "the latest value of every key, at its offset");
    let verified = chronik(data, &["verify"], None);
    assert!(verified.status.success(), "{}", text(&verified.stdout));
}

#[test]
fn a_killed_compaction_keeps_the_latest_value_of_every_key() {
    const KEYS: u64 = 40;
    const ROUNDS: u64 = 600;
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let created = chronik(
        &data,
        &["topic", "create", "k", "--segment-bytes", "16384", "--config", "cleanup=compact"],
        None,
    );
    assert!(created.status.success(), "{}", text(&created.stderr));
    let mut input = String::new();
    let mut latest = std::collections::BTreeMap::new();
    for round in 0..ROUNDS {
        for k in 0..KEYS {
            let (key, value) = (format!("key-{k}"), format!("round-{round}-of-{k}"));
            writeln!(input, "{key}:{value}").unwrap();
            latest.insert(key, (round * KEYS + k, value));
        }
    }
    let produced = chronik(&data, &["produce", "k", "--key-separator", ":"], Some(&input));
    assert!(produced.status.success(), "{}", text(&produced.stderr));
    check_compacted(&data, &latest);
    let logs_before = std::cell::Cell::new(0);
    let moments: [Moment<'_>; 3] = [
        ("a cleaned segment appears", Box::new(|| files_ending(&data, ".cleaned") > 0)),
        ("a swap is committed", Box::new(|| files_ending(&data, ".swap") > 0)),
        (
            "the first group is swapped",
            Box::new(|| files_ending(&data, ".log") < logs_before.get()),
        ),
    ];
    let mut killed_any = false;
    for (moment, when) in &moments {
        logs_before.set(files_ending(&data, ".log"));
        let killed = kill_when(&data, &["compact", "k"], when.as_ref());
        killed_any |= killed;
        println!("compact killed ({killed}) when {moment}");
        check_compacted(&data, &latest);
        // Produce the same updates again, so the next kill meets a dirty log too.
        let produced = chronik(&data, &["produce", "k", "--key-separator", ":"], Some(&input));
        assert!(produced.status.success(), "{}", text(&produced.stderr));
        let shift = (latest.len() as u64) * ROUNDS;
        for (offset, _) in latest.values_mut() {
            *offset += shift;
        }
        check_compacted(&data, &latest);
    }
    assert!(killed_any, "no compaction was killed before it ended");
    let finished = chronik(&data, &["compact", "k"], None);
    assert!(finished.status.success(), "{}", text(&finished.stderr));
    check_compacted(&data, &latest);
    assert!(files_ending(&data, ".log") < 40, "the last pass compacted the log");
}
