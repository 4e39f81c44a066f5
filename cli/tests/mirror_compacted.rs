//! `chronik mirror` of a compacted topic whose early batches compaction emptied: every record
//! that survived reaches the broker (the mirror once stopped at the first fetch without a
//! record and said "mirrored 0 records", exit 0, every rerun). Built with `--features kafka`;
//! run by `scripts/kafka-test`.
#![cfg(feature = "kafka")]

use chronik::kafka::KafkaClient;
use chronik::testing::TestBroker;
use chronik::{Chronik, Cleanup, Options, OwnedRecord, Record, TopicConfig};
use std::process::Command;

#[test]
fn a_compacted_topic_reaches_the_broker_whole() {
    let broker = TestBroker::start().expect("start tansu (scripts/kafka-broker install)");
    let directory = tempfile::tempdir().unwrap();
    let want: Vec<OwnedRecord> = {
        let chronik = Chronik::open(directory.path(), Options::default()).unwrap();
        let config = TopicConfig {
            segment_bytes: 4096,
            cleanup: Cleanup::Compact,
            ..TopicConfig::default()
        };
        chronik.create_topic("profiles", config).unwrap();
        for round in 0..6 {
            for key in 0..100 {
                let (key, value) = (format!("user-{key:03}"), format!("v{round}"));
                let record = Record::new(Some(key.as_bytes()), value.as_bytes());
                chronik.engine().append("profiles", 0, &[record]).unwrap();
            }
        }
        chronik.compact_topic("profiles").unwrap();
        let first = chronik.engine().read("profiles", 0, chronik::Offset::ZERO, 1 << 20).unwrap();
        assert_eq!(first.records().count(), 0, "the first fetch holds no record");
        chronik.consumer("profiles", 0).collect::<Result<_, _>>().unwrap()
    };
    assert!(want.len() >= 100 && want.len() < 600, "compacted to {} records", want.len());
    let output = Command::new(env!("CARGO_BIN_EXE_chronik"))
        .arg("mirror")
        .arg("--from")
        .arg(directory.path())
        .args(["--to", &broker.target(), "profiles"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("mirrored {} records", want.len())), "{stderr}");
    let cluster = KafkaClient::connect(&broker.bootstrap()).unwrap();
    let copied = cluster.records("profiles", 0).unwrap();
    let pairs = |records: &[OwnedRecord]| -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
        records.iter().map(|r| (r.key.clone(), r.value.clone())).collect()
    };
    assert_eq!(pairs(&copied), pairs(&want));
}
