"""`chronik.connect`: one call for a data directory or a Kafka-protocol cluster.

    db = chronik.connect("./data")                  # embedded, as chronik.open
    db = chronik.connect("kafka://127.0.0.1:9092")  # a Kafka-protocol cluster

On a cluster the same calls work: topics, producers (`producer(topic).send_batch`), and
`chronik.App` processor applications, whose processes share the input partitions in the
consumer group named after the application and restore their stores from the compacted
changelog topics when partitions move. Exactly once needs Kafka transactions; on a cluster
without them an application refuses to start unless asked for at least once
(`App(..., guarantee="at-least-once")` or `CHRONIK_GUARANTEE=at-least-once`).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

from chronik import _chronik

KAFKA_SCHEME = "kafka://"

# The calls of `chronik.Chronik` that a cluster does not have, because they have no meaning
# there (or none this client can give safely): the data directory's path and read-only open,
# refreshing a read-only open, compacting now (the cluster compacts on its own schedule), the
# engine's metrics, and `alter_topic_config` (Kafka's AlterConfigs replaces a topic's whole
# configuration, and its incremental form is not in the client). Every other call of
# `Chronik` is on `Cluster` with the same parameters and the same shape of answer
# (tests/test_parity.py holds both to that).
EMBEDDED_ONLY = frozenset(
    {
        "alter_topic_config",
        "compact_topic",
        "metrics",
        "metrics_prometheus",
        "path",
        "read_only",
        "refresh",
    }
)
# What only a cluster has: the address it was reached at (the counterpart of `path`).
CLUSTER_ONLY = frozenset({"bootstrap"})

# Topic settings of `create_topic(config=...)` and `describe_topic` by their Chronik names,
# with Kafka's names for them.
KAFKA_SETTINGS = {
    "cleanup": "cleanup.policy",
    "retention_ms": "retention.ms",
    "retention_bytes": "retention.bytes",
    "segment_bytes": "segment.bytes",
    "segment_ms": "segment.ms",
}
KAFKA_CLEANUP = {"delete": "delete", "compact": "compact", "compact+delete": "compact,delete"}

BATCH_RECORD_SHAPES = (
    "records are (key, value), (key, value, headers) or (key, value, headers, timestamp) tuples"
)


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise _chronik.InvalidArgumentError(f"expected bytes or str, got {type(value).__name__}")


def _headers(headers: Any) -> list:
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(_bytes(k), _bytes(v)) for k, v in items]


class ClusterPendingSend:
    """A `ClusterProducer.send_async`: the interface of `chronik.PendingSend`. The send was
    made, and acknowledged or refused, before `send_async` returned (a cluster's sends wait for
    the acknowledgement), so `done()` is always true; `result()` returns `(partition, offset)`
    or raises what the send raised, as an embedded one does."""

    def __init__(self, partition: int, offset: Optional[int], error: Optional[BaseException]) -> None:
        self._partition = partition
        self._offset = offset
        self._error = error

    @property
    def partition(self) -> int:
        return self._partition

    def done(self) -> bool:
        return True

    def result(self) -> Tuple[int, int]:
        if self._error is not None:
            raise self._error
        return (self._partition, self._offset)


class ClusterProducer:
    """Sends to one topic of a cluster, with the calls of `chronik.Producer`; each send returns
    once the cluster acknowledged it (`acks=all`), with the offsets it got."""

    def __init__(self, cluster: "Cluster", topic: str) -> None:
        self._cluster = cluster
        self._topic = topic

    @property
    def topic(self) -> str:
        return self._topic

    def _partition(self, key: Optional[bytes], partition: Optional[int]) -> int:
        if partition is not None:
            return partition
        if key is None:
            return 0
        return _chronik.partition_for_key(key, self._cluster.partition_count(self._topic))

    def send(
        self,
        key: Any,
        value: Any,
        headers: Any = None,
        partition: Optional[int] = None,
        timestamp: Optional[int] = None,
    ) -> Tuple[int, int]:
        """Send one record; `(partition, offset)` once acknowledged. The partition is the
        key's (0 without a key) unless given."""
        [(target, first, _)] = self.send_batch([(key, value, headers, timestamp)], partition)
        return (target, first)

    def send_batch(
        self, records: Iterable[Sequence[object]], partition: Optional[int] = None
    ) -> list[Tuple[int, int, int]]:
        """(key, value[, headers[, timestamp]]) tuples; keys and values bytes or str. Without
        `partition`, each record goes to the partition of its key (as embedded). All are
        acknowledged together; `(partition, first offset, last offset)` per partition, in the
        order the partitions first appear (not atomic: a failure may leave some written)."""
        by_partition = {}
        for record in records:
            if not isinstance(record, tuple) or not 2 <= len(record) <= 4:
                raise _chronik.InvalidArgumentError(BATCH_RECORD_SHAPES)
            key = None if record[0] is None else _bytes(record[0])
            value = _bytes(record[1])
            headers = _headers(record[2] if len(record) > 2 else None)
            timestamp = record[3] if len(record) > 3 else None
            target = self._partition(key, partition)
            by_partition.setdefault(target, []).append((key, value, headers, timestamp))
        if not by_partition:
            return []
        return self._cluster._rust.send(self._topic, list(by_partition.items()))

    def send_async(
        self,
        key: Any,
        value: Any,
        headers: Any = None,
        partition: Optional[int] = None,
        timestamp: Optional[int] = None,
    ) -> ClusterPendingSend:
        """As `chronik.Producer.send_async`, but the send is done when this returns (see
        `ClusterPendingSend`): a program written for embedded runs unchanged, without the
        embedded producer's sharing of acknowledgements among sends in flight."""
        target = self._partition(None if key is None else _bytes(key), partition)
        try:
            _, offset = self.send(key, value, headers, target, timestamp)
        except _chronik.ChronikError as error:
            return ClusterPendingSend(target, None, error)
        return ClusterPendingSend(target, offset, None)

    def flush(self) -> None:
        """Nothing to wait for: every send returned once the cluster acknowledged it."""


class Cluster:
    """A Kafka-protocol cluster behind the calls of `chronik.Chronik`, less `EMBEDDED_ONLY`."""

    def __init__(self, bootstrap: str, config: Optional[Mapping[str, object]] = None) -> None:
        self._rust = _chronik._Cluster(bootstrap, _properties(config))
        self._counts = {}

    @property
    def bootstrap(self) -> str:
        return self._rust.bootstrap()

    def __repr__(self) -> str:
        # The address only: the properties may hold secrets.
        return f"Cluster({self.bootstrap!r})"

    def recovery(self) -> list[str]:
        """Nothing: a cluster recovers on its own."""
        return []

    def list_topics(self) -> list[str]:
        return self._rust.list_topics()

    def create_topic(
        self, name: str, partitions: int = 1, config: Optional[Mapping[str, object]] = None
    ) -> None:
        """`config` takes the Chronik settings that Kafka has too (`cleanup`, `retention_ms`,
        `retention_bytes`, `segment_bytes`, `segment_ms`); only `cleanup` reaches the cluster
        here, the others are refused rather than dropped."""
        compacted = False
        for key, value in (config or {}).items():
            if key == "cleanup" and str(value) in ("delete", "compact"):
                compacted = str(value) == "compact"
            else:
                raise _chronik.InvalidArgumentError(
                    f"topic setting {key}={value}: a cluster topic takes only cleanup "
                    "(delete or compact) here"
                )
        self._rust.create_topic(name, partitions, compacted)

    def delete_topic(self, name: str) -> None:
        self._rust.delete_topic(name)
        self._counts.pop(name, None)

    def describe_topic(self, name: str) -> dict:
        """The shape of `Chronik.describe_topic`: `name`, `config` (the cluster's settings, by
        their Chronik names where there is one, else Kafka's) and `partitions`, where
        `log_end_offset` and `high_watermark` are both the cluster's high watermark and
        `segments` and `size_bytes` are None (the cluster does not say). The watermarks are
        the cluster's answers: tansu 0.6 puts the high one after the first record of the last
        batch, where `high_watermark` reads to count."""
        count = self.partition_count(name)
        kafka_names = {kafka: ours for ours, kafka in KAFKA_SETTINGS.items()}
        config = {}
        for key, value in self._rust.topic_config(name):
            if key == "cleanup.policy":
                value = {v: k for k, v in KAFKA_CLEANUP.items()}.get(value, value)
            config[kafka_names.get(key, key)] = value
        partitions = []
        for partition in range(count):
            low, high = self._rust.watermarks(name, partition)
            partitions.append(
                {
                    "partition": partition,
                    "log_start_offset": low,
                    "log_end_offset": high,
                    "high_watermark": high,
                    "segments": None,
                    "size_bytes": None,
                }
            )
        return {"name": name, "config": config, "partitions": partitions}

    def partition_count(self, topic: str) -> int:
        if topic not in self._counts:
            count = self._rust.partition_count(topic)
            if count is None:
                raise _chronik.NotFoundError(f"topic {topic!r} does not exist on the cluster")
            self._counts[topic] = count
        return self._counts[topic]

    def high_watermark(self, topic: str, partition: int) -> int:
        """How many committed records the partition holds (read, not asked: some brokers
        misreport their end offsets, and transaction markers take offsets)."""
        return len(self._rust.records(topic, partition))

    def delete_records(self, topic: str, partition: int, before: int) -> int:
        """Kafka's DeleteRecords below `before`; returns the partition's start after the call
        (on a cluster exactly `before`, where embedded deletes whole segments only)."""
        return self._rust.delete_records(topic, partition, before)

    def records(
        self, topic: str, partition: int
    ) -> list[Tuple[int, int, Optional[bytes], bytes, list[Tuple[bytes, bytes]]]]:
        """Every committed record: (offset, timestamp, key, value, headers)."""
        return self._rust.records(topic, partition)

    def flush(self) -> None:
        """Nothing to do: every send returned once the cluster acknowledged it."""

    def close(self) -> None:
        pass

    def producer(self, topic: str) -> ClusterProducer:
        self.partition_count(topic)
        return ClusterProducer(self, topic)

    def consumer(
        self, topic: str, partition: int = 0, group: Optional[str] = None
    ) -> "_chronik._ClusterConsumer":
        """A consumer of one partition, with the calls of `chronik.Consumer` (iterate until
        caught up, `poll`, `position`, `seek`); in `group`, it starts where the group committed
        last and `commit()` stores its position as the group's offset on the cluster."""
        return self._rust.consumer(topic, partition, group)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(
        self,
        exc_type: Optional[type],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


def _properties(config: Optional[Mapping[str, object]]) -> list[Tuple[str, str]]:
    """Kafka client properties as librdkafka takes them: strings, booleans as true/false."""
    properties = []
    for key, value in (config or {}).items():
        if not isinstance(key, str):
            raise _chronik.InvalidArgumentError(f"kafka property names are strings, not {key!r}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float, str)):
            value = str(value)
        else:
            # The value is not shown: it may be a secret.
            raise _chronik.InvalidArgumentError(
                f"kafka property {key!r}: a string, number or boolean, not {type(value).__name__}"
            )
        properties.append((key, value))
    return properties


def connect(
    target: str, config: Optional[Mapping[str, object]] = None, **options: Any
) -> Union["_chronik.Chronik", Cluster]:
    """A data directory (opened as `chronik.open(target, **options)`) or, for
    `kafka://HOST:PORT[,HOST:PORT...]`, a Kafka-protocol cluster; `config` takes its Kafka
    client properties (`{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
    "sasl.username": ..., "sasl.password": ...}`), refused ones named in the error, and
    `"state.dir"`: where processors and topologies keep disk stores on this machine."""
    if target.startswith(KAFKA_SCHEME):
        if not hasattr(_chronik, "_Cluster"):
            raise _chronik.ChronikError("this build of chronik has no Kafka support")
        return Cluster(target[len(KAFKA_SCHEME) :], config)
    if config is not None:
        raise _chronik.InvalidArgumentError(
            "config= takes Kafka client properties; a data directory takes open()'s options"
        )
    if target.startswith("file://"):
        target = target[len("file://") :]
    return _chronik.open(target, **options)
