//! Topologies from Python (`chronik.Topology`): the operators of `chronik::dsl`, with Python
//! functions where they take one. Keys and values are decoded with the topology's formats
//! before a function sees them and encoded after; the GIL is taken once per batch of records
//! (every function of the batch runs under it), never per record. A function that raises
//! fails the batch: nothing of it commits, and the run raises that exception.

use crate::codec::Codec;
use crate::processor::{
    AppState, apply_options, record_check, run_error_raising, run_stoppable, stats_dict,
};
use crate::{ChronikError, ClosedError, InvalidArgumentError, PyChronik};
use chronik::SystemIo;
use chronik::dsl::{
    Emit, Event, Grouped, JoinWindows, Stream, Table, Topology, TopologyRunner, Windowed, Windows,
};
use chronik::processor::{ProcessError, ProcessorError, RunStats, StoreKind};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

type Runner = TopologyRunner<SystemIo>;

/// What a topology's functions share: the formats, and the first exception one raised.
pub(crate) struct Functions {
    key: Codec,
    value: Codec,
    raised: Mutex<Option<PyErr>>,
    /// The topics read as streams: the runner checks their records decode in the formats.
    /// Not tables (an empty value deletes a row) nor internal topics (written encoded).
    streams: RwLock<BTreeSet<String>>,
}

impl Functions {
    /// Call Python; an exception is kept (the batch then fails) and `None` returned. Once one
    /// is kept, no more Python runs in the batch.
    ///
    /// The lock is never held while Python runs: Python may hand the GIL to another task's
    /// thread mid-call, and that thread may call here too.
    fn call<T>(&self, f: impl FnOnce(Python<'_>) -> PyResult<T>) -> Option<T> {
        if self.failed() {
            return None;
        }
        match Python::attach(f) {
            Ok(value) => Some(value),
            Err(e) => {
                let mut raised = self.raised.lock().unwrap_or_else(PoisonError::into_inner);
                let later = if raised.is_none() { raised.replace(e) } else { Some(e) };
                // A second exception is dropped after the lock is let go: dropping it may run
                // Python code, which may hand the GIL to a thread waiting for this lock.
                drop(raised);
                drop(later);
                None
            }
        }
    }

    /// Whether a function raised (and the batch must fail).
    fn failed(&self) -> bool {
        self.raised.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    fn take_raised(&self) -> Option<PyErr> {
        self.raised.lock().ok().and_then(|mut raised| raised.take())
    }

    fn event<'py>(&self, py: Python<'py>, event: &Event) -> PyResult<Bound<'py, PyEvent>> {
        let key = match &event.key {
            Some(key) => self.key.decode(py, key)?.unbind(),
            None => py.None(),
        };
        let value = self.value.decode(py, &event.value)?.unbind();
        let window = event.window.map(|w| (w.start, w.end));
        Bound::new(py, PyEvent { key, value, timestamp: Some(event.timestamp), window })
    }

    /// An event, or `None` for a stream join's missing side.
    fn maybe_event(&self, py: Python<'_>, event: Option<&Event>) -> PyResult<Py<PyAny>> {
        match event {
            Some(event) => Ok(self.event(py, event)?.into_any().unbind()),
            None => Ok(py.None()),
        }
    }

    fn encode_key(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u8>>> {
        if key.is_none() { Ok(None) } else { self.key.encode(key).map(Some) }
    }

    /// What a `map` or `flat_map` function returned for `input`: an `Event` (without a time
    /// of its own, it keeps the input's), or a `(key, value)` pair (keeping the input's time).
    /// Either keeps the input's window.
    fn returned(&self, item: &Bound<'_, PyAny>, input: &Event) -> PyResult<Event> {
        let (timestamp, window) = (input.timestamp, input.window);
        if let Ok(event) = item.cast::<PyEvent>() {
            let event = event.borrow();
            let py = item.py();
            return Ok(Event {
                key: self.encode_key(event.key.bind(py))?,
                value: self.value.encode(event.value.bind(py))?,
                timestamp: event.timestamp.unwrap_or(timestamp),
                window,
            });
        }
        let pair = item.cast::<PyTuple>().ok().filter(|t| t.len() == 2).ok_or_else(|| {
            PyTypeError::new_err("a map function returns an Event or a (key, value) tuple")
        })?;
        Ok(Event {
            key: self.encode_key(&pair.get_item(0)?)?,
            value: self.value.encode(&pair.get_item(1)?)?,
            timestamp,
            window,
        })
    }
}

/// A record as a topology's functions see it: `key` and `value` in the topology's formats,
/// `timestamp` (ms), and for an aggregation's result its `window`, `(start, end)` in ms.
/// Make one to return from `map` or `flat_map`: `Event(key, value)` keeps the time of the
/// event it replaces, `Event(key, value, timestamp)` sets one.
#[pyclass(name = "Event", module = "chronik._chronik")]
pub(crate) struct PyEvent {
    #[pyo3(get, set)]
    key: Py<PyAny>,
    #[pyo3(get, set)]
    value: Py<PyAny>,
    /// Milliseconds; `None` in an `Event` made without one (it then takes the time of the
    /// event it replaces).
    #[pyo3(get, set)]
    timestamp: Option<i64>,
    #[pyo3(get)]
    window: Option<(i64, i64)>,
}

#[pymethods]
impl PyEvent {
    #[new]
    #[pyo3(signature = (key, value, timestamp = None))]
    fn new(key: Py<PyAny>, value: Py<PyAny>, timestamp: Option<i64>) -> PyEvent {
        PyEvent { key, value, timestamp, window: None }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let window = self.window.map(|(s, e)| format!(", window=({s}, {e})")).unwrap_or_default();
        let timestamp = self.timestamp.map_or_else(|| "None".to_owned(), |t| t.to_string());
        Ok(format!(
            "Event(key={}, value={}, timestamp={timestamp}{window})",
            self.key.bind(py).repr()?,
            self.value.bind(py).repr()?,
        ))
    }
}

/// How events are cut into windows: `Windows.tumbling(size_ms)`, `Windows.hopping(size_ms,
/// advance_ms)`, `Windows.sliding(size_ms)` or `Windows.session(gap_ms)`, each with
/// `grace_ms`, how long after a window's end it still takes late events.
#[pyclass(name = "Windows", module = "chronik._chronik", frozen)]
#[derive(Clone)]
pub(crate) struct PyWindows(Windows);

/// `windows`, or `InvalidArgumentError` if its sizes cannot work.
fn checked(windows: Windows) -> PyResult<PyWindows> {
    windows.check().map_err(InvalidArgumentError::new_err)?;
    Ok(PyWindows(windows))
}

#[pymethods]
impl PyWindows {
    /// Back-to-back windows of `size_ms`, aligned to the epoch.
    #[staticmethod]
    #[pyo3(signature = (size_ms, grace_ms = 0))]
    fn tumbling(size_ms: i64, grace_ms: i64) -> PyResult<PyWindows> {
        checked(Windows::tumbling(size_ms).grace(grace_ms))
    }

    /// Windows of `size_ms` starting every `advance_ms`.
    #[staticmethod]
    #[pyo3(signature = (size_ms, advance_ms, grace_ms = 0))]
    fn hopping(size_ms: i64, advance_ms: i64, grace_ms: i64) -> PyResult<PyWindows> {
        checked(Windows::hopping(size_ms, advance_ms).grace(grace_ms))
    }

    /// For each event, the window of `size_ms` ending at it.
    #[staticmethod]
    #[pyo3(signature = (size_ms, grace_ms = 0))]
    fn sliding(size_ms: i64, grace_ms: i64) -> PyResult<PyWindows> {
        checked(Windows::sliding(size_ms).grace(grace_ms))
    }

    /// A key's events at most `gap_ms` apart, in one window.
    #[staticmethod]
    #[pyo3(signature = (gap_ms, grace_ms = 0))]
    fn session(gap_ms: i64, grace_ms: i64) -> PyResult<PyWindows> {
        checked(Windows::session(gap_ms).grace(grace_ms))
    }

    fn __repr__(&self) -> String {
        self.0.to_string()
    }
}

/// A stream of events; each operator returns a new stream (a stream may feed several).
#[pyclass(name = "Stream", module = "chronik._chronik", frozen)]
pub(crate) struct PyStream {
    stream: Stream,
    functions: Arc<Functions>,
}

/// A table (a topic's latest value per key) to join streams with.
#[pyclass(name = "Table", module = "chronik._chronik", frozen)]
pub(crate) struct PyTable(Table);

impl PyStream {
    /// A stream join's function calling `f` with both sides, `None` for a missing one.
    fn stream_joiner(
        &self,
        f: Py<PyAny>,
    ) -> impl Fn(Option<&Event>, Option<&Event>) -> Vec<u8> + Send + Sync + 'static {
        let fs = Arc::clone(&self.functions);
        move |left, right| {
            fs.call(|py| {
                let (left, right) = (fs.maybe_event(py, left)?, fs.maybe_event(py, right)?);
                fs.value.encode(f.call1(py, (left, right))?.bind(py))
            })
            .unwrap_or_default()
        }
    }

    fn next(&self, stream: Stream) -> PyStream {
        PyStream { stream, functions: Arc::clone(&self.functions) }
    }
}

#[pymethods]
impl PyStream {
    /// The events for which `keep(event)` is true.
    fn filter(&self, keep: Py<PyAny>) -> PyStream {
        let f = Arc::clone(&self.functions);
        self.next(self.stream.filter(move |event| {
            f.call(|py| keep.call1(py, (f.event(py, event)?,))?.bind(py).is_truthy())
                .unwrap_or(false)
        }))
    }

    /// Each event replaced by `f(event)`: an `Event` or a `(key, value)` pair (keeping the
    /// time). The key may change: a later `group_by_key` repartitions.
    fn map(&self, f: Py<PyAny>) -> PyStream {
        let fs = Arc::clone(&self.functions);
        self.next(self.stream.map(move |event| {
            fs.call(|py| fs.returned(f.call1(py, (fs.event(py, &event)?,))?.bind(py), &event))
                .unwrap_or(event)
        }))
    }

    /// Each event's value replaced by `f(event)`.
    fn map_values(&self, f: Py<PyAny>) -> PyStream {
        let fs = Arc::clone(&self.functions);
        self.next(self.stream.map_values(move |event| {
            fs.call(|py| fs.value.encode(f.call1(py, (fs.event(py, event)?,))?.bind(py)))
                .unwrap_or_default()
        }))
    }

    /// Each event replaced by the events (or `(key, value)` pairs) `f(event)` yields.
    fn flat_map(&self, f: Py<PyAny>) -> PyStream {
        let fs = Arc::clone(&self.functions);
        self.next(self.stream.flat_map(move |event| {
            fs.call(|py| {
                let items = f.call1(py, (fs.event(py, &event)?,))?;
                let mut out = Vec::new();
                for item in items.bind(py).try_iter()? {
                    out.push(fs.returned(&item?, &event)?);
                }
                Ok(out)
            })
            .unwrap_or_default()
        }))
    }

    /// The same events, each shown to `f(event)` first.
    fn peek(&self, f: Py<PyAny>) -> PyStream {
        let fs = Arc::clone(&self.functions);
        self.next(self.stream.peek(move |event| {
            let _ = fs.call(|py| f.call1(py, (fs.event(py, event)?,)));
        }))
    }

    /// Events grouped by the key `key(event)` returns, repartitioned by it through an
    /// internal topic.
    fn group_by(&self, key: Py<PyAny>) -> PyGrouped {
        let fs = Arc::clone(&self.functions);
        let grouped = self.stream.group_by(move |event| {
            fs.call(|py| {
                let key = key.call1(py, (fs.event(py, event)?,))?;
                fs.key.encode(key.bind(py)).map_err(|e| {
                    PyTypeError::new_err(format!(
                        "group_by's function returned a key the key format refuses: {e}"
                    ))
                })
            })
            .unwrap_or_default()
        });
        PyGrouped { grouped, functions: Arc::clone(&self.functions) }
    }

    /// Events grouped by their key (repartitioned only after an operator that may have
    /// changed keys).
    fn group_by_key(&self) -> PyGrouped {
        PyGrouped { grouped: self.stream.group_by_key(), functions: Arc::clone(&self.functions) }
    }

    /// Each event joined with its key's row in `table` as of the event's time: the new value
    /// is `f(event, row)`. Events without a row are dropped.
    fn join(&self, table: &PyTable, f: Py<PyAny>) -> PyStream {
        let fs = Arc::clone(&self.functions);
        self.next(self.stream.join(&table.0, move |event, row| {
            fs.call(|py| {
                let row = fs.value.decode(py, row)?;
                fs.value.encode(f.call1(py, (fs.event(py, event)?, row))?.bind(py))
            })
            .unwrap_or_default()
        }))
    }

    /// `join`, keeping events without a row: `f(event, None)`.
    fn left_join(&self, table: &PyTable, f: Py<PyAny>) -> PyStream {
        let fs = Arc::clone(&self.functions);
        self.next(self.stream.left_join(&table.0, move |event, row| {
            fs.call(|py| {
                let row = match row {
                    Some(row) => fs.value.decode(py, row)?.unbind(),
                    None => py.None(),
                };
                fs.value.encode(f.call1(py, (fs.event(py, event)?, row))?.bind(py))
            })
            .unwrap_or_default()
        }))
    }

    /// Pairs of events with the same key, one of this stream and one of `other`, at most
    /// `window_ms` apart: the joined value is `f(this_event, other_event)`.
    #[pyo3(signature = (other, window_ms, f, grace_ms = 0))]
    fn join_stream(
        &self,
        other: &PyStream,
        window_ms: i64,
        f: Py<PyAny>,
        grace_ms: i64,
    ) -> PyStream {
        let joiner = self.stream_joiner(f);
        let windows = JoinWindows::of(window_ms).grace(grace_ms);
        self.next(self.stream.join_stream(&other.stream, windows, move |left, right| {
            joiner(Some(left), Some(right))
        }))
    }

    /// `join_stream`, and each event of this stream that no event of `other` joined within
    /// the window: `f(this_event, None)`, once the window and grace have passed, at its own
    /// time.
    #[pyo3(signature = (other, window_ms, f, grace_ms = 0))]
    fn left_join_stream(
        &self,
        other: &PyStream,
        window_ms: i64,
        f: Py<PyAny>,
        grace_ms: i64,
    ) -> PyStream {
        let joiner = self.stream_joiner(f);
        let windows = JoinWindows::of(window_ms).grace(grace_ms);
        self.next(
            self.stream.left_join_stream(&other.stream, windows, move |left, right| {
                joiner(Some(left), right)
            }),
        )
    }

    /// `left_join_stream` on both sides: pairs, and the events of either stream without a
    /// partner, `f(this_event, None)` or `f(None, other_event)`.
    #[pyo3(signature = (other, window_ms, f, grace_ms = 0))]
    fn outer_join_stream(
        &self,
        other: &PyStream,
        window_ms: i64,
        f: Py<PyAny>,
        grace_ms: i64,
    ) -> PyStream {
        let windows = JoinWindows::of(window_ms).grace(grace_ms);
        self.next(self.stream.outer_join_stream(&other.stream, windows, self.stream_joiner(f)))
    }

    /// Write each event to `topic` (which must exist). A windowed result carries its window
    /// in the headers `window.start` and `window.end`.
    fn to(&self, topic: &str) {
        self.stream.to(topic);
    }
}

/// A grouped stream, to aggregate in windows or not.
#[pyclass(name = "Grouped", module = "chronik._chronik", frozen)]
pub(crate) struct PyGrouped {
    grouped: Grouped,
    functions: Arc<Functions>,
}

/// An aggregation's functions: `reduce(f)` or `aggregate(init, add, merge)`, on decoded
/// values, the aggregate kept in the value format.
fn reducer(
    fs: &Arc<Functions>,
    f: Py<PyAny>,
) -> impl Fn(&[u8], &[u8]) -> Vec<u8> + Send + Sync + 'static {
    let fs = Arc::clone(fs);
    move |aggregate, value| {
        fs.call(|py| {
            let (a, v) = (fs.value.decode(py, aggregate)?, fs.value.decode(py, value)?);
            fs.value.encode(f.call1(py, (a, v))?.bind(py))
        })
        .unwrap_or_default()
    }
}

type Init = Box<dyn Fn() -> Vec<u8> + Send + Sync>;
type Add = Box<dyn Fn(&[u8], &Event) -> Vec<u8> + Send + Sync>;

fn aggregator(fs: &Arc<Functions>, init: Py<PyAny>, add: Py<PyAny>) -> (Init, Add) {
    let (f_init, f_add) = (Arc::clone(fs), Arc::clone(fs));
    let init: Init = Box::new(move || {
        f_init.call(|py| f_init.value.encode(init.call0(py)?.bind(py))).unwrap_or_default()
    });
    let add: Add = Box::new(move |aggregate, event| {
        f_add
            .call(|py| {
                let aggregate = f_add.value.decode(py, aggregate)?;
                let added = add.call1(py, (aggregate, f_add.event(py, event)?))?;
                f_add.value.encode(added.bind(py))
            })
            .unwrap_or_default()
    });
    (init, add)
}

#[pymethods]
impl PyGrouped {
    /// The aggregation's store (and changelog) name.
    fn named(&self, store: &str) -> PyGrouped {
        PyGrouped {
            grouped: self.grouped.clone().named(store),
            functions: Arc::clone(&self.functions),
        }
    }

    /// The aggregation's store kind: "memory", "disk" or "disk:<MiB>".
    fn store_kind(&self, kind: &str) -> PyResult<PyGrouped> {
        let kind: StoreKind = kind.parse().map_err(InvalidArgumentError::new_err)?;
        Ok(PyGrouped {
            grouped: self.grouped.clone().store_kind(kind),
            functions: Arc::clone(&self.functions),
        })
    }

    /// Aggregate in `windows`; `emit`: "updates" (after every event, the default) or "final"
    /// (once, when the window closes); `late_to`: a topic for events too late for their
    /// windows (counted either way).
    #[pyo3(signature = (windows, emit = "updates", late_to = None))]
    fn window(
        &self,
        windows: &PyWindows,
        emit: &str,
        late_to: Option<&str>,
    ) -> PyResult<PyWindowed> {
        let emit = match emit {
            "updates" => Emit::Updates,
            "final" => Emit::Final,
            other => {
                return Err(InvalidArgumentError::new_err(format!(
                    "emit {other:?}: \"updates\" or \"final\""
                )));
            }
        };
        let mut windowed = self.grouped.clone().window(windows.0).emit(emit);
        if let Some(topic) = late_to {
            windowed = windowed.late_to(topic);
        }
        Ok(PyWindowed { windowed, functions: Arc::clone(&self.functions) })
    }

    /// Events per key so far (an int in the "json" value format).
    fn count(&self) -> PyStream {
        self.stream(self.grouped.clone().count())
    }

    /// Per key, `f(aggregate, value)` folded from the first value.
    fn reduce(&self, f: Py<PyAny>) -> PyStream {
        self.stream(self.grouped.clone().reduce(reducer(&self.functions, f)))
    }

    /// Per key, `add(aggregate, event)` folded from `init()`.
    fn aggregate(&self, init: Py<PyAny>, add: Py<PyAny>) -> PyStream {
        let (init, add) = aggregator(&self.functions, init, add);
        self.stream(self.grouped.clone().aggregate(init, add))
    }
}

impl PyGrouped {
    fn stream(&self, stream: Stream) -> PyStream {
        PyStream { stream, functions: Arc::clone(&self.functions) }
    }
}

/// A grouped stream in windows, to aggregate.
#[pyclass(name = "Windowed", module = "chronik._chronik", frozen)]
pub(crate) struct PyWindowed {
    windowed: Windowed,
    functions: Arc<Functions>,
}

#[pymethods]
impl PyWindowed {
    /// Events per key and window.
    fn count(&self) -> PyStream {
        self.stream(self.windowed.clone().count())
    }

    /// Per key and window, `f(aggregate, value)` folded from the first value.
    fn reduce(&self, f: Py<PyAny>) -> PyStream {
        self.stream(self.windowed.clone().reduce(reducer(&self.functions, f)))
    }

    /// Per key and window, `add(aggregate, event)` folded from `init()`; session windows
    /// need `merge(a, b)` too, for two sessions an event bridges.
    #[pyo3(signature = (init, add, merge = None))]
    fn aggregate(&self, init: Py<PyAny>, add: Py<PyAny>, merge: Option<Py<PyAny>>) -> PyStream {
        let (init, add) = aggregator(&self.functions, init, add);
        let windowed = self.windowed.clone();
        let stream = match merge {
            Some(merge) => windowed.aggregate_merging(init, add, reducer(&self.functions, merge)),
            None => windowed.aggregate(init, add),
        };
        self.stream(stream)
    }
}

impl PyWindowed {
    fn stream(&self, stream: Stream) -> PyStream {
        PyStream { stream, functions: Arc::clone(&self.functions) }
    }
}

/// A topology: streams, tables and their operators, run exactly once on a data directory.
///
///     topology = chronik.Topology(db, "per-minute", key_format="str")
///     (topology.stream("clicks")
///         .group_by_key()
///         .window(chronik.Windows.tumbling(60_000, grace_ms=5_000), emit="final")
///         .count()
///         .to("clicks-per-minute"))
///     topology.run_until_caught_up()
///
/// `db` may be `None` for a topology only simulated (`chronik.testing.simulate`). Keys are in
/// `key_format`, values (and aggregates) in `value_format`: "bytes", "str" or "json".
/// Settings: commit_interval_ms, commit_every_records, snapshot_every_commits, threads,
/// store_kind, store_memory_mib, on_decode_error and dead_letter_topic (the records of its streams, not its
/// tables, are checked against the formats before any operator sees them: as `App`'s).
#[pyclass(name = "Topology", module = "chronik._chronik", frozen)]
pub(crate) struct PyTopology {
    pub(crate) topology: Topology,
    pub(crate) functions: Arc<Functions>,
    db: Option<Arc<crate::Shared>>,
    /// A Kafka-protocol cluster (a `chronik.Cluster` as `db`), and the guarantee to run with.
    #[cfg(feature = "kafka")]
    cluster: Option<(Arc<chronik::kafka::KafkaClient>, chronik::processor::Guarantee)>,
    state: Arc<AppState<Runner>>,
    /// The formats' names.
    #[pyo3(get)]
    key_format: String,
    #[pyo3(get)]
    value_format: String,
}

impl PyTopology {
    /// Run on the cluster, if this topology has one (`None`: it has a data directory).
    #[cfg(feature = "kafka")]
    fn on_cluster(
        &self,
        py: Python<'_>,
        until: chronik::processor::Until<'_>,
    ) -> Option<PyResult<RunStats>> {
        use chronik::Log as _;
        let (client, guarantee) = self.cluster.as_ref()?;
        let result = py.detach(|| client.run_topology(&self.topology, *guarantee, until));
        let raised = self.functions.take_raised();
        Some(result.map_err(|e| run_error_raising(|| raised, e)))
    }

    #[cfg(not(feature = "kafka"))]
    #[allow(clippy::unused_self)] // the signature of the Kafka build's
    fn on_cluster(
        &self,
        _py: Python<'_>,
        _until: chronik::processor::Until<'_>,
    ) -> Option<PyResult<RunStats>> {
        None
    }

    fn with_runner<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut Runner) -> Result<T, ProcessorError> + Send,
    ) -> PyResult<T> {
        let db = self.db.as_ref().ok_or_else(|| {
            InvalidArgumentError::new_err("this topology has no data directory (db=None)")
        })?;
        let mut guard = self
            .state
            .runner
            .try_lock()
            .map_err(|_| ChronikError::new_err("the topology is already running"))?;
        if self.state.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ClosedError::new_err("the data directory is closed"));
        }
        let chronik = db.get()?;
        let runner = guard.take();
        let (runner, result) = py.detach(|| {
            let made = runner.map_or_else(|| self.topology.runner(chronik.engine()), Ok);
            let mut runner = match made {
                Ok(runner) => runner,
                Err(e) => return (None, Err(e)),
            };
            let result = call(&mut runner);
            (result.is_ok().then_some(runner), result)
        });
        drop(chronik);
        *guard = runner;
        // Taken whatever the error: an exception left in the slot would fail later runs.
        let raised = self.functions.take_raised();
        result.map_err(|e| run_error_raising(|| raised, e))
    }
}

#[pymethods]
impl PyTopology {
    #[new]
    #[pyo3(signature = (db, name, key_format = "str", value_format = "json", **options))]
    fn new(
        db: Option<&Bound<'_, PyAny>>,
        name: &str,
        key_format: &str,
        value_format: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyTopology> {
        // On a cluster: "exactly-once" (Kafka transactions) or "at-least-once", by the
        // `guarantee` option or CHRONIK_GUARANTEE; embedded runs are always exactly once.
        let guarantee: Option<String> = match options {
            Some(options) => match options.get_item("guarantee")? {
                Some(value) => {
                    options.del_item("guarantee")?;
                    value.extract()?
                }
                None => None,
            },
            None => None,
        };
        let (db, cluster) = target(db, guarantee)?;
        let functions = Arc::new(Functions {
            key: Codec::parse(key_format)?,
            value: Codec::parse(value_format)?,
            raised: Mutex::new(None),
            streams: RwLock::new(BTreeSet::new()),
        });
        let topology = Topology::new(name);
        let mut config = chronik::processor::ProcessorConfig::new(name, "");
        if let Some(options) = options {
            apply_options(&mut config, options)?;
        }
        let streams = Arc::clone(&functions);
        config.decode_check = record_check(functions.key, functions.value, move |topic| {
            streams.streams.read().unwrap_or_else(PoisonError::into_inner).contains(topic)
        });
        topology.configure(|_| config);
        let raised = Arc::clone(&functions);
        topology.around_batch(Arc::new(move |batch| {
            Python::attach(|_py| {
                let result = batch();
                let failed =
                    raised.raised.lock().ok().and_then(|r| r.as_ref().map(ToString::to_string));
                match failed {
                    Some(message) => Err(ProcessError::new(message)),
                    None => result,
                }
            })
        }));
        let state = Arc::new(AppState::new());
        let db = match db {
            Some(db) => {
                db.get()?;
                db.shared.register(&state);
                Some(Arc::clone(&db.shared))
            }
            None => None,
        };
        #[cfg(not(feature = "kafka"))]
        let () = cluster;
        Ok(PyTopology {
            topology,
            functions,
            db,
            #[cfg(feature = "kafka")]
            cluster,
            state,
            key_format: key_format.to_owned(),
            value_format: value_format.to_owned(),
        })
    }

    /// The records of `topic`, as a stream.
    fn stream(&self, topic: &str) -> PyStream {
        let mut streams = self.functions.streams.write().unwrap_or_else(PoisonError::into_inner);
        streams.insert(topic.to_owned());
        drop(streams);
        PyStream { stream: self.topology.stream(topic), functions: Arc::clone(&self.functions) }
    }

    /// The latest value per key of `topic` (an empty value deletes), co-partitioned with the
    /// streams joined to it.
    fn table(&self, topic: &str) -> PyTable {
        PyTable(self.topology.table(topic))
    }

    /// The stages, operators, topics and stores.
    fn describe(&self) -> String {
        self.topology.describe()
    }

    /// The topics read from outside, in the order first used.
    fn sources(&self) -> Vec<String> {
        self.topology.sources()
    }

    /// Restore the stores (first time) and process every stage up to its inputs' end, then
    /// commit. On the calling thread (the GIL is taken per batch).
    fn run_until_caught_up<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats: RunStats = match self.on_cluster(py, chronik::processor::Until::CaughtUp) {
            Some(result) => result?,
            None => self.with_runner(py, Runner::run_until_caught_up)?,
        };
        stats_dict(py, stats)
    }

    /// Run every stage on its threads until `stop()`, `seconds` or Ctrl-C; then commit.
    #[pyo3(signature = (seconds = None))]
    fn run<'py>(&self, py: Python<'py>, seconds: Option<f64>) -> PyResult<Bound<'py, PyDict>> {
        let stats = run_stoppable(py, &self.state.stop, seconds, || {
            Python::attach(|py| {
                let until = chronik::processor::Until::Stopped(&self.state.stop);
                match self.on_cluster(py, until) {
                    Some(result) => result,
                    None => self.with_runner(py, |runner| runner.run_until(&self.state.stop)),
                }
            })
        })?;
        stats_dict(py, stats)
    }

    /// Make a `run` in progress stop cleanly.
    fn stop(&self) {
        self.state.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Events too late for their windows, over every windowed operator, as of the last
    /// commit (exact across crashes).
    fn late_records(&self, py: Python<'_>) -> PyResult<u64> {
        #[cfg(feature = "kafka")]
        if self.cluster.is_some() {
            return Err(InvalidArgumentError::new_err(
                "on a cluster the stores are the group's: each run's late records are in the \
                 dict it returns (late_records)",
            ));
        }
        self.with_runner(py, |runner| runner.late_records())
    }

    fn __repr__(&self) -> String {
        self.topology.describe()
    }
}

/// A data directory (`chronik.Chronik`) or, with the Kafka backend, a cluster
/// (`chronik.Cluster`, whose `_rust` is the connection) to run a topology on.
#[cfg(feature = "kafka")]
type ClusterTarget = Option<(Arc<chronik::kafka::KafkaClient>, chronik::processor::Guarantee)>;
#[cfg(not(feature = "kafka"))]
type ClusterTarget = ();

#[cfg_attr(not(feature = "kafka"), allow(clippy::needless_pass_by_value))]
fn target<'a, 'py>(
    db: Option<&'a Bound<'py, PyAny>>,
    guarantee: Option<String>,
) -> PyResult<(Option<PyRef<'py, PyChronik>>, ClusterTarget)> {
    let _ = &guarantee; // Read on a cluster only: embedded runs are always exactly once.
    let Some(db) = db else { return Ok((None, ClusterTarget::default())) };
    if let Ok(chronik) = db.extract::<PyRef<'py, PyChronik>>() {
        return Ok((Some(chronik), ClusterTarget::default()));
    }
    #[cfg(feature = "kafka")]
    if let Ok(rust) = db.getattr("_rust")
        && let Ok(cluster) = rust.cast::<crate::kafka::PyCluster>()
    {
        let guarantee = guarantee.or_else(|| std::env::var("CHRONIK_GUARANTEE").ok());
        let guarantee = match guarantee {
            Some(name) => name.parse().map_err(|_| {
                InvalidArgumentError::new_err(format!(
                    "guarantee {name:?}: exactly-once or at-least-once"
                ))
            })?,
            None => chronik::processor::Guarantee::ExactlyOnce,
        };
        return Ok((None, Some((Arc::clone(&cluster.get().client), guarantee))));
    }
    Err(PyTypeError::new_err(format!(
        "a topology runs on a data directory (chronik.open) or a cluster (chronik.connect), not \
         {}",
        db.get_type().name()?
    )))
}

/// Run a topology under the simulator (see `chronik.testing.simulate`): records already
/// encoded, `(input index into sources(), partition, key, value, timestamp)`.
#[pyfunction]
#[pyo3(signature = (topology, input_partitions, outputs, records, seeds, crashes_max))]
fn simulate_topology<'py>(
    py: Python<'py>,
    topology: &PyTopology,
    input_partitions: u32,
    outputs: Vec<(String, u32)>,
    records: Vec<crate::processor::SimulatedRecord>,
    seeds: (u64, u64),
    crashes_max: u32,
) -> PyResult<Bound<'py, PyDict>> {
    use chronik::testing::Simulation;
    if input_partitions == 0 {
        return Err(InvalidArgumentError::new_err("input_partitions must be at least 1"));
    }
    let sources = topology.topology.sources();
    let first = sources.first().ok_or_else(|| InvalidArgumentError::new_err("no stream"))?;
    let input = crate::processor::simulated_input(records, sources.len(), input_partitions)?;
    let simulation = Simulation {
        config: chronik::processor::ProcessorConfig::new(&topology.topology.application(), first),
        input_partitions,
        outputs,
        input,
        seeds: seeds.0..seeds.1,
        crashes_max,
    };
    let result = py.detach(|| simulation.run_topology(&topology.topology));
    crate::processor::simulation_result(py, result, || topology.functions.take_raised())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(simulate_topology, m)?)?;
    m.add_class::<PyTopology>()?;
    m.add_class::<PyStream>()?;
    m.add_class::<PyTable>()?;
    m.add_class::<PyGrouped>()?;
    m.add_class::<PyWindowed>()?;
    m.add_class::<PyWindows>()?;
    m.add_class::<PyEvent>()?;
    Ok(())
}
