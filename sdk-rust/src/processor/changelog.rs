//! The records of a changelog topic, as restores on the engine and on a cluster read them.
//! Invariants: a store entry's changelog value is the stored value after one leading byte,
//! [`CHANGELOG_PUT`], so that an empty stored value is not taken for a tombstone (an empty
//! changelog value: the key was deleted); on a Kafka-protocol cluster, every commit of a task
//! ends each changelog partition it wrote with a commit marker, and what follows the last
//! marker is an unfinished commit that no restore applies.

use crate::Offset;
use crate::store::CHANGELOG_PUT;
use std::collections::BTreeMap;

/// A store entry's changelog value as the change it stands for: `None` a deletion (an empty
/// value), `Some(stored)` a put; `Err` if it is not a store entry's value.
pub(crate) fn decode_change(value: &[u8]) -> Result<Option<&[u8]>, ()> {
    match value.split_first() {
        None => Ok(None),
        Some((&CHANGELOG_PUT, stored)) => Ok(Some(stored)),
        Some(_) => Err(()),
    }
}

/// The key and header of a commit marker in a changelog on a Kafka-protocol cluster: every
/// commit of a task ends each of its changelog partitions with one (see `kafka::group`).
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) const MARKER_KEY: &[u8] = b"chronik.commit";
pub(crate) const MARKER_HEADER: &str = "chronik.commit";
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) const MARKER_MAGIC: &[u8; 4] = b"CHCM";

/// A marker's value: the commit's sequence number and its input positions.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) fn decode_marker(bytes: &[u8]) -> Option<(u64, Vec<Offset>)> {
    let rest = bytes.strip_prefix(MARKER_MAGIC)?;
    let (seq, rest) = rest.split_at_checked(8)?;
    if rest.len() % 8 != 0 {
        return None;
    }
    let seq = u64::from_le_bytes(seq.try_into().ok()?);
    let positions = rest
        .chunks_exact(8)
        .map(|c| Offset::new(u64::from_le_bytes(c.try_into().expect("8 bytes"))))
        .collect();
    Some((seq, positions))
}

/// The committed state a changelog partition holds, key order: what a restore of a finished
/// run makes of it. `records` are the partition's records in offset order. Where commit markers
/// are present (a cluster's changelog), what follows the last one is an unfinished commit and
/// is left out. Records that are not store entries are skipped.
pub fn committed_state(records: &[crate::OwnedRecord]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let is_marker =
        |r: &crate::OwnedRecord| r.headers.iter().any(|(k, _)| k == MARKER_HEADER.as_bytes());
    let end = records.iter().rposition(is_marker).unwrap_or(records.len());
    let mut state = BTreeMap::new();
    for record in records[..end].iter().filter(|r| !is_marker(r)) {
        let key = record.key.clone().unwrap_or_default();
        match record.value.split_first() {
            None => {
                state.remove(&key);
            }
            Some((&CHANGELOG_PUT, stored)) => {
                state.insert(key, stored.to_vec());
            }
            Some(_) => {}
        }
    }
    state.into_iter().collect()
}
