//! Direct I/O (`Options::direct_io`): segment files are written in whole blocks through an
//! `O_DIRECT` descriptor, the last block padded with zeros while the segment is active. Sealed
//! segments and a cleanly closed active one end exactly at their last batch; a copy of the
//! directory taken while it is open (the padding in place, as after a crash) recovers every
//! record and reports nothing lost. The whole engine suite also runs in this mode
//! (`CHRONIK_TEST_DIRECT=1`, from the test script).

mod common;

use chronik_engine::io::{DIRECT_ALIGNMENT, SystemIo};
use chronik_engine::{Durability, Engine, Options, Record, TopicConfig};
use common::ManualClock;
use std::path::Path;

const BLOCK: u64 = DIRECT_ALIGNMENT as u64;

fn open_direct(root: &Path) -> (Engine<SystemIo>, chronik_engine::RecoveryReport) {
    let options = Options { durability: Durability::Sync, direct_io: true, ..Options::default() };
    Engine::open(common::test_io(), ManualClock::new(common::EPOCH_MS), root, options).unwrap()
}

fn value(i: usize) -> Vec<u8> {
    // Sizes that put batch ends everywhere in a block, some batches spanning several blocks.
    let length = (i * 997) % 9000 + 1;
    (0..length).map(|j| (i + j) as u8).collect()
}

fn values(engine: &Engine<SystemIo>) -> Vec<Vec<u8>> {
    common::read_all(engine, "t", 0, 0, 1 << 20).into_iter().map(|r| r.value).collect()
}

#[test]
fn direct_segments_read_back_recover_and_close_exactly() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    let (engine, _) = open_direct(root);
    let config = TopicConfig { segment_bytes: 64 * 1024, ..TopicConfig::default() };
    engine.create_topic("t", config).unwrap();
    let mut written = Vec::new();
    for i in 0..120 {
        let value = value(i);
        engine.append("t", 0, &[Record::new(None, &value)]).unwrap();
        written.push(value);
    }
    assert_eq!(values(&engine), written);
    let partition = common::partition_directory(root, "t", 0);
    let logs = common::log_files(&partition);
    assert!(logs.len() > 3, "the appends rolled segments: {logs:?}");
    #[cfg(target_os = "linux")]
    assert_opened_direct(logs.last().unwrap());
    // Sealed segments end at their last batch; the active one is padded to a block.
    for log in &logs[..logs.len() - 1] {
        let bytes = std::fs::read(log).unwrap();
        common::batch_positions_of(&bytes);
    }
    let active = std::fs::read(logs.last().unwrap()).unwrap();
    assert_eq!(active.len() as u64 % BLOCK, 0, "the active segment is padded to a block");
    let size = engine.describe_topic("t").unwrap().partitions[0].size_bytes;

    // A copy taken now is what a crash (after the fsyncs of these sync appends) leaves.
    let copy = tempfile::tempdir().unwrap();
    for (path, bytes) in common::snapshot(root) {
        std::fs::create_dir_all(copy.path().join(&path).parent().unwrap()).unwrap();
        std::fs::write(copy.path().join(&path), bytes).unwrap();
    }
    let (recovered, report) = open_direct(copy.path());
    assert!(report.is_clean(), "padding is not a torn tail: {report:?}");
    assert_eq!(values(&recovered), written);
    recovered.append("t", 0, &[Record::new(None, b"after recovery")]).unwrap();
    written.push(b"after recovery".to_vec());
    assert_eq!(values(&recovered), written);
    drop(recovered);

    drop(engine);
    let sizes: u64 =
        common::log_files(&partition).iter().map(|log| std::fs::metadata(log).unwrap().len()).sum();
    assert_eq!(sizes, size, "a clean close cuts the padding");
    // Reopened without direct I/O: the same records, nothing to cut.
    let (engine, report) = common::open(root, Durability::Sync);
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(values(&engine), written[..written.len() - 1]);
}

/// The writer's segment descriptor really has `O_DIRECT`: a second descriptor of the active
/// segment, for writes, is open with the flag (read from `/proc/self/fdinfo`).
#[cfg(target_os = "linux")]
fn assert_opened_direct(log: &Path) {
    let mut flags = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let entry = entry.unwrap();
        if std::fs::read_link(entry.path()).ok().as_deref() != Some(log) {
            continue;
        }
        let info = std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(entry.file_name()))
            .unwrap();
        let line = info.lines().find(|l| l.starts_with("flags:")).unwrap();
        let octal = line.trim_start_matches("flags:").trim();
        flags.push(u32::from_str_radix(octal, 8).unwrap());
    }
    let direct = u32::try_from(libc::O_DIRECT).unwrap();
    assert!(
        flags.iter().any(|f| f & direct != 0),
        "no O_DIRECT descriptor of {}: {flags:?}",
        log.display()
    );
}
