//! [`CountByKey`]: the processor the workspace's tests count with, so that each of them does
//! not write its own. It keeps the same encoding everywhere (an 8-byte little-endian count
//! per key), so a test's helpers that read the store back agree with every other test's.

use crate::RecordView;
use crate::processor::{Context, ProcessError, Processor};

/// How [`CountByKey`] writes a key's new count to its output topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountEncoding {
    /// 8 bytes, little-endian, as in the store.
    LittleEndian,
    /// The count in decimal ASCII digits, as `u64::to_string` writes it.
    Decimal,
}

/// A test processor that counts records per key: each record adds one to its key's count in
/// a store (an 8-byte little-endian `u64`; a record without a key counts under the empty
/// key), and, when asked, emits the new count to an output topic under the same key. It can
/// also fail on purpose, to stand for a crash in the middle of a run.
///
/// A factory makes one per task; the builder methods set it up:
///
/// ```
/// use chronik::processor::{ProcessorConfig, Runner};
/// use chronik::testing::{CountByKey, CountEncoding};
/// use chronik::{Chronik, Options, Record, TopicConfig};
///
/// let dir = tempfile::tempdir().unwrap();
/// let chronik = Chronik::open(dir.path(), Options::default()).unwrap();
/// chronik.create_topic("clicks", TopicConfig::default()).unwrap();
/// chronik.create_topic("totals", TopicConfig::default()).unwrap();
/// for key in ["ann", "bob", "ann"] {
///     let record = Record::new(Some(key.as_bytes()), b"click");
///     chronik.engine().append("clicks", 0, &[record]).unwrap();
/// }
///
/// let config = ProcessorConfig::new("counter", "clicks").store("counts");
/// let counter = CountByKey::new("counts").emit("totals", CountEncoding::Decimal);
/// let mut runner = Runner::new(chronik.engine(), config, move |_| counter.clone()).unwrap();
/// runner.run_until_caught_up().unwrap();
///
/// let ann = runner.store(0, "counts").unwrap().get(b"ann").unwrap().unwrap();
/// assert_eq!(u64::from_le_bytes((*ann).try_into().unwrap()), 2);
/// let totals: Vec<_> = chronik.consumer("totals", 0).map(|r| r.unwrap().value).collect();
/// assert_eq!(totals, [b"1".to_vec(), b"1".to_vec(), b"2".to_vec()]);
///
/// // One that fails on the record at offset 1 of any partition.
/// let config = ProcessorConfig::new("failing", "clicks").store("counts");
/// let failing = |_| CountByKey::new("counts").fail_at_offset(1);
/// let mut runner = Runner::new(chronik.engine(), config, failing).unwrap();
/// assert!(runner.run_until_caught_up().is_err());
/// assert_eq!(chronik.committed_offset("failing", "clicks", 0), None);
/// ```
#[derive(Clone, Debug)]
pub struct CountByKey {
    store: String,
    output: Option<(String, CountEncoding)>,
    fail_at_offset: Option<u64>,
    fail_at_record: Option<u64>,
    /// Records this processor was given, to find the one `fail_at_record` names.
    records: u64,
}

impl CountByKey {
    /// Counts into the store `store` (which the processor's config must declare) and emits
    /// nothing.
    pub fn new(store: &str) -> CountByKey {
        assert!(!store.is_empty(), "a store has a name");
        CountByKey {
            store: store.to_owned(),
            output: None,
            fail_at_offset: None,
            fail_at_record: None,
            records: 0,
        }
    }

    /// Also emits each new count to `topic`, keyed like the record, written as `encoding`.
    #[must_use]
    pub fn emit(mut self, topic: &str, encoding: CountEncoding) -> CountByKey {
        self.output = Some((topic.to_owned(), encoding));
        self
    }

    /// Fails, before counting, on every record at `offset` (of any partition).
    #[must_use]
    pub fn fail_at_offset(mut self, offset: u64) -> CountByKey {
        self.fail_at_offset = Some(offset);
        self
    }

    /// Fails, before counting, on the `record`-th record (from 1) this processor is given:
    /// once, wherever its task started.
    #[must_use]
    pub fn fail_at_record(mut self, record: u64) -> CountByKey {
        assert!(record >= 1, "records are counted from 1");
        self.fail_at_record = Some(record);
        self
    }
}

impl Processor for CountByKey {
    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        self.records += 1;
        let offset = record.offset().get();
        if self.fail_at_offset == Some(offset) || self.fail_at_record == Some(self.records) {
            return Err(ProcessError::new(format!("failing on purpose at offset {offset}")));
        }
        let key = record.key().unwrap_or_default();
        let store = ctx.store(&self.store)?;
        let count = match store.get(key)? {
            None => 0,
            Some(value) => <[u8; 8]>::try_from(&*value).map(u64::from_le_bytes).map_err(|_| {
                ProcessError::new(format!("a count in store {:?} is not 8 bytes", self.store))
            })?,
        } + 1;
        store.put(key, &count.to_le_bytes());
        if let Some((topic, encoding)) = &self.output {
            match encoding {
                CountEncoding::LittleEndian => ctx.emit(topic, Some(key), &count.to_le_bytes()),
                CountEncoding::Decimal => ctx.emit(topic, Some(key), count.to_string().as_bytes()),
            }
        }
        Ok(())
    }
}
