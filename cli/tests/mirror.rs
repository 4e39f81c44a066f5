//! `chronik mirror` through a Kafka-protocol broker (tansu, started here): a topic of a million
//! records copied from a data directory to the broker and back into another directory is the
//! same record for record (offsets, keys, values, headers, timestamps), with each direction
//! killed once midway and resumed; and a directory mirrored again and again while `chronik
//! produce` writes it ends up on the broker exactly once, in order. Built with
//! `--features kafka`; run by `scripts/kafka-test`.
#![cfg(feature = "kafka")]

use chronik::kafka::KafkaClient;
use chronik::testing::TestBroker;
use chronik::{Chronik, Header, Options, OwnedRecord, Record, TopicConfig, TransactionWrite};
use std::io::{BufRead, BufReader, Write};
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

/// How many records the producer writes in the test beside a writer, and how fast.
const LIVE_RECORDS: u64 = 30_000;
const LIVE_RECORDS_PER_PAUSE: u64 = 1_000;

fn mirror_topic(from: &std::path::Path, to: &str, topic: &str) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chronik"));
    command.arg("mirror").arg("--from").arg(from).args(["--to", to, topic]);
    command.output().unwrap()
}

/// The N of "mirrored N records" in a mirror's standard error.
fn mirrored(stderr: &str) -> u64 {
    let (_, rest) = stderr.split_once("mirrored ").unwrap_or_else(|| panic!("{stderr}"));
    rest.split(' ').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{stderr}"))
}

#[test]
fn a_directory_mirrored_while_a_producer_writes_it_reaches_the_broker_exactly_once_in_order() {
    let broker = TestBroker::start().expect("start tansu (scripts/kafka-broker install)");
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let binary = env!("CARGO_BIN_EXE_chronik");
    // Small segments: the producer rolls them while the mirrors read.
    let created = Command::new(binary)
        .arg("--data")
        .arg(&data)
        .args(["topic", "create", "live", "--partitions", "2", "--segment-bytes", "65536"])
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let mut producer = Command::new(binary)
        .arg("--data")
        .arg(&data)
        .args(["produce", "live", "--key-separator", ":"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = producer.stdin.take().unwrap();
    let mut acknowledgements = BufReader::new(producer.stdout.take().unwrap()).lines();
    // The producer holds the data directory's lock before the first mirror starts.
    writeln!(input, "key-0:value-0").unwrap();
    input.flush().unwrap();
    acknowledgements.next().unwrap().unwrap();
    let drained = std::thread::spawn(move || acknowledgements.count() + 1);
    let writer = std::thread::spawn(move || {
        for i in 1..LIVE_RECORDS {
            writeln!(input, "key-{}:value-{i}", i % 1000).unwrap();
            if i % LIVE_RECORDS_PER_PAUSE == 0 {
                input.flush().unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // Dropping the input ends the producer.
    });

    // Mirror again and again while the producer writes: each run copies what it finds and
    // notes how far it got on the broker, the next goes on from there.
    let (mut runs, mut copied_while_writing) = (0, 0);
    while !writer.is_finished() {
        let output = mirror_topic(&data, &broker.target(), "live");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "run {runs} beside the producer: {stderr}");
        copied_while_writing += mirrored(&stderr);
        runs += 1;
    }
    writer.join().unwrap();
    assert!(producer.wait().unwrap().success());
    assert_eq!(drained.join().unwrap() as u64, LIVE_RECORDS, "acknowledgements");
    assert!(runs >= 2 && copied_while_writing > 0, "{runs} runs, {copied_while_writing} copied");

    // The rest, once the producer stopped; then nothing more.
    let output = mirror_topic(&data, &broker.target(), "live");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let output = mirror_topic(&data, &broker.target(), "live");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && mirrored(&stderr) == 0, "{stderr}");

    let source = Chronik::open(&data, Options::default()).unwrap();
    let cluster = KafkaClient::connect(&broker.bootstrap()).unwrap();
    let mut values = Vec::new();
    for partition in 0..2 {
        let original: Vec<OwnedRecord> =
            source.consumer("live", partition).collect::<Result<_, _>>().unwrap();
        let copied = cluster.records("live", partition).unwrap();
        assert_eq!(original.len(), copied.len(), "partition {partition}");
        for (a, b) in original.iter().zip(&copied) {
            assert_eq!(a, b, "partition {partition}");
        }
        values.extend(copied.into_iter().map(|r| String::from_utf8(r.value).unwrap()));
    }
    values.sort();
    let mut expected: Vec<String> = (0..LIVE_RECORDS).map(|i| format!("value-{i}")).collect();
    expected.sort();
    assert_eq!(values, expected, "every record once");
    eprintln!("{runs} mirrors beside the producer copied {copied_while_writing} records");
}

/// A mirror begun by the previous version, which kept its progress in a state file of the
/// source (`state/mirror-to-<cluster>.progress`), goes on from that file. Its note pairs source
/// offset 50 with destination offset 40 (the old run began at source offset 10, as after
/// retention), and the destination holds 5 records past it (a chunk acknowledged, its note
/// never written): the copy ends with source records 10 to 99, each once. Counting the
/// destination's records instead of reading the note would copy records 45 to 54 twice.
#[test]
fn a_mirror_goes_on_from_the_previous_versions_state_file_then_from_its_note_on_the_broker() {
    let broker = TestBroker::start().expect("start tansu (scripts/kafka-broker install)");
    let directory = tempfile::tempdir().unwrap();
    let state_file = format!("mirror-to-{}.progress", broker.bootstrap().replace(':', "-"));
    let values: Vec<Vec<u8>> = (0..100).map(|i| format!("value-{i}").into_bytes()).collect();
    let records: Vec<Record<'_>> =
        values.iter().map(|v| Record::new(None, v).with_timestamp(1_700_000_000_000)).collect();
    {
        let source = Chronik::open(directory.path(), Options::default()).unwrap();
        source.create_topic("old", TopicConfig::default()).unwrap();
        source.producer("old").send_to(0, &records).unwrap();
        source.engine().state_dir().write(&state_file, b"old\t0\t50\t40\n".to_vec()).unwrap();
    }
    let cluster = KafkaClient::connect(&broker.bootstrap()).unwrap();
    cluster.create_topic("old", 1, false).unwrap();
    cluster.send("old", 0, &records[10..55]).unwrap();

    let output = mirror_topic(directory.path(), &broker.target(), "old");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && mirrored(&stderr) == 45, "{stderr}");
    let copied: Vec<Vec<u8>> =
        cluster.records("old", 0).unwrap().into_iter().map(|r| r.value).collect();
    assert_eq!(copied, values[10..]);
    // Noted on the broker now: with the state file emptied, a further run goes on from the
    // broker's note and copies nothing (counting the destination's 90 records would skip 90
    // source records and copy 90 to 99 again).
    let source = Chronik::open(directory.path(), Options::default()).unwrap();
    source.engine().state_dir().write(&state_file, Vec::new()).unwrap();
    drop(source);
    let output = mirror_topic(directory.path(), &broker.target(), "old");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && mirrored(&stderr) == 0, "{stderr}");
    let copied: Vec<Vec<u8>> =
        cluster.records("old", 0).unwrap().into_iter().map(|r| r.value).collect();
    assert_eq!(copied, values[10..]);
}
