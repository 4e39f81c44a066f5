//! Store snapshots: every entry of a store and the changelog offset they cover, checksummed.
//!
//! Layout, little endian: magic `CHSS` (4), version 1 (`u16`), changelog offset (`u64`),
//! entry count (`u64`), then per entry key length (`u32`), key, value length (`u32`), value;
//! then the xxh3-64 of everything before it (`u64`). Anything that does not decode is ignored
//! (the restore reads the whole changelog instead).
//!
//! Invariant: what [`decode`] accepts is exactly what [`encode`] wrote, entries in strictly
//! increasing key order; a snapshot is a cache of the changelog, never the only copy.

use crate::Offset;
use std::collections::BTreeMap;

const MAGIC: &[u8; 4] = b"CHSS";
const VERSION: u16 = 1;

/// A store's entries.
pub type Data = BTreeMap<Vec<u8>, Vec<u8>>;
/// A store's entries in key order.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

pub fn encode(offset: Offset, data: &Data) -> Vec<u8> {
    let size: usize = data.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
    let mut bytes = Vec::with_capacity(30 + size);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    bytes.extend_from_slice(&offset.get().to_le_bytes());
    bytes.extend_from_slice(&(data.len() as u64).to_le_bytes());
    for (key, value) in data {
        for part in [key, value] {
            let length = u32::try_from(part.len()).expect("store entries are under 4 GiB");
            bytes.extend_from_slice(&length.to_le_bytes());
            bytes.extend_from_slice(part);
        }
    }
    let checksum = xxhash_rust::xxh3::xxh3_64(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    bytes
}

/// The offset and the entries, in key order.
pub fn decode(bytes: &[u8]) -> Option<(Offset, Entries)> {
    let (body, checksum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(checksum.try_into().ok()?) {
        return None;
    }
    let mut rest = body;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        rest = tail;
        Some(head)
    };
    if take(4)? != MAGIC || u16::from_le_bytes(take(2)?.try_into().ok()?) != VERSION {
        return None;
    }
    let offset = Offset::new(u64::from_le_bytes(take(8)?.try_into().ok()?));
    let count = u64::from_le_bytes(take(8)?.try_into().ok()?);
    // Entries come in key order: collected into a vector, the map is built in one pass.
    let mut entries = Vec::with_capacity(usize::try_from(count).ok()?.min(body.len() / 8));
    for _ in 0..count {
        let mut part = || -> Option<Vec<u8>> {
            let length = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            Some(take(length)?.to_vec())
        };
        let key = part()?;
        let value = part()?;
        entries.push((key, value));
    }
    let sorted = entries.windows(2).all(|pair| pair[0].0 < pair[1].0);
    (rest.is_empty() && sorted).then_some((offset, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_and_any_damage_is_refused() {
        let mut data = BTreeMap::new();
        data.insert(b"a".to_vec(), b"1".to_vec());
        data.insert(b"bb".to_vec(), Vec::new());
        let bytes = encode(Offset::new(42), &data);
        assert_eq!(decode(&bytes), Some((Offset::new(42), data.into_iter().collect())));
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x40;
            assert_eq!(decode(&damaged), None, "byte {i}");
        }
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(decode(&[]), None);
    }
}
