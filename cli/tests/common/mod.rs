//! Helpers shared by the `chronik` binary's tests.

#![allow(dead_code)] // each test binary uses some of the helpers

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Run `chronik --data DATA ARGS...` with `stdin` as standard input; wait for it.
pub fn chronik(data: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_chronik"))
        .arg("--data")
        .arg(data)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        std::io::Write::write_all(&mut input, text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn segments(data: &Path) -> Vec<PathBuf> {
    segments_of(data, "t")
}

/// The segment files of `topic`'s partition 0, in order.
pub fn segments_of(data: &Path, topic: &str) -> Vec<PathBuf> {
    let directory = data.join("topics").join(topic).join("0");
    let mut logs: Vec<PathBuf> = std::fs::read_dir(directory)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

pub fn snapshot(data: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![data.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            files.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    files.sort();
    files
}

/// A topic with several segments holding the values 1..=n, one record per line.
pub fn produce_lines(data: &Path, n: usize) -> String {
    let created = chronik(data, &["topic", "create", "t", "--segment-bytes", "4096"], None);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let lines: String = (1..=n).map(|i| i.to_string() + "\n").collect();
    // One line at a time would be slow; a few batches make several segments.
    for chunk in lines.split_inclusive('\n').collect::<Vec<_>>().chunks(50) {
        let output = chronik(data, &["produce", "t"], Some(&chunk.concat()));
        assert!(output.status.success(), "{}", text(&output.stderr));
    }
    lines
}

/// Run `chronik ARGS...` (no `--data` added) with `stdin` as standard input, bytes and all;
/// killed after `TIMEOUT`, so a hang fails the test instead of stalling it.
pub fn chronik_raw(args: &[&std::ffi::OsStr], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_chronik"))
        .args(args)
        .env_remove("CHRONIK_DATA")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let bytes = stdin.to_vec();
    // A thread writes, so a child that stops reading (it failed) cannot block the test.
    let writer = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut input, &bytes);
    });
    let id = child.id();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if wait.recv_timeout(TIMEOUT).is_err() {
            // SAFETY: kill(2) on the id of a child not yet waited for (the main thread waits
            // only after this thread is told to stop or has sent the signal).
            unsafe { libc::kill(libc::pid_t::try_from(id).unwrap(), libc::SIGKILL) };
        }
    });
    let output = child.wait_with_output().unwrap();
    let _ = done.send(());
    watchdog.join().unwrap();
    writer.join().unwrap();
    output
}

/// Longest a single command of these tests may take before it counts as hung.
pub const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// `chronik --data DATA ARGS...` with `stdin` as bytes.
pub fn chronik_bytes(data: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut all: Vec<&std::ffi::OsStr> = vec!["--data".as_ref(), data.as_os_str()];
    all.extend(args.iter().map(std::ffi::OsStr::new));
    chronik_raw(&all, stdin)
}

/// The command failed with `code`, without a panic, and said why in one line: its last line
/// of standard error is `chronik: error: ...` (or clap's `error: ...` first line, for a usage
/// error clap found), holding `needle`. Returns standard error.
pub fn assert_fails(output: &Output, code: i32, needle: &str, case: &str) -> String {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{case}: exit code; stderr: {stderr}");
    assert_no_panic(output, case);
    let line = if stderr.starts_with("error: ") {
        stderr.lines().next().unwrap_or_default()
    } else {
        stderr.lines().last().unwrap_or_default()
    };
    assert!(
        line.starts_with("chronik: error: ") || line.starts_with("error: "),
        "{case}: no one-line error in: {stderr}"
    );
    assert!(line.contains(needle), "{case}: {needle:?} not in the error line: {line}");
    stderr
}

/// Nothing on standard error looks like a panic or a backtrace.
pub fn assert_no_panic(output: &Output, case: &str) {
    let stderr = text(&output.stderr);
    for sign in ["panicked", "RUST_BACKTRACE", "stack backtrace"] {
        assert!(!stderr.contains(sign), "{case}: {sign} in: {stderr}");
    }
    // A signal (SIGABRT of a panic = abort, SIGKILL of the watchdog) leaves no exit code.
    assert!(output.status.code().is_some(), "{case}: killed by a signal (a hang?): {stderr}");
}

/// The acknowledgements `PARTITION:OFFSET` printed by `produce`, in order.
pub fn acknowledgements(output: &Output) -> Vec<(u32, u64)> {
    text(&output.stdout)
        .lines()
        .map(|line| {
            let (partition, offset) = line.split_once(':').expect("PARTITION:OFFSET");
            (partition.parse().unwrap(), offset.parse().unwrap())
        })
        .collect()
}
