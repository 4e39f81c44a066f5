//! `Options::write_shards`: partitions spread over several write paths, each turned by its
//! own driver. Writers on every partition at once, pipelined appends, a flush and a
//! transaction that span shards, and the runtime's driver threads (one per shard) completing
//! futures: everything acknowledged is there, in order, after a reopen with a different shard
//! count (shards are not part of the data directory).

mod common;

use chronik_engine::internals::EngineInternals;
use chronik_engine::runtime::{Runtime, SystemClock};
use chronik_engine::{Durability, Engine, Options, Record, TopicConfig, TransactionWrite};
use std::sync::Arc;

const TOPIC: &str = "sharded";
const PARTITIONS: u32 = 8;
const PER_WRITER: u32 = 50;

fn open(root: &std::path::Path, shards: usize) -> Engine<chronik_engine::io::SystemIo> {
    let options = Options {
        durability: Durability::Sync,
        write_shards: shards,
        direct_io: common::test_direct_io(),
        ..Options::default()
    };
    Engine::open(common::test_io(), Arc::new(SystemClock), root, options).unwrap().0
}

#[test]
fn partitions_on_several_shards_keep_every_acknowledged_record() {
    let directory = tempfile::tempdir().unwrap();
    let engine = open(directory.path(), 3);
    assert_eq!(engine.write_shards(), 3);
    let config = TopicConfig { partitions: PARTITIONS, ..TopicConfig::default() };
    engine.create_topic(TOPIC, config).unwrap();
    let runtime = Runtime::start(&engine).unwrap();
    // A writer per partition, all at once: each shard's driver role passes among its writers.
    std::thread::scope(|scope| {
        for partition in 0..PARTITIONS {
            let engine = engine.clone();
            scope.spawn(move || {
                for i in 0..PER_WRITER {
                    let value = format!("{partition}-{i}");
                    let appended =
                        engine.append(TOPIC, partition, &[Record::new(None, value.as_bytes())]);
                    assert_eq!(appended.unwrap().base_offset.get(), u64::from(i));
                }
            });
        }
    });
    // Futures on every partition, completed by the shards' driver threads.
    let pending: Vec<_> = (0..PARTITIONS)
        .map(|p| engine.append_nowait(TOPIC, p, &[Record::new(None, b"pipelined")]).unwrap())
        .collect();
    for pending in pending {
        common::block_on(pending).unwrap();
    }
    // A transaction across partitions of different shards, then a flush of all.
    let records = [Record::new(None, b"transaction")];
    let writes: Vec<TransactionWrite<'_>> = (0..PARTITIONS)
        .map(|partition| TransactionWrite { topic: TOPIC, partition, records: &records })
        .collect();
    engine.commit_transaction(&writes, None).unwrap();
    engine.flush().unwrap();
    drop(runtime);
    drop(engine);
    let engine = open(directory.path(), 1);
    for partition in 0..PARTITIONS {
        let values: Vec<Vec<u8>> = common::read_all(&engine, TOPIC, partition, 0, 1 << 20)
            .into_iter()
            .map(|r| r.value)
            .collect();
        let mut expected: Vec<Vec<u8>> =
            (0..PER_WRITER).map(|i| format!("{partition}-{i}").into_bytes()).collect();
        expected.push(b"pipelined".to_vec());
        expected.push(b"transaction".to_vec());
        assert_eq!(values, expected, "partition {partition}");
    }
}
