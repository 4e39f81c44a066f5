//! Process-kill crash test on real files: `chronik produce --durability sync` is SIGKILLed at
//! random moments, many times; after each kill the data directory is reopened and checked:
//! every acknowledged record is there byte for byte, and the partition is, run by run, a prefix
//! of what that run wrote, with no holes, duplicates or invented records.
//!
//! Every other run writes with direct I/O (`CHRONIK_DIRECT_IO=1`).
//!
//! Seeded: set `CHRONIK_CRASH_SEED` to replay a run, `CHRONIK_CRASH_RUNS` for more runs.

use chronik::{Chronik, Offset, Options};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The value of record `n` of run `run`; lengths vary so batches and tails vary.
fn value(run: u64, n: u64) -> String {
    let padding = "x".repeat(((run * 7 + n * 13) % 97) as usize);
    format!("{run}-{n}-{padding}")
}

fn parse(bytes: &[u8]) -> (u64, u64) {
    let text = std::str::from_utf8(bytes).expect("values are ASCII");
    let mut parts = text.splitn(3, '-');
    let run = parts.next().unwrap().parse().unwrap();
    let n = parts.next().unwrap().parse().unwrap();
    assert_eq!(text, value(run, n), "a record's bytes differ from what was written");
    (run, n)
}

/// Run the producer once, kill it after `delay`, and return the acknowledged offsets.
fn produce_and_kill(data: &std::path::Path, run: u64, delay: Duration) -> BTreeMap<u64, String> {
    // Every other run writes with direct I/O: the kill leaves a padded last block, and the
    // check below reopens without direct I/O.
    let direct = if run % 2 == 1 { "1" } else { "0" };
    let mut child = Command::new(env!("CARGO_BIN_EXE_chronik"))
        .args(["--data", data.to_str().unwrap(), "produce", "t", "--durability", "sync"])
        .env("CHRONIK_DIRECT_IO", direct)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chronik produce");
    let mut stdin = child.stdin.take().unwrap();
    let written = Arc::new(Mutex::new(Vec::new()));
    let writer_log = Arc::clone(&written);
    let writer = std::thread::spawn(move || {
        for n in 0.. {
            let line = value(run, n);
            if stdin.write_all(format!("{line}\n").as_bytes()).is_err() {
                return;
            }
            writer_log.lock().unwrap().push(line);
            if n % 64 == 0 {
                // Vary the pace so some batches are small and some large.
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    });
    let stdout = child.stdout.take().unwrap();
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let reader_log = Arc::clone(&acknowledged);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let (partition, offset) = line.split_once(':').expect("PARTITION:OFFSET");
            assert_eq!(partition, "0");
            reader_log.lock().unwrap().push(offset.parse::<u64>().unwrap());
        }
    });
    std::thread::sleep(delay);
    child.kill().expect("SIGKILL the producer");
    child.wait().unwrap();
    writer.join().unwrap();
    reader.join().unwrap();
    // Acknowledgements come in input order, so the k-th one belongs to the k-th line written.
    let written = written.lock().unwrap();
    let acknowledged = acknowledged.lock().unwrap();
    assert!(acknowledged.len() <= written.len());
    acknowledged.iter().zip(written.iter()).map(|(&offset, line)| (offset, line.clone())).collect()
}

#[test]
fn sigkill_never_loses_acknowledged_records() {
    let seed = std::env::var("CHRONIK_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
                | 1
        });
    let runs: u64 =
        std::env::var("CHRONIK_CRASH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(25);
    println!("kill_crash: seed {seed} runs {runs} (replay: CHRONIK_CRASH_SEED={seed})");
    let mut random = Random(seed);
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let mut all_acknowledged = BTreeMap::new();
    let mut total_acknowledged = 0;
    for run in 0..runs {
        let delay = Duration::from_millis(5 + random.next() % 150);
        let acknowledged = produce_and_kill(&data, run, delay);
        total_acknowledged += acknowledged.len();
        for (offset, line) in acknowledged {
            assert!(
                all_acknowledged.insert(offset, line).is_none(),
                "offset {offset} acknowledged twice"
            );
        }
        check(&data, &all_acknowledged, run);
    }
    println!("kill_crash: {runs} kills, {total_acknowledged} acknowledged records, all present");
    assert!(
        total_acknowledged > 0,
        "the producer never acknowledged anything; the test proved nothing"
    );
}

/// Reopen and check the partition against everything acknowledged so far.
fn check(data: &std::path::Path, acknowledged: &BTreeMap<u64, String>, run: u64) {
    let chronik = Chronik::open(data, Options::default()).expect("reopen after SIGKILL");
    assert!(chronik.partition_count("t").is_some() || acknowledged.is_empty());
    if chronik.partition_count("t").is_none() {
        return;
    }
    let mut consumer = chronik.consumer("t", 0);
    let mut expected_next_offset = 0;
    // Per run, the next sequence number the log must hold: runs appear in order, and inside a
    // run the records are 0, 1, 2, ... with no hole and no duplicate.
    let mut last: Option<(u64, u64)> = None;
    loop {
        let fetch = consumer.poll(1 << 20).expect("read after recovery");
        if fetch.is_empty() {
            break;
        }
        for record in fetch.records() {
            assert_eq!(record.offset().get(), expected_next_offset, "offsets have a hole");
            expected_next_offset += 1;
            let (record_run, n) = parse(record.value());
            match last {
                Some((previous_run, previous_n)) if previous_run == record_run => {
                    assert_eq!(
                        n,
                        previous_n + 1,
                        "run {record_run}: hole or duplicate after {previous_n}"
                    );
                }
                Some((previous_run, _)) => {
                    assert!(record_run > previous_run, "runs out of order");
                    assert_eq!(n, 0, "run {record_run} does not start at its first record");
                }
                None => assert_eq!(n, 0),
            }
            assert!(record_run <= run, "a record from the future");
            last = Some((record_run, n));
            if let Some(expected) = acknowledged.get(&record.offset().get()) {
                assert_eq!(record.value(), expected.as_bytes(), "acknowledged record changed");
            }
        }
    }
    let end = chronik.high_watermark("t", 0).unwrap();
    assert_eq!(end, Offset::new(expected_next_offset));
    if let Some((&offset, _)) = acknowledged.last_key_value() {
        assert!(offset < end.get(), "acknowledged offset {offset} lost (log ends at {end})");
    }
}
