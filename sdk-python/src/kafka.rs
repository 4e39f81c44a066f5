//! `chronik.connect("kafka://HOST:PORT")`: the same producers and processor applications on a
//! Kafka-protocol cluster (the Rust SDK's `kafka` backend).

use crate::PyRecord;
use crate::processor::{PyProcessor, Spec, run_error, setup, stats_dict};
use crate::{ChronikError, InvalidArgumentError, NotFoundError};
use chronik::kafka::{ClusterConsumer, ClusterError, KafkaClient, KafkaConfig};
use chronik::processor::{Guarantee, ProcessorConfig, Until};
use chronik::{Header, OwnedRecord, Record, TransactionWrite};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, Mutex};

fn cluster_error(error: ClusterError) -> PyErr {
    match error {
        ClusterError::TopicNotFound { .. } => NotFoundError::new_err(error.to_string()),
        ClusterError::TopicExists { .. } => crate::AlreadyExistsError::new_err(error.to_string()),
        ClusterError::Address { .. } | ClusterError::Config { .. } => {
            InvalidArgumentError::new_err(error.to_string())
        }
        other => ChronikError::new_err(other.to_string()),
    }
}

/// A connection to a Kafka-protocol cluster (the `chronik.Cluster` class wraps it).
#[pyclass(name = "_Cluster", module = "chronik._chronik", frozen)]
pub(crate) struct PyCluster {
    pub(crate) client: Arc<KafkaClient>,
}

/// A record to send: key, value, headers, timestamp.
type Outgoing = (Option<Vec<u8>>, Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>, Option<i64>);

/// A record as the cluster's `records` returns it: offset, timestamp, key, value, headers.
type ClusterRecord = (u64, i64, Option<Py<PyBytes>>, Py<PyBytes>, Vec<(Py<PyBytes>, Py<PyBytes>)>);

#[pymethods]
impl PyCluster {
    /// `config`: Kafka client properties (`security.protocol`, `sasl.mechanism`, ...), as
    /// strings (the Python side turns booleans and numbers into them).
    #[new]
    #[pyo3(signature = (bootstrap, config = None))]
    fn new(
        py: Python<'_>,
        bootstrap: &str,
        config: Option<Vec<(String, String)>>,
    ) -> PyResult<PyCluster> {
        let mut settings = KafkaConfig::new(bootstrap);
        for (key, value) in config.unwrap_or_default() {
            settings = settings.set(key, value);
        }
        let client = py.detach(|| KafkaClient::connect_with(settings)).map_err(cluster_error)?;
        Ok(PyCluster { client: Arc::new(client) })
    }

    fn bootstrap(&self) -> &str {
        self.client.bootstrap()
    }

    fn list_topics(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        py.detach(|| self.client.topics()).map_err(cluster_error)
    }

    fn partition_count(&self, py: Python<'_>, topic: &str) -> PyResult<Option<u32>> {
        py.detach(|| self.client.partition_count(topic)).map_err(cluster_error)
    }

    #[pyo3(signature = (name, partitions = 1, compacted = false))]
    fn create_topic(
        &self,
        py: Python<'_>,
        name: &str,
        partitions: u32,
        compacted: bool,
    ) -> PyResult<()> {
        py.detach(|| self.client.create_topic(name, partitions, compacted)).map_err(cluster_error)
    }

    /// Send `(key, value, headers, timestamp)` records (bytes, key and timestamp may be None)
    /// per partition of `topic`, all acknowledged together; returns `(partition, first offset,
    /// last offset)` per partition given records, the offsets the cluster's delivery reports
    /// gave them.
    #[allow(clippy::needless_pass_by_value)] // pyo3 hands arguments over owned
    fn send(
        &self,
        py: Python<'_>,
        topic: &str,
        batches: Vec<(u32, Vec<Outgoing>)>,
    ) -> PyResult<Vec<(u32, u64, u64)>> {
        let headers: Vec<Vec<Vec<Header<'_>>>> = batches
            .iter()
            .map(|(_, records)| {
                records
                    .iter()
                    .map(|(_, _, h, _)| {
                        h.iter().map(|(k, v)| Header { key: k, value: v }).collect()
                    })
                    .collect()
            })
            .collect();
        let outgoing: Vec<Vec<Record<'_>>> = batches
            .iter()
            .zip(&headers)
            .map(|((_, records), headers)| {
                records
                    .iter()
                    .zip(headers)
                    .map(|((key, value, _, timestamp), headers)| {
                        let record = Record::new(key.as_deref(), value).with_headers(headers);
                        match timestamp {
                            Some(t) => record.with_timestamp(*t),
                            None => record,
                        }
                    })
                    .collect()
            })
            .collect();
        let writes: Vec<TransactionWrite<'_>> = batches
            .iter()
            .zip(&outgoing)
            .map(|((partition, _), records)| TransactionWrite {
                topic,
                partition: *partition,
                records,
            })
            .collect();
        let sent = py.detach(|| self.client.send_acknowledged(&writes)).map_err(cluster_error)?;
        Ok(sent.into_iter().flatten().map(|s| (s.partition, s.first, s.last)).collect())
    }

    fn delete_topic(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.detach(|| self.client.delete_topic(name)).map_err(cluster_error)
    }

    /// The topic's settings as the cluster names them, sorted.
    fn topic_config(&self, py: Python<'_>, name: &str) -> PyResult<Vec<(String, String)>> {
        py.detach(|| self.client.topic_config(name)).map_err(cluster_error)
    }

    /// The partition's low and high watermarks.
    fn watermarks(&self, py: Python<'_>, topic: &str, partition: u32) -> PyResult<(u64, u64)> {
        py.detach(|| self.client.watermarks(topic, partition)).map_err(cluster_error)
    }

    /// Kafka's DeleteRecords below `before`; the partition's start after the call.
    fn delete_records(
        &self,
        py: Python<'_>,
        topic: &str,
        partition: u32,
        before: u64,
    ) -> PyResult<u64> {
        py.detach(|| self.client.delete_records(topic, partition, before)).map_err(cluster_error)
    }

    /// A consumer of one partition; in `group`, from where the group committed last.
    #[pyo3(signature = (topic, partition, group = None))]
    fn consumer(
        &self,
        py: Python<'_>,
        topic: &str,
        partition: u32,
        group: Option<&str>,
    ) -> PyResult<PyClusterConsumer> {
        let count = py.detach(|| self.client.partition_count(topic)).map_err(cluster_error)?;
        if count.is_none_or(|count| partition >= count) {
            return Err(NotFoundError::new_err(format!("{topic:?} has no partition {partition}")));
        }
        let consumer =
            py.detach(|| self.client.consumer(topic, partition, group)).map_err(cluster_error)?;
        Ok(PyClusterConsumer { consumer: Mutex::new(consumer) })
    }

    /// Every committed record of `topic`/`partition`, in offset order.
    fn records(&self, py: Python<'_>, topic: &str, partition: u32) -> PyResult<Vec<ClusterRecord>> {
        let records = py.detach(|| self.client.records(topic, partition)).map_err(cluster_error)?;
        Ok(records
            .into_iter()
            .map(|r| {
                let bytes = |b: &[u8]| PyBytes::new(py, b).unbind();
                let headers = r.headers.iter().map(|(k, v)| (bytes(k), bytes(v))).collect();
                (r.offset.get(), r.timestamp, r.key.as_deref().map(bytes), bytes(&r.value), headers)
            })
            .collect())
    }
}

/// A consumer of one partition of a cluster, with the calls of `chronik.Consumer`: iterate
/// (stops when caught up), `poll`, `position`, `seek`, and in a group `commit`/`committed`.
#[pyclass(name = "_ClusterConsumer", module = "chronik._chronik", frozen)]
pub(crate) struct PyClusterConsumer {
    consumer: Mutex<ClusterConsumer>,
}

impl PyClusterConsumer {
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, ClusterConsumer>> {
        self.consumer.lock().map_err(|_| ChronikError::new_err("a consumer call panicked"))
    }
}

/// Records as `chronik.Record`s (key and value as bytes).
fn py_records(py: Python<'_>, records: Vec<OwnedRecord>) -> PyResult<Vec<Py<PyRecord>>> {
    let bytes = |b: &[u8]| PyBytes::new(py, b).unbind();
    records
        .into_iter()
        .map(|r| {
            let record = PyRecord {
                offset: r.offset.get(),
                timestamp: r.timestamp,
                key: r.key.as_deref().map(|k| bytes(k).into_any()),
                value: bytes(&r.value).into_any(),
                headers: r.headers.iter().map(|(k, v)| (bytes(k), bytes(v))).collect(),
            };
            Py::new(py, record)
        })
        .collect()
}

#[pymethods]
impl PyClusterConsumer {
    /// Up to `max_records` records (1000 when not given) from the position on; when caught
    /// up, waits up to `timeout` seconds (half a second when not given) for more.
    #[pyo3(signature = (max_records = None, timeout = None))]
    fn poll(
        &self,
        py: Python<'_>,
        max_records: Option<usize>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Py<PyRecord>>> {
        let max = max_records.unwrap_or(1_000).max(1);
        // NaN and negative timeouts do not wait (NaN passed `clamp` and made
        // `Duration::from_secs_f64` panic).
        let seconds = timeout.filter(|s| *s > 0.0).map_or(0.0, |s| s.min(1e6));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
        let mut guard = self.lock()?;
        let consumer: &mut ClusterConsumer = &mut guard;
        loop {
            // Each call waits about 100 ms when caught up: between them, look for Ctrl-C.
            let records = py.detach(|| consumer.next_batch(max)).map_err(cluster_error)?;
            if !records.is_empty() || std::time::Instant::now() >= deadline {
                return py_records(py, records);
            }
            py.check_signals()?;
        }
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
        Ok(self.lock()?.position().get())
    }

    fn seek(&self, py: Python<'_>, offset: u64) -> PyResult<()> {
        let mut guard = self.lock()?;
        let consumer: &mut ClusterConsumer = &mut guard;
        py.detach(|| consumer.seek(chronik::Offset::new(offset))).map_err(cluster_error)
    }

    /// Commit the position as the group's offset on the cluster.
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        let guard = self.lock()?;
        let consumer: &ClusterConsumer = &guard;
        if consumer.group().is_none() {
            return Err(InvalidArgumentError::new_err("this consumer is in no group"));
        }
        py.detach(|| consumer.commit()).map_err(cluster_error)
    }

    /// What the group committed last for this partition, if anything.
    fn committed(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        let guard = self.lock()?;
        let consumer: &ClusterConsumer = &guard;
        py.detach(|| consumer.committed())
            .map(|committed| committed.map(chronik::Offset::get))
            .map_err(cluster_error)
    }

    #[getter]
    fn group(&self) -> PyResult<Option<String>> {
        Ok(self.lock()?.group().map(str::to_owned))
    }
}

/// A store entry: key and value.
type Entry = (Vec<u8>, Vec<u8>);

/// A processor application on a cluster: the processes running it share the input partitions
/// in the consumer group named after it.
#[pyclass(name = "_ClusterApp", module = "chronik._chronik", frozen)]
pub(crate) struct PyClusterApp {
    client: Arc<KafkaClient>,
    config: ProcessorConfig,
    spec: Arc<Spec>,
    guarantee: Guarantee,
}

#[pymethods]
impl PyClusterApp {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (cluster, application, inputs, factory, stores, key_format, value_format, options, guarantee))]
    fn new(
        cluster: &PyCluster,
        application: &str,
        inputs: Vec<String>,
        factory: Py<PyAny>,
        stores: Vec<(String, String)>,
        key_format: &str,
        value_format: &str,
        options: &Bound<'_, PyDict>,
        guarantee: &str,
    ) -> PyResult<PyClusterApp> {
        let (config, spec) =
            setup(application, inputs, factory, stores, key_format, value_format, options)?;
        let guarantee = match guarantee {
            "exactly-once" => Guarantee::ExactlyOnce,
            "at-least-once" => Guarantee::AtLeastOnce,
            other => {
                return Err(InvalidArgumentError::new_err(format!(
                    "guarantee {other:?}: exactly-once or at-least-once"
                )));
            }
        };
        Ok(PyClusterApp { client: Arc::clone(&cluster.client), config, spec, guarantee })
    }

    /// Take partitions in the group, restore their stores from the changelogs, and process
    /// until the group's committed positions of every input partition reach their ends.
    fn run_until_caught_up<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let spec = &self.spec;
        let stats = py
            .detach(|| {
                self.client.run(
                    self.config.clone(),
                    self.guarantee,
                    |p| PyProcessor::new(spec, p),
                    Until::CaughtUp,
                )
            })
            .map_err(|e| run_error(spec, e))?;
        stats_dict(py, stats)
    }

    /// Store `name` as committed on the cluster (every partition's changelog), as a dict.
    fn store<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let format = self
            .spec
            .stores
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| *f)
            .ok_or_else(|| NotFoundError::new_err(format!("no store named {name:?}")))?;
        let changelog = self.config.changelog(name);
        let entries = py
            .detach(|| -> Result<Vec<Entry>, ClusterError> {
                let partitions = self.client.partition_count(&changelog)?.unwrap_or(0);
                let mut all = Vec::new();
                for partition in 0..partitions {
                    let records = self.client.records(&changelog, partition)?;
                    all.extend(chronik::processor::committed_state(&records));
                }
                Ok(all)
            })
            .map_err(cluster_error)?;
        let out = PyDict::new(py);
        for (key, value) in entries {
            out.set_item(format.decode(py, &key)?, format.decode(py, &value)?)?;
        }
        Ok(out)
    }
}
