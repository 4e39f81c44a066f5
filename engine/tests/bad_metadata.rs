//! Damaged metadata files: a damaged `chronik.meta` fails the open with a typed error naming
//! the file; a damaged file of one topic (`topic.meta`, `log.start`) keeps that topic closed,
//! reported with the file (`damaged_topic_meta.rs` has the rest). Never a panic, never a silent
//! fresh start over existing data, nothing changed in the damaged topic, and once the file is
//! put back every record reads as before. A data directory path that is a file is an I/O
//! error. (Damaged segments, indexes and checkpoints: `sealed_corruption.rs`, `torn_tail.rs`,
//! `missing_index.rs`, and the fuzz targets replayed by `sim/tests/fuzz_corpus.rs`.)

mod common;

use chronik_engine::{CorruptionKind, Durability, Engine, OpenError, Options, TopicConfig};
use std::path::{Path, PathBuf};

fn files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    out.sort();
    out
}

fn try_open(root: &Path) -> Result<Engine<chronik_engine::io::SystemIo>, OpenError> {
    try_open_reporting(root).map(|(engine, _)| engine)
}

fn try_open_reporting(
    root: &Path,
) -> Result<(Engine<chronik_engine::io::SystemIo>, chronik_engine::RecoveryReport), OpenError> {
    let clock = common::ManualClock::new(common::EPOCH_MS);
    let options = Options { durability: Durability::Sync, ..Options::default() };
    Engine::open(common::test_io(), clock, root, options)
}

fn damage_bytes(files: &[(PathBuf, Vec<u8>)], path: &Path) -> Vec<u8> {
    files.iter().find(|(p, _)| p == path).map(|(_, b)| b.clone()).unwrap()
}

#[test]
fn each_damaged_metadata_file_is_reported_and_loses_nothing() {
    type Damage = fn(&[u8]) -> Vec<u8>;
    let cases: [(&str, &str, Damage); 6] = [
        ("chronik.meta", "newer version", |b| {
            let mut b = b.to_vec();
            b[12] += 1;
            b
        }),
        ("chronik.meta", "garbage", |_| b"garbage garbage!".to_vec()),
        ("chronik.meta", "empty", |_| Vec::new()),
        ("topics/t/topic.meta", "flipped byte", |b| {
            let mut b = b.to_vec();
            b[40] ^= 0x10;
            b
        }),
        ("topics/t/topic.meta", "cut short", |b| b[..20].to_vec()),
        ("topics/t/1/log.start", "flipped byte", |b| {
            let mut b = b.to_vec();
            b[20] ^= 0x01;
            b
        }),
    ];
    for (file, how, damage) in cases {
        let directory = tempfile::tempdir().unwrap();
        let root = directory.path();
        {
            let (engine, _) = common::open(root, Durability::Sync);
            let config = TopicConfig { partitions: 2, ..TopicConfig::default() };
            engine.create_topic("t", config).unwrap();
            for i in 0..20_u32 {
                common::append_value(&engine, "t", i % 2, format!("v{i}").as_bytes());
            }
            // A log.start file exists once retention moved the start: write partition 1's.
            chronik_engine::internals::log_start::write(
                &common::test_io(),
                &root.join("topics/t/1"),
                chronik_engine::Offset::ZERO,
            )
            .unwrap();
        }
        let path = root.join(file);
        let original = std::fs::read(&path).unwrap();
        std::fs::write(&path, damage(&original)).unwrap();
        let before = files(root);
        if file.starts_with("topics/") {
            let (engine, report) = try_open_reporting(root).unwrap();
            let damage = &report.damaged_topics[0].damage;
            assert_eq!(damage.file, path, "{file} {how}: {damage}");
            assert!(damage.to_string().contains(file.rsplit('/').next().unwrap()), "{damage}");
            let error = engine.read("t", 0, chronik_engine::Offset::ZERO, 1).unwrap_err();
            assert!(matches!(error, chronik_engine::ReadError::Corruption(_)), "{error}");
            drop(engine);
            // The damaged file is as it was.
            assert_eq!(std::fs::read(&path).unwrap(), damage_bytes(&before, &path));
        } else {
            let error = try_open(root).map(|_| ()).expect_err(&format!("{file} {how}: opened"));
            match (&error, file) {
                (OpenError::UnsupportedVersion { found, supported, .. }, "chronik.meta") => {
                    assert_eq!(*found, supported + 1, "{file} {how}");
                }
                (OpenError::Corruption(c), _) => {
                    assert_eq!(c.file, path, "{file} {how}: {error}");
                    assert!(
                        !matches!(c.kind, CorruptionKind::OffsetMismatch { .. }),
                        "{file} {how}"
                    );
                }
                _ => panic!("{file} {how}: unexpected {error:?}"),
            }
            assert!(error.to_string().contains(file.rsplit('/').next().unwrap()), "{error}");
            // The refused open changed nothing (the lock file aside, which holds no data).
            let after: Vec<_> =
                files(root).into_iter().filter(|(p, _)| !p.ends_with("LOCK")).collect();
            let before: Vec<_> = before.into_iter().filter(|(p, _)| !p.ends_with("LOCK")).collect();
            assert_eq!(after, before, "{file} {how}: the failed open changed files");
        }
        // Put back, everything is there.
        std::fs::write(&path, &original).unwrap();
        let engine = try_open(root).unwrap();
        for partition in 0..2 {
            let values: Vec<Vec<u8>> = common::read_all(&engine, "t", partition, 0, 1 << 20)
                .into_iter()
                .map(|r| r.value)
                .collect();
            let expected: Vec<Vec<u8>> = (0..20)
                .filter(|i| i % 2 == partition)
                .map(|i| format!("v{i}").into_bytes())
                .collect();
            assert_eq!(values, expected, "{file} {how}: partition {partition}");
        }
    }
}

#[test]
fn a_data_directory_path_that_is_a_file_is_an_io_error() {
    let directory = tempfile::tempdir().unwrap();
    let file = directory.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    match try_open(&file) {
        Err(OpenError::Io(e)) => assert!(e.to_string().contains("not-a-directory"), "{e}"),
        other => panic!("expected an I/O error, got {:?}", other.map(|_| ())),
    }
}
