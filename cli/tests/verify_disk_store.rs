//! `chronik verify` checks the processors' disk stores under `state/` too: an intact store is
//! listed with its runs; a flipped byte in a run, or a damaged manifest, is a DAMAGE finding
//! naming the file, with exit code 3; and verify changes no byte.

mod common;

use chronik::processor::{ProcessorConfig, Runner};
use chronik::testing::CountByKey;
use chronik::{Chronik, Options, Record, TopicConfig};
use common::{assert_fails, chronik, snapshot, text};
use std::path::{Path, PathBuf};

/// A data directory whose processor `counter` keeps a disk store of several runs, closed.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let chronik = Chronik::open(&data, Options::default()).unwrap();
    chronik.create_topic("clicks", TopicConfig::default()).unwrap();
    for chunk in 0..10 {
        let keys: Vec<String> = (0..1000).map(|i| format!("key-{:05}", chunk * 1000 + i)).collect();
        let records: Vec<Record<'_>> =
            keys.iter().map(|k| Record::new(Some(k.as_bytes()), b"x")).collect();
        chronik.engine().append("clicks", 0, &records).unwrap();
    }
    // A small cache: the store writes runs.
    let config = ProcessorConfig::new("counter", "clicks")
        .store_with("counts", "disk:1".parse().unwrap())
        .commit_interval_ms(5);
    let store = data.join("state").join(config.store_directory("counts", 0));
    let mut runner = Runner::new(chronik.engine(), config, |_| CountByKey::new("counts")).unwrap();
    runner.run_until_caught_up().unwrap();
    assert!(runner.store(0, "counts").unwrap().disk_runs().unwrap() >= 1);
    drop(runner);
    drop(chronik);
    (directory, data, store)
}

fn runs(store: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "run"))
        .collect();
    runs.sort();
    runs
}

/// `verify` exits 3 with one DAMAGE finding, on `file`, holding `needle`; nothing changed.
fn verify_damage(data: &Path, file: &Path, needle: &str) {
    let before = snapshot(data);
    let output = chronik(data, &["verify"], None);
    let stdout = text(&output.stdout);
    assert_fails(&output, 3, "1 damaged structures found", "verify");
    let finding = format!("DAMAGE: {}: damaged disk store file: {needle}", file.display());
    assert!(stdout.lines().any(|l| l.starts_with(&finding)), "no {finding:?} in: {stdout}");
    assert_eq!(snapshot(data), before, "verify changed the directory");
}

#[test]
fn verify_checks_the_processors_disk_stores() {
    let (_keep, data, store) = fixture();
    let output = chronik(&data, &["verify"], None);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    let runs_now = runs(&store);
    let listed = format!("{}: disk store, {} runs", store.display(), runs_now.len());
    assert!(stdout.contains(&listed), "expected {listed:?} in {stdout}");
    let json = chronik(&data, &["verify", "--format", "json"], None);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["stores"][0]["runs"], runs_now.len());

    // A flipped byte in the middle of a run: a data block whose checksum no longer matches.
    let run = &runs_now[0];
    let original = std::fs::read(run).unwrap();
    let mut bytes = original.clone();
    let middle = bytes.len() / 3;
    bytes[middle] ^= 0x10;
    std::fs::write(run, &bytes).unwrap();
    verify_damage(&data, run, "block checksum");
    std::fs::write(run, &original).unwrap();

    // A run cut short, and a damaged manifest.
    std::fs::write(run, &original[..original.len() - 1]).unwrap();
    verify_damage(&data, run, "size differs from the manifest's");
    std::fs::write(run, &original).unwrap();
    let manifest = store.join("MANIFEST");
    let mut bytes = std::fs::read(&manifest).unwrap();
    bytes[5] ^= 0x01;
    std::fs::write(&manifest, bytes).unwrap();
    verify_damage(&data, &manifest, "does not decode");
}
