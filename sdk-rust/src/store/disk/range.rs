//! A disk store's range: the pending changes over the memtable over the runs, merged in key
//! order, the newest change of a key winning.

use super::{DiskStore, untag};
use crate::store::merge::MergeHeap;
use crate::store::{StoreError, bounds_ordered, is_empty_range};
use std::borrow::Cow;
use std::ops::Bound;

type Tagged<'a> = std::iter::Peekable<std::collections::btree_map::Range<'a, Vec<u8>, Vec<u8>>>;

/// The pending changes over the memtable, in key order: a pending change wins a key both
/// hold. Yields tagged values (empty for a deletion).
struct Newest<'a> {
    pending: Tagged<'a>,
    memtable: Tagged<'a>,
}

impl<'a> Iterator for Newest<'a> {
    type Item = (&'a Vec<u8>, &'a Vec<u8>);

    fn next(&mut self) -> Option<Self::Item> {
        let order = match (self.pending.peek(), self.memtable.peek()) {
            (Some((p, _)), Some((m, _))) => p.cmp(m),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, _) => return self.memtable.next(),
        };
        match order {
            std::cmp::Ordering::Less => self.pending.next(),
            std::cmp::Ordering::Equal => {
                self.memtable.next();
                self.pending.next()
            }
            std::cmp::Ordering::Greater => self.memtable.next(),
        }
    }
}

/// A merged range over the pending changes, the memtable and runs; iterating yields live
/// entries. A read that fails is its last item, also remembered in the store
/// ([`DiskStore::take_failure`]).
pub struct DiskRange<'a> {
    store: &'a DiskStore,
    memtable: std::iter::Peekable<Newest<'a>>,
    runs: MergeHeap,
    high: Bound<Vec<u8>>,
    done: bool,
}

impl std::fmt::Debug for DiskRange<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskRange").field("done", &self.done).finish_non_exhaustive()
    }
}

impl<'a> DiskRange<'a> {
    pub(super) fn new(store: &'a DiskStore, low: Bound<&[u8]>, high: Bound<&[u8]>) -> Self {
        let empty = is_empty_range(low, high);
        assert!(empty || bounds_ordered(low, high), "a range's bounds are in order");
        // BTreeMap::range panics on bounds out of order: an empty range reads nothing.
        let bounds = if empty { (Bound::Unbounded, Bound::Unbounded) } else { (low, high) };
        let memtable = Newest {
            pending: store.pending.range::<[u8], _>(bounds).peekable(),
            memtable: store.memtable.range::<[u8], _>(bounds).peekable(),
        };
        let runs = if empty { &[][..] } else { &store.runs[..] };
        DiskRange {
            store,
            memtable: memtable.peekable(),
            runs: MergeHeap::new(runs.iter().cloned(), low),
            high: high.map(<[u8]>::to_vec),
            done: empty,
        }
    }

    fn failed(&mut self, error: StoreError) -> Result<Entry<'a>, StoreError> {
        self.done = true;
        Err(self.store.fail(error))
    }
}

type Entry<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// Whether `key` lies past a range's `high` bound.
fn beyond(high: &Bound<Vec<u8>>, key: &[u8]) -> bool {
    match high {
        Bound::Included(high) => key > high.as_slice(),
        Bound::Excluded(high) => key >= high.as_slice(),
        Bound::Unbounded => false,
    }
}

impl<'a> Iterator for DiskRange<'a> {
    type Item = Result<Entry<'a>, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let run = match self.runs.peek(self.store) {
                Ok(entry) => entry,
                Err(error) => return Some(self.failed(error)),
            };
            // The memtable is newer than every run: it wins a key they share.
            let from_memtable = match (self.memtable.peek(), run) {
                (None, None) => {
                    self.done = true;
                    return None;
                }
                (Some(_), None) => Some(false),
                (None, Some(_)) => None,
                (Some((m, _)), Some((r, _))) => match m.as_slice().cmp(r) {
                    std::cmp::Ordering::Less => Some(false),
                    std::cmp::Ordering::Equal => Some(true),
                    std::cmp::Ordering::Greater => None,
                },
            };
            let (key, value): (Cow<'a, [u8]>, Option<Cow<'a, [u8]>>) =
                if let Some(shadows) = from_memtable {
                    let (key, value) = self.memtable.next().expect("peeked");
                    if shadows && let Err(error) = self.runs.advance(self.store) {
                        return Some(self.failed(error));
                    }
                    (Cow::Borrowed(key.as_slice()), untag(value).map(Cow::Borrowed))
                } else {
                    let (key, value) = run.expect("a run has the smallest key");
                    // Checked before the runs move on, which may read (a block past the range).
                    if beyond(&self.high, key) {
                        self.done = true;
                        return None;
                    }
                    let owned = (key.to_vec(), value.map(<[u8]>::to_vec));
                    if let Err(error) = self.runs.advance(self.store) {
                        return Some(self.failed(error));
                    }
                    (Cow::Owned(owned.0), owned.1.map(Cow::Owned))
                };
            // The memtable's range has the bound already, and a run's key was checked above.
            debug_assert!(!beyond(&self.high, &key), "a range yields keys within its bound");
            if let Some(value) = value {
                return Some(Ok((key, value)));
            }
        }
        None
    }
}
