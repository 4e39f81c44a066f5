//! `chronik consume --group` while another process (a producer) holds the data directory: a
//! read-only open cannot commit the group's offsets, so it refuses before printing anything,
//! saying why; without `--group` the same read works beside the producer.

mod common;

use common::{assert_fails, chronik_bytes, text};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

#[test]
fn a_group_read_beside_a_writer_refuses_before_printing() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let output = chronik_bytes(&data, &["produce", "t"], b"a\nb\nc\n");
    assert!(output.status.success(), "{}", text(&output.stderr));

    let mut producer = Command::new(env!("CARGO_BIN_EXE_chronik"))
        .arg("--data")
        .arg(&data)
        .args(["produce", "t"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = producer.stdin.take().unwrap();
    let mut acknowledgements = BufReader::new(producer.stdout.take().unwrap()).lines();
    // The producer holds the data directory once it acknowledged a record.
    writeln!(input, "d").unwrap();
    input.flush().unwrap();
    assert_eq!(acknowledgements.next().unwrap().unwrap(), "0:3");

    let output = chronik_bytes(&data, &["consume", "t", "--group", "g"], b"");
    let stderr = assert_fails(&output, 1, "is open in another process", "--group");
    assert!(stderr.contains("--group commits the group's offsets"), "{stderr}");
    assert!(output.stdout.is_empty(), "printed: {}", text(&output.stdout));
    // Without a group the read works beside the producer.
    let output = chronik_bytes(&data, &["consume", "t"], b"");
    assert_eq!(text(&output.stdout), "a\nb\nc\nd\n", "{}", text(&output.stderr));

    drop(input);
    assert!(producer.wait().unwrap().success());
    // Alone, the group reads everything and commits it: a second read prints nothing.
    let output = chronik_bytes(&data, &["consume", "t", "--group", "g"], b"");
    assert_eq!(text(&output.stdout), "a\nb\nc\nd\n", "{}", text(&output.stderr));
    let output = chronik_bytes(&data, &["consume", "t", "--group", "g"], b"");
    assert!(output.status.success() && output.stdout.is_empty(), "{}", text(&output.stderr));
}
