//! `chronik consume --follow` in one process while `chronik produce` writes in another: the
//! consumer reads beside the producer (which holds the lock) and sees every record in order,
//! across segment rolls, as it is written.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn a_follower_sees_every_record_a_running_producer_writes() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let binary = env!("CARGO_BIN_EXE_chronik");
    let created = Command::new(binary)
        .arg("--data")
        .arg(&data)
        .args(["topic", "create", "t", "--segment-bytes", "4096"])
        .output()
        .unwrap();
    assert!(created.status.success());

    let mut producer = Command::new(binary)
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
    // The producer holds the data directory before the follower starts.
    writeln!(input, "record-0").unwrap();
    input.flush().unwrap();
    assert_eq!(acknowledgements.next().unwrap().unwrap(), "0:0");

    let total = 600;
    let follower = Command::new(binary)
        .arg("--data")
        .arg(&data)
        .args(["consume", "t", "--follow", "--max", &total.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for i in 1..total {
        writeln!(input, "record-{i}").unwrap();
        if i % 100 == 0 {
            input.flush().unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    drop(input);
    let output = follower.wait_with_output().unwrap();
    producer.wait().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("reading beside it"), "{stderr}");
    let printed = String::from_utf8(output.stdout).unwrap();
    let expected: Vec<String> = (0..total).map(|i| format!("record-{i}")).collect();
    assert_eq!(printed.lines().collect::<Vec<_>>(), expected);
}
