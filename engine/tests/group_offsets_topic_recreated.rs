//! A consumer group's committed offsets of a topic go with the topic: after `delete_topic`
//! and `create_topic` of the same name, the group has no position on the new topic (it starts
//! empty, and the old position would point past its end), also after a reopen, while its
//! positions on other topics stay.

mod common;

use chronik_engine::{Durability, Offset, TopicConfig};

#[test]
fn a_recreated_topic_does_not_inherit_the_old_ones_committed_offsets() {
    let directory = tempfile::tempdir().unwrap();
    let (engine, _) = common::open(directory.path(), Durability::Sync);
    let config = TopicConfig::default().with_partitions(2);
    engine.create_topic("doomed", config).unwrap();
    engine.create_topic("kept", config).unwrap();
    for i in 0..10 {
        common::append_value(&engine, "doomed", 0, format!("old-{i}").as_bytes());
    }
    let positions = [("doomed", 0, Offset::new(10)), ("doomed", 1, Offset::ZERO)];
    engine.commit_offsets("billing", &positions).unwrap();
    engine.commit_offsets("billing", &[("kept", 1, Offset::new(7))]).unwrap();

    engine.delete_topic("doomed").unwrap();
    assert_eq!(engine.committed_offset("billing", "doomed", 0), None, "after the delete");
    engine.create_topic("doomed", config).unwrap();
    let check = |engine: &common::Engine, when: &str| {
        for partition in 0..2 {
            let found = engine.committed_offset("billing", "doomed", partition);
            assert_eq!(found, None, "{when}: partition {partition} inherited {found:?}");
        }
        assert_eq!(engine.committed_offset("billing", "kept", 1), Some(Offset::new(7)), "{when}");
        assert_eq!(engine.committed_offsets("billing"), vec![("kept".into(), 1, Offset::new(7))]);
    };
    check(&engine, "after the create");
    drop(engine);
    let (engine, report) = common::open(directory.path(), Durability::Sync);
    assert!(report.is_clean(), "{report:?}");
    check(&engine, "after a reopen");
}
