//! Python processors on the Rust runner (`chronik::processor`): the loop, the stores, the
//! commits and the restore are Rust's; a Python handler is called with the GIL taken once per
//! batch of records (up to `chronik::processor::BATCH_RECORDS_MAX`), never per record.
//!
//! A task's stores live in the Rust `Store`s of its `Context`; for the length of a batch they
//! are moved into the task's Python `Store` objects (a move, not a copy) and moved back after,
//! so the handler reads and writes them directly. Outside a call they are empty and refuse to
//! be used. The handler's emits are collected and handed to the context after the batch.

use crate::codec::{self, Codec};
use crate::{
    ChronikError, ClosedError, CorruptionError, DecodeError, InvalidArgumentError, NotFoundError,
    PyChronik, PyRecord, commit_error,
};
use chronik::processor::{
    Context, DecodeCheck, OnDecodeError, ProcessError, Processor, ProcessorConfig, ProcessorError,
    Punctuation, RunStats, Runner, Store, StoreKind,
};
use chronik::{RecordView, SystemIo};
use pyo3::exceptions::{PyException, PyKeyError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pyo3::create_exception!(
    _chronik,
    SimulationFailure,
    PyException,
    "A simulated run's stores or outputs differ from the fault-free run's; `seed`, `kind` and \
     `detail` say which and how to replay it."
);

/// What every task of one application shares: how to make a handler, and the formats.
pub(crate) struct Spec {
    /// `factory(partition)` returns the handler object: it has `process(record, ctx)` or
    /// `process_batch(records, ctx)`, and optionally `init(ctx)`, `punctuate(kind, time,
    /// ctx)` and `close(ctx)`.
    factory: Py<PyAny>,
    key_format: Codec,
    value_format: Codec,
    /// The stores, in `ProcessorConfig::stores` order, with their formats.
    pub(crate) stores: Vec<(String, Codec)>,
    /// The Python exception a handler raised last, re-raised as itself when the run ends.
    raised: Mutex<Option<PyErr>>,
}

impl Spec {
    fn take_raised(&self) -> Option<PyErr> {
        self.raised.lock().ok().and_then(|mut raised| raised.take())
    }
}

/// One task's handler and the Python objects it is given.
pub(crate) struct PyProcessor {
    spec: Arc<Spec>,
    /// Why the handler could not be made (reported by `init`).
    broken: Option<PyErr>,
    process: Option<Py<PyAny>>,
    process_batch: Option<Py<PyAny>>,
    init: Option<Py<PyAny>>,
    punctuate: Option<Py<PyAny>>,
    close: Option<Py<PyAny>>,
    ctx: Option<Py<PyContext>>,
    stores: Vec<Py<PyStore>>,
}

impl PyProcessor {
    pub(crate) fn new(spec: &Arc<Spec>, partition: u32) -> PyProcessor {
        let mut made = PyProcessor {
            spec: Arc::clone(spec),
            broken: None,
            process: None,
            process_batch: None,
            init: None,
            punctuate: None,
            close: None,
            ctx: None,
            stores: Vec::new(),
        };
        if let Err(e) = Python::attach(|py| made.make(py, partition)) {
            made.broken = Some(e);
        }
        made
    }

    fn make(&mut self, py: Python<'_>, partition: u32) -> PyResult<()> {
        let handler = self.spec.factory.call1(py, (partition,))?.into_bound(py);
        let method = |name: &str| -> PyResult<Option<Py<PyAny>>> {
            Ok(handler.getattr_opt(name)?.filter(|m| !m.is_none()).map(Bound::unbind))
        };
        self.process = method("process")?;
        self.process_batch = method("process_batch")?;
        self.init = method("init")?;
        self.punctuate = method("punctuate")?;
        self.close = method("close")?;
        if self.process.is_none() && self.process_batch.is_none() {
            return Err(InvalidArgumentError::new_err(
                "a processor needs a process(record, ctx) or process_batch(records, ctx) method",
            ));
        }
        for (name, format) in &self.spec.stores {
            let store = PyStore {
                name: name.clone(),
                format: *format,
                store: Store::default(),
                live: false,
            };
            self.stores.push(Py::new(py, store)?);
        }
        let stores = self.stores.iter().map(|s| s.clone_ref(py)).collect();
        let ctx = PyContext {
            stores,
            emits: Vec::new(),
            partition,
            stream_time: i64::MIN,
            input: String::new(),
            live: false,
        };
        self.ctx = Some(Py::new(py, ctx)?);
        Ok(())
    }

    /// Run `call` with the GIL and the task's stores and context in Python's hands.
    fn with_python(
        &mut self,
        ctx: &mut Context<'_>,
        call: impl FnOnce(Python<'_>, &PyProcessor, &Py<PyContext>) -> PyResult<()>,
    ) -> Result<(), ProcessError> {
        Python::attach(|py| {
            if let Some(e) = self.broken.take() {
                return Err(self.raise(py, e));
            }
            let py_ctx = self.ctx.as_ref().expect("a handler that is not broken has a context");
            let handed = self.hand_over(py, ctx, py_ctx);
            let result = handed.and_then(|()| call(py, self, py_ctx));
            let returned = self.take_back(py, ctx, py_ctx);
            result.and(returned).map_err(|e| self.raise(py, e))
        })
    }

    fn hand_over(
        &self,
        py: Python<'_>,
        ctx: &mut Context<'_>,
        py_ctx: &Py<PyContext>,
    ) -> PyResult<()> {
        for ((name, _), store) in self.spec.stores.iter().zip(&self.stores) {
            let mut store = store.try_borrow_mut(py)?;
            store.store = std::mem::take(ctx.store(name).map_err(process_error)?);
            store.live = true;
        }
        let mut c = py_ctx.try_borrow_mut(py)?;
        c.live = true;
        c.stream_time = ctx.stream_time();
        if c.input != ctx.input() {
            ctx.input().clone_into(&mut c.input);
        }
        Ok(())
    }

    fn take_back(
        &self,
        py: Python<'_>,
        ctx: &mut Context<'_>,
        py_ctx: &Py<PyContext>,
    ) -> PyResult<()> {
        for ((name, _), store) in self.spec.stores.iter().zip(&self.stores) {
            let mut store = store.try_borrow_mut(py)?;
            store.live = false;
            *ctx.store(name).map_err(process_error)? = std::mem::take(&mut store.store);
        }
        let mut c = py_ctx.try_borrow_mut(py)?;
        c.live = false;
        for (topic, key, value) in c.emits.drain(..) {
            ctx.emit_owned(&topic, key, value);
        }
        Ok(())
    }

    /// Keep the Python exception to re-raise it when the run ends; the runner gets its text.
    fn raise(&self, py: Python<'_>, e: PyErr) -> ProcessError {
        let message = e.value(py).repr().map_or_else(|_| e.to_string(), |r| r.to_string());
        if let Ok(mut raised) = self.spec.raised.lock() {
            *raised = Some(e);
        }
        ProcessError(message)
    }

    /// `record` for the handler, decoded; `c` says where it is from if it does not decode.
    fn record<'py>(
        &self,
        py: Python<'py>,
        record: &RecordView<'_>,
        c: &Py<PyContext>,
    ) -> PyResult<Bound<'py, PyRecord>> {
        // The runner's check passed it, but that is the formats' syntax only: name the
        // record here too (whatever the policy, as the handler cannot be given it).
        let named = |part: &str, e: PyErr| {
            let c = c.borrow(py);
            let reason = format!("{part} {}", e.value(py));
            let message = format!(
                "input {:?}, partition {}, offset {}: cannot decode: {reason}",
                c.input,
                c.partition,
                record.offset().get()
            );
            decode_error(message, &c.input, c.partition, record.offset().get(), &reason)
        };
        let key = match record.key() {
            Some(key) => {
                Some(self.spec.key_format.decode(py, key).map_err(|e| named("key", e))?.unbind())
            }
            None => None,
        };
        let value = self.spec.value_format.decode(py, record.value());
        let value = value.map_err(|e| named("value", e))?.unbind();
        let headers = record
            .headers()
            .map(|h| (PyBytes::new(py, h.key).unbind(), PyBytes::new(py, h.value).unbind()))
            .collect();
        Bound::new(
            py,
            PyRecord {
                offset: record.offset().get(),
                timestamp: record.timestamp(),
                key,
                value,
                headers,
            },
        )
    }
}

fn process_error(e: ProcessError) -> PyErr {
    InvalidArgumentError::new_err(e.0)
}

fn call_optional<'py>(
    py: Python<'py>,
    method: Option<&Py<PyAny>>,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<()> {
    if let Some(method) = method {
        method.call1(py, args)?;
    }
    Ok(())
}

impl Processor for PyProcessor {
    fn init(&mut self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        self.with_python(ctx, |py, me, c| call_optional(py, me.init.as_ref(), (c,)))
    }

    fn process(
        &mut self,
        record: &RecordView<'_>,
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        self.process_batch(std::slice::from_ref(record), ctx)
    }

    fn process_batch(
        &mut self,
        records: &[RecordView<'_>],
        ctx: &mut Context<'_>,
    ) -> Result<(), ProcessError> {
        self.with_python(ctx, |py, me, c| {
            if let Some(batch) = &me.process_batch {
                let list = PyList::empty(py);
                for record in records {
                    list.append(me.record(py, record, c)?)?;
                }
                batch.call1(py, (list, c))?;
                return Ok(());
            }
            let process = me.process.as_ref().expect("checked when made");
            let mut stream_time = c.borrow(py).stream_time;
            for record in records {
                if record.timestamp() > stream_time {
                    stream_time = record.timestamp();
                    c.try_borrow_mut(py)?.stream_time = stream_time;
                }
                process.call1(py, (me.record(py, record, c)?, c))?;
            }
            Ok(())
        })
    }

    fn punctuate(&mut self, time: Punctuation, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        let (kind, time) = match time {
            Punctuation::StreamTime(t) => ("stream", t),
            Punctuation::WallClock(t) => ("wall", t),
        };
        self.with_python(ctx, |py, me, c| call_optional(py, me.punctuate.as_ref(), (kind, time, c)))
    }

    fn close(&mut self, ctx: &mut Context<'_>) -> Result<(), ProcessError> {
        self.with_python(ctx, |py, me, c| call_optional(py, me.close.as_ref(), (c,)))
    }
}

/// What a handler is given with each call: its stores, its emits, its partition and time.
#[pyclass(name = "Context", module = "chronik._chronik")]
pub(crate) struct PyContext {
    stores: Vec<Py<PyStore>>,
    emits: Vec<(String, Option<Vec<u8>>, Vec<u8>)>,
    partition: u32,
    stream_time: i64,
    input: String,
    live: bool,
}

impl PyContext {
    fn check(&self) -> PyResult<()> {
        if self.live {
            Ok(())
        } else {
            Err(ChronikError::new_err("a context is usable only inside its processor's calls"))
        }
    }
}

/// A key or value to emit: bytes-like or str as they are, anything else as JSON.
fn emitted(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    codec::raw(value).or_else(|_| Codec::Json.encode(value))
}

#[pymethods]
impl PyContext {
    /// The store named `name`: a dict-like view, usable during this call.
    fn store(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyStore>> {
        self.check()?;
        for store in &self.stores {
            if store.borrow(py).name == name {
                return Ok(store.clone_ref(py));
            }
        }
        Err(InvalidArgumentError::new_err(format!("no store named {name:?}")))
    }

    /// Emit a record to `topic`, committed with the task's next commit (exactly once). Keys and
    /// values that are bytes-like or str go as they are; others (int, dict, list...) as JSON.
    /// The partition is the key's, or without a key this task's partition (modulo the count).
    #[pyo3(signature = (topic, key, value))]
    fn emit(
        &mut self,
        topic: String,
        key: Option<&Bound<'_, PyAny>>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.check()?;
        let key = key.filter(|k| !k.is_none()).map(emitted).transpose()?;
        self.emits.push((topic, key, emitted(value)?));
        Ok(())
    }

    /// `emit` with the key (unless None) and the value encoded as JSON, strings included.
    #[pyo3(signature = (topic, key, value))]
    fn emit_json(
        &mut self,
        topic: String,
        key: Option<&Bound<'_, PyAny>>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.check()?;
        let key = key.filter(|k| !k.is_none()).map(|k| Codec::Json.encode(k)).transpose()?;
        self.emits.push((topic, key, Codec::Json.encode(value)?));
        Ok(())
    }

    /// The input partition: this task's, and its stores' partition.
    #[getter]
    fn partition(&self) -> u32 {
        self.partition
    }

    /// The largest input timestamp seen so far, milliseconds since the epoch.
    #[getter]
    fn stream_time(&self) -> i64 {
        self.stream_time
    }

    /// The input topic of the records being processed.
    #[getter]
    fn input(&self) -> &str {
        &self.input
    }
}

/// A task's key-value store, restored from its changelog: behaves like a dict (`get`, `[]`,
/// `in`, `del`, `len`, iteration, `items`, `range`) whose keys and values are encoded in the
/// store's format ("json" by default, or "bytes"). Ordered by encoded key.
#[pyclass(name = "Store", module = "chronik._chronik")]
pub(crate) struct PyStore {
    name: String,
    format: Codec,
    store: Store,
    live: bool,
}

impl PyStore {
    fn check(&self) -> PyResult<()> {
        if self.live {
            Ok(())
        } else {
            Err(ChronikError::new_err(format!(
                "store {:?} is usable only inside its processor's calls",
                self.name
            )))
        }
    }

    fn key(&self, key: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
        self.check()?;
        self.format.encode(key)
    }

    fn pairs<'py, 'a>(
        &self,
        py: Python<'py>,
        entries: impl Iterator<Item = Result<chronik::store::Entry<'a>, chronik::store::StoreError>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for entry in entries {
            let (key, value) = entry.map_err(store_error)?;
            let pair = (self.format.decode(py, &key)?, self.format.decode(py, &value)?);
            list.append(pair)?;
        }
        Ok(list)
    }
}

#[pymethods]
impl PyStore {
    #[pyo3(signature = (key, default = None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self.store.get(&self.key(key)?).map_err(store_error)? {
            Some(value) => self.format.decode(py, &value),
            None => Ok(default.unwrap_or_else(|| py.None().into_bound(py))),
        }
    }

    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match self.store.get(&self.key(key)?).map_err(store_error)? {
            Some(value) => self.format.decode(py, &value),
            None => Err(PyKeyError::new_err(key.clone().unbind())),
        }
    }

    fn __setitem__(&mut self, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = self.key(key)?;
        let value = self.format.encode(value)?;
        self.store.put(&key, &value);
        Ok(())
    }

    /// `del store[key]`: KeyError when absent, as a dict (so it reads the key first;
    /// `discard` deletes without reading).
    fn __delitem__(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let encoded = self.key(key)?;
        if !self.store.contains_key(&encoded).map_err(store_error)? {
            return Err(PyKeyError::new_err(key.clone().unbind()));
        }
        self.store.delete(&encoded);
        Ok(())
    }

    /// Delete `key` whether it is there or not, without reading it (a blind write).
    fn discard(&mut self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let encoded = self.key(key)?;
        self.store.delete(&encoded);
        Ok(())
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.store.contains_key(&self.key(key)?).map_err(store_error)
    }

    /// The number of keys, exactly: a scan of every entry for a disk store
    /// (`len_estimate()` answers at once).
    fn __len__(&self) -> PyResult<usize> {
        self.check()?;
        let count = self.store.count().map_err(store_error)?;
        Ok(usize::try_from(count).unwrap_or(usize::MAX))
    }

    /// The number of keys without reading: exact for a memory store, an estimate for a disk
    /// store (see the Rust `Store::len_estimate`).
    fn len_estimate(&self) -> PyResult<u64> {
        self.check()?;
        Ok(self.store.len_estimate())
    }

    /// The keys, in order (a list taken now: the store may change while you go through it).
    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.keys(py)?.try_iter().map(Bound::into_any)
    }

    /// Remove `key` and return its value, or `default` (KeyError without one).
    #[pyo3(signature = (key, default = None))]
    fn pop<'py>(
        &mut self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let encoded = self.key(key)?;
        let value = match self.store.get(&encoded).map_err(store_error)? {
            Some(value) => self.format.decode(py, &value)?,
            None => return default.ok_or_else(|| PyKeyError::new_err(key.clone().unbind())),
        };
        self.store.delete(&encoded);
        Ok(value)
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.check()?;
        let list = PyList::empty(py);
        for entry in &self.store {
            let (key, _) = entry.map_err(store_error)?;
            list.append(self.format.decode(py, &key)?)?;
        }
        Ok(list)
    }

    fn values<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.check()?;
        let list = PyList::empty(py);
        for entry in &self.store {
            let (_, value) = entry.map_err(store_error)?;
            list.append(self.format.decode(py, &value)?)?;
        }
        Ok(list)
    }

    /// Every `(key, value)`, in key order.
    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.check()?;
        self.pairs(py, self.store.iter())
    }

    /// The `(key, value)` pairs with `start <= key < end` (either bound may be None), in key
    /// order, compared by encoded key.
    #[pyo3(signature = (start = None, end = None))]
    fn range<'py>(
        &self,
        py: Python<'py>,
        start: Option<&Bound<'py, PyAny>>,
        end: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        use std::ops::Bound as B;
        self.check()?;
        let start = start.filter(|s| !s.is_none()).map(|s| self.key(s)).transpose()?;
        let end = end.filter(|e| !e.is_none()).map(|e| self.key(e)).transpose()?;
        let lower = start.as_deref().map_or(B::Unbounded, B::Included);
        let upper = end.as_deref().map_or(B::Unbounded, B::Excluded);
        if let (Some(s), Some(e)) = (&start, &end)
            && s >= e
        {
            return Ok(PyList::empty(py));
        }
        self.pairs(py, self.store.range::<(B<&[u8]>, B<&[u8]>)>((lower, upper)))
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
}

/// The processor configuration and formats from the Python side's keyword arguments.
#[allow(clippy::too_many_arguments)]
pub(crate) fn setup(
    application: &str,
    inputs: Vec<String>,
    factory: Py<PyAny>,
    stores: Vec<(String, String)>,
    key_format: &str,
    value_format: &str,
    options: &Bound<'_, PyDict>,
) -> PyResult<(ProcessorConfig, Arc<Spec>)> {
    let checked = check(application, inputs, stores, key_format, value_format, options)?;
    let spec = Spec {
        factory,
        key_format: checked.key_format,
        value_format: checked.value_format,
        stores: checked.stores,
        raised: Mutex::new(None),
    };
    Ok((checked.config, Arc::new(spec)))
}

/// A processor's settings, parsed and checked.
pub(crate) struct Checked {
    config: ProcessorConfig,
    key_format: Codec,
    value_format: Codec,
    stores: Vec<(String, Codec)>,
}

/// Parse and check what `setup` takes (all but the handler): store specs, formats and
/// options. `App` calls this from its constructor, so a bad setting is refused there rather
/// than at the first run, which is often far away.
pub(crate) fn check(
    application: &str,
    inputs: Vec<String>,
    stores: Vec<(String, String)>,
    key_format: &str,
    value_format: &str,
    options: &Bound<'_, PyDict>,
) -> PyResult<Checked> {
    let first = inputs.first().ok_or_else(|| InvalidArgumentError::new_err("no input topic"))?;
    let mut config = ProcessorConfig::new(application, first);
    config.inputs = inputs;
    let mut formats = Vec::with_capacity(stores.len());
    for (name, spec) in stores {
        if formats.iter().any(|(n, _)| *n == name) {
            return Err(InvalidArgumentError::new_err(format!("store {name:?} is named twice")));
        }
        let (codec, kind) = store_spec(&name, &spec)?;
        config.stores.push(name.clone());
        if let Some(kind) = kind {
            config.store_kinds.insert(name.clone(), kind);
        }
        formats.push((name, codec));
    }
    apply_options(&mut config, options)?;
    let (key_format, value_format) = (Codec::parse(key_format)?, Codec::parse(value_format)?);
    config.decode_check = record_check(key_format, value_format, |_| true);
    Ok(Checked { config, key_format, value_format, stores: formats })
}

/// Check an application's settings without making it (see [`check`]).
#[pyfunction]
#[pyo3(name = "_check_spec")]
pub(crate) fn check_spec(
    application: &str,
    inputs: Vec<String>,
    stores: Vec<(String, String)>,
    key_format: &str,
    value_format: &str,
    options: &Bound<'_, PyDict>,
) -> PyResult<()> {
    check(application, inputs, stores, key_format, value_format, options).map(drop)
}

/// The processor settings among `options` (keyword arguments), onto `config`.
pub(crate) fn apply_options(
    config: &mut ProcessorConfig,
    options: &Bound<'_, PyDict>,
) -> PyResult<()> {
    let (mut policy, mut dead_letter_topic) = (None, None);
    for (key, value) in options.iter() {
        let key: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        match key.as_str() {
            "commit_interval_ms" => config.commit_interval_ms = value.extract()?,
            "commit_every_records" => config.commit_every_records = Some(value.extract()?),
            "snapshot_every_commits" => config.snapshot_every_commits = Some(value.extract()?),
            "threads" => config.threads = value.extract()?,
            "store_kind" => {
                let text: String = value.extract()?;
                config.store_kind = text.parse().map_err(InvalidArgumentError::new_err)?;
            }
            "store_memory_mib" => {
                let mib: i64 = value.extract()?;
                let bytes = usize::try_from(mib)
                    .ok()
                    .and_then(|mib| mib.checked_mul(1 << 20))
                    .filter(|&b| b > 0)
                    .ok_or_else(|| {
                        InvalidArgumentError::new_err(format!("store_memory_mib {mib}: 1 or more"))
                    })?;
                config.store_memory = Some(chronik::processor::StoreMemory::new(bytes));
            }
            "punctuate_stream_ms" => config.punctuate_stream_ms = Some(value.extract()?),
            "punctuate_wall_ms" => config.punctuate_wall_ms = Some(value.extract()?),
            "on_decode_error" => policy = Some(value.extract::<String>()?),
            "dead_letter_topic" => dead_letter_topic = Some(value.extract::<String>()?),
            other => {
                return Err(InvalidArgumentError::new_err(format!("unknown option {other:?}")));
            }
        }
    }
    // The runner refuses these too, but only when it starts.
    if config.commit_interval_ms == 0 || config.threads == 0 {
        return Err(InvalidArgumentError::new_err("commit_interval_ms and threads must be > 0"));
    }
    config.on_decode_error = decode_policy(policy.as_deref(), dead_letter_topic)?;
    Ok(())
}

/// `on_decode_error` and `dead_letter_topic` as the runner's policy; a topic without the
/// dead-letter policy is refused rather than ignored (it would say records go where they
/// do not).
fn decode_policy(policy: Option<&str>, topic: Option<String>) -> PyResult<OnDecodeError> {
    match (policy.unwrap_or("fail"), topic) {
        ("fail", None) => Ok(OnDecodeError::Fail),
        ("skip", None) => Ok(OnDecodeError::Skip),
        ("dead_letter", Some(topic)) if !topic.is_empty() => {
            Ok(OnDecodeError::DeadLetter { topic })
        }
        ("dead_letter", _) => Err(InvalidArgumentError::new_err(
            "on_decode_error=\"dead_letter\" needs dead_letter_topic, an existing topic",
        )),
        ("fail" | "skip", Some(_)) => Err(InvalidArgumentError::new_err(
            "dead_letter_topic is used only with on_decode_error=\"dead_letter\"",
        )),
        (other, _) => Err(InvalidArgumentError::new_err(format!(
            "on_decode_error {other:?}: one of \"fail\", \"skip\", \"dead_letter\""
        ))),
    }
}

/// The runner's check that an input record's key (if any) and value decode in `key` and
/// `value`, for the inputs `checked` accepts; `None` when neither format can refuse.
pub(crate) fn record_check(
    key: Codec,
    value: Codec,
    checked: impl Fn(&str) -> bool + Send + Sync + 'static,
) -> Option<DecodeCheck> {
    if !key.can_refuse() && !value.can_refuse() {
        return None;
    }
    Some(Arc::new(move |topic, record| {
        if !checked(topic) {
            return Ok(());
        }
        if let Some(bytes) = record.key() {
            key.check(bytes).map_err(|e| format!("key {e}"))?;
        }
        value.check(record.value()).map_err(|e| format!("value {e}"))
    }))
}

/// A store's format and kind from its spec: `+`-separated words, each a format (`json`, the
/// default; `str`; `bytes`) or a kind (`memory`; `disk`; `disk:<MiB>`), e.g. `"disk"`,
/// `"str+disk:256"`.
fn store_spec(name: &str, spec: &str) -> PyResult<(Codec, Option<StoreKind>)> {
    let (mut codec, mut kind) = (Codec::Json, None);
    for word in spec.split('+').map(str::trim) {
        if let Ok(parsed) = word.parse::<StoreKind>() {
            kind = Some(parsed);
        } else {
            codec = Codec::parse(word).map_err(|_| {
                InvalidArgumentError::new_err(format!(
                    "store {name:?}: {word:?} is neither a format (\"json\", \"str\", \"bytes\") \
                     nor a kind (\"memory\", \"disk\", \"disk:<MiB>\")"
                ))
            })?;
        }
    }
    Ok((codec, kind))
}

/// A store read that failed: damage is `CorruptionError`, anything else `ChronikIoError`.
fn store_error(error: chronik::store::StoreError) -> PyErr {
    match error {
        chronik::store::StoreError::Damaged(_) => CorruptionError::new_err(error.to_string()),
        other => crate::ChronikIoError::new_err(other.to_string()),
    }
}

/// `DecodeError` with its `topic`, `partition`, `offset` and `reason`.
fn decode_error(message: String, topic: &str, partition: u32, offset: u64, reason: &str) -> PyErr {
    let err = DecodeError::new_err(message);
    Python::attach(|py| {
        let value = err.value(py);
        value.setattr("topic", topic)?;
        value.setattr("partition", partition)?;
        value.setattr("offset", offset)?;
        value.setattr("reason", reason)
    })
    .map_or_else(|e| e, |()| err)
}

/// A run's end as a Python exception: the handler's own exception when it raised one.
pub(crate) fn run_error(spec: &Spec, error: ProcessorError) -> PyErr {
    run_error_raising(|| spec.take_raised(), error)
}

/// [`run_error`] with the handler's exception from `raised`.
pub(crate) fn run_error_raising(
    raised: impl FnOnce() -> Option<PyErr>,
    error: ProcessorError,
) -> PyErr {
    match error {
        ProcessorError::Process { .. } => {
            raised().unwrap_or_else(|| ChronikError::new_err(error.to_string()))
        }
        ProcessorError::Config(_) => InvalidArgumentError::new_err(error.to_string()),
        ProcessorError::Decode { ref input, partition, offset, ref reason } => {
            decode_error(error.to_string(), input, partition, offset, reason)
        }
        ProcessorError::Topic(e) => crate::error(e.into()),
        ProcessorError::Read(e) => crate::error(e.into()),
        ProcessorError::Commit(e) => commit_error(e),
        ProcessorError::BadChangelog { .. }
        | ProcessorError::Store { source: chronik::processor::StoreError::Damaged(_), .. } => {
            CorruptionError::new_err(error.to_string())
        }
        other => ChronikError::new_err(other.to_string()),
    }
}

pub(crate) fn stats_dict(py: Python<'_>, stats: RunStats) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("records", stats.records)?;
    out.set_item("commits", stats.commits)?;
    out.set_item("emitted", stats.emitted)?;
    out.set_item("restored", stats.restored)?;
    out.set_item("snapshots_loaded", stats.snapshots_loaded)?;
    out.set_item("snapshots_written", stats.snapshots_written)?;
    out.set_item("stores_opened", stats.stores_opened)?;
    out.set_item("stores_rebuilt", stats.stores_rebuilt)?;
    out.set_item("late_records", stats.late_records)?;
    out.set_item("skipped_records", stats.skipped_records)?;
    out.set_item("dead_letters", stats.dead_letters)?;
    Ok(out)
}

type AppRunner = Runner<SystemIo, PyProcessor>;

/// Run `work` (which runs until `stop` is set) on another thread until it ends, `seconds`
/// have passed or Ctrl-C (then `stop` is set, and KeyboardInterrupt raised once it ended).
pub(crate) fn run_stoppable(
    py: Python<'_>,
    stop: &AtomicBool,
    seconds: Option<f64>,
    work: impl FnOnce() -> PyResult<RunStats> + Send,
) -> PyResult<RunStats> {
    stop.store(false, Ordering::Relaxed);
    let deadline = seconds.map(|s| Instant::now() + Duration::from_secs_f64(s.clamp(0.0, 1e9)));
    let done = AtomicBool::new(false);
    let mut interrupted: Option<PyErr> = None;
    let stats = std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let result = work();
            done.store(true, Ordering::Release);
            result
        });
        while !done.load(Ordering::Acquire) {
            py.detach(|| std::thread::sleep(Duration::from_millis(20)));
            if interrupted.is_none()
                && let Err(e) = py.check_signals()
            {
                interrupted = Some(e);
                stop.store(true, Ordering::Relaxed);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                stop.store(true, Ordering::Relaxed);
            }
        }
        py.detach(|| worker.join())
            .unwrap_or_else(|_| Err(ChronikError::new_err("the processor thread panicked")))
    });
    if let Some(e) = interrupted {
        return Err(e);
    }
    stats
}

/// What the data directory's close does to an application on it.
pub(crate) trait Close {
    /// Stop a run in progress, wait for it, and drop the runner (its engine handle).
    fn close(&self);
}

/// An application's runner and stop flag, reachable from the data directory's close.
pub(crate) struct AppState<R = AppRunner> {
    /// Made (and the stores restored) at the first run; kept between runs.
    pub(crate) runner: Mutex<Option<R>>,
    pub(crate) stop: AtomicBool,
    pub(crate) closed: AtomicBool,
}

impl<R> AppState<R> {
    pub(crate) fn new() -> AppState<R> {
        AppState {
            runner: Mutex::new(None),
            stop: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }
}

impl<R: Send> Close for AppState<R> {
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
        let runner = self.runner.lock().map(|mut runner| runner.take());
        drop(runner);
    }
}

/// A processor application on an open data directory (the `chronik.App` class wraps it).
#[pyclass(name = "_App", module = "chronik._chronik", frozen)]
pub(crate) struct PyApp {
    shared: Arc<crate::Shared>,
    config: ProcessorConfig,
    spec: Arc<Spec>,
    state: Arc<AppState>,
}

impl PyApp {
    /// The runner, made now if there is none yet, under `call`, with the GIL released.
    fn with_runner<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&mut AppRunner) -> Result<T, ProcessorError> + Send,
    ) -> PyResult<T> {
        let mut guard = self
            .state
            .runner
            .try_lock()
            .map_err(|_| ChronikError::new_err("the application is already running"))?;
        if self.state.closed.load(Ordering::Relaxed) {
            return Err(ClosedError::new_err("the data directory is closed"));
        }
        let chronik = self.shared.get()?;
        let runner = guard.take();
        let (runner, result) = py.detach(|| {
            let made = runner.map_or_else(
                || {
                    let spec = &self.spec;
                    Runner::new(chronik.engine(), self.config.clone(), |p| {
                        PyProcessor::new(spec, p)
                    })
                },
                Ok,
            );
            let mut runner = match made {
                Ok(runner) => runner,
                Err(e) => return (None, Err(e)),
            };
            let result = call(&mut runner);
            // After a failure its memory may be ahead of what is durable: the next run
            // restores afresh.
            (result.is_ok().then_some(runner), result)
        });
        drop(chronik);
        *guard = runner;
        result.map_err(|e| run_error(&self.spec, e))
    }
}

#[pymethods]
impl PyApp {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (db, application, inputs, factory, stores, key_format, value_format, options))]
    fn new(
        db: &PyChronik,
        application: &str,
        inputs: Vec<String>,
        factory: Py<PyAny>,
        stores: Vec<(String, String)>,
        key_format: &str,
        value_format: &str,
        options: &Bound<'_, PyDict>,
    ) -> PyResult<PyApp> {
        let (config, spec) =
            setup(application, inputs, factory, stores, key_format, value_format, options)?;
        db.get()?;
        let state = Arc::new(AppState::new());
        db.shared.register(&state);
        Ok(PyApp { shared: Arc::clone(&db.shared), config, spec, state })
    }

    /// Restore the stores (if not done yet) and process until every input partition is caught
    /// up with its high watermark, then commit. On the calling thread.
    fn run_until_caught_up<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.with_runner(py, Runner::run_until_caught_up)?;
        stats_dict(py, stats)
    }

    /// Run on the configured worker threads until `stop()` is called, `seconds` have passed
    /// or Ctrl-C (then the processors close and commit, and KeyboardInterrupt is raised).
    #[pyo3(signature = (seconds = None))]
    fn run<'py>(&self, py: Python<'py>, seconds: Option<f64>) -> PyResult<Bound<'py, PyDict>> {
        let stats = run_stoppable(py, &self.state.stop, seconds, || {
            Python::attach(|py| self.with_runner(py, |runner| runner.run_until(&self.state.stop)))
        })?;
        stats_dict(py, stats)
    }

    /// Ask a `run` in progress (on another thread, or from a signal handler) to stop.
    fn stop(&self) {
        self.state.stop.store(true, Ordering::Relaxed);
    }

    /// Store `name` of task `partition` as a dict, or with no partition every task's entries
    /// in one dict (a key held by two partitions is an error then: ask per partition).
    /// Restores the stores first if no run has.
    #[pyo3(signature = (name, partition = None))]
    fn store<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        partition: Option<u32>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let format = self
            .spec
            .stores
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| *f)
            .ok_or_else(|| NotFoundError::new_err(format!("no store named {name:?}")))?;
        let entries = self.with_runner(py, |runner| {
            let tasks = u32::try_from(runner.positions().len()).unwrap_or(u32::MAX);
            let mut all = Vec::new();
            for p in (0..tasks).filter(|p| partition.is_none_or(|wanted| wanted == *p)) {
                if let Some(store) = runner.store(p, name) {
                    for entry in store {
                        let (k, v) = entry.map_err(|source| ProcessorError::Store {
                            store: name.to_owned(),
                            partition: p,
                            source,
                        })?;
                        all.push((p, k.to_vec(), v.to_vec()));
                    }
                }
            }
            Ok((tasks, all))
        })?;
        let (tasks, entries) = entries;
        if partition.is_some_and(|p| p >= tasks) {
            return Err(NotFoundError::new_err(format!("no partition {partition:?}")));
        }
        let out = PyDict::new(py);
        let mut seen = std::collections::HashMap::new();
        for (p, key, value) in entries {
            if let Some(other) = seen.insert(key.clone(), p) {
                return Err(InvalidArgumentError::new_err(format!(
                    "store {name:?} holds a key in partitions {other} and {p}: ask per partition"
                )));
            }
            out.set_item(format.decode(py, &key)?, format.decode(py, &value)?)?;
        }
        Ok(out)
    }

    /// Per partition, the next offset of the first input to process.
    fn positions(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        self.with_runner(py, |runner| Ok(runner.positions().iter().map(|o| o.get()).collect()))
    }
}

/// A simulated input record: input index, partition, key, value, timestamp.
pub(crate) type SimulatedRecord = (usize, u32, Option<Vec<u8>>, Vec<u8>, Option<i64>);

/// Run a processor under the simulator (see `chronik.testing.simulate`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (application, inputs, factory, stores, key_format, value_format, options, input_partitions, outputs, records, seeds, crashes_max))]
pub(crate) fn simulate<'py>(
    py: Python<'py>,
    application: &str,
    inputs: Vec<String>,
    factory: Py<PyAny>,
    stores: Vec<(String, String)>,
    key_format: &str,
    value_format: &str,
    options: &Bound<'py, PyDict>,
    input_partitions: u32,
    outputs: Vec<(String, u32)>,
    records: Vec<SimulatedRecord>,
    seeds: (u64, u64),
    crashes_max: u32,
) -> PyResult<Bound<'py, PyDict>> {
    use chronik::testing::Simulation;
    let (config, spec) =
        setup(application, inputs, factory, stores, key_format, value_format, options)?;
    if input_partitions == 0 {
        return Err(InvalidArgumentError::new_err("input_partitions must be at least 1"));
    }
    let input = simulated_input(records, config.inputs.len(), input_partitions)?;
    let simulation = Simulation {
        config,
        input_partitions,
        outputs,
        input,
        seeds: seeds.0..seeds.1,
        crashes_max,
    };
    let result = py.detach(|| simulation.run(|p| PyProcessor::new(&spec, p)));
    simulation_result(py, result, || spec.take_raised())
}

/// Simulated records as the simulator takes them, checked against the inputs and partitions.
pub(crate) fn simulated_input(
    records: Vec<SimulatedRecord>,
    inputs: usize,
    input_partitions: u32,
) -> PyResult<Vec<chronik::testing::InputRecord>> {
    let mut input = Vec::with_capacity(records.len());
    for (which, partition, key, value, timestamp) in records {
        if which >= inputs || partition >= input_partitions {
            return Err(InvalidArgumentError::new_err(format!(
                "a record for input {which} partition {partition}: there are {inputs} inputs of \
                 {input_partitions} partitions"
            )));
        }
        let mut record = chronik::testing::InputRecord::new(partition, key, value).on(which);
        record.timestamp = timestamp;
        input.push(record);
    }
    Ok(input)
}

/// A simulation's report as a dict, or its failure as `SimulationFailure` (with the
/// exception the application's Python code raised, if any).
pub(crate) fn simulation_result(
    py: Python<'_>,
    result: Result<chronik::testing::SimulationReport, chronik::testing::SimulationFailure>,
    raised: impl FnOnce() -> Option<PyErr>,
) -> PyResult<Bound<'_, PyDict>> {
    use chronik::testing::FailureKind;
    match result {
        Ok(report) => {
            let out = PyDict::new(py);
            out.set_item("seeds", report.seeds)?;
            out.set_item("crashes", report.crashes)?;
            out.set_item("records_processed", report.records_processed)?;
            Ok(out)
        }
        Err(failure) => {
            let kind = match failure.kind {
                FailureKind::State => "state",
                FailureKind::Outputs => "outputs",
                FailureKind::Run => "run",
                FailureKind::Tail => "tail",
                FailureKind::Damage => "damage",
                FailureKind::Model => "model",
            };
            let mut message = failure.to_string();
            if let Some(raised) = raised()
                && failure.kind == FailureKind::Run
            {
                message = format!("{message}\nthe processor raised: {raised}");
            }
            let err = SimulationFailure::new_err(message);
            let value = err.value(py);
            value.setattr("seed", failure.seed)?;
            value.setattr("kind", kind)?;
            value.setattr("detail", failure.detail)?;
            Err(err)
        }
    }
}
