//! The committed data directories in `tests/fixtures/` pin the format: `v1/` was written by
//! format version 1 (`topic.meta` version 1), `v2/` by version 2 (`topic.meta` version 2, with
//! the cleanup settings; every other file as in version 1), `v3/` by the current one (every
//! file as in version 2, plus each active segment's recovery point, its index files, and the
//! clean-shutdown mark `clean.shutdown`). This build must open all three and read exactly the
//! records they hold, changing no file but adding the recovery points and the mark that an
//! older close did not leave, and must write `v3/`'s bytes when it generates it again.
//!
//! Regenerate `v3/` (only when the format changes on purpose, together with a new version) with
//! `cargo test -p chronik-engine --test fixture -- --ignored regenerate`.

mod common;

use chronik_engine::{Durability, Header, Record, TopicConfig};
use common::{ManualClock, Owned};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A topic with two partitions and small segments, so it holds sealed segments with index files.
const CLICKS: &str = "clicks";
/// A topic with one partition and default settings: one active segment.
const PROFILES: &str = "profiles";

/// The fixture this build writes.
const CURRENT: &str = "v3";

fn fixture_directory(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(version)
}

fn clicks_config() -> TopicConfig {
    TopicConfig {
        partitions: 2,
        segment_bytes: 4096,
        segment_ms: 24 * 60 * 60 * 1000,
        index_interval_bytes: 512,
        ..TopicConfig::default()
    }
}

/// One append of the fixture: where, the clock at the time, and the records.
struct Append {
    topic: &'static str,
    partition: u32,
    clock_ms: i64,
    /// Records with their offsets still zero.
    records: Vec<Owned>,
}

/// Every append of the fixture, in order. Pure: the same list every time.
fn appends() -> Vec<Append> {
    let mut appends = Vec::new();
    for i in 0..120i64 {
        let records = (0..=i % 3)
            .map(|j| Owned {
                offset: 0,
                // Every fourth batch takes the engine clock; the others carry their own time.
                timestamp: if i % 4 == 0 { clock_at(i) } else { clock_at(i) - 500 + j },
                key: (i % 5 != 0).then(|| format!("user-{}", (i * 7 + j) % 13).into_bytes()),
                value: format!("click {i}.{j} {}", "page/".repeat(usize::try_from(i % 9).unwrap()))
                    .into_bytes(),
                headers: if j == 0 && i % 2 == 0 {
                    vec![(b"source".to_vec(), b"web".to_vec()), (b"trace".to_vec(), vec![])]
                } else {
                    Vec::new()
                },
            })
            .collect();
        appends.push(Append {
            topic: CLICKS,
            partition: u32::try_from(i % 2).unwrap(),
            clock_ms: clock_at(i),
            records,
        });
        if i % 10 == 9 {
            let record = Owned {
                offset: 0,
                timestamp: clock_at(i),
                key: Some(format!("profile-{}", i % 3).into_bytes()),
                value: format!("{{\"visits\": {i}}}").into_bytes(),
                headers: Vec::new(),
            };
            appends.push(Append {
                topic: PROFILES,
                partition: 0,
                clock_ms: clock_at(i),
                records: vec![record],
            });
        }
    }
    appends
}

fn clock_at(step: i64) -> i64 {
    common::EPOCH_MS + step * 1000
}

/// The records each partition must hold, with their offsets.
fn expected_records() -> BTreeMap<(&'static str, u32), Vec<Owned>> {
    let mut expected: BTreeMap<(&'static str, u32), Vec<Owned>> = BTreeMap::new();
    for append in appends() {
        let records = expected.entry((append.topic, append.partition)).or_default();
        for mut record in append.records {
            record.offset = records.len() as u64;
            records.push(record);
        }
    }
    expected
}

/// Write the fixture's data directory at `root`, which must not exist yet.
fn generate(root: &Path) {
    let clock = ManualClock::new(common::EPOCH_MS);
    let (engine, _) = common::open_with_clock(root, Durability::Sync, clock.clone());
    engine.create_topic(CLICKS, clicks_config()).unwrap();
    engine.create_topic(PROFILES, TopicConfig::default()).unwrap();
    let expected = expected_records();
    let mut next: BTreeMap<(&str, u32), u64> = BTreeMap::new();
    for append in appends() {
        clock.set(append.clock_ms);
        let headers: Vec<Vec<Header<'_>>> = append
            .records
            .iter()
            .map(|r| r.headers.iter().map(|(k, v)| Header { key: k, value: v }).collect())
            .collect();
        let records: Vec<Record<'_>> = append
            .records
            .iter()
            .zip(&headers)
            .map(|(r, headers)| {
                let record = Record::new(r.key.as_deref(), &r.value).with_headers(headers);
                // Leave the clock's time implicit where it is the clock's, to cover both paths.
                if r.timestamp == append.clock_ms {
                    record
                } else {
                    record.with_timestamp(r.timestamp)
                }
            })
            .collect();
        let appended = engine.append(append.topic, append.partition, &records).unwrap();
        let offset = next.entry((append.topic, append.partition)).or_default();
        assert_eq!(appended.base_offset.get(), *offset);
        *offset += records.len() as u64;
    }
    for ((topic, partition), records) in &expected {
        assert_eq!(next[&(*topic, *partition)], records.len() as u64);
    }
    drop(engine);
    std::fs::remove_file(root.join("LOCK")).unwrap();
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn the_committed_fixtures_open_and_read_back_exactly() {
    for version in ["v1", "v2", CURRENT] {
        open_and_read_back(version);
    }
}

fn open_and_read_back(version: &str) {
    let fixture = fixture_directory(version);
    let committed = common::snapshot(&fixture);
    assert!(!committed.is_empty(), "the fixture is missing: run the ignored `regenerate` test");
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path().join("data");
    copy_tree(&fixture, &root);

    let (engine, report) = common::open(&root, Durability::Sync);
    assert!(report.is_clean(), "{:?}", report.lines());
    assert_eq!(engine.list_topics(), [CLICKS, PROFILES]);
    assert_eq!(engine.describe_topic(CLICKS).unwrap().config, clicks_config());
    assert_eq!(engine.describe_topic(PROFILES).unwrap().config, TopicConfig::default());
    for ((topic, partition), expected) in expected_records() {
        let records = common::read_all(&engine, topic, partition, 0, 1 << 20);
        assert_eq!(records, expected, "{topic}/{partition}");
        // Mid-log reads and timestamp lookups work on the committed indexes too.
        for record in expected.iter().step_by(7) {
            let from = common::read_all(&engine, topic, partition, record.offset, 300);
            assert_eq!(from, expected[usize::try_from(record.offset).unwrap()..]);
            let want = expected.iter().find(|r| r.timestamp >= record.timestamp).unwrap().offset;
            let found = engine.offset_for_timestamp(topic, partition, record.timestamp).unwrap();
            assert_eq!(found.unwrap().get(), want);
        }
    }
    let clicks = engine.describe_topic(CLICKS).unwrap();
    for partition in &clicks.partitions {
        assert!(partition.segment_count >= 3, "sealed segments: {partition:?}");
    }
    let index_files = committed
        .iter()
        .filter(|(path, _)| path.extension().is_some_and(|e| e == "index" || e == "timeindex"));
    assert!(index_files.count() >= 8, "the fixture holds index files of sealed segments");
    drop(engine);
    let after = common::snapshot(&root);
    let added: Vec<&PathBuf> =
        after.iter().filter(|file| !committed.contains(file)).map(|(path, _)| path).collect();
    for path in &added {
        // Only what a close of this version leaves and an older one did not.
        let extension = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
        assert!(
            path.as_os_str() == "clean.shutdown" || ["index", "timeindex"].contains(&extension),
            "{version}: opening and closing a clean fixture wrote {}",
            path.display()
        );
        assert!(
            !committed.iter().any(|(p, _)| &p == path),
            "{version}: {} changed",
            path.display()
        );
    }
    assert!(committed.iter().all(|file| after.contains(file)), "{version}: a file changed or went");
    if version == CURRENT {
        assert!(added.is_empty(), "the current fixture is left exactly as it was: {added:?}");
    }
}

#[test]
fn generating_the_fixture_again_writes_the_same_bytes() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path().join("data");
    generate(&root);
    let generated = common::snapshot(&root);
    let committed = common::snapshot(&fixture_directory(CURRENT));
    let names = |snapshot: &[(PathBuf, Vec<u8>)]| -> Vec<PathBuf> {
        snapshot.iter().map(|(path, _)| path.clone()).collect()
    };
    assert_eq!(names(&generated), names(&committed), "the same files");
    for ((path, bytes), (_, committed_bytes)) in generated.iter().zip(&committed) {
        let first_difference = bytes.iter().zip(committed_bytes).position(|(a, b)| a != b);
        assert!(
            bytes == committed_bytes,
            "{} differs from the committed fixture (lengths {} and {}, first difference at {:?})",
            path.display(),
            bytes.len(),
            committed_bytes.len(),
            first_difference,
        );
    }
}

/// Regenerates `tests/fixtures/v2/`. Ignored: run it by name, on purpose.
#[test]
#[ignore = "rewrites the committed fixture"]
fn regenerate() {
    let fixture = fixture_directory(CURRENT);
    if fixture.exists() {
        std::fs::remove_dir_all(&fixture).unwrap();
    }
    std::fs::create_dir_all(fixture.parent().unwrap()).unwrap();
    generate(&fixture);
    println!("wrote {} files to {}", common::files_under(&fixture).len(), fixture.display());
}
