//! The fuzz targets' committed corpus (`fuzz/corpus/<target>/`: the seeds, inputs the fuzzer
//! found interesting, and every input that once crashed a target, named `crash-*`) replayed
//! through the same target bodies on stable Rust. A failure names the target and the file;
//! `cargo fuzz run <target> <file>` replays it under libFuzzer.

use chronik_sim::fuzz::{TARGETS, seeds};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

fn corpus_dir(target: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
}

#[test]
fn every_corpus_input_passes_every_target() {
    let mut failures = Vec::new();
    for &(target, body) in TARGETS {
        let dir = corpus_dir(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a corpus entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{target}: the corpus is empty");
        for file in files {
            let data = std::fs::read(&file).expect("a corpus file reads");
            if catch_unwind(AssertUnwindSafe(|| body(&data))).is_err() {
                failures.push(format!("{target}: {}", file.display()));
            }
        }
    }
    assert!(failures.is_empty(), "corpus inputs that fail:\n{}", failures.join("\n"));
}

#[test]
fn the_committed_seeds_are_the_generated_ones() {
    for (target, name, bytes) in seeds() {
        let path = corpus_dir(target).join(format!("seed-{name}"));
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            committed == bytes,
            "{}: regenerate with `chronik-sim fuzz-seeds fuzz/corpus`",
            path.display()
        );
    }
}
