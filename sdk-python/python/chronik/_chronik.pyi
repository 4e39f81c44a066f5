"""Type stubs of the extension module `chronik._chronik`."""

from types import TracebackType
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Tuple, Union

BytesLike = Union[bytes, bytearray, memoryview, str]
Headers = Union[Mapping[BytesLike, BytesLike], Iterable[Tuple[BytesLike, BytesLike]]]

class ChronikError(Exception): ...
class CorruptionError(ChronikError): ...
class PoisonedError(ChronikError): ...
class NotFoundError(ChronikError): ...
class AlreadyExistsError(ChronikError): ...
class InvalidArgumentError(ChronikError): ...
class LockedError(ChronikError): ...
class OffsetOutOfRangeError(ChronikError): ...
class IoError(ChronikError): ...
class ClosedError(ChronikError): ...

class SimulationFailure(Exception):
    """A simulated run differed from the fault-free run (or an oracle failed)."""

    seed: int
    kind: str
    detail: str

class Record:
    """A record read from a partition; `key` and `value` are memoryviews (no copy per record)."""

    offset: int
    timestamp: int
    key: Optional[memoryview]
    value: memoryview
    headers: list[Tuple[bytes, bytes]]

class Producer:
    topic: str
    def send(
        self,
        key: Optional[BytesLike],
        value: BytesLike,
        headers: Optional[Headers] = None,
        partition: Optional[int] = None,
        timestamp: Optional[int] = None,
    ) -> Tuple[int, int]:
        """Append one record (timestamp: ms since the epoch, default now); `(partition,
        offset)` once acknowledged per the durability mode."""
    def send_batch(
        self, records: Iterable[Sequence[object]], partition: Optional[int] = None
    ) -> list[Tuple[int, int, int]]:
        """Append `(key, value)`, `(key, value, headers)` or `(key, value, headers, timestamp)`
        tuples, one batch per partition; `(partition, first offset, count)` per batch."""
    def send_async(
        self,
        key: Optional[BytesLike],
        value: BytesLike,
        headers: Optional[Headers] = None,
        partition: Optional[int] = None,
        timestamp: Optional[int] = None,
    ) -> PendingSend:
        """Queue one record and return at once; many in flight share fsyncs. Offsets follow
        the order of the calls per partition."""
    def flush(self) -> None:
        """Wait until every record queued so far is durable."""

class PendingSend:
    partition: int
    def done(self) -> bool:
        """Whether the send is acknowledged or failed (never blocks)."""
    def result(self) -> Tuple[int, int]:
        """Wait (without the GIL) and return `(partition, offset)`, or raise what `send`
        would have raised."""

class Consumer:
    position: int
    group: Optional[str]
    def poll(
        self, max_records: Optional[int] = None, timeout: Optional[float] = None
    ) -> list[Record]: ...
    def __iter__(self) -> Iterator[Record]: ...
    def __next__(self) -> Record: ...
    def seek(self, offset: int) -> None: ...
    def commit(self) -> None: ...
    def committed(self) -> Optional[int]: ...

class Chronik:
    path: str
    def __enter__(self) -> "Chronik": ...
    def __exit__(
        self,
        exc_type: Optional[type],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...
    def close(self) -> None: ...
    def recovery(self) -> list[str]: ...
    def metrics(self) -> dict[str, Any]:
        """Counters and latency histograms since the directory was opened."""
    def metrics_prometheus(self) -> str:
        """The metrics in the Prometheus text exposition format."""
    def create_topic(
        self, name: str, partitions: int = 1, config: Optional[Mapping[str, object]] = None
    ) -> None: ...
    def delete_topic(self, name: str) -> None: ...
    def list_topics(self) -> list[str]: ...
    def describe_topic(self, name: str) -> dict: ...
    def alter_topic_config(self, name: str, settings: Mapping[str, object]) -> None: ...
    def high_watermark(self, topic: str, partition: int) -> int: ...
    def flush(self) -> None: ...
    def producer(self, topic: str) -> Producer: ...
    def consumer(self, topic: str, partition: int = 0, group: Optional[str] = None) -> Consumer: ...

class Store:
    """A task's key-value store (restored from its changelog), usable inside its calls."""

    name: str
    def get(self, key: Any, default: Any = None) -> Any: ...
    def __getitem__(self, key: Any) -> Any: ...
    def __setitem__(self, key: Any, value: Any) -> None: ...
    def __delitem__(self, key: Any) -> None: ...
    def __contains__(self, key: Any) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Any]: ...
    def pop(self, key: Any, default: Any = ...) -> Any: ...
    def keys(self) -> list[Any]: ...
    def values(self) -> list[Any]: ...
    def items(self) -> list[Tuple[Any, Any]]: ...
    def range(self, start: Any = None, end: Any = None) -> list[Tuple[Any, Any]]:
        """Entries with start <= encoded key < end, in key order."""

class Context:
    """Given to each handler call: stores, emits, partition and stream time."""

    partition: int
    stream_time: int
    input: str
    def store(self, name: str) -> Store: ...
    def emit(self, topic: str, key: Any, value: Any) -> None:
        """Emit with the next commit; bytes-like and str as they are, others as JSON."""
    def emit_json(self, topic: str, key: Any, value: Any) -> None:
        """Emit with key (unless None) and value as JSON, strings included."""

class _App:
    def __init__(
        self,
        db: Chronik,
        application: str,
        inputs: Sequence[str],
        factory: Callable[[int], Any],
        stores: Sequence[Tuple[str, str]],
        key_format: str,
        value_format: str,
        options: Mapping[str, Any],
    ) -> None: ...
    def run(self, seconds: Optional[float] = None) -> dict[str, int]: ...
    def run_until_caught_up(self) -> dict[str, int]: ...
    def stop(self) -> None: ...
    def store(self, name: str, partition: Optional[int] = None) -> dict[Any, Any]: ...
    def positions(self) -> list[int]: ...

def simulate(
    application: str,
    inputs: Sequence[str],
    factory: Callable[[int], Any],
    stores: Sequence[Tuple[str, str]],
    key_format: str,
    value_format: str,
    options: Mapping[str, Any],
    input_partitions: int,
    outputs: Sequence[Tuple[str, int]],
    records: Sequence[Tuple[int, int, Optional[bytes], bytes, Optional[int]]],
    seeds: Tuple[int, int],
    crashes_max: int,
) -> dict[str, int]: ...
def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition a key goes to among `partitions` (the producer's choice)."""

def _encode(format: str, value: Any) -> bytes: ...

def open(path: str, durability: str = "sync") -> Chronik:
    """Open (creating if needed) a data directory; durability "sync", "os" or "interval:MS"."""
