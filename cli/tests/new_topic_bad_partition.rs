//! `chronik produce NEW --partition P` for a topic that does not exist yet: the partition is
//! checked against the partition count the topic would be created with before anything is
//! created (neither the topic nor, when missing, the data directory).

mod common;

use common::{assert_fails, chronik_bytes, text};

#[test]
fn a_bad_partition_for_a_new_topic_creates_nothing() {
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    // No data directory yet: refused before it is created.
    let output = chronik_bytes(&data, &["produce", "new", "--partition", "5"], b"x\n");
    assert_fails(&output, 2, "would be created with 1 partitions", "missing directory");
    assert!(!data.exists(), "the data directory was created");
    let output = chronik_bytes(&data, &["produce", "new", "--create-partitions", "0"], b"x\n");
    assert_fails(&output, 2, "partitions must be in", "no partitions");
    assert!(!data.exists(), "the data directory was created");
    // An existing data directory: no topic created.
    let output = chronik_bytes(&data, &["topic", "create", "t"], b"");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let args = ["produce", "new", "--partition", "3", "--create-partitions", "3"];
    let output = chronik_bytes(&data, &args, b"x\n");
    assert_fails(&output, 2, "would be created with 3 partitions, no 3", "existing directory");
    assert!(output.stdout.is_empty());
    let output = chronik_bytes(&data, &["topic", "list"], b"");
    assert_eq!(text(&output.stdout), "t\n", "{}", text(&output.stderr));
    // A partition the new topic will have is fine.
    let args = ["produce", "new", "--partition", "2", "--create-partitions", "3"];
    let output = chronik_bytes(&data, &args, b"x\n");
    assert_eq!(text(&output.stdout), "2:0\n", "{}", text(&output.stderr));
}
