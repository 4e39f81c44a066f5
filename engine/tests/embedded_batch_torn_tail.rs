//! A torn, never-synced last batch whose record value carries a whole valid batch (a mirrored
//! fetch, say) is still a torn tail: the carried batch's synced-offset hint is not evidence,
//! because evidence is only read from where the damaged batch's own header says it ends.

mod common;

use chronik_engine::internals::format::{self, BATCH_HEADER_BYTES, RECORD_HEADER_BYTES};
use chronik_engine::{Durability, Offset, Record};
use std::io::Write;

#[test]
fn a_batch_inside_a_torn_value_is_not_evidence_of_a_sync() {
    let directory = tempfile::tempdir().unwrap();
    {
        let (engine, _) = common::open(directory.path(), Durability::Sync);
        engine.create_topic("t", chronik_engine::TopicConfig::default()).unwrap();
        for i in 0..5 {
            common::append_value(&engine, "t", 0, format!("v{i}").as_bytes());
        }
    }
    // The batch the engine would write next (offset 5), whose value holds a batch from a busier
    // partition with a far higher hint.
    let mut inner = Vec::new();
    let mirrored = [Record::new(None, b"mirrored")];
    format::encode_batch(&mut inner, Offset::new(1_000_000), &mirrored, 0, Offset::new(1_000_000))
        .unwrap();
    let mut value = inner.clone();
    value.extend_from_slice(&[7; 200]);
    let mut outer = Vec::new();
    format::encode_batch(&mut outer, Offset::ZERO, &[Record::new(None, &value)], 0, Offset::ZERO)
        .unwrap();
    format::set_batch_offsets(&mut outer, Offset::new(5), Offset::new(5));
    // A machine crash before the fdatasync kept only the first sectors of that write.
    let cut = BATCH_HEADER_BYTES + RECORD_HEADER_BYTES + inner.len() + 20;
    let partition = common::partition_directory(directory.path(), "t", 0);
    let active = common::log_files(&partition).pop().unwrap();
    let mut file = std::fs::OpenOptions::new().append(true).open(&active).unwrap();
    file.write_all(&outer[..cut]).unwrap();
    drop(file);

    let (engine, report) = common::open(directory.path(), Durability::Sync);
    let recovered = &report.partitions[0];
    assert!(recovered.damage.is_empty(), "{recovered:?}");
    assert_eq!(recovered.truncated_bytes, cut as u64);
    assert_eq!(common::append_value(&engine, "t", 0, b"after"), 5);
}
