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
    let directory = data.join("topics/t/0");
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
