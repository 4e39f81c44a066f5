//! The restore's decisions on a fake changelog: what a test broker cannot do (compaction,
//! records deleted, a changelog recreated, another cluster) is written here by hand. The
//! oracle is the committed state worked out from the records alone
//! ([`crate::processor::committed_state`]); each test's canary (a deliberate bug of the
//! module) makes it fail.

use super::restore::{
    BUFFER_BYTES, CANARY, Canary, Changelogs, LocalState, Restored, restore_partition,
};
use crate::kafka::group::encode_marker;
use crate::processor::{MARKER_HEADER, ProcessorConfig, ProcessorError, committed_state};
use crate::store::{CHANGELOG_PUT, StoreKind};
use crate::{Offset, OwnedRecord};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// Changelog partitions in memory; partition 0 of each topic only.
#[derive(Default)]
struct Fake {
    topics: RefCell<BTreeMap<String, Vec<OwnedRecord>>>,
    /// Records handed out by reads, all topics together.
    read: RefCell<u64>,
    /// Each commit's marker followed by a transaction's control record (exactly once): an
    /// offset no read returns.
    transactional: bool,
}

impl Fake {
    /// The offset after `record`: one more, or two after a marker in a transaction.
    fn after(&self, record: &OwnedRecord) -> Offset {
        let control = self.transactional && !record.headers.is_empty();
        record.offset.plus(if control { 2 } else { 1 })
    }
}

impl Changelogs for Fake {
    fn end(&self, topic: &str, _partition: u32) -> Result<Offset, ProcessorError> {
        let topics = self.topics.borrow();
        let last = topics.get(topic).and_then(|records| records.last());
        Ok(last.map_or(Offset::ZERO, |r| self.after(r)))
    }

    fn read(
        &self,
        topic: &str,
        _partition: u32,
        from: Offset,
        each: &mut dyn FnMut(OwnedRecord) -> Result<bool, ProcessorError>,
    ) -> Result<(), ProcessorError> {
        let records = self.topics.borrow().get(topic).cloned().unwrap_or_default();
        for record in records.into_iter().filter(|r| r.offset >= from) {
            *self.read.borrow_mut() += 1;
            if !each(record)? {
                break;
            }
        }
        Ok(())
    }
}

enum Entry<'a> {
    Put(&'a str, &'a str),
    Delete(&'a str),
    /// A commit marker: its sequence number and input position.
    Commit(u64, u64),
}
use Entry::{Commit, Delete, Put};

impl Fake {
    fn append(&self, topic: &str, entries: &[Entry<'_>]) {
        let mut topics = self.topics.borrow_mut();
        let records = topics.entry(topic.to_owned()).or_default();
        for entry in entries {
            let offset = records.last().map_or(Offset::ZERO, |r| self.after(r));
            let (key, value, headers) = match entry {
                Put(key, value) => {
                    let mut tagged = vec![CHANGELOG_PUT];
                    tagged.extend_from_slice(value.as_bytes());
                    (key.as_bytes().to_vec(), tagged, Vec::new())
                }
                Delete(key) => (key.as_bytes().to_vec(), Vec::new(), Vec::new()),
                Commit(seq, position) => {
                    let marker = encode_marker(*seq, &[Offset::new(*position)]);
                    let header = (MARKER_HEADER.as_bytes().to_vec(), Vec::new());
                    (b"chronik.commit".to_vec(), marker, vec![header])
                }
            };
            records.push(OwnedRecord { offset, timestamp: 0, key: Some(key), value, headers });
        }
    }

    /// Compaction: only the last record of each key stays, tombstones included unless
    /// `drop_tombstones` (their retention ran out).
    fn compact(&self, topic: &str, drop_tombstones: bool) {
        let mut topics = self.topics.borrow_mut();
        let records = topics.get_mut(topic).unwrap();
        let last: BTreeMap<Vec<u8>, Offset> =
            records.iter().map(|r| (r.key.clone().unwrap(), r.offset)).collect();
        records.retain(|r| {
            last[r.key.as_ref().unwrap()] == r.offset && !(drop_tombstones && r.value.is_empty())
        });
    }

    fn committed(&self, topic: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        committed_state(&self.topics.borrow()[topic])
    }
}

const CHANGELOG: &str = "app-counts-changelog";
const OTHER: &str = "app-seen-changelog";

fn config(other: bool) -> ProcessorConfig {
    let config = ProcessorConfig::new("app", "input").store_with("counts", StoreKind::disk());
    if other { config.store("seen") } else { config }
}

fn local(directory: &std::path::Path, cluster: &str) -> LocalState {
    let io = chronik_engine::io::SystemIo::new(chronik_engine::io::Backend::Pread).unwrap();
    let budgets = [("counts".to_owned(), crate::store::StoreMemory::new(8 << 20))].into();
    LocalState {
        directory: directory.to_owned(),
        io: std::sync::Arc::new(io),
        cluster: cluster.to_owned(),
        budgets,
    }
}

/// Restore partition 0, then let the task's end flush the disk store where the restored
/// commit ends (as the first commit after it would).
fn restore(fake: &Fake, config: &ProcessorConfig, local: &LocalState) -> Restored {
    let mut restored = restore_partition(fake, config, 0, Some(local)).unwrap();
    let end = restored.ends.iter().find(|(topic, _)| topic == CHANGELOG).unwrap().1;
    restored.stores.get_mut("counts").unwrap().disk_mut().unwrap().flush(end).unwrap();
    restored
}

fn entries(restored: &Restored, store: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let store = &restored.stores[store];
    store.into_iter().map(|e| e.unwrap()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

/// Three commits and an unfinished fourth; then the store's files and a tail.
fn history(fake: &Fake) {
    fake.append(CHANGELOG, &[Put("a", "1"), Put("b", "1"), Commit(1, 10)]);
    fake.append(CHANGELOG, &[Put("a", "2"), Delete("b"), Put("c", "1"), Commit(2, 20)]);
    fake.append(CHANGELOG, &[Put("d", "1"), Commit(3, 30)]);
    fake.append(CHANGELOG, &[Put("a", "junk"), Put("e", "junk")]);
}

#[test]
fn a_reopened_disk_store_reads_only_the_tail_after_its_marker() {
    reopened(&Fake::default());
}

#[test]
fn a_reopened_disk_store_reads_only_the_tail_after_its_marker_in_transactions() {
    reopened(&Fake { transactional: true, ..Fake::default() });
}

fn reopened(fake: &Fake) {
    let dir = tempfile::tempdir().unwrap();
    let local = local(dir.path(), "one");
    let (config, reasons) = listened(config(false));
    history(fake);
    let first = restore(fake, &config, &local);
    assert!(rebuilt(&reasons, "missing"));
    assert_eq!(first.positions, Some(vec![Offset::new(30)]));
    assert_eq!(entries(&first, "counts"), fake.committed(CHANGELOG));
    // The unfinished commit is written back as committed: "a" as "2", "e" deleted.
    let repairs: Vec<_> = first.repairs.iter().map(|(_, k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(repairs, vec![(b"a".to_vec(), b"\x012".to_vec()), (b"e".to_vec(), Vec::new())]);
    drop(first);
    // The repairs and a commit after them, then a restart: from the marker of commit 3 on.
    fake.append(CHANGELOG, &[Put("a", "2"), Delete("e"), Put("f", "1"), Commit(4, 40)]);
    *fake.read.borrow_mut() = 0;
    let second = restore(fake, &config, &local);
    assert_eq!(reasons.lock().unwrap().last(), Some(&None), "not rebuilt");
    assert_eq!(second.stats.stores_opened, 1);
    assert_eq!(second.stats.restored, 5, "the tail's changes only");
    assert_eq!(*fake.read.borrow(), 1 + 6, "the marker before the files' offset, and the tail");
    assert_eq!(second.positions, Some(vec![Offset::new(40)]));
    assert_eq!(entries(&second, "counts"), fake.committed(CHANGELOG));
}

/// Why the disk store was rebuilt at each restore of `config` (`None`: it was not).
type Reasons = std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>;

/// `config`, with a restore listener that keeps why the disk store was rebuilt.
fn listened(config: ProcessorConfig) -> (ProcessorConfig, Reasons) {
    let reasons = Reasons::default();
    let kept = std::sync::Arc::clone(&reasons);
    let config = config.on_restore(move |progress| {
        if progress.store == "counts" && progress.done {
            kept.lock().unwrap().push(progress.rebuilt.map(str::to_owned));
        }
    });
    (config, reasons)
}

/// Whether the last restore rebuilt the disk store for a reason starting with `word`.
fn rebuilt(reasons: &Reasons, word: &str) -> bool {
    let last = reasons.lock().unwrap().last().cloned().flatten();
    last.is_some_and(|reason| reason.starts_with(word) || reason.contains(&format!("({word})")))
}

/// Store entries: key, value.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// The store restored after compaction ran past its files, and the committed state.
fn compacted_past_the_files(canary_on: bool) -> (Entries, Entries) {
    let dir = tempfile::tempdir().unwrap();
    let (fake, local) = (Fake::default(), local(dir.path(), "one"));
    let (config, reasons) = listened(config(false));
    history(&fake);
    drop(restore(&fake, &config, &local));
    // Another machine deletes "c" and commits twice more; compaction then drops the marker
    // the files were flushed at, and the tombstone of "c".
    fake.append(CHANGELOG, &[Put("a", "2"), Delete("e"), Delete("c"), Commit(4, 40)]);
    fake.append(CHANGELOG, &[Put("g", "1"), Commit(5, 50)]);
    fake.compact(CHANGELOG, true);
    CANARY.with(|c| c.set(canary_on.then_some(Canary::TrustFiles)));
    let restored = restore(&fake, &config, &local);
    CANARY.with(|c| c.set(None));
    if !canary_on {
        assert!(rebuilt(&reasons, "compacted"));
        assert_eq!(restored.stats.stores_rebuilt, 1);
    }
    (entries(&restored, "counts"), fake.committed(CHANGELOG))
}

#[test]
fn a_changelog_compacted_past_the_files_rebuilds_the_store() {
    let (restored, expected) = compacted_past_the_files(false);
    assert_eq!(restored, expected);
    assert!(!restored.iter().any(|(k, _)| k == b"c"), "the deleted key stays deleted");
}

#[test]
fn canary_files_trusted_past_compaction_keep_a_deleted_key() {
    let (restored, expected) = compacted_past_the_files(true);
    assert_ne!(restored, expected);
    assert!(restored.iter().any(|(k, _)| k == b"c"), "the tombstone compacted away was missed");
}

#[test]
fn files_of_another_cluster_or_past_the_changelog_end_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let (config, reasons) = listened(config(false));
    history(&fake);
    drop(restore(&fake, &config, &local(dir.path(), "one")));
    // Another cluster with the same topic names: foreign files.
    let restored = restore(&fake, &config, &local(dir.path(), "two"));
    assert!(rebuilt(&reasons, "foreign"), "the identity differs");
    assert_eq!(entries(&restored, "counts"), fake.committed(CHANGELOG));
    drop(restored);
    // The changelog deleted and written again, shorter: the files are past its end.
    let fake = Fake::default();
    fake.append(CHANGELOG, &[Put("z", "1"), Commit(1, 5)]);
    let restored = restore(&fake, &config, &local(dir.path(), "two"));
    assert!(rebuilt(&reasons, "stale"));
    assert_eq!(entries(&restored, "counts"), fake.committed(CHANGELOG));
    assert_eq!(restored.positions, Some(vec![Offset::new(5)]));
}

/// A crash between the markers of one commit: the disk store's changelog has commit 4, the
/// memory store's ends at commit 3.
fn crash_between_markers(canary_on: bool) -> Restored {
    let dir = tempfile::tempdir().unwrap();
    let (fake, local, config) = (Fake::default(), local(dir.path(), "one"), config(true));
    history(&fake);
    fake.append(
        OTHER,
        &[Put("x", "1"), Commit(1, 10), Commit(2, 20), Put("y", "1"), Commit(3, 30)],
    );
    fake.append(CHANGELOG, &[Put("a", "4"), Commit(4, 40)]);
    fake.append(OTHER, &[Put("y", "4")]);
    CANARY.with(|c| c.set(canary_on.then_some(Canary::ApplyHeld)));
    let restored = restore_partition(&fake, &config, 0, Some(&local)).unwrap();
    CANARY.with(|c| c.set(None));
    restored
}

#[test]
fn a_commit_one_changelog_lacks_is_undone_in_the_others() {
    let restored = crash_between_markers(false);
    assert_eq!((restored.commit, restored.seq), (3, 4), "commit 3 restored, 4 seen");
    assert_eq!(restored.positions, Some(vec![Offset::new(30)]));
    let counts = entries(&restored, "counts");
    assert!(counts.contains(&(b"a".to_vec(), b"2".to_vec())), "{counts:?}");
    let seen = entries(&restored, "seen");
    assert_eq!(seen, vec![(b"x".to_vec(), b"1".to_vec()), (b"y".to_vec(), b"1".to_vec())]);
    let mut repairs: Vec<_> =
        restored.repairs.iter().map(|(t, k, _)| (t.as_str(), k.clone())).collect();
    repairs.sort();
    let expected = [(CHANGELOG, "a"), (CHANGELOG, "e"), (OTHER, "y")];
    assert_eq!(repairs, expected.map(|(t, k)| (t, k.as_bytes().to_vec())));
}

#[test]
fn canary_a_commit_applied_where_another_changelog_lacks_it() {
    let restored = crash_between_markers(true);
    let counts = entries(&restored, "counts");
    assert!(counts.contains(&(b"a".to_vec(), b"4".to_vec())), "commit 4 applied: {counts:?}");
}

#[test]
fn a_store_new_to_the_application_keeps_the_others_state() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, local, config) = (Fake::default(), local(dir.path(), "one"), config(true));
    history(&fake);
    let restored = restore_partition(&fake, &config, 0, Some(&local)).unwrap();
    assert_eq!(restored.seq, 3);
    assert_eq!(restored.positions, Some(vec![Offset::new(30)]));
    assert!(entries(&restored, "seen").is_empty());
    assert_eq!(entries(&restored, "counts"), fake.committed(CHANGELOG));
}

#[test]
fn a_second_process_waits_for_the_partition_lock() {
    let dir = tempfile::tempdir().unwrap();
    let local = local(dir.path(), "one");
    let held = local.lock("app-counts-0.store").unwrap();
    let other = std::fs::File::open(dir.path().join("app-counts-0.store.lock")).unwrap();
    assert!(matches!(other.try_lock(), Err(std::fs::TryLockError::WouldBlock)));
    // Another store of the same partition (a second stage's, on a thread of this process).
    let beside = local.lock("app-seen-0.store").unwrap();
    drop(held);
    assert!(other.try_lock().is_ok(), "free once its holder is gone");
    drop(beside);
}

/// Commit 4 of one owner reached the first changelog only; the next owner, restored at 3,
/// numbers its commit 5 (past every number seen) and it reaches the second only.
fn two_unfinished_owners(canary: Option<Canary>) -> Restored {
    let dir = tempfile::tempdir().unwrap();
    let (fake, local, config) = (Fake::default(), local(dir.path(), "one"), config(true));
    history(&fake);
    fake.append(OTHER, &[Put("x", "1"), Commit(3, 30)]);
    fake.append(CHANGELOG, &[Put("a", "undone"), Commit(4, 40)]);
    let restored = restore_partition(&fake, &config, 0, Some(&local)).unwrap();
    assert_eq!((restored.commit, restored.seq), (3, 4));
    drop(restored);
    fake.append(CHANGELOG, &[Put("a", "2"), Delete("e"), Put("h", "1")]);
    fake.append(OTHER, &[Put("x", "5"), Commit(5, 41)]);
    CANARY.with(|c| c.set(canary));
    let restored = restore_partition(&fake, &config, 0, Some(&local));
    CANARY.with(|c| c.set(None));
    restored.unwrap()
}

#[test]
fn a_commit_number_names_one_commit_and_the_restore_takes_the_last_every_changelog_holds() {
    let restored = two_unfinished_owners(None);
    assert_eq!((restored.commit, restored.seq), (3, 5));
    assert_eq!(restored.positions, Some(vec![Offset::new(30)]));
    let counts = entries(&restored, "counts");
    assert!(counts.contains(&(b"a".to_vec(), b"2".to_vec())), "{counts:?}");
    assert!(!counts.iter().any(|(k, _)| k == b"h"), "{counts:?}");
    assert_eq!(entries(&restored, "seen"), vec![(b"x".to_vec(), b"1".to_vec())]);
}

#[test]
fn canary_the_lowest_last_commit_mixes_two_owners_commits() {
    let restored = two_unfinished_owners(Some(Canary::LowestLast));
    assert_eq!(restored.commit, 4);
    assert_eq!(restored.positions, Some(vec![Offset::new(40)]), "the undone commit's positions");
}

#[test]
fn a_store_ahead_by_two_commits_is_read_again_to_the_common_one() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, local, config) = (Fake::default(), local(dir.path(), "one"), config(true));
    let (config, reasons) = listened(config);
    history(&fake);
    fake.append(OTHER, &[Put("x", "1"), Commit(1, 10)]);
    let restored = restore_partition(&fake, &config, 0, Some(&local)).unwrap();
    assert_eq!(restored.commit, 1);
    assert!(rebuilt(&reasons, "ahead"), "{reasons:?}");
    let counts = entries(&restored, "counts");
    let expected =
        [("a", "1"), ("b", "1")].map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()));
    assert_eq!(counts, expected.to_vec());
    let mut repaired: Vec<_> = restored.repairs.iter().map(|(_, k, _)| k.clone()).collect();
    repaired.sort();
    assert_eq!(repaired, ["a", "b", "c", "d", "e"].map(|k| k.as_bytes().to_vec()));
}

#[test]
fn changes_past_the_buffer_are_applied_and_read_again_only_when_not_committed() {
    // A buffer of 8 bytes: every change is applied as it is read.
    BUFFER_BYTES.with(|b| b.set(8));
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fake = Fake::default();
    let (listening, reasons) = listened(config(false));
    history(&fake);
    let restored =
        restore_partition(&fake, &listening, 0, Some(&local(first.path(), "one"))).unwrap();
    assert!(rebuilt(&reasons, "ahead"), "the unfinished commit was applied: read again");
    assert_eq!(entries(&restored, "counts"), fake.committed(CHANGELOG));
    drop(restored);
    let fake = Fake::default();
    fake.append(CHANGELOG, &[Put("a", "1"), Put("b", "1"), Delete("a"), Commit(1, 10)]);
    let restored =
        restore_partition(&fake, &config(false), 0, Some(&local(second.path(), "one"))).unwrap();
    BUFFER_BYTES.with(|b| b.set(64 << 20));
    assert_eq!(restored.stats.stores_rebuilt, 1, "missing only");
    assert_eq!(entries(&restored, "counts"), fake.committed(CHANGELOG));
}
