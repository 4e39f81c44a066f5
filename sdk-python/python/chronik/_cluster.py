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

from typing import Any, Iterable, List, Optional, Tuple, Union

from chronik import _chronik

KAFKA_SCHEME = "kafka://"


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise _chronik.InvalidArgumentError(f"expected bytes or str, got {type(value).__name__}")


class ClusterProducer:
    """Sends to one topic of a cluster; each call returns once the cluster acknowledged."""

    def __init__(self, cluster: "Cluster", topic: str) -> None:
        self._cluster = cluster
        self.topic = topic

    def send(self, key: Any, value: Any, partition: Optional[int] = None) -> None:
        self.send_batch([(key, value)], partition)

    def send_batch(self, records: Iterable[Tuple[Any, ...]], partition: Optional[int] = None) -> None:
        """(key, value[, headers[, timestamp]]) tuples; keys and values bytes or str. Without
        `partition`, each record goes to the partition of its key (as embedded)."""
        count = self._cluster.partition_count(self.topic)
        by_partition = {}
        for record in records:
            key = None if record[0] is None else _bytes(record[0])
            value = _bytes(record[1])
            headers = [(_bytes(k), _bytes(v)) for k, v in (record[2] if len(record) > 2 and record[2] else [])]
            timestamp = record[3] if len(record) > 3 else None
            target = partition
            if target is None:
                target = 0 if key is None else _chronik.partition_for_key(key, count)
            by_partition.setdefault(target, []).append((key, value, headers, timestamp))
        for target, batch in by_partition.items():
            self._cluster._rust.send(self.topic, target, batch)


class Cluster:
    """A Kafka-protocol cluster behind the calls of `chronik.Chronik` that make sense there."""

    def __init__(self, bootstrap: str) -> None:
        self._rust = _chronik._Cluster(bootstrap)
        self._counts = {}

    @property
    def bootstrap(self) -> str:
        return self._rust.bootstrap()

    def recovery(self) -> List[str]:
        return []

    def list_topics(self) -> List[str]:
        return self._rust.list_topics()

    def create_topic(self, name: str, partitions: int = 1, compacted: bool = False) -> None:
        self._rust.create_topic(name, partitions, compacted)

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

    def records(self, topic: str, partition: int) -> List[Tuple[int, int, Optional[bytes], bytes, list]]:
        """Every committed record: (offset, timestamp, key, value, headers)."""
        return self._rust.records(topic, partition)

    def producer(self, topic: str) -> ClusterProducer:
        return ClusterProducer(self, topic)

    def consumer(self, topic: str, partition: int = 0, group: Optional[str] = None):
        """A consumer of one partition, with the calls of `chronik.Consumer` (iterate until
        caught up, `poll`, `position`, `seek`); in `group`, it starts where the group committed
        last and `commit()` stores its position as the group's offset on the cluster."""
        return self._rust.consumer(topic, partition, group)

    def flush(self) -> None:
        """Nothing to do: every send returned once the cluster acknowledged it."""

    def close(self) -> None:
        pass

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect(target: str, **options: Any) -> Union["_chronik.Chronik", Cluster]:
    """A data directory (opened as `chronik.open(target, **options)`) or, for
    `kafka://HOST:PORT[,HOST:PORT...]`, a Kafka-protocol cluster."""
    if target.startswith(KAFKA_SCHEME):
        if not hasattr(_chronik, "_Cluster"):
            raise _chronik.ChronikError("this build of chronik has no Kafka support")
        return Cluster(target[len(KAFKA_SCHEME) :])
    if target.startswith("file://"):
        target = target[len("file://") :]
    return _chronik.open(target, **options)
