//! `chronik mirror` to and from a broker behind mutual TLS (tansu behind a TLS terminator, a
//! CA made here): properties from `--kafka-config` (a Java `client.properties` file) and the
//! key's passphrase from `CHRONIK_KAFKA_SSL_KEY_PASSWORD`; the round trip is record for record
//! the source, and the passphrase is in no output, error or record of the mirror's state topic,
//! after a successful and after a refused connection. Built with `--features kafka`; run by
//! `scripts/kafka-test`.
#![cfg(feature = "kafka")]

use chronik::kafka::{KafkaClient, KafkaConfig};
use chronik::testing::{TestBroker, TestCertificates};
use chronik::{Chronik, Options, OwnedRecord, Record, TopicConfig, TransactionWrite};
use std::path::Path;
use std::process::{Command, Output};

const SECRET: &str = TestCertificates::KEY_PASSWORD;

fn mirror(from: &str, to: &str, properties: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_chronik"))
        .args(["mirror", "--from", from, "--to", to, "--kafka-config"])
        .arg(properties)
        .arg("events")
        .env("CHRONIK_KAFKA_SSL_KEY_PASSWORD", SECRET)
        .output()
        .unwrap()
}

/// Standard output and error, checked for the secret.
fn text(output: &Output) -> String {
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!text.contains(SECRET), "the key's passphrase was printed: {text}");
    text
}

fn records(chronik: &Chronik, partition: u32) -> Vec<OwnedRecord> {
    chronik.consumer("events", partition).collect::<Result<_, _>>().unwrap()
}

#[test]
fn a_mirror_over_mutual_tls_round_trips_and_never_shows_the_key_passphrase() {
    let directory = tempfile::tempdir().unwrap();
    let tls = directory.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    let certificates = TestCertificates::make(&tls).unwrap();
    let broker = TestBroker::start_tls(&certificates, true).expect("start tansu behind TLS");
    let properties = directory.path().join("client.properties");
    std::fs::write(
        &properties,
        format!(
            "# mutual TLS; the key's passphrase comes from the environment\n\
             security.protocol=SSL\nssl.ca.location={}\nssl.certificate.location={}\n\
             ssl.key.location={}\n",
            certificates.ca.display(),
            certificates.client_cert.display(),
            certificates.client_key.display()
        ),
    )
    .unwrap();

    let source_path = directory.path().join("source");
    let source = Chronik::open(&source_path, Options::default()).unwrap();
    source.create_topic("events", TopicConfig::default().with_partitions(2)).unwrap();
    for partition in 0..2 {
        let values: Vec<String> = (0..2000).map(|i| format!("value-{partition}-{i}")).collect();
        let batch: Vec<Record<'_>> =
            values.iter().map(|v| Record::new(Some(b"k"), v.as_bytes())).collect();
        let write = TransactionWrite { topic: "events", partition, records: &batch };
        source.commit_transaction(&[write], None).unwrap();
    }
    let back_path = directory.path().join("back");
    let to = mirror(source_path.to_str().unwrap(), &broker.target(), &properties);
    assert!(to.status.success(), "{}", text(&to));
    assert!(text(&to).contains("mirrored 4000 records"), "{}", text(&to));
    let back = mirror(&broker.target(), back_path.to_str().unwrap(), &properties);
    assert!(
        back.status.success() && text(&back).contains("mirrored 4000 records"),
        "{}",
        text(&back)
    );
    let back = Chronik::open(&back_path, Options::default()).unwrap();
    for partition in 0..2 {
        assert_eq!(records(&source, partition), records(&back, partition), "partition {partition}");
    }

    // The mirror's notes on the cluster hold offsets and names, never a property.
    let config = KafkaConfig::new(broker.bootstrap())
        .set_properties(&std::fs::read_to_string(&properties).unwrap())
        .unwrap()
        .set("ssl.key.password", SECRET);
    let cluster = KafkaClient::connect_with(config).unwrap();
    let state = "chronik-mirror.state";
    let partitions = cluster.partition_count(state).unwrap().expect("the state topic exists");
    let mut notes = 0;
    for partition in 0..partitions {
        for record in cluster.records(state, partition).unwrap() {
            let bytes = [record.key.unwrap_or_default(), record.value].concat();
            assert!(!String::from_utf8_lossy(&bytes).contains(SECRET));
            notes += 1;
        }
    }
    assert!(notes >= 2, "one note per partition at least: {notes}");

    // A refused connection (a CA that did not sign the broker's certificate) says why.
    let other = directory.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let other = TestCertificates::make(&other).unwrap();
    let wrong = directory.path().join("wrong.properties");
    let wrong_ca = format!("ssl.ca.location={}\n", other.ca.display());
    std::fs::write(&wrong, std::fs::read_to_string(&properties).unwrap() + &wrong_ca).unwrap();
    let refused = mirror(source_path.to_str().unwrap(), &broker.target(), &wrong);
    assert!(!refused.status.success());
    assert!(text(&refused).contains("certificate verify failed"), "{}", text(&refused));
}

#[test]
fn a_bad_kafka_config_file_is_refused_naming_the_property() {
    let directory = tempfile::tempdir().unwrap();
    let source = directory.path().join("source");
    Chronik::open(&source, Options::default()).unwrap();
    let properties = directory.path().join("client.properties");
    // Nothing listens on port 9 here: every case fails before any connection.
    for (text_of_file, expected) in [
        ("acks=1\n", "\"acks\""),
        ("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n", "GSSAPI"),
        ("security.protocol=TLS\n", "security.protocol"),
        ("ssl.truststore.location=/etc/kafka/truststore.jks\n", "ssl.ca.location"),
        ("no.such.property=1\n", "no.such.property"),
    ] {
        std::fs::write(&properties, text_of_file).unwrap();
        let output = mirror(source.to_str().unwrap(), "kafka://127.0.0.1:9", &properties);
        assert!(!output.status.success());
        assert!(text(&output).contains(expected), "{text_of_file}: {}", text(&output));
    }
    let missing =
        mirror(source.to_str().unwrap(), "kafka://127.0.0.1:9", &directory.path().join("nope"));
    assert!(text(&missing).contains("cannot read --kafka-config"), "{}", text(&missing));
}
