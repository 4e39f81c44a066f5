//! `Connection`'s calls behave the same on a data directory and on a Kafka-protocol broker
//! (tansu, started here on 127.0.0.1): sends keep keys, values, headers and timestamps;
//! consumers in a group resume where the group committed; iteration stops when caught up and
//! goes on when more arrives. Built with `--features kafka`; run by `scripts/kafka-test`.
#![cfg(feature = "kafka")]

use chronik::Log;
use chronik::testing::TestBroker;
use chronik::{Connection, Header, OwnedRecord, Record};

fn send(log: &Connection, from: u64, to: u64) {
    let values: Vec<String> = (from..to).map(|i| format!("value-{i}")).collect();
    let headers = [Header { key: b"h", value: b"x" }];
    let records: Vec<Record<'_>> = values
        .iter()
        .zip(1_700_000_000_000_i64..)
        .map(|(v, timestamp)| {
            Record::new(Some(b"key"), v.as_bytes()).with_timestamp(timestamp).with_headers(&headers)
        })
        .collect();
    log.send("t", 1, &records).unwrap();
}

fn values(records: &[OwnedRecord]) -> Vec<String> {
    records.iter().map(|r| String::from_utf8_lossy(&r.value).into_owned()).collect()
}

fn expected(from: u64, to: u64) -> Vec<String> {
    (from..to).map(|i| format!("value-{i}")).collect()
}

/// The same script on either log.
fn consumers_resume_where_their_group_committed(log: &Connection) {
    log.ensure_topic("t", 2).unwrap();
    send(log, 0, 10);
    let mut first = log.consumer("t", 1, Some("readers")).unwrap();
    let head: Vec<OwnedRecord> = first.by_ref().take(4).map(Result::unwrap).collect();
    assert_eq!(values(&head), expected(0, 4));
    assert_eq!(head[0].key.as_deref(), Some(&b"key"[..]));
    assert_eq!(head[0].headers, vec![(b"h".to_vec(), b"x".to_vec())]);
    assert_eq!(head[1].timestamp, 1_700_000_000_001);
    assert_eq!(first.position(), head[3].offset.plus(1));
    first.commit().unwrap();
    drop(first);

    // A new consumer of the group starts at the commit and stops when caught up.
    let mut second = log.consumer("t", 1, Some("readers")).unwrap();
    let rest: Vec<OwnedRecord> = second.by_ref().map(Result::unwrap).collect();
    assert_eq!(values(&rest), expected(4, 10));
    assert!(second.next().is_none(), "caught up");
    send(log, 10, 12);
    let more: Vec<OwnedRecord> = second.by_ref().map(Result::unwrap).collect();
    assert_eq!(values(&more), expected(10, 12));

    // Another group, and no group, start at the beginning; outside a group, no commit.
    let other: Vec<OwnedRecord> =
        log.consumer("t", 1, Some("others")).unwrap().map(Result::unwrap).collect();
    assert_eq!(values(&other), expected(0, 12));
    let plain = log.consumer("t", 1, None).unwrap();
    assert!(plain.commit().is_err());
    assert_eq!(log.consumer("t", 0, None).unwrap().count(), 0);
}

#[test]
fn consumers_resume_where_their_group_committed_embedded_and_on_the_broker() {
    let directory = tempfile::tempdir().unwrap();
    consumers_resume_where_their_group_committed(
        &chronik::connect(directory.path().to_str().unwrap()).unwrap(),
    );
    let broker = TestBroker::start().expect("start tansu (CHRONIK_TANSU)");
    consumers_resume_where_their_group_committed(&chronik::connect(&broker.target()).unwrap());
}
