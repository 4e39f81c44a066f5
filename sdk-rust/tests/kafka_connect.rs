//! `Connection`'s calls behave the same on a data directory and on a Kafka-protocol broker
//! (tansu, started here on 127.0.0.1): sends keep keys, values, headers and timestamps;
//! consumers in a group resume where the group committed; iteration stops when caught up and
//! goes on when more arrives; the same over TLS and mutual TLS (a CA made here), and wrong
//! certificates, plaintext to a TLS listener and a refused SASL login are clear errors that
//! show no secret. Built with `--features kafka`; run by `scripts/kafka-test`.
#![cfg(feature = "kafka")]

use chronik::Log;
use chronik::kafka::KafkaConfig;
use chronik::testing::{TestBroker, TestCertificates};
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

/// The properties of a TLS client of `broker`: the CA, and with `mutual` the client's
/// certificate and its encrypted key.
fn tls_config(broker: &TestBroker, certificates: &TestCertificates, mutual: bool) -> KafkaConfig {
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let config = KafkaConfig::new(broker.bootstrap())
        .set("security.protocol", "SSL")
        .set("ssl.ca.location", path(&certificates.ca));
    if !mutual {
        return config;
    }
    config
        .set("ssl.certificate.location", path(&certificates.client_cert))
        .set("ssl.key.location", path(&certificates.client_key))
        .set("ssl.key.password", TestCertificates::KEY_PASSWORD)
}

/// The error text of a connection that must fail, checked for `secret` (which `config` holds).
fn refused(config: KafkaConfig, secret: &str) -> String {
    let held = format!("{:?}", config.get("ssl.key.password").or(config.get("sasl.password")));
    assert!(held.contains(secret), "the configuration must hold the secret looked for");
    let error = chronik::connect_kafka(config).expect_err("the connection must be refused");
    let text = format!("{error} / {error:?}");
    assert!(!text.contains(secret), "a secret in an error: {text}");
    text
}

#[test]
fn the_same_calls_over_tls_and_mutual_tls() {
    let directory = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::make(directory.path()).unwrap();
    for mutual in [false, true] {
        let broker = TestBroker::start_tls(&certificates, mutual).expect("start tansu behind TLS");
        let log = chronik::connect_kafka(tls_config(&broker, &certificates, mutual)).unwrap();
        let debug = format!("{log:?}");
        assert!(!debug.contains(TestCertificates::KEY_PASSWORD), "a secret in Debug: {debug}");
        consumers_resume_where_their_group_committed(&log);
    }
}

#[test]
fn wrong_certificates_and_plaintext_are_refused_with_clear_errors() {
    let directory = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::make(directory.path()).unwrap();
    let other = directory.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let other = TestCertificates::make(&other).unwrap();
    let broker = TestBroker::start_tls(&certificates, true).expect("start tansu behind TLS");

    // A CA that did not sign the broker's certificate.
    let wrong_ca =
        tls_config(&broker, &certificates, true).set("ssl.ca.location", other.ca.to_str().unwrap());
    let secret = TestCertificates::KEY_PASSWORD;
    let text = refused(wrong_ca, secret);
    assert!(text.contains("certificate verify failed"), "{text}");
    // No client certificate where the listener requires one (this terminator closes the
    // connection without a TLS alert, so librdkafka only sees it go down). The passphrase is
    // set, unused, to be looked for.
    let no_certificate = tls_config(&broker, &certificates, false).set("ssl.key.password", secret);
    let text = refused(no_certificate, secret);
    assert!(text.contains("reach the cluster"), "{text}");
    // A client key with the wrong passphrase: librdkafka refuses it before connecting.
    let wrong = "wrong-passphrase-d41e";
    let text =
        refused(tls_config(&broker, &certificates, true).set("ssl.key.password", wrong), wrong);
    assert!(text.contains("ssl.key.location failed"), "{text}");
    // A plaintext client speaking to the TLS listener.
    let text =
        refused(KafkaConfig::new(broker.bootstrap()).set("ssl.key.password", secret), secret);
    assert!(text.contains("over PLAINTEXT") && text.contains("SSL or SASL_SSL"), "{text}");
}

#[test]
fn a_refused_sasl_login_is_a_clear_error_without_the_password() {
    let broker = TestBroker::start_sasl().expect("start tansu with --authentication");
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] {
        let config = KafkaConfig::new(broker.bootstrap())
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", mechanism)
            .set("sasl.username", "nobody")
            .set("sasl.password", TestCertificates::KEY_PASSWORD);
        let text = refused(config, TestCertificates::KEY_PASSWORD);
        // librdkafka's words, reported at once (not Chronik's hint after a silence).
        let login = text.contains("SASL authentication error") || text.contains("handshake failed");
        assert!(login && !text.contains("SSL or SASL_SSL"), "{mechanism}: {text}");
    }
}
