//! The `chronik` binary used wrongly, as a new user would: bad arguments (unknown topics,
//! partitions out of range, negative and huge numbers, bad durability strings, missing values,
//! hostile topic and group names) and hostile standard input (a line larger than a record can
//! be, lines that fit only if batched with care, binary bytes, NUL bytes in keys). Each case
//! fails with one clear line and the README's exit code (2 usage, 1 failure), never a panic or
//! a hang, and changes nothing; whatever was acknowledged reads back byte for byte.

mod common;

use common::{acknowledgements, assert_fails, assert_no_panic, chronik_bytes, chronik_raw, text};
use std::ffi::OsStr;
use std::path::Path;

/// A data directory with topic `t` (3 partitions) holding one record per partition.
fn fixture(data: &Path) {
    let created = chronik_bytes(data, &["topic", "create", "t", "--partitions", "3"], b"");
    assert!(created.status.success(), "{}", text(&created.stderr));
    for partition in ["0", "1", "2"] {
        let value = format!("v{partition}\n");
        let produced =
            chronik_bytes(data, &["produce", "t", "--partition", partition], value.as_bytes());
        assert!(produced.status.success(), "{}", text(&produced.stderr));
    }
}

/// Every record of `topic`, partition after partition, as printed by `consume`.
fn consume_all(data: &Path, topic: &str) -> Vec<u8> {
    let output = chronik_bytes(data, &["consume", topic], b"");
    assert!(output.status.success(), "{}", text(&output.stderr));
    output.stdout
}

#[test]
#[allow(clippy::too_many_lines)] // one table of cases
fn bad_arguments_fail_with_one_line_and_the_right_exit_code() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    fixture(&data);
    let long_name = "a".repeat(201);
    // (arguments, exit code, what the error line says)
    let cases: &[(&[&str], i32, &str)] = &[
        (&["consume", "nope"], 1, "topic \"nope\" does not exist"),
        (&["consume", "nope", "--partition", "5"], 1, "does not exist"),
        (&["consume", "t", "--partition", "3"], 2, "topic t has 3 partitions, no 3"),
        (&["consume", "t", "--partition", "-1"], 2, "unexpected argument '-1'"),
        (&["consume", "t", "--partition", "99999999999"], 2, "invalid value '99999999999'"),
        (&["consume", "t", "--from", "-5"], 2, "unexpected argument '-5'"),
        (&["consume", "t", "--from", "18446744073709551616"], 2, "invalid value"),
        (&["consume", "t", "--from", "1000"], 1, "offset 1000 is out of range"),
        (&["consume", "t", "--max"], 2, "a value is required for '--max <MAX>'"),
        (&["consume", "t", "--format", "xml"], 2, "invalid value 'xml'"),
        (&["consume", "t", "--group", ""], 2, "invalid group name \"\""),
        (&["consume", "t", "--group", "a/b"], 2, "invalid group name \"a/b\""),
        (&["consume", "t", "--group", "../g"], 2, "invalid group name"),
        (&["produce"], 2, "the following required arguments were not provided"),
        (&["produce", "t", "--partition", "3"], 2, "topic t has 3 partitions, no 3"),
        (&["produce", "t", "--partition"], 2, "a value is required for '--partition"),
        (&["produce", "t", "--durability", "sometimes"], 2, "is not sync, os or interval:MS"),
        (&["produce", "t", "--durability", "SYNC"], 2, "is not sync, os or interval:MS"),
        (&["produce", "t", "--durability", ""], 2, "is not sync, os or interval:MS"),
        (&["produce", "t", "--durability", "interval:"], 2, "is not a number of milliseconds"),
        (&["produce", "t", "--durability", "interval:0"], 2, "at least 1 ms"),
        (&["produce", "t", "--durability", "interval:-1"], 2, "is not a number"),
        (&["produce", "t", "--durability", "interval:1e3"], 2, "is not a number"),
        (
            &["produce", "t", "--durability", "interval:99999999999999999999"],
            2,
            "is not a number of milliseconds",
        ),
        (&["produce", "t", "--key-separator", ""], 2, "--key-separator must not be empty"),
        (&["produce", "a/b"], 2, "invalid topic name \"a/b\""),
        (&["produce", ".."], 2, "invalid topic name \"..\""),
        (&["produce", "new", "--create-partitions", "0"], 2, "partitions must be in 1..=4096"),
        (&["produce", "new", "--partition", "5"], 2, "would be created with 1 partitions, no 5"),
        (&["topic", "create"], 2, "the following required arguments were not provided"),
        (&["topic", "create", "t"], 1, "topic \"t\" already exists"),
        (&["topic", "create", "a/b"], 2, "invalid topic name \"a/b\""),
        (&["topic", "create", ".."], 2, "invalid topic name \"..\": must not start with '.'"),
        (&["topic", "create", "../escape"], 2, "invalid topic name"),
        (&["topic", "create", "."], 2, "invalid topic name"),
        (&["topic", "create", ""], 2, "must be 1 to 200 bytes long"),
        (&["topic", "create", &long_name], 2, "must be 1 to 200 bytes long"),
        (&["topic", "create", "é"], 2, "invalid topic name"),
        (&["topic", "create", "with space"], 2, "invalid topic name"),
        (&["topic", "create", "__mine"], 2, "reserved for internal topics"),
        (&["topic", "create", "x", "--partitions", "0"], 2, "partitions must be in 1..=4096"),
        (&["topic", "create", "x", "--partitions", "4294967295"], 2, "partitions must be in"),
        (&["topic", "create", "x", "--partitions", "-1"], 2, "unexpected argument '-1'"),
        (&["topic", "create", "x", "--segment-bytes", "0"], 2, "segment_bytes must be in"),
        (
            &["topic", "create", "x", "--segment-bytes", "18446744073709551615"],
            2,
            "segment_bytes must be in",
        ),
        (&["topic", "create", "x", "--segment-ms", "0"], 2, "segment_ms must be positive"),
        (&["topic", "create", "x", "--config", "foo"], 2, "setting \"foo\" is not KEY=VALUE"),
        (&["topic", "create", "x", "--config", "foo=1"], 2, "unknown setting \"foo\""),
        (&["topic", "create", "x", "--config", "retention_ms=abc"], 2, "is not a whole number"),
        (&["topic", "create", "x", "--config", "retention_ms=-2"], 2, "retention_ms must be"),
        (
            &["topic", "create", "x", "--config", "min_cleanable_dirty_ratio=NaN"],
            2,
            "min_cleanable_dirty_ratio must be in 0..=1",
        ),
        (&["topic", "config", "t"], 2, "the following required arguments were not provided"),
        (&["topic", "config", "nope", "retention_ms=1"], 1, "topic \"nope\" does not exist"),
        (&["topic", "config", "t", "partitions=5"], 2, "cannot change"),
        (&["topic", "describe", "nope"], 1, "does not exist"),
        (&["topic", "delete", "nope"], 1, "topic \"nope\" does not exist"),
        (&["topic", "delete", "__consumer_offsets"], 2, "internal topics cannot be deleted"),
        (&["compact", "nope"], 1, "topic \"nope\" does not exist"),
        (&["compact", "t"], 2, "topic t is not compacted"),
        (&["stats", "nope"], 1, "does not exist"),
        (&["stats", "--format", "xml"], 2, "invalid value 'xml'"),
        (&["dump"], 2, "give segment files, or --topic NAME with --data"),
        (&["dump", "--topic", "nope"], 2, "no topic nope in"),
        (&["dump", "--topic", "t", "--partition", "7"], 2, "topic t has no partition 7"),
        (&["dump", "--topic", "../data"], 2, "invalid topic name"),
        (&["dump", "missing.log"], 1, "open missing.log: No such file or directory"),
        (&["--io", "bogus", "topic", "list"], 2, "unknown I/O backend \"bogus\""),
        (&["frobnicate"], 2, "unrecognized subcommand 'frobnicate'"),
    ];
    for &(args, code, needle) in cases {
        let case = format!("chronik {}", args.join(" "));
        let output = chronik_bytes(&data, args, b"x\n");
        let stderr = assert_fails(&output, code, needle, &case);
        assert!(output.stdout.is_empty(), "{case}: printed {}", text(&output.stdout));
        // An OS error's text once, not once per cause.
        assert!(stderr.matches("(os error").count() <= 1, "{case}: {stderr}");
    }
    // Without a data directory, every command but dump says so.
    for args in [&["consume", "t"][..], &["produce", "t"], &["topic", "list"], &["verify"]] {
        let output = chronik_raw(&args.iter().map(OsStr::new).collect::<Vec<_>>(), b"");
        assert_fails(&output, 2, "--data DIR (or CHRONIK_DATA) is required", &args.join(" "));
    }
    // A data directory that is a file, or a directory no one may create.
    let file = directory.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let output = chronik_bytes(&file, &["topic", "list"], b"");
    assert_fails(&output, 1, "Not a directory", "--data FILE");
    let output = chronik_bytes(&file, &["verify"], b"");
    assert_fails(&output, 2, "is not a directory", "verify --data FILE");

    // Nothing of the refused commands stayed: the topics and records are as before.
    let listed = chronik_bytes(&data, &["topic", "list"], b"");
    assert_eq!(text(&listed.stdout), "t\n", "{}", text(&listed.stderr));
    assert_eq!(consume_all(&data, "t"), b"v0\nv1\nv2\n");
    // A group with a bad name printed nothing and committed nothing.
    let grouped = chronik_bytes(&data, &["consume", "t", "--group", "g"], b"");
    assert_eq!(text(&grouped.stdout), "v0\nv1\nv2\n", "{}", text(&grouped.stderr));
}

#[test]
fn extreme_but_valid_arguments_work() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    fixture(&data);
    // The longest interval there is: acknowledged at once, synced at the close.
    let output = chronik_bytes(
        &data,
        &["produce", "t", "--partition", "0", "--durability", "interval:18446744073709551615"],
        b"late\n",
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(acknowledgements(&output), [(0, 1)]);
    let name = "n".repeat(200);
    let created = chronik_bytes(&data, &["topic", "create", &name, "--partitions", "8"], b"");
    assert!(created.status.success(), "{}", text(&created.stderr));
    let produced = chronik_bytes(&data, &["produce", &name, "--partition", "7"], b"edge\n");
    assert_eq!(acknowledgements(&produced), [(7, 0)], "{}", text(&produced.stderr));
    let read = chronik_bytes(&data, &["consume", &name, "--partition", "7", "--max", "0"], b"");
    assert!(read.status.success() && read.stdout.is_empty(), "{}", text(&read.stderr));
    let end = chronik_bytes(&data, &["consume", "t", "--partition", "0", "--from", "2"], b"");
    assert!(end.status.success() && end.stdout.is_empty(), "{}", text(&end.stderr));
    let deleted = chronik_bytes(&data, &["topic", "delete", &name], b"");
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    assert_eq!(consume_all(&data, "t"), b"v0\nlate\nv1\nv2\n");
}

/// A line of `length` bytes of `fill`, with its newline.
fn line(fill: u8, length: usize) -> Vec<u8> {
    let mut line = vec![fill; length];
    line.push(b'\n');
    line
}

#[test]
fn a_line_too_large_for_a_record_is_named_and_the_lines_before_it_are_kept() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    // A 20 MiB value alone: nothing acknowledged, the topic empty.
    let output = chronik_bytes(&data, &["produce", "big"], &line(b'v', 20 << 20));
    let stderr =
        assert_fails(&output, 1, "line 1 of standard input holds 20971520 bytes", "20 MiB");
    assert!(stderr.contains("the 0 lines before it are acknowledged"), "{stderr}");
    assert!(output.stdout.is_empty());
    assert!(consume_all(&data, "big").is_empty());

    // Three lines, then 17 MiB, then more: the three are acknowledged and kept, no more.
    let mut input = b"one\ntwo\nthree\n".to_vec();
    input.extend(line(b'x', 17 << 20));
    input.extend(b"after\n");
    let output = chronik_bytes(&data, &["produce", "big"], &input);
    let stderr =
        assert_fails(&output, 1, "line 4 of standard input holds 17825792 bytes", "17 MiB");
    assert!(stderr.contains("the 3 lines before it are acknowledged"), "{stderr}");
    assert_eq!(acknowledgements(&output), [(0, 0), (0, 1), (0, 2)]);
    assert_eq!(consume_all(&data, "big"), b"one\ntwo\nthree\n");
}

#[test]
fn a_line_that_fits_a_record_is_never_refused_for_the_lines_batched_with_it() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    // Just under 4 MiB of short lines (the producer's batch limit), then a line just under the
    // largest record: batched together they would pass the engine's 16 MiB batch limit.
    let mut input = b"first\n".to_vec();
    for _ in 0..4100 {
        input.extend(line(b's', 1000));
    }
    let largest = (16 << 20) - 256;
    input.extend(line(b'L', largest));
    for _ in 0..100 {
        input.extend(line(b'e', 1000));
    }
    let output = chronik_bytes(&data, &["produce", "mixed"], &input);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_no_panic(&output, "mixed sizes");
    let acknowledged = acknowledgements(&output);
    assert_eq!(acknowledged.len(), 1 + 4100 + 1 + 100);
    assert!(acknowledged.iter().enumerate().all(|(i, &(p, o))| p == 0 && o == i as u64));
    assert!(consume_all(&data, "mixed") == input, "the records differ from the lines");
}

/// Seeded bytes: every value 0..=255 but `\n` and `\r`, which are line structure.
fn binary(length: usize, mut seed: u64) -> Vec<u8> {
    (0..length)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match (seed >> 24) as u8 {
                b'\n' | b'\r' => 0,
                byte => byte,
            }
        })
        .collect()
}

#[test]
fn binary_and_nul_bytes_round_trip_byte_for_byte() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    // Non-UTF-8 lines, NUL bytes among them, an empty line, a lone CR inside a line; CRLF is a
    // line end, and a last line without a newline is still a record.
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for i in 0..200u64 {
        let value = binary(1 + (i as usize * 37) % 700, i | 1);
        input.extend(&value);
        input.push(b'\n');
        expected.push(value);
    }
    input.extend(b"\na\rb\r\nlast");
    expected.extend([b"".to_vec(), b"a\rb".to_vec(), b"last".to_vec()]);
    let output = chronik_bytes(&data, &["produce", "bin"], &input);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(acknowledgements(&output).len(), expected.len());
    let printed = consume_all(&data, "bin");
    let mut want: Vec<u8> = expected.join(&b'\n');
    want.push(b'\n');
    assert!(printed == want, "binary records differ");

    // NUL bytes in keys (and an empty key, an empty value) with a key separator.
    let input = b"k\0ey=va\0l\n\0\0=\0\n=\n=x\nx=\nnosep\n";
    let output = chronik_bytes(&data, &["produce", "nul", "--key-separator", "="], input);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = chronik_bytes(&data, &["consume", "nul", "--print-key"], b"");
    let want: &[u8] = b"k\0ey\tva\0l\n\0\0\t\0\n\t\n\tx\nx\t\n\tnosep\n";
    assert_eq!(printed.stdout, want, "{}", text(&printed.stderr));
    let json = chronik_bytes(&data, &["consume", "nul", "--format", "json"], b"");
    let objects: Vec<serde_json::Value> =
        text(&json.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(objects[0]["key"], "k\0ey");
    assert_eq!(objects[0]["value"], "va\0l");
    assert_eq!(objects[2]["key"], "");
    assert_eq!(objects[5]["key"], serde_json::Value::Null);
}

#[test]
fn unreadable_standard_input_is_one_clear_error() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_chronik"))
        .arg("--data")
        .arg(&data)
        .args(["produce", "t"])
        .stdin(std::fs::File::open("/").unwrap())
        .output()
        .unwrap();
    assert_fails(&output, 1, "reading standard input: Is a directory", "stdin is a directory");
}
