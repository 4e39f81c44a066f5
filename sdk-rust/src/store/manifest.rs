//! A disk store's manifest: the one file naming its runs, their levels, and the changelog
//! offset the store reflects. Replaced whole and atomically; a run is named here only once it
//! is durable. Invariants (asserted before encoding, refused as damage when decoding): run ids
//! below the next id, levels never decreasing from newest to oldest.

use super::run::{self, RunMeta, verified};

pub(super) const MANIFEST_MAGIC: &[u8; 4] = b"CHSM";
pub(super) const MANIFEST_VERSION: u16 = 2;
/// Bytes of a run's record: id, level and 7 zero bytes, file length, entries, and (from
/// version 2) the run's live-key change.
const RUN_RECORD_BYTES: usize = 40;

/// What the manifest records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Manifest {
    pub identity: String,
    pub offset: u64,
    /// The store's keys at that offset, estimated (the sum of the runs' `live`).
    pub len: u64,
    pub next_id: u64,
    pub runs: Vec<RunMeta>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        // Pair with `decode` and `DiskStore::load`, which refuse a manifest breaking these.
        assert!(self.runs.iter().all(|r| r.id < self.next_id), "run ids are below the next id");
        assert!(
            self.runs.windows(2).all(|pair| pair[0].level <= pair[1].level),
            "levels never decrease from newest to oldest"
        );
        assert!(u32::try_from(self.identity.len()).is_ok(), "an identity's length fits u32");
        let mut bytes =
            Vec::with_capacity(64 + self.identity.len() + self.runs.len() * RUN_RECORD_BYTES);
        bytes.extend_from_slice(MANIFEST_MAGIC);
        bytes.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
        bytes.extend_from_slice(&[0, 0]);
        bytes.extend_from_slice(&(self.identity.len() as u32).to_le_bytes());
        bytes.extend_from_slice(self.identity.as_bytes());
        for field in [self.offset, self.len, self.next_id, self.runs.len() as u64] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
        for run in &self.runs {
            bytes.extend_from_slice(&run.id.to_le_bytes());
            bytes.extend_from_slice(&[run.level, 0, 0, 0, 0, 0, 0, 0]);
            bytes.extend_from_slice(&run.bytes.to_le_bytes());
            bytes.extend_from_slice(&run.entries.to_le_bytes());
            bytes.extend_from_slice(&run.live.to_le_bytes());
        }
        // Pair with `decode`, which reads exactly these fields and refuses bytes left over.
        assert_eq!(
            bytes.len(),
            12 + self.identity.len() + 32 + self.runs.len() * RUN_RECORD_BYTES,
            "a manifest is its header, identity, counts and runs"
        );
        let sum = run::checksum(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
        // Pair assertion: what is about to be written reads back as written.
        debug_assert_eq!(Manifest::decode(&bytes).as_ref(), Some(self), "a manifest round-trips");
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Option<Manifest> {
        let body = verified(bytes)?;
        let mut rest = body;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = rest.split_at_checked(n)?;
            rest = tail;
            Some(head)
        };
        if take(4)? != MANIFEST_MAGIC {
            return None;
        }
        // Version 1 kept no run's live-key change: its exact count goes to the oldest run.
        let version = u16::from_le_bytes(take(2)?.try_into().ok()?);
        if version != 1 && version != MANIFEST_VERSION {
            return None;
        }
        take(2)?;
        let length = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let identity = String::from_utf8(take(length)?.to_vec()).ok()?;
        let mut u64_field =
            || -> Option<u64> { Some(u64::from_le_bytes(take(8)?.try_into().ok()?)) };
        let (offset, len, next_id, count) =
            (u64_field()?, u64_field()?, u64_field()?, u64_field()?);
        let mut runs = Vec::new();
        for _ in 0..count {
            let id = u64::from_le_bytes(take(8)?.try_into().ok()?);
            let level = take(8)?[0];
            let bytes = u64::from_le_bytes(take(8)?.try_into().ok()?);
            let entries = u64::from_le_bytes(take(8)?.try_into().ok()?);
            let live = match version {
                1 => 0,
                _ => i64::from_le_bytes(take(8)?.try_into().ok()?),
            };
            // Damage (or a manifest we would never write) is refused here, not asserted.
            let older = runs.last().is_some_and(|newer: &RunMeta| newer.level > level);
            if id >= next_id || older {
                return None;
            }
            runs.push(RunMeta { id, level, bytes, entries, live });
        }
        if version == 1
            && let Some(oldest) = runs.last_mut()
        {
            oldest.live = i64::try_from(len).ok()?;
        }
        rest.is_empty().then_some(Manifest { identity, offset, len, next_id, runs })
    }
}
