//! The oracles must be able to fail: a model told a lie about the engine is caught, both
//! through a whole [`run`] and by the oracles called directly.

use chronik_engine::{Durability, Engine, Options, Record, TopicConfig};
use chronik_sim::clock::EPOCH_MS;
use chronik_sim::model::{Model, ModelBatch, ModelRecord, TopicState};
use chronik_sim::oracle::{self, Context};
use chronik_sim::run::{RunOptions, Sabotage, run};
use chronik_sim::workload::TOPIC;
use chronik_sim::{Rng, SimClock, SimDisk};
use std::path::Path;

#[test]
fn a_phantom_acknowledgement_is_reported_as_a_violation() {
    let options =
        RunOptions { sabotage: Some(Sabotage::PhantomAcknowledgement), ..RunOptions::default() };
    let mut caught = 0;
    for seed in 0..10 {
        let outcome = run(seed, &options);
        let honest = run(seed, &RunOptions::default());
        assert!(honest.violation.is_none(), "seed {seed}: {:?}", honest.violation);
        // A seed whose topic never survived a crash gives the lie no chance to show.
        if let Some(violation) = outcome.violation {
            assert_eq!(violation.oracle, "acknowledged_survive", "seed {seed}: {violation}");
            assert!(outcome.trace.iter().any(|e| e.contains("sabotage")));
            caught += 1;
        }
    }
    assert!(caught >= 8, "only {caught} of 10 sabotaged runs were caught");
}

/// An engine with `values` appended to partition 0 of the workload's topic.
fn engine_with(values: &[&[u8]]) -> Engine<SimDisk> {
    let disk = SimDisk::new(Rng::new(1));
    let clock = SimClock::new(EPOCH_MS);
    let options = Options { durability: Durability::Sync, ..Options::default() };
    let (engine, _) = Engine::open(disk, clock.shared(), Path::new("/data"), options).unwrap();
    engine.create_topic(TOPIC, TopicConfig::default()).unwrap();
    for value in values {
        engine.append(TOPIC, 0, &[Record::new(None, value)]).unwrap();
    }
    engine
}

fn model_of(values: &[&[u8]]) -> Model {
    let mut model = Model::new(1);
    model.topic = TopicState::Present;
    for value in values {
        let record = ModelRecord { key: None, value: value.to_vec(), timestamp: EPOCH_MS };
        model.acknowledge(0, ModelBatch { records: vec![record], appended_ms: EPOCH_MS });
    }
    model
}

fn first_violation(engine: &Engine<SimDisk>, model: &Model) -> Option<&'static str> {
    let mut rng = Rng::new(2);
    let scan = match oracle::scan(engine, model, &mut rng) {
        Ok(scan) => scan,
        Err(violation) => return Some(violation.oracle),
    };
    let context = Context { model, engine, scan: &scan, topic_exists: true, now_ms: EPOCH_MS };
    oracle::check_all(&oracle::standard(), &context, &mut rng).err().map(|v| v.oracle)
}

#[test]
fn each_lie_is_caught_by_the_oracle_it_concerns() {
    let engine = engine_with(&[b"a", b"b"]);
    assert_eq!(first_violation(&engine, &model_of(&[b"a", b"b"])), None, "the truth passes");
    let lost = model_of(&[b"a", b"b", b"c"]);
    assert_eq!(first_violation(&engine, &lost), Some("acknowledged_survive"));
    let different = model_of(&[b"a", b"x"]);
    assert_eq!(first_violation(&engine, &different), Some("prefix_of_written"));
    let mut fewer = model_of(&[b"a"]);
    fewer.partitions[0].durable_records = 0;
    assert_eq!(first_violation(&engine, &fewer), Some("prefix_of_written"), "an invented record");
    // The model saw the log start at 1 once: the engine's 0 is removed records come back.
    let mut moved_back = model_of(&[b"a", b"b"]);
    moved_back.partitions[0].log_start = 1;
    assert_eq!(first_violation(&engine, &moved_back), Some("retention_bounds"));
    let mut absent = model_of(&[]);
    absent.topic = TopicState::Absent;
    let mut rng = Rng::new(3);
    let scan = oracle::scan(&engine, &absent, &mut rng).unwrap();
    let context = Context {
        model: &absent,
        engine: &engine,
        scan: &scan,
        topic_exists: false,
        now_ms: EPOCH_MS,
    };
    let violation = oracle::check_all(&oracle::standard(), &context, &mut rng).unwrap_err();
    assert_eq!(violation.oracle, "topic_survives");
}
