//! `Consumer`: reads one partition of an embedded data directory in order, remembering its
//! position; in a consumer group, commits it. It follows the one reading rule of
//! [`next_fetch`](crate::next_fetch): caught up means the position reached the high watermark.

use crate::cursor::next_fetch;
use crate::{CommitError, Fetch, Header, Io, Offset, ReadError, Record, SystemIo};
use std::collections::VecDeque;
use std::time::Duration;

/// Reads one partition in order, remembering its position; in a consumer group, commits it.
///
/// A position that retention removed (below the log start) moves to the log start, as Kafka's
/// `auto.offset.reset = earliest`. Iterating a consumer yields owned records until it is caught
/// up; [`Consumer::poll`] hands out borrowed views of whole batches instead.
///
/// Caught up means the position reached the high watermark: fetches of batches that
/// compaction emptied, and the gaps compaction, retention and `delete_records` leave, are read
/// past, never taken for the end (see [`next_fetch`]).
#[derive(Debug)]
pub struct Consumer<I: Io = SystemIo> {
    engine: chronik_engine::Engine<I>,
    topic: String,
    partition: u32,
    position: Offset,
    group: Option<String>,
    /// Records fetched for the iterator and not yet handed out; the position counts only
    /// records handed out, so a commit never skips a buffered one.
    buffered: VecDeque<OwnedRecord>,
    /// Where the position goes once `buffered` is empty: the end of its fetch.
    buffered_end: Offset,
}

/// A record copied out of a fetch, for the iterator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedRecord {
    pub offset: Offset,
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl OwnedRecord {
    /// The headers, borrowed, for [`OwnedRecord::as_record`].
    pub fn header_views(&self) -> Vec<Header<'_>> {
        self.headers.iter().map(|(key, value)| Header { key, value }).collect()
    }

    /// The record, borrowed, to write again (timestamp kept); `headers` are its
    /// [`OwnedRecord::header_views`].
    pub fn as_record<'a>(&'a self, headers: &'a [Header<'a>]) -> Record<'a> {
        Record::new(self.key.as_deref(), &self.value)
            .with_timestamp(self.timestamp)
            .with_headers(headers)
    }
}

/// Bytes one iterator step fetches.
const ITERATOR_FETCH_BYTES: usize = 1 << 20;

impl<I: Io> Clone for Consumer<I> {
    fn clone(&self) -> Self {
        Consumer {
            engine: self.engine.clone(),
            topic: self.topic.clone(),
            partition: self.partition,
            position: self.position,
            group: self.group.clone(),
            buffered: self.buffered.clone(),
            buffered_end: self.buffered_end,
        }
    }
}

impl<I: Io> Consumer<I> {
    /// A consumer of one partition of `engine`, from offset zero (or the log start), in no
    /// group. [`Chronik::consumer`] is the usual way to get one.
    pub fn new(engine: chronik_engine::Engine<I>, topic: &str, partition: u32) -> Self {
        Consumer {
            engine,
            topic: topic.to_owned(),
            partition,
            position: Offset::ZERO,
            group: None,
            buffered: VecDeque::new(),
            buffered_end: Offset::ZERO,
        }
    }

    /// A consumer in consumer group `group`, from where the group committed last (or the
    /// log start). [`Chronik::group_consumer`] is the usual way to get one.
    pub fn in_group(
        engine: chronik_engine::Engine<I>,
        group: &str,
        topic: &str,
        partition: u32,
    ) -> Self {
        let position = engine.committed_offset(group, topic, partition).unwrap_or(Offset::ZERO);
        Consumer {
            position,
            group: Some(group.to_owned()),
            ..Consumer::new(engine, topic, partition)
        }
    }

    /// The topic and partition this consumer reads.
    pub fn partition(&self) -> (&str, u32) {
        (&self.topic, self.partition)
    }

    /// The offset of the next record this consumer reads.
    pub fn position(&self) -> Offset {
        self.position
    }

    pub fn seek(&mut self, offset: Offset) {
        self.position = offset;
        self.buffered.clear();
    }

    /// The consumer group, if any.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Commit the position (the next offset to read) for the group, durably.
    pub fn commit(&self) -> Result<(), CommitError> {
        let Some(group) = &self.group else {
            return Err(CommitError::InvalidGroup {
                name: String::new(),
                reason: "this consumer is in no group (see Chronik::group_consumer)",
            });
        };
        self.engine.commit_offsets(group, &[(&self.topic, self.partition, self.position)])
    }

    /// What the group committed last for this partition.
    pub fn committed(&self) -> Option<Offset> {
        let group = self.group.as_deref()?;
        self.engine.committed_offset(group, &self.topic, self.partition)
    }

    /// Records from the current position on, about `max_bytes` of them, in whole batches;
    /// empty ([`Fetch::is_empty`]) only when caught up. Records before the position in the
    /// first batch are skipped by [`Fetch::records`]. Batches without a record at or past the
    /// position (emptied by compaction) are read past, not returned.
    pub fn poll(&mut self, max_bytes: usize) -> Result<Fetch, ReadError> {
        self.buffered.clear();
        let fetch =
            next_fetch(&self.engine, &self.topic, self.partition, self.position, max_bytes)?;
        // Past the records read (or at the log start, when retention removed the position).
        self.position = fetch.next_offset();
        Ok(fetch)
    }

    /// As [`Consumer::poll`], but when caught up waits up to `timeout` for new records.
    pub fn poll_wait(&mut self, max_bytes: usize, timeout: Duration) -> Result<Fetch, ReadError> {
        let fetch = self.poll(max_bytes)?;
        if !fetch.is_empty() {
            return Ok(fetch);
        }
        if self.engine.wait_for(&self.topic, self.partition, self.position, timeout)? {
            return self.poll(max_bytes);
        }
        Ok(fetch)
    }

    /// Whether the position has reached the high watermark (nothing more to read for now).
    /// A position past it (a seek past the end; a group's commit that a crash in `os` mode
    /// outlived) is [`ReadError::OffsetOutOfRange`], as a read from there is.
    pub fn caught_up(&self) -> Result<bool, ReadError> {
        let end = self.engine.high_watermark(&self.topic, self.partition)?;
        if self.position > end {
            // The read's own error, with the log start and the end in it.
            return self.engine.read(&self.topic, self.partition, self.position, 1).map(|_| false);
        }
        Ok(self.buffered.is_empty() && self.position == end)
    }
}

impl<I: Io> Iterator for Consumer<I> {
    type Item = Result<OwnedRecord, ReadError>;

    /// The next record, or `None` once caught up: the position reached the high watermark
    /// (iterate again later for more).
    fn next(&mut self) -> Option<Self::Item> {
        if self.buffered.is_empty() {
            let fetch = match self.poll(ITERATOR_FETCH_BYTES) {
                Ok(fetch) => fetch,
                Err(error) => return Some(Err(error)),
            };
            let from = fetch.from();
            self.buffered = fetch
                .records()
                .map(|r| OwnedRecord {
                    offset: r.offset(),
                    timestamp: r.timestamp(),
                    key: r.key().map(<[u8]>::to_vec),
                    value: r.value().to_vec(),
                    headers: r.headers().map(|h| (h.key.to_vec(), h.value.to_vec())).collect(),
                })
                .collect();
            self.buffered_end = self.position;
            if self.buffered.is_empty() {
                return None;
            }
            self.position = from;
        }
        let record = self.buffered.pop_front()?;
        self.position =
            if self.buffered.is_empty() { self.buffered_end } else { record.offset.plus(1) };
        Some(Ok(record))
    }
}
