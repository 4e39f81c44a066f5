//! `chronik topic create --config KEY=VALUE` and `chronik topic config NAME KEY=VALUE...`: the
//! settings are stored, shown by `topic describe`, survive reopening, and a bad one is a usage
//! error (exit code 2) that changes nothing. Retention set this way removes old segments.

mod common;

use common::chronik;
use std::fmt::Write as _;
use std::process::Output;

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn settings_are_stored_shown_and_checked() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let created = chronik(
        &data,
        &[
            "topic",
            "create",
            "log",
            "--config",
            "cleanup=compact",
            "--config",
            "delete_retention_ms=0",
        ],
        None,
    );
    stdout(&created);
    let described = stdout(&chronik(&data, &["topic", "describe", "log"], None));
    assert!(described.contains("cleanup=compact "), "{described}");
    assert!(described.contains("delete_retention_ms=0 "), "{described}");

    let changed =
        chronik(&data, &["topic", "config", "log", "cleanup=delete", "retention_bytes=8192"], None);
    assert!(stdout(&changed).contains("retention_bytes=8192"));
    for bad in
        [vec!["colour=blue"], vec!["partitions=9"], vec!["retention_ms"], vec!["retention_ms=-4"]]
    {
        let mut args = vec!["topic", "config", "log"];
        args.extend(bad.iter().copied());
        let refused = chronik(&data, &args, None);
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{bad:?}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }
    let described = stdout(&chronik(&data, &["topic", "describe", "log"], None));
    assert!(
        described.contains("cleanup=delete retention_ms=-1 retention_bytes=8192 "),
        "{described}"
    );

    // Small segments, then enough records that retention has old segments to remove. Every
    // writable open ticks once at start, so the next command applies retention.
    stdout(&chronik(&data, &["topic", "config", "log", "segment_bytes=4096"], None));
    // Several commands: one command may append all its input as one batch, and a batch is
    // never split across segments.
    for command in 0..12 {
        let mut lines = String::new();
        for i in 0..250 {
            writeln!(lines, "record {:05} {}", command * 250 + i, "x".repeat(40)).unwrap();
        }
        stdout(&chronik(&data, &["produce", "log", "--durability", "os"], Some(&lines)));
    }
    stdout(&chronik(&data, &["topic", "list"], None));
    let described = stdout(&chronik(&data, &["topic", "describe", "log"], None));
    let row = described.lines().find(|l| l.trim_start().starts_with("0 ")).unwrap().to_owned();
    let start = row.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
    assert!(start > 0, "retention moved the log start: {described}");
    let consumed = stdout(&chronik(
        &data,
        &["consume", "log", "--from", &start.to_string(), "--max", "1"],
        None,
    ));
    assert!(consumed.contains(&format!("record {start:05}")), "{consumed}");
}

/// `chronik consume --group NAME` starts where the group committed and commits what it
/// printed: two runs of `--max 3` print records 0-2, then 3-5; another group starts over.
#[test]
fn a_consumer_group_resumes_across_commands() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let lines: String = (0..10).map(|i| format!("line-{i}\n")).collect::<Vec<_>>().concat();
    stdout(&chronik(&data, &["produce", "t"], Some(&lines)));
    let first = stdout(&chronik(&data, &["consume", "t", "--group", "g", "--max", "3"], None));
    assert_eq!(first, "line-0\nline-1\nline-2\n");
    let second = stdout(&chronik(&data, &["consume", "t", "--group", "g", "--max", "3"], None));
    assert_eq!(second, "line-3\nline-4\nline-5\n");
    let other = stdout(&chronik(&data, &["consume", "t", "--group", "h", "--max", "1"], None));
    assert_eq!(other, "line-0\n");
    let rest = stdout(&chronik(&data, &["consume", "t", "--group", "g"], None));
    assert_eq!(rest, "line-6\nline-7\nline-8\nline-9\n");
    let none = stdout(&chronik(&data, &["consume", "t", "--group", "g"], None));
    assert_eq!(none, "", "everything was committed");
    let listed = stdout(&chronik(&data, &["topic", "list"], None));
    assert_eq!(listed, "t\n", "the offsets topic is internal");
}

/// `chronik compact TOPIC` compacts a compacted topic (sizes before and after, the latest
/// value of every key still there) and refuses one that is not compacted (exit code 2).
#[test]
fn compact_command_keeps_the_latest_of_every_key() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let create =
        ["topic", "create", "kv", "--config", "cleanup=compact", "--config", "segment_bytes=4096"];
    stdout(&chronik(&data, &create, None));
    for round in 0..5 {
        let lines: String = (0..200)
            .map(|i| format!("key{}:value-{round}-{i}\n", i % 20))
            .collect::<Vec<_>>()
            .concat();
        stdout(&chronik(&data, &["produce", "kv", "--key-separator", ":"], Some(&lines)));
    }
    let printed = stdout(&chronik(&data, &["compact", "kv"], None));
    assert!(printed.starts_with("compacted kv: "), "{printed}");
    let consumed = stdout(&chronik(&data, &["consume", "kv", "--print-key"], None));
    let mut latest = std::collections::BTreeMap::new();
    for line in consumed.lines() {
        let (key, value) = line.split_once('\t').unwrap();
        latest.insert(key.to_owned(), value.to_owned());
    }
    assert_eq!(latest.len(), 20);
    assert_eq!(latest["key7"], "value-4-187");
    assert!(consumed.lines().count() < 1000, "compaction removed replaced records");
    stdout(&chronik(&data, &["topic", "create", "plain"], None));
    let refused = chronik(&data, &["compact", "plain"], None);
    assert_eq!(refused.status.code(), Some(2));
}

/// `chronik delete-records` moves each partition's log start to the first segment holding the
/// offset asked for, consumers then start there, and a bad partition is a usage error.
#[test]
fn delete_records_command_moves_the_log_start() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let create = ["topic", "create", "events", "--config", "segment_bytes=4096"];
    stdout(&chronik(&data, &create, None));
    for round in 0..5 {
        let mut lines = String::new();
        for i in 0..200 {
            writeln!(lines, "value-{round}-{i:04}-{}", "x".repeat(40)).unwrap();
        }
        stdout(&chronik(&data, &["produce", "events"], Some(&lines)));
    }
    let printed = stdout(&chronik(&data, &["delete-records", "events", "--before", "500"], None));
    let start: u64 = printed
        .strip_prefix("events/0: log start 0 -> ")
        .and_then(|rest| rest.split([' ', '\n']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{printed}"));
    assert!(start > 0 && start <= 500, "{printed}");
    let consumed = stdout(&chronik(&data, &["consume", "events"], None));
    assert_eq!(consumed.lines().count() as u64, 1000 - start);
    assert!(consumed.lines().any(|line| line.starts_with("value-2-0100-")), "offset 500 kept");
    let refused =
        chronik(&data, &["delete-records", "events", "--before", "1", "--partition", "1"], None);
    assert_eq!(refused.status.code(), Some(2));
}
