//! `chronik mirror` round trip through a Kafka-protocol broker (tansu, started here): a topic
//! of a million records copied from a data directory to the broker and back into another
//! directory is the same record for record (offsets, keys, values, headers, timestamps), with
//! each direction killed once midway and resumed. Built with `--features kafka`; run by
//! `scripts/kafka-test`.
#![cfg(feature = "kafka")]

use chronik::kafka::TestBroker;
use chronik::{Chronik, Header, Options, OwnedRecord, Record, TopicConfig, TransactionWrite};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RECORDS: u64 = 1_000_000;
const PARTITIONS: u32 = 4;

/// A generated record: partition, key, value, timestamp, which header set.
type Generated = (u32, Option<Vec<u8>>, Vec<u8>, i64, usize);

/// Record `i`: some without a key, some with an empty value, some with headers (one with an
/// empty value), timestamps not in order.
fn fill(chronik: &Chronik) {
    chronik.create_topic("events", TopicConfig::default().with_partitions(PARTITIONS)).unwrap();
    let header_sets: [&[Header<'_>]; 3] = [
        &[],
        &[Header { key: b"trace", value: b"abc" }],
        &[Header { key: b"a", value: b"" }, Header { key: b"b", value: &[0, 255, 7] }],
    ];
    let mut i = 0;
    while i < RECORDS {
        let end = (i + 4000).min(RECORDS);
        let owned: Vec<Generated> = (i..end)
            .map(|n| {
                let key = (n % 7 != 0).then(|| format!("key-{}", n % 5000).into_bytes());
                let value =
                    if n % 11 == 0 { Vec::new() } else { vec![(n % 251) as u8; (n % 97) as usize] };
                let timestamp = 1_700_000_000_000 + i64::try_from((n * 7919) % 100_000).unwrap();
                ((n % u64::from(PARTITIONS)) as u32, key, value, timestamp, (n % 3) as usize)
            })
            .collect();
        let mut by_partition: Vec<Vec<Record<'_>>> = vec![Vec::new(); PARTITIONS as usize];
        for (partition, key, value, timestamp, headers) in &owned {
            by_partition[*partition as usize].push(
                Record::new(key.as_deref(), value)
                    .with_timestamp(*timestamp)
                    .with_headers(header_sets[*headers]),
            );
        }
        let writes: Vec<TransactionWrite<'_>> = by_partition
            .iter()
            .enumerate()
            .map(|(p, records)| TransactionWrite { topic: "events", partition: p as u32, records })
            .collect();
        chronik.commit_transaction(&writes, None).unwrap();
        i = end;
    }
}

fn mirror(from: &str, to: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chronik"));
    command.args(["mirror", "--from", from, "--to", to, "events"]);
    command
}

/// Start a mirror, kill it after `after`, then run it again to the end.
fn mirror_killed_then_resumed(from: &str, to: &str, after: Duration) {
    let mut child = mirror(from, to).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let started = Instant::now();
    while started.elapsed() < after && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(killed, "the mirror {from} -> {to} ended before its kill");
    let output = mirror(from, to).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

fn records(chronik: &Chronik, partition: u32) -> Vec<OwnedRecord> {
    chronik.consumer("events", partition).collect::<Result<_, _>>().unwrap()
}

#[test]
fn a_million_records_round_trip_through_the_broker_unchanged_with_both_directions_killed_once() {
    let broker = TestBroker::start().expect("start tansu (scripts/kafka-broker install)");
    let source = tempfile::tempdir().unwrap();
    let back = tempfile::tempdir().unwrap();
    let source_path = source.path().to_str().unwrap().to_owned();
    let back_path = back.path().to_str().unwrap().to_owned();
    fill(&Chronik::open(source.path(), Options::default()).unwrap());
    mirror_killed_then_resumed(&source_path, &broker.target(), Duration::from_secs(8));
    mirror_killed_then_resumed(&broker.target(), &back_path, Duration::from_millis(1500));
    // Run again: nothing more is copied either way.
    for (from, to) in [(&source_path, &broker.target()), (&broker.target(), &back_path)] {
        let output = mirror(from, to).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success() && stderr.contains("mirrored 0 records"), "{stderr}");
    }
    let source = Chronik::open(source.path(), Options::default()).unwrap();
    let back = Chronik::open(back.path(), Options::default()).unwrap();
    let mut total = 0;
    for partition in 0..PARTITIONS {
        let (original, copied) = (records(&source, partition), records(&back, partition));
        assert_eq!(original.len(), copied.len(), "partition {partition}");
        for (a, b) in original.iter().zip(&copied) {
            assert_eq!(a, b, "partition {partition}");
        }
        total += copied.len() as u64;
    }
    assert_eq!(total, RECORDS);
}
