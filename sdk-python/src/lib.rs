//! `chronik._chronik`: the Python extension module behind the `chronik` package (pyo3, abi3 for
//! Python 3.9 and newer). The pure-Python layer in `python/chronik/` re-exports it.
//!
//! Every call that may wait on the disk releases the GIL. Errors become the `ChronikError`
//! tree (see `python/chronik/_chronik.pyi`); a Rust panic inside a call becomes pyo3's
//! `PanicException`, never a crash of the interpreter.

use chronik::{
    AppendError, Chronik, CommitError, Durability, Offset, OpenError, Options, ReadError, Record,
    TopicConfig, TopicError,
};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyMemoryView, PySlice, PyTuple};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

mod codec;
#[cfg(feature = "kafka")]
mod kafka;
mod processor;
mod topology;

pyo3::create_exception!(_chronik, ChronikError, PyException, "Any Chronik error.");
pyo3::create_exception!(_chronik, CorruptionError, ChronikError, "Damaged data was found.");
pyo3::create_exception!(
    _chronik,
    PoisonedError,
    ChronikError,
    "An earlier write or fsync failed: reopen the data directory to recover."
);
pyo3::create_exception!(_chronik, NotFoundError, ChronikError, "No such topic or partition.");
pyo3::create_exception!(_chronik, AlreadyExistsError, ChronikError, "The topic exists.");
pyo3::create_exception!(
    _chronik,
    InvalidArgumentError,
    ChronikError,
    "A name, config or value is invalid."
);
pyo3::create_exception!(
    _chronik,
    LockedError,
    ChronikError,
    "Another process has the directory open."
);
pyo3::create_exception!(
    _chronik,
    OffsetOutOfRangeError,
    ChronikError,
    "The offset is not in the log."
);
pyo3::create_exception!(_chronik, ChronikIoError, ChronikError, "An I/O error.");
pyo3::create_exception!(
    _chronik,
    DecodeError,
    ChronikError,
    "An input record is not in the processor's key or value format: `topic`, `partition` and \
     `offset` say which, `reason` why."
);
pyo3::create_exception!(_chronik, ClosedError, ChronikError, "The data directory was closed.");
pyo3::create_exception!(
    _chronik,
    ReadOnlyError,
    ChronikError,
    "The data directory was opened read-only: it takes no writes."
);

/// The exception for an engine error, by kind. By value, so callers can pass `e.into()`.
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn error(error: chronik::Error) -> PyErr {
    use chronik::Error as E;
    let message = error.to_string();
    // Every error that carries damage evidence, whatever the operation: an append refused
    // after damage at a partition's end (the consumer offsets topic's, for a commit) reports
    // the damage, not an I/O failure.
    if error.corruption().is_some() {
        return CorruptionError::new_err(message);
    }
    match error {
        E::Open(OpenError::Locked { .. }) => LockedError::new_err(message),
        E::Topic(TopicError::Poisoned(_))
        | E::Append(AppendError::Poisoned(_))
        | E::Read(ReadError::Poisoned(_)) => PoisonedError::new_err(message),
        E::Topic(TopicError::NotFound { .. })
        | E::Append(AppendError::TopicNotFound { .. } | AppendError::PartitionNotFound { .. })
        | E::Read(ReadError::TopicNotFound { .. } | ReadError::PartitionNotFound { .. }) => {
            NotFoundError::new_err(message)
        }
        E::Topic(TopicError::AlreadyExists { .. }) => AlreadyExistsError::new_err(message),
        E::Topic(TopicError::InvalidName { .. } | TopicError::InvalidConfig { .. })
        | E::Append(
            AppendError::Empty
            | AppendError::BatchTooLarge { .. }
            | AppendError::TooManyRecords { .. },
        ) => InvalidArgumentError::new_err(message),
        E::Topic(TopicError::ReadOnly) | E::Append(AppendError::ReadOnly) => {
            ReadOnlyError::new_err(message)
        }
        E::Read(ReadError::OffsetOutOfRange { .. }) => OffsetOutOfRangeError::new_err(message),
        E::Commit(commit) => commit_error(commit),
        _ => ChronikIoError::new_err(message),
    }
}

pub(crate) fn commit_error(error: CommitError) -> PyErr {
    match error {
        CommitError::InvalidGroup { .. } => InvalidArgumentError::new_err(error.to_string()),
        CommitError::PartitionNotFound { .. } => NotFoundError::new_err(error.to_string()),
        CommitError::Topic(e) => self::error(e.into()),
        CommitError::Append(e) => self::error(e.into()),
        other => ChronikIoError::new_err(other.to_string()),
    }
}

fn parse_durability(text: &str) -> PyResult<Durability> {
    match text {
        "sync" => Ok(Durability::Sync),
        "os" => Ok(Durability::Os),
        _ => text
            .strip_prefix("interval:")
            .and_then(|ms| ms.parse().ok())
            .map(|ms| Durability::Interval { ms })
            .ok_or_else(|| {
                InvalidArgumentError::new_err(format!(
                    "durability {text:?}: one of \"sync\", \"os\", \"interval:MS\""
                ))
            }),
    }
}

/// The open engine that a data directory's Python objects share. Closing it closes the
/// directory for all of them (producers, consumers, applications): later calls raise
/// `ClosedError`, and the directory's lock is released once calls in flight return.
pub(crate) struct Shared {
    chronik: RwLock<Option<Arc<Chronik>>>,
    /// Opened with `read_only=True`: another process may write, and readers refresh.
    read_only: bool,
    /// Applications, whose runners hold engine handles of their own.
    apps: Mutex<Vec<Weak<dyn processor::Close + Send + Sync>>>,
}

impl Shared {
    pub(crate) fn get(&self) -> PyResult<Arc<Chronik>> {
        let chronik = self.chronik.read().map_err(|_| ChronikError::new_err("lock poisoned"))?;
        chronik.clone().ok_or_else(|| ClosedError::new_err("the data directory is closed"))
    }

    pub(crate) fn register<A: processor::Close + Send + Sync + 'static>(&self, app: &Arc<A>) {
        if let Ok(mut apps) = self.apps.lock() {
            apps.retain(|a| a.strong_count() > 0);
            let weak: Weak<A> = Arc::downgrade(app);
            apps.push(weak);
        }
    }

    fn close(&self, py: Python<'_>) {
        let taken = self.chronik.write().ok().and_then(|mut chronik| chronik.take());
        let apps: Vec<_> = self.apps.lock().map(|apps| apps.clone()).unwrap_or_default();
        py.detach(move || {
            for app in apps.iter().filter_map(Weak::upgrade) {
                app.close();
            }
            if let Some(mut chronik) = taken {
                // Calls in flight hold clones; the engine closes when the last one returns.
                loop {
                    match Arc::try_unwrap(chronik) {
                        Ok(only) => break drop(only),
                        Err(shared) => chronik = shared,
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
    }
}

/// An open data directory (a context manager: `with chronik.open(path) as db: ...`).
#[pyclass(name = "Chronik", module = "chronik._chronik", frozen)]
pub(crate) struct PyChronik {
    pub(crate) shared: Arc<Shared>,
    path: String,
}

impl PyChronik {
    pub(crate) fn get(&self) -> PyResult<Arc<Chronik>> {
        self.shared.get()
    }
}

/// Open (creating if needed) a data directory, recovering it after a crash. `durability`:
/// "sync" (the default), "os" or "interval:MS". With `read_only`, open an existing directory
/// beside a process that writes it: no lock taken, no file changed, writes raise
/// `ReadOnlyError`; consumers see what the writer appends (see `Chronik.refresh`).
#[pyfunction]
#[pyo3(signature = (path, durability = "sync", read_only = false))]
fn open(py: Python<'_>, path: &str, durability: &str, read_only: bool) -> PyResult<PyChronik> {
    let durability = parse_durability(durability)?;
    let options = Options { durability, read_only, ..Options::default() };
    let owned = path.to_owned();
    let chronik = py.detach(move || Chronik::open(&owned, options)).map_err(error)?;
    let shared =
        Shared { chronik: RwLock::new(Some(Arc::new(chronik))), read_only, apps: Mutex::default() };
    Ok(PyChronik { shared: Arc::new(shared), path: path.to_owned() })
}

/// Apply `settings` (the keys of `chronik topic create --config`) to `config`, in order.
fn apply_settings(config: &mut TopicConfig, settings: &Bound<'_, PyDict>) -> PyResult<()> {
    for (key, value) in settings.iter() {
        let key: String = key.extract()?;
        let value = value.str()?.to_string();
        config.set(&key, &value).map_err(|e| InvalidArgumentError::new_err(e.to_string()))?;
    }
    Ok(())
}

fn config_from(partitions: u32, settings: Option<&Bound<'_, PyDict>>) -> PyResult<TopicConfig> {
    let mut config = TopicConfig::default().with_partitions(partitions);
    if let Some(settings) = settings {
        apply_settings(&mut config, settings)?;
    }
    Ok(config)
}

#[pymethods]
impl PyChronik {
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Close (the exception, if any, goes on).
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: &Bound<'_, PyAny>,
        exc: &Bound<'_, PyAny>,
        tb: &Bound<'_, PyAny>,
    ) {
        let _ = (exc_type, exc, tb);
        self.close(py);
    }

    /// Flush and close, with every producer, consumer and application of this directory;
    /// later calls raise `ClosedError`. Returns once the directory's lock is released.
    fn close(&self, py: Python<'_>) {
        self.shared.close(py);
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// What recovery did at open, one line per partition that was not clean.
    fn recovery(&self) -> PyResult<Vec<String>> {
        Ok(self.get()?.recovery().lines())
    }

    /// Counters and latency histograms since the directory was opened: every counter by name
    /// (`appends`, `records_appended`, `bytes_written`, `fsyncs`, `bytes_read`,
    /// `compaction_passes`, `restore_records`, ...), and `append_latency` / `fsync_latency` as
    /// dicts with `count`, `sum_us`, `p50_us`, `p99_us`, `max_us` (bucket upper bounds, within
    /// a factor of two) and `buckets` (per power-of-two bucket of microseconds).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot = self.get()?.metrics();
        let out = PyDict::new(py);
        for (name, _, value) in snapshot.counters() {
            out.set_item(name, value)?;
        }
        for (name, h) in [
            ("append_latency", &snapshot.append_latency),
            ("fsync_latency", &snapshot.fsync_latency),
        ] {
            let d = PyDict::new(py);
            d.set_item("count", h.count)?;
            d.set_item("sum_us", h.sum_us)?;
            d.set_item("p50_us", h.quantile_upper_us(0.5))?;
            d.set_item("p99_us", h.quantile_upper_us(0.99))?;
            d.set_item("max_us", h.quantile_upper_us(1.0))?;
            d.set_item("buckets", h.buckets.to_vec())?;
            out.set_item(name, d)?;
        }
        Ok(out)
    }

    /// The same metrics in the Prometheus text exposition format.
    fn metrics_prometheus(&self) -> PyResult<String> {
        Ok(self.get()?.metrics().prometheus())
    }

    /// Create a topic; `config` takes the settings of `chronik topic create --config`.
    #[pyo3(signature = (name, partitions = 1, config = None))]
    fn create_topic(
        &self,
        py: Python<'_>,
        name: &str,
        partitions: u32,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let config = config_from(partitions, config)?;
        let chronik = self.get()?;
        py.detach(|| chronik.create_topic(name, config)).map_err(|e| error(e.into()))
    }

    fn delete_topic(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let chronik = self.get()?;
        py.detach(|| chronik.delete_topic(name)).map_err(|e| error(e.into()))
    }

    fn list_topics(&self) -> PyResult<Vec<String>> {
        Ok(self.get()?.list_topics())
    }

    /// A dict: `name`, `config` (every setting) and `partitions` (a dict per partition).
    fn describe_topic<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let description = self.get()?.describe_topic(name).map_err(|e| error(e.into()))?;
        let out = PyDict::new(py);
        out.set_item("name", &description.name)?;
        let config = PyDict::new(py);
        for (key, value) in description.config.entries() {
            config.set_item(key, value)?;
        }
        out.set_item("config", config)?;
        let partitions = PyList::empty(py);
        for p in &description.partitions {
            let d = PyDict::new(py);
            d.set_item("partition", p.partition)?;
            d.set_item("log_start_offset", p.log_start_offset.get())?;
            d.set_item("log_end_offset", p.log_end_offset.get())?;
            d.set_item("high_watermark", p.high_watermark.get())?;
            d.set_item("segments", p.segment_count)?;
            d.set_item("size_bytes", p.size_bytes)?;
            partitions.append(d)?;
        }
        out.set_item("partitions", partitions)?;
        Ok(out)
    }

    /// Change settings of an existing topic, durably.
    fn alter_topic_config(
        &self,
        py: Python<'_>,
        name: &str,
        settings: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        let chronik = self.get()?;
        let mut config = chronik.describe_topic(name).map_err(|e| error(e.into()))?.config;
        apply_settings(&mut config, settings)?;
        py.detach(|| chronik.alter_topic_config(name, config)).map_err(|e| error(e.into()))
    }

    fn high_watermark(&self, topic: &str, partition: u32) -> PyResult<u64> {
        self.get()?.high_watermark(topic, partition).map(Offset::get).map_err(|e| error(e.into()))
    }

    /// Delete the records of a partition below `before`, whole sealed segments at a time
    /// (Kafka's DeleteRecords); returns the log start after the call (the call never moves it
    /// past `before`, nor back).
    fn delete_records(
        &self,
        py: Python<'_>,
        topic: &str,
        partition: u32,
        before: u64,
    ) -> PyResult<u64> {
        let chronik = self.get()?;
        py.detach(|| chronik.delete_records(topic, partition, Offset::new(before)))
            .map(Offset::get)
            .map_err(|e| error(e.into()))
    }

    /// Sync everything written so far.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let chronik = self.get()?;
        py.detach(|| chronik.flush()).map_err(|e| error(e.into()))
    }

    /// Whether the directory was opened with `read_only=True`.
    #[getter]
    fn read_only(&self) -> bool {
        self.shared.read_only
    }

    /// A read-only open: take in what the writing process appended since the last look (high
    /// watermarks, `describe_topic`). Consumers do this themselves when caught up. Topics the
    /// writer created after the open are not seen until a new open. No-op for a writer.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let chronik = self.get()?;
        py.detach(|| chronik.engine().refresh()).map_err(|e| error(e.into()))
    }

    /// Compact every partition of a compacted topic (`cleanup` "compact") now, whatever its
    /// dirty ratio (the compaction lag settings still hold); the background compaction does
    /// the same when a partition is dirty enough. Returns the records kept per partition
    /// compacted (`None` for one with nothing to compact).
    fn compact_topic(&self, py: Python<'_>, name: &str) -> PyResult<Vec<Option<u64>>> {
        let chronik = self.get()?;
        let reports = py.detach(|| chronik.compact_topic(name)).map_err(|e| error(e.into()))?;
        Ok(reports.into_iter().map(|r| r.map(|r| r.records_kept)).collect())
    }

    /// The topic's partition count (`NotFoundError` for no such topic).
    fn partition_count(&self, topic: &str) -> PyResult<u32> {
        self.get()?
            .partition_count(topic)
            .ok_or_else(|| NotFoundError::new_err(format!("topic {topic:?} does not exist")))
    }

    /// Every record of `topic`/`partition` from its log start: `(offset, timestamp, key,
    /// value, headers)` tuples, keys and values as bytes (a copy, unlike a consumer's records).
    fn records(&self, py: Python<'_>, topic: &str, partition: u32) -> PyResult<Vec<RecordTuple>> {
        let chronik = self.get()?;
        let bytes = |b: &[u8]| PyBytes::new(py, b).unbind();
        let mut out = Vec::new();
        let mut from = Offset::ZERO;
        loop {
            let fetch = py
                .detach(|| {
                    chronik::next_fetch(chronik.engine(), topic, partition, from, FETCH_BYTES)
                })
                .map_err(|e: ReadError| error(e.into()))?;
            if fetch.is_empty() {
                return Ok(out);
            }
            for record in fetch.records() {
                let headers = record.headers().map(|h| (bytes(h.key), bytes(h.value))).collect();
                let key = record.key().map(bytes);
                out.push((
                    record.offset().get(),
                    record.timestamp(),
                    key,
                    bytes(record.value()),
                    headers,
                ));
            }
            from = fetch.next_offset();
        }
    }

    fn producer(&self, topic: &str) -> PyResult<PyProducer> {
        let chronik = self.get()?;
        if chronik.partition_count(topic).is_none() {
            return Err(NotFoundError::new_err(format!("topic {topic:?} does not exist")));
        }
        Ok(PyProducer { shared: Arc::clone(&self.shared), topic: topic.to_owned() })
    }

    /// A consumer of one partition; in `group`, it starts where the group committed
    /// (`CorruptionError` if damage in the committed offsets hides where that is).
    #[pyo3(signature = (topic, partition = 0, group = None))]
    fn consumer(&self, topic: &str, partition: u32, group: Option<&str>) -> PyResult<PyConsumer> {
        let chronik = self.get()?;
        if chronik.partition_count(topic).is_none_or(|count| partition >= count) {
            return Err(NotFoundError::new_err(format!("{topic:?} has no partition {partition}")));
        }
        if group.is_some()
            && let Some(corruption) = chronik.engine().committed_offsets_damage()
        {
            // The group's last commit may be hidden by the damage: starting from an older one
            // would hand out records again, silently (the CLI's `consume --group` refuses too).
            return Err(CorruptionError::new_err(format!(
                "the consumer groups' committed offsets are damaged, so the group's position is \
                 unknown: {corruption}"
            )));
        }
        let position = group
            .and_then(|g| chronik.committed_offset(g, topic, partition))
            .unwrap_or(Offset::ZERO);
        Ok(PyConsumer {
            shared: Arc::clone(&self.shared),
            topic: topic.to_owned(),
            partition,
            group: group.map(str::to_owned),
            state: Mutex::new(ConsumerState {
                position,
                buffered: std::collections::VecDeque::new(),
                polling: false,
                seeks: 0,
            }),
        })
    }
}

/// A record as `Chronik.records` returns it: offset, timestamp, key, value, headers.
type RecordTuple = (u64, i64, Option<Py<PyBytes>>, Py<PyBytes>, Vec<(Py<PyBytes>, Py<PyBytes>)>);

/// Appends records to one topic.
#[pyclass(name = "Producer", module = "chronik._chronik", frozen)]
struct PyProducer {
    shared: Arc<Shared>,
    topic: String,
}

/// Bytes taken from Python for an append: a `bytes` object's own buffer, held (immutable, so
/// readable without the GIL and without a copy), or a copy of anything else bytes-like.
enum Payload<'py> {
    Held(Bound<'py, PyBytes>),
    Copied(Vec<u8>),
}

impl Payload<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Held(bytes) => bytes.as_bytes(),
            Payload::Copied(bytes) => bytes,
        }
    }
}

fn payload<'py>(value: &Bound<'py, PyAny>) -> PyResult<Payload<'py>> {
    if let Ok(bytes) = value.cast::<PyBytes>() {
        return Ok(Payload::Held(bytes.clone()));
    }
    if let Ok(text) = value.cast::<pyo3::types::PyString>() {
        return Ok(Payload::Held(text.encode_utf8()?));
    }
    codec::raw(value).map(Payload::Copied)
}

/// One record to append, taken from Python.
struct Outgoing<'py> {
    key: Option<Payload<'py>>,
    value: Payload<'py>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// Milliseconds since the epoch; `None` takes the engine clock's time.
    timestamp: Option<i64>,
}

impl Outgoing<'_> {
    fn header_views(&self) -> Vec<chronik::Header<'_>> {
        self.headers.iter().map(|(k, v)| chronik::Header { key: k, value: v }).collect()
    }

    /// The record to append, with `headers` from [`Outgoing::header_views`].
    fn record<'a>(&'a self, headers: &'a [chronik::Header<'a>]) -> Record<'a> {
        let record = Record::new(self.key.as_ref().map(Payload::as_slice), self.value.as_slice())
            .with_headers(headers);
        match self.timestamp {
            Some(timestamp) => record.with_timestamp(timestamp),
            None => record,
        }
    }
}

fn outgoing<'py>(
    key: Option<&Bound<'py, PyAny>>,
    value: &Bound<'py, PyAny>,
    headers: Option<&Bound<'py, PyAny>>,
    timestamp: Option<i64>,
) -> PyResult<Outgoing<'py>> {
    let key = key.filter(|k| !k.is_none()).map(payload).transpose()?;
    let mut pairs = Vec::new();
    if let Some(headers) = headers.filter(|h| !h.is_none()) {
        let items = if let Ok(dict) = headers.cast::<PyDict>() {
            dict.items().into_any()
        } else {
            headers.clone()
        };
        for item in items.try_iter()? {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            pairs.push((codec::raw(&k)?, codec::raw(&v)?));
        }
    }
    Ok(Outgoing { key, value: payload(value)?, headers: pairs, timestamp })
}

impl PyProducer {
    /// The partition named, or the key's (0 without a key), as the Rust producer chooses it.
    fn partition_of(&self, key: Option<&[u8]>, partition: Option<u32>) -> PyResult<u32> {
        match (partition, key) {
            (Some(partition), _) => Ok(partition),
            (None, None) => Ok(0),
            (None, Some(key)) => {
                let producer = self.shared.get()?.producer(&self.topic);
                producer.partition_for_key(key).map_err(|e| error(e.into()))
            }
        }
    }

    /// Append each partition's records as one batch (several where one would pass the
    /// engine's batch limits), without the GIL: the Rust producer's `send_batch`.
    fn append(
        &self,
        py: Python<'_>,
        records: &[Outgoing<'_>],
        partition: Option<u32>,
    ) -> PyResult<Vec<(u32, u64, u64)>> {
        let headers: Vec<Vec<chronik::Header<'_>>> =
            records.iter().map(Outgoing::header_views).collect();
        let batch: Vec<Record<'_>> =
            records.iter().zip(&headers).map(|(record, headers)| record.record(headers)).collect();
        let chronik = self.shared.get()?;
        py.detach(|| chronik.producer(&self.topic).send_batch(&batch, partition))
            .map(|sent| {
                sent.iter()
                    .map(|s| {
                        (s.partition, s.appended.base_offset.get(), s.appended.last_offset.get())
                    })
                    .collect()
            })
            .map_err(|e: AppendError| error(e.into()))
    }
}

/// What `send_batch` takes, for its error.
const BATCH_RECORD_SHAPES: &str =
    "records are (key, value), (key, value, headers) or (key, value, headers, timestamp) tuples";

#[pymethods]
impl PyProducer {
    /// Append one record; returns `(partition, offset)` once acknowledged under the data
    /// directory's durability. The partition is the key's (or 0 without a key) unless given;
    /// the timestamp (milliseconds since the epoch) is now unless given.
    #[pyo3(signature = (key, value, headers = None, partition = None, timestamp = None))]
    fn send(
        &self,
        py: Python<'_>,
        key: Option<&Bound<'_, PyAny>>,
        value: &Bound<'_, PyAny>,
        headers: Option<&Bound<'_, PyAny>>,
        partition: Option<u32>,
        timestamp: Option<i64>,
    ) -> PyResult<(u32, u64)> {
        let record = outgoing(key, value, headers, timestamp)?;
        let appended = self.append(py, std::slice::from_ref(&record), partition)?;
        let (partition, base, _) = appended[0];
        Ok((partition, base))
    }

    /// Append many records, `(key, value)`, `(key, value, headers)` or `(key, value, headers,
    /// timestamp)` each: one batch per partition, one acknowledgement each; a partition's
    /// records past the engine's batch limits (16 MiB encoded, 2**20 records) go in further
    /// batches, appended in order (each atomic on its own: if one fails, the earlier ones
    /// stay). Returns `(partition, first offset, last offset)` per batch.
    #[pyo3(signature = (records, partition = None))]
    fn send_batch(
        &self,
        py: Python<'_>,
        records: &Bound<'_, PyAny>,
        partition: Option<u32>,
    ) -> PyResult<Vec<(u32, u64, u64)>> {
        let mut outgoing_records = Vec::with_capacity(records.len().unwrap_or(0));
        for item in records.try_iter()? {
            let item = item?;
            // A tuple of another length is refused here, not left to `get_item`'s IndexError
            // (or, past four, to extra fields silently dropped).
            let tuple = item
                .cast::<PyTuple>()
                .ok()
                .filter(|t| (2..=4).contains(&t.len()))
                .ok_or_else(|| InvalidArgumentError::new_err(BATCH_RECORD_SHAPES))?;
            let key = tuple.get_item(0)?;
            let value = tuple.get_item(1)?;
            let headers = if tuple.len() > 2 { Some(tuple.get_item(2)?) } else { None };
            let timestamp = if tuple.len() > 3 { tuple.get_item(3)?.extract()? } else { None };
            outgoing_records.push(outgoing(Some(&key), &value, headers.as_ref(), timestamp)?);
        }
        if outgoing_records.is_empty() {
            return Ok(Vec::new());
        }
        self.append(py, &outgoing_records, partition)
    }

    /// Queue one record and return at once with a `PendingSend`: many sends in flight share
    /// the engine's turns (and, in `sync` mode, their fdatasyncs). Offsets follow the order of
    /// the calls per partition. `PendingSend.result()` waits (without the GIL) and returns
    /// `(partition, offset)`; `Producer.flush()` waits until everything queued is durable.
    #[pyo3(signature = (key, value, headers = None, partition = None, timestamp = None))]
    fn send_async(
        &self,
        py: Python<'_>,
        key: Option<&Bound<'_, PyAny>>,
        value: &Bound<'_, PyAny>,
        headers: Option<&Bound<'_, PyAny>>,
        partition: Option<u32>,
        timestamp: Option<i64>,
    ) -> PyResult<PyPendingSend> {
        let outgoing = outgoing(key, value, headers, timestamp)?;
        let partition =
            self.partition_of(outgoing.key.as_ref().map(Payload::as_slice), partition)?;
        let header_views = outgoing.header_views();
        let record = outgoing.record(&header_views);
        let chronik = self.shared.get()?;
        let pending = py
            .detach(|| chronik.producer(&self.topic).send_async_to(partition, &[record]))
            .map_err(|e| error(e.into()))?;
        Ok(PyPendingSend { partition, state: Mutex::new(SendState::InFlight(pending)) })
    }

    /// Wait until every record queued so far (by any producer of the directory) is durable.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let chronik = self.shared.get()?;
        py.detach(|| chronik.flush()).map_err(|e| error(e.into()))
    }

    #[getter]
    fn topic(&self) -> &str {
        &self.topic
    }
}

/// Where a `PendingSend` is.
enum SendState {
    InFlight(chronik::PendingAppend),
    Done(Result<u64, String>),
    /// Taken by a `result()` running on another thread.
    Waiting,
}

/// A record sent with `Producer.send_async`, in flight.
#[pyclass(name = "PendingSend", module = "chronik._chronik", frozen)]
struct PyPendingSend {
    partition: u32,
    state: Mutex<SendState>,
}

impl PyPendingSend {
    fn settle(result: Result<chronik::Appended, AppendError>) -> Result<u64, String> {
        result.map(|a| a.base_offset.get()).map_err(|e| e.to_string())
    }

    fn answer(&self, outcome: &Result<u64, String>) -> PyResult<(u32, u64)> {
        match outcome {
            Ok(offset) => Ok((self.partition, *offset)),
            Err(message) => Err(ChronikError::new_err(message.clone())),
        }
    }
}

#[pymethods]
impl PyPendingSend {
    /// Whether the send is done (acknowledged or failed); never blocks.
    fn done(&self) -> PyResult<bool> {
        let mut state = self.state.lock().map_err(|_| ChronikError::new_err("lock poisoned"))?;
        if let SendState::InFlight(pending) = &mut *state
            && let Some(result) = pending.try_take()
        {
            *state = SendState::Done(Self::settle(result));
        }
        Ok(matches!(*state, SendState::Done(_)))
    }

    /// Wait for the send (without the GIL) and return `(partition, offset)`; raises what
    /// `send` would have raised.
    fn result(&self, py: Python<'_>) -> PyResult<(u32, u64)> {
        let taken = {
            let mut state =
                self.state.lock().map_err(|_| ChronikError::new_err("lock poisoned"))?;
            match std::mem::replace(&mut *state, SendState::Waiting) {
                SendState::InFlight(pending) => pending,
                SendState::Done(outcome) => {
                    *state = SendState::Done(outcome.clone());
                    return self.answer(&outcome);
                }
                SendState::Waiting => {
                    return Err(ChronikError::new_err("result() is already waiting elsewhere"));
                }
            }
        };
        let outcome = Self::settle(py.detach(|| taken.wait()));
        let mut state = self.state.lock().map_err(|_| ChronikError::new_err("lock poisoned"))?;
        *state = SendState::Done(outcome.clone());
        self.answer(&outcome)
    }

    #[getter]
    fn partition(&self) -> u32 {
        self.partition
    }
}

/// A record read from a partition. `key` and `value` are memoryviews over the bytes of the
/// fetch they came in (one copy per fetch, none per record); `bytes(record.value)` copies.
#[pyclass(name = "Record", module = "chronik._chronik", frozen, get_all)]
pub(crate) struct PyRecord {
    pub(crate) offset: u64,
    pub(crate) timestamp: i64,
    pub(crate) key: Option<Py<PyAny>>,
    pub(crate) value: Py<PyAny>,
    pub(crate) headers: Vec<(Py<PyBytes>, Py<PyBytes>)>,
}

#[pymethods]
impl PyRecord {
    fn __repr__(&self, py: Python<'_>) -> String {
        let length = self.value.bind(py).len().unwrap_or(0);
        format!(
            "Record(offset={}, timestamp={}, value=<{length} bytes>)",
            self.offset, self.timestamp
        )
    }
}

struct ConsumerState {
    position: Offset,
    /// Records fetched and not yet handed out by iteration, in order.
    buffered: std::collections::VecDeque<Py<PyRecord>>,
    /// A `poll` is fetching or waiting, without this lock (a thread that took the lock while
    /// holding the GIL would otherwise wait forever for the poller, which needs the GIL back).
    polling: bool,
    /// Counts `seek`s, so a poll that ran across one drops what it fetched from the old
    /// position.
    seeks: u64,
}

/// Reads one partition in order (an iterator: `for record in consumer`, until caught up).
#[pyclass(name = "Consumer", module = "chronik._chronik", frozen)]
struct PyConsumer {
    shared: Arc<Shared>,
    topic: String,
    partition: u32,
    group: Option<String>,
    state: Mutex<ConsumerState>,
}

const FETCH_BYTES: usize = 1 << 20;

/// The longest a `poll(timeout=...)` waits without the GIL before it looks for signals:
/// Ctrl-C is answered within this.
const WAIT_SLICE: Duration = Duration::from_millis(200);

/// The longest `poll` waits, whatever its timeout says (a day).
const POLL_TIMEOUT_SECONDS_MAX: f64 = 86_400.0;

impl PyConsumer {
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, ConsumerState>> {
        self.state.lock().map_err(|_| ChronikError::new_err("consumer lock poisoned"))
    }

    /// The next fetch at or after `from` that holds a record ([`chronik::next_fetch`]: past
    /// batches compaction emptied, from the log start when retention removed `from`), without
    /// the GIL. When caught up (the high watermark reached) it waits for records up to
    /// `timeout` seconds, in slices, looking for signals (Ctrl-C) between them.
    fn next_fetch(
        &self,
        py: Python<'_>,
        from: Offset,
        timeout: Option<f64>,
    ) -> PyResult<chronik::Fetch> {
        let chronik = self.shared.get()?;
        let read_only = self.shared.read_only;
        let fetch_at = |from| {
            chronik::next_fetch(chronik.engine(), &self.topic, self.partition, from, FETCH_BYTES)
        };
        let read = |from| {
            py.detach(|| {
                let fetch = fetch_at(from)?;
                if fetch.is_empty() && read_only {
                    // Another process writes: what it appended is seen only once looked for.
                    chronik.engine().refresh()?;
                    return fetch_at(from);
                }
                Ok(fetch)
            })
            .map_err(|e: ReadError| error(e.into()))
        };
        let seconds = timeout.filter(|s| *s > 0.0).map_or(0.0, |s| s.min(POLL_TIMEOUT_SECONDS_MAX));
        let deadline = std::time::Instant::now() + Duration::from_secs_f64(seconds);
        loop {
            let fetch = read(from)?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !fetch.is_empty() || left.is_zero() {
                return Ok(fetch);
            }
            // Caught up at `fetch.next_offset()` (the log start, if retention passed `from`).
            let at = fetch.next_offset();
            py.detach(|| {
                chronik.engine().wait_for(&self.topic, self.partition, at, left.min(WAIT_SLICE))
            })
            .map_err(|e| error(e.into()))?;
            py.check_signals()?;
        }
    }

    /// The records of `fetch` (those at or after where it was read from) as Python objects:
    /// one copy of its bytes, and memoryviews into it.
    fn records(py: Python<'_>, fetch: &chronik::Fetch) -> PyResult<Vec<Py<PyRecord>>> {
        if fetch.is_empty() {
            return Ok(Vec::new());
        }
        let buffer = PyBytes::new(py, fetch.as_bytes());
        let view = PyMemoryView::from(buffer.as_any())?;
        let base = fetch.as_bytes().as_ptr() as usize;
        let slice = |bytes: &[u8]| -> PyResult<Py<PyAny>> {
            let start = bytes.as_ptr() as usize - base;
            let index = |i: usize| {
                isize::try_from(i).map_err(|_| ChronikIoError::new_err("fetch too large"))
            };
            let slice = PySlice::new(py, index(start)?, index(start + bytes.len())?, 1);
            Ok(view.get_item(slice)?.unbind())
        };
        let mut records = Vec::new();
        for record in fetch.records() {
            let headers = record
                .headers()
                .map(|h| (PyBytes::new(py, h.key).unbind(), PyBytes::new(py, h.value).unbind()))
                .collect();
            let record = PyRecord {
                offset: record.offset().get(),
                timestamp: record.timestamp(),
                key: record.key().map(slice).transpose()?,
                value: slice(record.value())?,
                headers,
            };
            records.push(Py::new(py, record)?);
        }
        Ok(records)
    }

    /// Up to `max_records` of the buffered records, the position moved past them.
    fn take_buffered(state: &mut ConsumerState, max_records: Option<usize>) -> Vec<Py<PyRecord>> {
        // From the front of the buffered fetch: iterating one record at a time stays linear.
        let take = max_records.map_or(state.buffered.len(), |max| max.min(state.buffered.len()));
        let records: Vec<Py<PyRecord>> = state.buffered.drain(..take).collect();
        if let Some(last) = records.last() {
            state.position = Offset::new(last.get().offset + 1);
        }
        records
    }
}

#[pymethods]
impl PyConsumer {
    /// Up to `max_records` records from the position on (all of one fetch, about 1 MiB, when
    /// not given); waits up to `timeout` seconds when caught up (Ctrl-C interrupts the wait).
    /// Returns `[]` only when caught up: the position is the high watermark. Moves the
    /// position past the records returned.
    #[pyo3(signature = (max_records = None, timeout = None))]
    fn poll(
        &self,
        py: Python<'_>,
        max_records: Option<usize>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Py<PyRecord>>> {
        let (from, seeks) = {
            let mut state = self.lock()?;
            if !state.buffered.is_empty() {
                return Ok(Self::take_buffered(&mut state, max_records));
            }
            if state.polling {
                return Err(ChronikError::new_err("this consumer is polled on another thread"));
            }
            state.polling = true;
            (state.position, state.seeks)
        };
        let fetched = self
            .next_fetch(py, from, timeout)
            .and_then(|fetch| Ok((Self::records(py, &fetch)?, fetch.next_offset())));
        let mut state = self.lock()?;
        state.polling = false;
        let (records, next) = fetched?;
        if state.seeks != seeks {
            // Sought elsewhere meanwhile: what was fetched is from the old position.
            return Ok(Vec::new());
        }
        if records.is_empty() {
            // Caught up at the high watermark (above the old position when retention moved
            // the log start past it).
            state.position = next;
            return Ok(records);
        }
        state.buffered = records.into();
        Ok(Self::take_buffered(&mut state, max_records))
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyRecord>>> {
        Ok(self.poll(py, Some(1), None)?.into_iter().next())
    }

    /// The offset of the next record this consumer reads.
    #[getter]
    fn position(&self) -> PyResult<u64> {
        Ok(self.lock()?.position.get())
    }

    fn seek(&self, offset: u64) -> PyResult<()> {
        let mut state = self.lock()?;
        state.position = Offset::new(offset);
        state.buffered.clear();
        state.seeks += 1;
        Ok(())
    }

    /// Commit the position for the consumer's group, durably.
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        let group = self
            .group
            .clone()
            .ok_or_else(|| InvalidArgumentError::new_err("this consumer is in no group"))?;
        let position = self.lock()?.position;
        let offsets = [(self.topic.as_str(), self.partition, position)];
        let chronik = self.shared.get()?;
        py.detach(|| chronik.engine().commit_offsets(&group, &offsets)).map_err(commit_error)
    }

    /// What the group committed last for this partition, if anything.
    fn committed(&self) -> PyResult<Option<u64>> {
        let Some(group) = self.group.as_deref() else { return Ok(None) };
        let chronik = self.shared.get()?;
        Ok(chronik.committed_offset(group, &self.topic, self.partition).map(Offset::get))
    }

    #[getter]
    fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }
}

/// The partition of `key` among `partitions`: the one a producer sends it to.
#[pyfunction]
fn partition_for_key(key: &[u8], partitions: u32) -> PyResult<u32> {
    if partitions == 0 {
        return Err(InvalidArgumentError::new_err("partitions must be at least 1"));
    }
    Ok(chronik::partition_for_key(key, partitions))
}

/// `value` encoded in `format` ("bytes", "str" or "json"), as records and stores hold it.
#[pyfunction]
#[pyo3(name = "_encode")]
fn encode<'py>(
    py: Python<'py>,
    format: &str,
    value: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(py, &codec::Codec::parse(format)?.encode(value)?))
}

#[pymodule]
fn _chronik(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_class::<PyChronik>()?;
    m.add_class::<PyProducer>()?;
    m.add_class::<PyPendingSend>()?;
    m.add_class::<PyConsumer>()?;
    m.add_class::<PyRecord>()?;
    m.add_class::<processor::PyApp>()?;
    #[cfg(feature = "kafka")]
    m.add_class::<kafka::PyCluster>()?;
    #[cfg(feature = "kafka")]
    m.add_class::<kafka::PyClusterConsumer>()?;
    #[cfg(feature = "kafka")]
    m.add_class::<kafka::PyClusterApp>()?;
    m.add_class::<processor::PyContext>()?;
    m.add_class::<processor::PyStore>()?;
    m.add_function(wrap_pyfunction!(processor::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(processor::check_spec, m)?)?;
    topology::register(m)?;
    m.add_function(wrap_pyfunction!(partition_for_key, m)?)?;
    m.add_function(wrap_pyfunction!(encode, m)?)?;
    m.add("SimulationFailure", py.get_type::<processor::SimulationFailure>())?;
    m.add("ChronikError", py.get_type::<ChronikError>())?;
    m.add("CorruptionError", py.get_type::<CorruptionError>())?;
    m.add("PoisonedError", py.get_type::<PoisonedError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("AlreadyExistsError", py.get_type::<AlreadyExistsError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("LockedError", py.get_type::<LockedError>())?;
    m.add("OffsetOutOfRangeError", py.get_type::<OffsetOutOfRangeError>())?;
    m.add("IoError", py.get_type::<ChronikIoError>())?;
    m.add("ClosedError", py.get_type::<ClosedError>())?;
    m.add("ReadOnlyError", py.get_type::<ReadOnlyError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    Ok(())
}
