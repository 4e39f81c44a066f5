//! The one rule by which every reader of a partition moves on, shared by every surface that
//! reads a log: the [`Consumer`](crate::Consumer) (iterator, `poll`, `poll_wait`), group
//! consumers, [`Connection`](crate::Connection), the CLI's `consume` and `mirror`, and the
//! Python consumer.
//!
//! A reader is caught up when its position reaches the high watermark, and only then. A fetch
//! that holds no record at or past the position is not the end: compaction empties batches
//! (their offsets stay, their records go), and an early stretch of a compacted changelog may
//! be thousands of such batches before the first record that survived. The engine's read
//! returns no batch at all exactly when the position is the high watermark (batches are
//! contiguous, compacted ones included), so that is the test.

use chronik_engine::canary::{self, Canary};
use chronik_engine::io::Io;
use chronik_engine::{Engine, Fetch, Offset, ReadError};

/// The next fetch of `topic`/`partition` at or after `from` that holds a record, or an empty
/// fetch (no batch, [`Fetch::is_empty`]) when `from` is the high watermark. A `from` that
/// retention or `delete_records` removed reads from the log start instead (Kafka's
/// `auto.offset.reset = earliest`); a `from` past the high watermark is
/// [`ReadError::OffsetOutOfRange`], at once. [`Fetch::from`] says where the fetch was read
/// from, and [`Fetch::next_offset`] where the next one starts: the reader's new position.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// let db = chronik::Chronik::open(dir.path(), chronik::Options::default())?;
/// db.create_topic("t", chronik::TopicConfig::default())?;
/// db.producer("t").send(chronik::Record::new(None, b"a"))?;
/// let fetch = chronik::next_fetch(db.engine(), "t", 0, chronik::Offset::ZERO, 1 << 20)?;
/// assert_eq!(fetch.records().count(), 1);
/// let end = chronik::next_fetch(db.engine(), "t", 0, fetch.next_offset(), 1 << 20)?;
/// assert!(end.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn next_fetch<I: Io>(
    engine: &Engine<I>,
    topic: &str,
    partition: u32,
    from: Offset,
    max_bytes: usize,
) -> Result<Fetch, ReadError> {
    skip_recordless(from, |from| read_in_range(engine, topic, partition, from, max_bytes))
}

/// One engine read at `from`, or at the log start when `from` is below it.
pub(crate) fn read_in_range<I: Io>(
    engine: &Engine<I>,
    topic: &str,
    partition: u32,
    from: Offset,
    max_bytes: usize,
) -> Result<Fetch, ReadError> {
    match engine.read(topic, partition, from, max_bytes) {
        Err(ReadError::OffsetOutOfRange { requested, start, .. }) if requested < start => {
            engine.read(topic, partition, Offset::new(start), max_bytes)
        }
        other => other,
    }
}

/// Read with `read` from `from` on until a fetch holds a record at or past where it was read
/// from, or holds no batch (the end). Each fetch of batches moves `from` forward, so this
/// ends: at the latest at the high watermark.
fn skip_recordless<E>(
    mut from: Offset,
    mut read: impl FnMut(Offset) -> Result<Fetch, E>,
) -> Result<Fetch, E> {
    loop {
        let fetch = read(from)?;
        if fetch.is_empty() || fetch.records().next().is_some() {
            return Ok(fetch);
        }
        if canary::active(Canary::ReaderStopsAtEmptyFetch) {
            // The bug: "this fetch held no record" taken for "caught up".
            let stop = Fetch::from_records(from, from, &[]).expect("an empty fetch is valid");
            return Ok(stop);
        }
        let next = fetch.next_offset();
        assert!(
            next > from && next > fetch.from(),
            "a fetch of batches ends past where it was read from ({from} -> {next})"
        );
        from = next;
    }
}
