//! Helpers shared by the `chronik` binary's tests.

use std::path::Path;
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
